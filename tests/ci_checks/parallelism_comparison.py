"""parallelism_comparison on the CI grid (4 ranks, six layouts): every layout trains like
one device; the counters equal the papers' counts, recomputed here from the CI config
(Megatron's all-reduces for TP, one ring all-reduce of the gradients for DP, one
activation and one gradient per boundary for PP), and so does the TP ÷ DP traffic ratio;
TP and PP keep one copy of the model cut 4 ways while DP keeps a whole one; the pipeline's
replayed utilization sits at its bubble bound M/(M+P−1) once its measured transfers are
on the critical path; single-stage layouts never wait; and every ordering of the
lecture's table is recorded as a finding, the communication one as the counts predict."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from impls.models import GPT, GPTConfig
from tests.ci_checks import ran, rows

ARTEFACTS = ("memory_per_rank", "comm_per_step", "utilization")

_GRID = (
    Path(__file__).resolve().parents[2] / "experiments/profile_grid/ci_parallelism_comparison.yaml"
)
CI = OmegaConf.to_container(OmegaConf.load(_GRID))
MODEL = GPTConfig(**CI["model"])
M, B = CI["microbatches"], CI["batch_size"]
L, H, S = MODEL.n_layers, MODEL.d_model, MODEL.seq_len
PSI = sum(p.numel() for p in GPT(MODEL).parameters())
LECTURE = "as the lecture's words say"
LAYOUTS = {"dp4", "tp4", "pp4", "dp2×tp2", "dp2×pp2", "pp2×tp2"}
REQUIRED = (
    "world_size",
    "dp",
    "pp",
    "tp",
    "layout",
    "strategy",
    "util_replayed",
    "util_wall",
    "util_theory",
    "memory_per_rank_bytes",
    "model_state_bytes",
    "activation_peak_bytes",
    "comm_bytes_dp",
    "comm_bytes_pp",
    "comm_bytes_tp",
    "comm_bytes_per_step",
    "step_time_s",
    "replayed_step_time_s",
    "wrong",
    "git_sha",
)


def _ring(numel: float, n: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `numel` float32 on `n` ranks."""
    return 2 * (n - 1) / n * numel * 4


def _megatron_tp_bytes(dp: int, tp: int) -> float:
    """A single-stage TP rank's bytes per step: per micro-batch of b = B/(dp·M) sequences,
    four all-reduces of the (b, s, h) activation per block (Megatron-LM §3), the
    vocab-parallel embedding's and LM head's two, and the cross-entropy's max and pair of
    sums over (b, s)."""
    b = B // (dp * M)
    return M * _ring((4 * L + 2) * b * S * H + 3 * b * S, tp)


def _layout(df: pd.DataFrame, name: str) -> pd.Series:
    return rows(df, layout=name).iloc[0]


def every_layout_ran_and_trains_like_one_device(df: pd.DataFrame, headline: dict) -> None:
    """Every layout matched single-device AdamW; the loss is what uniform random targets
    give a freshly initialised LM, ln V (2 steps at lr 1e-3 move it by hundredths), and
    the same for every layout (one model, one batch)."""
    done = ran(df)
    assert set(REQUIRED) <= set(done.columns), set(REQUIRED) - set(done.columns)
    assert set(done["layout"]) == LAYOUTS
    assert (done["wrong"] == 0).all(), done.loc[done["wrong"] != 0, ["layout", "update_error"]]
    assert headline["wrong_total"] == 0 and headline["failed_cells"] == 0
    assert (done["loss"] - math.log(MODEL.vocab_size)).abs().max() < 0.2, done["loss"].tolist()
    assert done["loss"].max() - done["loss"].min() < 1e-5
    assert (done["params"] == PSI).all(), (done["params"].tolist(), PSI)


def counters_equal_the_papers_counts(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    for axis in ("dp", "pp", "tp"):  # an axis in use moves bytes; one not in use, none
        used = done[axis] > 1
        assert (done.loc[used, f"comm_bytes_{axis}"] > 0).all(), axis
        assert (done.loc[~used, f"comm_bytes_{axis}"] == 0).all(), axis
    assert (done["comm_bytes_tp"] == done["predicted_comm_bytes_tp"]).all()
    for axis, slack in (("dp", 8), ("pp", 64)):  # ring chunks' rounding; barrier and loss
        extra = done[f"comm_bytes_{axis}"] - done[f"predicted_comm_bytes_{axis}"]
        assert ((extra >= -slack) & (extra <= slack)).all(), (axis, extra.tolist())
    # The same counts recomputed from the CI config, not from the experiment's code.
    assert _layout(done, "tp4")["comm_bytes_tp"] == _megatron_tp_bytes(1, 4)
    assert _layout(done, "dp2×tp2")["comm_bytes_tp"] == _megatron_tp_bytes(2, 2)
    assert _layout(done, "dp4")["comm_bytes_dp"] == pytest.approx(_ring(PSI + 1, 4), abs=8)
    interior = 2 * M * (B // M) * S * H * 4  # one activation forward, one gradient back
    assert 0 <= _layout(done, "pp4")["comm_bytes_pp"] - interior <= 64


def tp_traffic_ratio_is_the_counted_formulas(df: pd.DataFrame, headline: dict) -> None:
    """TP ÷ DP bytes per step at N = 4: Megatron's count over one ring all-reduce of the
    gradients, B·s·((4L+2)·h + 3) / (Ψ + 1) for this model (the ring factor cancels);
    above 1, as the lecture's "TP higher" says, since B·s exceeds ~Ψ/(4·L·h) here."""
    by_size = headline.get("by_world_size", {}).get("4", {})
    theory = B * S * ((4 * L + 2) * H + 3) / (PSI + 1)
    measured = by_size.get("tp_comm_vs_dp")
    assert isinstance(measured, float) and measured == pytest.approx(theory, rel=1e-4)
    assert by_size.get("tp_comm_vs_dp_theory") == pytest.approx(theory, rel=1e-9)
    assert theory > 1
    figure = [f for f in headline["figures"] if f["figure"].startswith("TP communication")]
    assert [(f["measured"], f["gap"]) for f in figure] == [(f"{theory:.2f}×", "+0.00×")]


def model_states_are_one_copy_cut_k_ways(df: pd.DataFrame, headline: dict) -> None:
    """fp32 AdamW holds 16 bytes per parameter (and a 4-byte step count per tensor): DP a
    whole copy on every rank, TP and PP one copy cut 4 ways, TP a little more for its
    replicated LayerNorms and position embedding."""
    done = ran(df)
    dp_states = _layout(done, "dp4")["model_state_bytes_mean"]
    assert dp_states == pytest.approx(16 * PSI, rel=1e-3)
    k = done["pp"] * done["tp"]
    assert (done["theory_model_state_bytes"] == 16 * PSI / k).all()
    assert _layout(done, "pp4")["model_state_bytes_mean"] == pytest.approx(dp_states / 4, rel=1e-3)
    assert dp_states / 4 < _layout(done, "tp4")["model_state_bytes_mean"] < 1.1 * dp_states / 4
    for name in ("tp4", "pp4"):
        assert (
            _layout(done, "dp4")["model_state_bytes"] > 3 * _layout(done, name)["model_state_bytes"]
        )
    by_size = headline.get("by_world_size", {}).get("4", {})
    assert by_size.get("pp_model_states_vs_dp") == pytest.approx(0.25, rel=1e-3)
    assert 0.25 < (by_size.get("tp_model_states_vs_dp") or 0) < 0.275


def pipeline_sits_at_its_bubble_bound(df: pd.DataFrame, headline: dict) -> None:
    """The replay of pp4 (P = M = 4) against GPipe's M/(M+P−1) = 4/7.

    From above, exactly: only the work after the pipeline (optimizer, dp all-reduce),
    which has no bubble, lifts the replay over the bound. A pipeline whose stages take cᵢ
    per micro-batch spans at least Σ cᵢ + (M − 1)·max cᵢ ≥ (M + P − 1)·mean cᵢ, so with
    the row's compute after the pipeline A (mean over stages) and the longest stage's
    work after it T: util ≤ C / ((C − A)·(M + P − 1)/M + T). (A fixed 2 points above the
    bound had stood here; CI read 0.594 against 0.591 when the optimizer ran slow.)
    From below: the bound's makespan with what the replay adds to it, each measured in the
    row — the 2(P−1) transfers of the critical path at τ = α + β·bytes, and the step's own
    rounds (the loss broadcast) — so C / (C·(M+P−1)/M + 2(P−1)·τ + comm) for the replayed
    compute C; less 5 points for unequal stages, which the model leaves out: the end stages'
    extra work (embedding; LM head and loss) and each stage's CPU time, which varies by up
    to ±20% on a loaded host. Four runs (load 3 to 13 on 2 cores) came −2.7 to +2.6 points
    from that model; a schedule with a larger bubble, or a replay that serialised the stages
    (1/P = 25%), misses by ten points or more."""
    done = ran(df)
    pp = _layout(done, "pp4")
    p = 4
    assert pp["util_theory"] == pytest.approx(M / (M + p - 1))
    tau = pp["link_alpha_s"] + pp["link_beta_s_per_byte"] * (B // M) * S * H * 4
    compute = pp["replayed_compute_s"]
    comm = pp["replayed_comm_latency_s"] + pp["replayed_comm_bandwidth_s"]
    assert compute > 0 and tau > 0 and comm >= 0, (compute, tau, comm)
    model = compute / (compute * (M + p - 1) / M + 2 * (p - 1) * tau + comm)
    after, longest = pp["replayed_after_compute_s"], pp["replayed_after_s"]
    assert 0 <= after < compute and longest >= after, (after, longest, compute)
    ceiling = compute / ((compute - after) * (M + p - 1) / M + longest)
    band = (model - 0.05, ceiling + 1e-9)
    assert band[0] <= pp["util_replayed"] <= band[1], (pp["util_replayed"], band)
    assert _layout(done, "dp4")["util_replayed"] > pp["util_replayed"]
    by_size = headline.get("by_world_size", {}).get("4", {})
    assert by_size.get("pp_util_replayed") == pytest.approx(pp["util_replayed"])
    assert by_size.get("pp_util_bound") == pytest.approx(4 / 7)


def utilization_accounts_for_the_whole_step(df: pd.DataFrame, headline: dict) -> None:
    """Shares of one step: a single stage never waits (compute + communication is the
    whole replayed step); a pipeline waits at least half its bubble share."""
    done = ran(df)
    assert ((done["util_wall"] > 0) & (done["util_wall"] <= 1)).all()
    assert ((done["util_replayed"] > 0) & (done["util_replayed"] <= 1)).all()
    waiting = 1 - done["util_replayed"] - done["comm_fraction_replayed"]
    single = done["pp"] == 1
    assert (waiting[single].abs() <= 1e-9).all(), waiting[single].tolist()
    bubble = 1 - done.loc[~single, "util_theory"]
    assert (waiting[~single] >= bubble / 2).all(), (waiting[~single].tolist(), bubble.tolist())


def findings_record_every_ordering(df: pd.DataFrame, headline: dict) -> None:
    """Six orderings at N = 4, each a finding. Model states DP > TP and DP > PP hold for
    any model; the communication ordering TP > PP > DP holds exactly when the counted
    formulas say so (here PP ÷ DP = 2·B·s·h / (2·3/4·(Ψ+1)) < 1: it does not). The counts
    and model-state targets are met on every cell."""
    findings = {f["claim"]: f for f in headline["findings"]}
    assert len(findings) == 6, list(findings)
    for order in ("DP > TP", "DP > PP"):
        claim = findings.get(f"model states per rank at N = 4: {order}, {LECTURE}")
        assert claim is not None and claim["holds"], (order, claim)
    predicted = (_megatron_tp_bytes(1, 4), 2 * M * (B // M) * S * H * 4, _ring(PSI + 1, 4))
    comm = findings.get(f"communication per step at N = 4: TP > PP > DP, {LECTURE}")
    assert comm is not None and comm["holds"] == (predicted[0] > predicted[1] > predicted[2])
    assert not comm["holds"] and "measured TP " in comm["detail"]
    targets = {t["column"]: t for t in headline["targets"]}
    for column in ("comm_count_error", "model_state_vs_theory"):
        target = targets.get(column, {})
        assert target.get("met") and target.get("measured") == len(LAYOUTS), (column, target)


CHECKS = (
    every_layout_ran_and_trains_like_one_device,
    counters_equal_the_papers_counts,
    tp_traffic_ratio_is_the_counted_formulas,
    model_states_are_one_copy_cut_k_ways,
    pipeline_sits_at_its_bubble_bound,
    utilization_accounts_for_the_whole_step,
    findings_record_every_ordering,
)
