"""planner_validation: config refusals, the ground truth read and labelled from synthetic
source reports, the composed memory against hand counts and the repo's own formula, the
core-sharing rule, the reference fit recovering known constants, one prediction by hand
(single rank: the step is the sum of the calibrated layer costs), and the report's ρ."""

from __future__ import annotations

import csv
import math
import statistics
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from bench.experiments.planner_validation import calibration, experiment, ranks, rounds
from bench.experiments.planner_validation.config import PROBE_LINK, PlannerValidationConfig
from bench.experiments.planner_validation.report import prepare, spearman
from impls.costmodel.activations import activation_bytes
from impls.models import GPT, GPTConfig

MODEL = {
    "d_model": 128,
    "n_layers": 8,
    "n_heads": 8,
    "seq_len": 64,
    "vocab_size": 256,
    "bias": False,
}
CAL = {
    "threads": 1,
    "peak_fp32_flops": 1e11,
    "peak_bf16_flops": 4e11,
    "gemm_table": ((1e5, 0.5), (1e8, 1.0)),
    "memory_bandwidth": 5e10,
    "kernel_overhead_s": 2e-6,
}
LINK = (5e-5, 3e-10)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"sources": ["allreduce_scaling"]}, "sources"),
        ({"sources": ["zero_memory"] * 2}, "sources"),
        ({"sources": []}, "sources"),
        ({"reports_root": " "}, "reports_root"),
        ({"max_rows": 0}, "max_rows"),
        ({"gemm_sizes": [0, 8]}, "gemm_sizes"),
        ({"gemm_sizes": [64]}, "gemm_sizes"),
        ({"copy_mib": 0}, "copy_mib"),
        ({"repeats": -1}, "repeats"),
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"reference_window_s": -0.1}, "reference_window_s"),
        ({"held_out": ["at_scale"]}, "held_out"),
        ({"held_out": []}, "held_out"),
        ({"held_out": ["zero_memory"] * 2}, "held_out"),
    ],
)
def test_config_refuses_naming_the_key(values, key):
    with pytest.raises(ValueError, match=key):
        PlannerValidationConfig(**values)


# The unit tests' config: the rows priced at their source run's host speed, so that the
# scaling's every path is exercised (the experiment's default is off: `host_scaling`).
CFG = SimpleNamespace(host_scaling=True)


def test_missing_source_report_is_refused_naming_reports_root(tmp_path):
    _sources(tmp_path)
    (tmp_path / "zero_memory" / "results.csv").unlink()
    with pytest.raises(ValueError, match="reports_root=.*zero_memory/results.csv"):
        PlannerValidationConfig(reports_root=str(tmp_path), sources=["zero_memory"])
    (tmp_path / "parallelism_comparison" / "results.csv").unlink()  # the link is measured
    PlannerValidationConfig(reports_root=str(tmp_path), sources=["pipeline_utilization"])
    with pytest.raises(ValueError, match="reports_root=.*parallelism_comparison/results.csv"):
        PlannerValidationConfig(reports_root=str(tmp_path))


def _write(root: Path, name: str, rows: list[dict]) -> None:
    (root / name).mkdir(parents=True)
    with (root / name / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def _sources(root: Path) -> None:
    shape = {k: str(v) for k, v in MODEL.items()}
    common = {**shape, "status": "ok", "git_sha": "abc1234", "host_cores": "2"}
    _write(
        root,
        "parallelism_comparison",
        [
            {
                **common,
                "world_size": "4",
                "dp": "2",
                "tp": "1",
                "pp": "2",
                "layout": "dp2×pp2",
                "schedule": "1f1b",
                "batch_size": "32",
                "microbatches": "4",
                "step_time_s": "0.2",
                "replayed_step_time_s": "0.1",
                "memory_per_rank_bytes": "3e7",
                "link_alpha_s": "5e-5",
                "link_beta_s_per_byte": "3e-10",
                "host_probe_s": "0.03",
                "host_probe_before_s": "0.035",
                "host_probe_after_s": "0.025",
            },
            {
                **common,
                "world_size": "2",
                "dp": "2",
                "tp": "1",
                "pp": "1",
                "layout": "dp2",
                "schedule": "1f1b",
                "batch_size": "32",
                "microbatches": "4",
                "step_time_s": "0.2",
                "replayed_step_time_s": "0.1",
                "memory_per_rank_bytes": "3e7",
                "link_alpha_s": "7e-5",
                "link_beta_s_per_byte": "2e-10",
            },
        ],
    )
    zero = {
        **common,
        "impl": "distbench",
        "precision": "fp32",
        "batch_size": "32",
        "step_time_s": "0.3",
        "peak_bytes": "2e7",
    }
    _write(
        root,
        "zero_memory",
        [
            {**zero, "method": "zero3", "world_size": "8"},
            {**zero, "method": "torch_fsdp", "world_size": "8", "impl": "torch"},
            {**zero, "method": "dp", "world_size": "1", "status": "failed"},
        ],
    )
    _write(
        root,
        "pipeline_utilization",
        [
            {
                **common,
                "impl": "distbench",
                "schedule": "interleaved_1f1b",
                "stages": "4",
                "microbatches": "8",
                "virtual_stages": "2",
                "microbatch_size": "4",
                "world_size": "4",
                "step_time_s": "0.5",
                "replayed_makespan_s": "0.25",
                "peak_activation_bytes": "1e7",
            },
            {
                **common,
                "impl": "distbench",
                "schedule": "zero_bubble_v",
                "stages": "4",
                "microbatches": "8",
                "virtual_stages": "2",
                "microbatch_size": "4",
                "world_size": "4",
                "step_time_s": "0.5",
                "replayed_makespan_s": "0.2",
                "peak_activation_bytes": "1e7",
            },
        ],
    )


def test_ground_truth_rows_labels_and_link(tmp_path):
    _sources(tmp_path)
    truths = experiment.ground_truth(PlannerValidationConfig(reports_root=str(tmp_path)))
    by_config = {t["config"]: t for t in truths}
    # torch's own and failed rows are left out, and ZB-V (the simulator has no V
    # placement); one cell per distbench row
    assert sorted(by_config) == [
        "dp2, M=4",
        "dp2×pp2, M=4",
        "interleaved_1f1b, P=4, M=8, V=2",
        "zero3, N=8, fp32",
    ]
    assert by_config["dp2, M=4"]["ground_truth"] == "wall clock"  # 2 ranks on 2 cores
    assert by_config["dp2, M=4"]["measured_step_time_s"] == 0.2
    assert by_config["dp2×pp2, M=4"]["ground_truth"] == "replayed"
    assert by_config["dp2×pp2, M=4"]["measured_step_time_s"] == 0.1
    assert by_config["dp2×pp2, M=4"]["microbatch_size"] == 32 // (2 * 4)
    zero3 = by_config["zero3, N=8, fp32"]
    assert zero3["ground_truth"] == "wall clock, 8 ranks on 2 cores (modelled core sharing)"
    assert (zero3["zero_stage"], zero3["dp"], zero3["microbatch_size"]) == (3, 8, 4)
    assert by_config["interleaved_1f1b, P=4, M=8, V=2"]["optimizer"] is False
    # pipeline_utilization's replay prices actions at their fastest; the rest are medians
    assert {c: t["statistic"] for c, t in by_config.items()} == {
        "dp2, M=4": "median",
        "dp2×pp2, M=4": "median",
        "interleaved_1f1b, P=4, M=8, V=2": "fastest",
        "zero3, N=8, fp32": "median",
    }
    for t in truths:  # no ring fits here: every row on this run's own probe, none on the
        assert t["link"] is None and t["link_source"] == PROBE_LINK  # sources' link columns
    assert all(t["source_git_sha"] == "abc1234" for t in truths)
    # the default split: pipeline_utilization held out, the other sources developed on
    assert {c: t["split"] for c, t in by_config.items()} == {
        "dp2, M=4": "development",
        "dp2×pp2, M=4": "development",
        "interleaved_1f1b, P=4, M=8, V=2": "held_out",
        "zero3, N=8, fp32": "development",
    }
    flipped = experiment.ground_truth(
        PlannerValidationConfig(
            reports_root=str(tmp_path), held_out=["zero_memory", "parallelism_comparison"]
        )
    )
    assert {t["source"]: t["split"] for t in flipped} == {
        "parallelism_comparison": "held_out",
        "zero_memory": "held_out",
        "pipeline_utilization": "development",
    }
    limited = experiment.ground_truth(
        PlannerValidationConfig(reports_root=str(tmp_path), max_rows=1)
    )
    assert len(limited) == 3


def test_wall_clock_rows_use_the_ring_fitted_at_their_rank_count(tmp_path):
    """allreduce_scaling's ring times built from a known α (per round) and β (per byte)
    give them back; a wall-clock row of N ranks is priced on the fit at N, a replayed row
    (or an N the grid lacks) on the two-rank probe; ZeRO rows are split into their units."""
    _sources(tmp_path)
    alpha, beta = 2e-3, 5e-10
    rows = [
        {
            "algorithm": algorithm,
            "world_size": str(n),
            "message_bytes": str(m),
            "time_s": repr(2 * (n - 1) * alpha + 2 * (n - 1) / n * m * beta * scale),
            "status": status,
        }
        for n in (2, 8)
        for m in (4096, 1 << 20, 64 << 20)
        for algorithm, status, scale in (
            ("ring", "ok", 1),
            ("tree", "ok", 9),
            ("ring", "failed", 9),
        )
    ]
    one_size = {
        "algorithm": "ring",
        "world_size": "4",
        "message_bytes": "4096",
        "time_s": "0.01",
        "status": "ok",
    }
    rows.append(one_size)  # one size: no fit at N = 4
    _write(tmp_path, "allreduce_scaling", rows)
    links = experiment.ring_links(tmp_path)
    assert sorted(links) == [2, 8]
    for n in (2, 8):
        assert links[n] == pytest.approx((alpha, beta), rel=1e-9)
    truths = experiment.ground_truth(PlannerValidationConfig(reports_root=str(tmp_path)))
    by_config = {t["config"]: t for t in truths}
    zero3 = by_config["zero3, N=8, fp32"]
    assert zero3["link"] == pytest.approx((alpha, beta), rel=1e-9)
    assert zero3["link_source"] == "allreduce_scaling ring, N=8"
    assert zero3["dp_collectives"] == MODEL["n_layers"] + 1  # the blocks and the root unit
    assert by_config["dp2, M=4"]["link_source"] == "allreduce_scaling ring, N=2"
    # a row's own probes (and its neighbours', timed next to its cell) never price it:
    # the first pc row's are the only ones, so neither pc row has another to go by
    assert math.isnan(by_config["dp2×pp2, M=4"]["host_probe_s"])
    assert math.isnan(by_config["dp2, M=4"]["host_probe_s"])
    assert math.isnan(zero3["host_probe_s"])  # a source row without one: not scaled
    # per row the faster of the two around the cell, not their mean
    assert (
        experiment._host_probe({"host_probe_before_s": "0.035", "host_probe_after_s": "0.025"})
        == 0.025
    )
    assert experiment._host_probe({"host_probe_s": "0.02"}) == 0.02  # only the mean recorded
    for config in ("dp2×pp2, M=4", "interleaved_1f1b, P=4, M=8, V=2"):  # replayed
        assert by_config[config]["link_source"] == PROBE_LINK
        assert by_config[config]["link"] is None  # this run's probe, measured by the rank
    assert experiment.ring_links(tmp_path / "elsewhere") == {}


def test_the_ring_fit_is_a_median_regression_that_one_outlying_size_does_not_drag():
    n, alpha, beta = 4, 1e-3, 4e-10
    sizes = [4096 << 2 * i for i in range(8)]
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * m * beta for m in sizes]
    assert experiment.fit_ring(n, sizes, times) == pytest.approx((alpha, beta), rel=1e-6)
    times[2] /= 3  # one size timed in a fast phase of the host
    robust = experiment.fit_ring(n, sizes, times)
    squares = experiment.fit_ring(n, sizes, times, robust=False)
    assert robust == pytest.approx((alpha, beta), rel=1e-6)  # the other seven still fit
    assert squares[0] < 0.8 * alpha  # least squares is pulled towards the outlier
    # a time that falls with size: β floored at a positive minimum, never negative
    assert experiment.fit_ring(2, [1e3, 1e6], [2e-3, 1e-3])[1] == 1e-15


def test_params_per_stage_match_the_model_and_the_tp_hand_count():
    cfg = GPTConfig(**MODEL)
    assert ranks.params_per_stage(MODEL, 1, 1) == [sum(p.numel() for p in GPT(cfg).parameters())]
    # tp = 4: blocks 8 × (196608/4 + 256 LayerNorm) + embedding 32768/4 + positions 8192
    # + final LayerNorm 128 + head 32768/4 = 419,968 (parallelism_comparison's rank_params_max)
    assert ranks.params_per_stage(MODEL, 1, 4) == [
        8 * (196608 / 4 + 256) + 8192 + 8192 + 128 + 8192
    ]
    assert ranks.params_per_stage(MODEL, 1, 4) == [419968]
    two = ranks.params_per_stage(MODEL, 2, 1)
    assert two == [4 * 196864 + 32768 + 8192, 4 * 196864 + 128 + 32768]


def test_activation_stage_bytes_equal_the_repo_formula():
    for micro, elem in ((1, 4), (8, 4), (4, 2)):
        total = ranks.activation_stage_bytes(MODEL, micro, 1, 1, elem)
        assert total == [activation_bytes(GPTConfig(**MODEL), micro, bytes_per_elem=elem)]
        split = ranks.activation_stage_bytes(MODEL, micro, 4, 1, elem)
        assert sum(split) == total[0]
    # tp shards q/k/v, attention output, MLP and log-softmax, keeps the LayerNorms whole:
    # T = 512, per block (4Th + (4Th + 2Tf)/4)·4 + (4T + Ta/4)·4
    t, h = 512, 128
    block = (4 * t * h + (4 * t * h + 2 * t * 4 * h) / 4) * 4 + (4 * t + t * 8 / 4) * 4
    head = (2 * t * h + t * 256 / 4) * 4 + 2 * t * 4
    assert ranks.activation_stage_bytes(MODEL, 8, 1, 4, 4) == [8 * block + 64 * 8 + head]


def test_rank_rates_share_cores_only_on_the_crowded_wall_clock():
    assert ranks.rank_rates(1, 2, True) == (2, 2.0, 1.0)
    assert ranks.rank_rates(2, 2, True) == (1, 1.0, 1.0)
    assert ranks.rank_rates(8, 2, True) == (1, 0.25, 4.0)
    assert ranks.rank_rates(8, 2, False) == (1, 1.0, 1.0)


def test_reference_fit_recovers_known_scale_and_overhead():
    from impls.simulator import simulate

    truth = {1: None, 16: None}
    for micro in truth:  # what a host 2× slower with 10 µs per kernel would measure
        spec, plan = calibration.reference_plan(micro)
        hw = calibration.host_hardware(CAL, LINK, 0.5, overhead_s=1e-5)
        truth[micro] = simulate(spec, plan, hw, dtype="fp32").compute_s
    fit = calibration.fit_reference(CAL, "fp32", truth)
    assert fit["two_point"]
    assert fit["scale"] == pytest.approx(2.0, rel=1e-9)
    assert fit["overhead_s"] == pytest.approx(1e-5, rel=1e-9)


def test_reference_fit_reads_the_median_step_as_the_ground_truth_does(monkeypatch):
    """The ground-truth rows are medians of timed steps; fitting the fastest repeat priced
    every row short. Each reference timing here is a known spread around its median."""
    median = {
        ("fp32", 1): 8e-3,
        ("fp32", 16): 8e-2,
        ("bf16", 1): 9e-3,
        ("bf16", 16): 7e-2,
        rounds.PROBE: 2e-2,
        ("executor", 1): 1e-3,
        ("ledger", 1): 0.5e-3,
    }  # paired excess

    def fake_rounds(count, window_s):  # fastest 0.7 m; the jitter of one window of three
        return {key: [1.3 * m, 0.7 * m, m] for key, m in median.items()}, [0.7, 1.0, 1.3]

    probed = []

    def fake_meeting(ranks_, segment_s, rounds_, timeout_s):
        probed.append((ranks_, segment_s, rounds_))
        return {"after_compute_s": 2e-3, "world_size": ranks_}

    def fake_pool(world_size, numels, link=False, timeout_s=300.0):
        probed.append(("link", world_size, link))
        return {"world_size": world_size, "tp_call_cpu_s": {}, "link": LINK}

    monkeypatch.setattr(rounds, "reference_rounds", fake_rounds)
    monkeypatch.setattr(calibration, "measure_meeting", fake_meeting)
    monkeypatch.setattr(calibration.pool_probes, "measure", fake_pool)
    monkeypatch.setattr(calibration.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(calibration, "_CALIBRATIONS", {})
    cfg = SimpleNamespace(
        gemm_sizes=[8, 16],
        copy_mib=1,
        repeats=1,
        reference_window_s=0.0,
        meeting_segment_s=1e-3,
        meeting_rounds=2,
        timeout_s=60.0,
    )
    cal = calibration.calibrate(cfg, 1)
    assert probed == [("link", 2, True), (2, 1e-3, 2)]  # this run's own two-rank link
    assert cal["meeting"]["after_compute_s"] == 2e-3 and cal["link"] == LINK
    assert cal["host_probe_s"] == 2e-2  # the probe's median over the rounds
    assert cal["step_jitter"] == (0.7, 1.0, 1.3)
    # each runtime's cost per action: its median excess over the plain step, ÷ its F and B
    for runtime, excess in (("executor", 1e-3), ("ledger", 0.5e-3)):
        assert calibration.action_overhead(cal, runtime) == pytest.approx(excess / 2)
    assert calibration.action_overhead(cal, None) == 0.0
    with pytest.raises(ValueError, match="runtime='hybrid'"):
        calibration.action_overhead(cal, "hybrid")
    for dtype in ("fp32", "bf16"):
        want = {b: median[(dtype, b)] for b in (1, 16)}
        assert cal[f"reference_{dtype}_s"] == want
        assert cal[f"reference_{dtype}_fastest_s"] == {b: 0.7 * v for b, v in want.items()}
        assert cal[f"fit_{dtype}"] == calibration.fit_reference(cal, dtype, want)
        assert calibration.fit_for(cal, dtype, "median") is cal[f"fit_{dtype}"]
        fastest = {b: 0.7 * v for b, v in want.items()}
        assert calibration.fit_for(cal, dtype, "fastest") == calibration.fit_reference(
            cal, dtype, fastest
        )


def test_reference_rounds_take_turns_and_fill_their_windows(monkeypatch):
    """Each configuration steps in every round, for its window (at least once), in the
    orders of a balanced design, so no configuration always goes first or always follows
    the same one; a runtime's step is paired with a plain one."""
    order = []

    def step_of(micro, dtype):
        def step():
            order.append((dtype, micro))

        return step

    monkeypatch.setattr(rounds, "reference_step", step_of)
    monkeypatch.setattr(rounds, "runtime_step", lambda name, micro: (step_of(micro, name), 1))
    samples, jitter = rounds.reference_rounds(14, 0.0)  # 7 configurations: a design of 14
    assert {k: len(v) for k, v in samples.items()} == dict.fromkeys(samples, 14)
    assert jitter == [1.0] * 14  # one step a window: its own median
    configs = {
        ("fp32", 1),
        ("fp32", 16),
        ("bf16", 1),
        ("bf16", 16),
        rounds.PROBE,  # the host probe's step among them
        ("executor", 1),
        ("ledger", 1),
    }  # and each runtime's
    assert set(samples) == configs
    # after the seven warm-ups, nine steps a round: each runtime's paired with a plain one
    steps = [order[7 + 9 * r : 16 + 9 * r] for r in range(14)]
    for runtime in rounds.RUNTIMES:
        for round_ in steps:
            at = round_.index((runtime, 1))
            assert round_[at + 1] == ("fp32", 1)  # the plain b = 1 step right after it
    # the seven configurations of a round, the pairing's plain steps left out
    turns = [
        [s for i, s in enumerate(r) if i == 0 or r[i - 1][0] not in rounds.RUNTIMES] for r in steps
    ]
    assert all(set(t) == configs for t in turns)
    firsts = Counter(t[0] for t in turns)
    assert len(firsts) == 7 and set(firsts.values()) == {2}  # each first in two rounds
    followers = Counter((a, b) for t in turns for a, b in zip(t, t[1:], strict=False))
    assert len(followers) == 7 * 6 and set(followers.values()) == {2}  # each after each
    windowed, jitter = rounds.reference_rounds(1, 0.01)
    assert all(len(v) > 1 for v in windowed.values())  # 10 ms windows of µs steps
    assert len(jitter) == len(windowed[rounds.JITTER])
    assert statistics.median(jitter) == pytest.approx(1.0)


def test_single_rank_prediction_is_the_sum_of_the_calibrated_layer_costs():
    from impls.costmodel.compute import TransformerSpec
    from impls.simulator import ParallelPlan, layer_costs

    truth = {
        "model": MODEL,
        "dp": 1,
        "tp": 1,
        "pp": 1,
        "zero_stage": 0,
        "precision": "fp32",
        "schedule": "1f1b",
        "microbatches": 1,
        "virtual_stages": 1,
        "microbatch_size": 4,
        "optimizer": False,
        "memory_includes_states": True,
    }
    hw = calibration.host_hardware(CAL, LINK)
    got = ranks.predict(truth, hw)
    spec = TransformerSpec(n_layers=8, d_model=128, n_heads=8, vocab_size=256, seq_len=64)
    plan = ParallelPlan(dp=1, tp=1, pp=1, microbatch_size=4, stage_layers=(10,))
    layers = layer_costs(spec, plan, hw, "fp32")
    by_hand = sum(c.forward_s + c.backward_input_s + c.backward_weight_s for c in layers)
    assert got["predicted_step_time_s"] == pytest.approx(by_hand, rel=1e-12)
    assert got["predicted_bubble_s"] == 0 and got["predicted_optimizer_s"] == 0
    # memory: 16 B per parameter (fp32 Adam) + one micro-batch's saved activations
    params = sum(p.numel() for p in GPT(GPTConfig(**MODEL)).parameters())
    saved = activation_bytes(GPTConfig(**MODEL), 4)
    assert got["predicted_peak_bytes"] == 16 * params + saved


RUN_CAL = {
    **CAL,
    "reference_fp32_s": {1: 1e-3, 16: 1e-2},
    "reference_bf16_s": {1: 1e-3, 16: 1e-2},
    "reference_fp32_fastest_s": {1: 9e-4, 16: 9e-3},
    "reference_bf16_fastest_s": {1: 9e-4, 16: 9e-3},
    "fit_fp32": {"scale": 1.5, "overhead_s": 4e-6, "kernels": 1.0, "two_point": True},
    "fit_bf16": {"scale": 1.0, "overhead_s": 1e-6, "kernels": 1.0, "two_point": True},
    "fit_fp32_fastest": {"scale": 1.2, "overhead_s": 3e-6, "kernels": 1.0, "two_point": True},
    "fit_bf16_fastest": {"scale": 0.8, "overhead_s": 1e-6, "kernels": 1.0, "two_point": True},
}


def _local(threads: int, adamw: float = 3e-9, one: float = 0.08, at: float = 0.05) -> dict:
    many = threads > 1
    return {
        "threads": threads,
        "adamw_s_per_param": adamw,
        **{f"reference_{d}_one_thread_s": one if many else None for d in ("fp32", "bf16")},
        **{f"reference_{d}_at_threads_s": at if many else None for d in ("fp32", "bf16")},
    }


def _truth(ranks_: int, zero_stage: int = 0, label: str = "wall clock") -> dict:
    return {
        "model": MODEL,
        "dp": ranks_,
        "tp": 1,
        "pp": 1,
        "zero_stage": zero_stage,
        "precision": "fp32",
        "schedule": "1f1b",
        "microbatches": 1,
        "virtual_stages": 1,
        "microbatch_size": 4,
        "optimizer": True,
        "memory_includes_states": True,
        "ranks": ranks_,
        "host_cores": 2,
        "ground_truth": label,
        "link": LINK,
    }


def test_run_records_the_calibration_it_used(monkeypatch):
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: RUN_CAL)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    truth = _truth(8, label="wall clock, 8 ranks on 2 cores (modelled core sharing)")
    row = ranks.run(CFG, SimpleNamespace(carry=truth))
    assert (row["compute_rate"], row["overhead_stretch"], row["fit_scale"]) == (0.25, 4.0, 1.5)
    assert row["link_alpha_s"] == LINK[0] and row["predicted_step_time_s"] > 0
    assert row["cal_adamw_s_per_param"] == 3e-9 and row["cal_thread_speedup"] == 1.0
    assert row["p2p_blocking"] is True  # the wall clock: the executor waits out its rounds


def test_pipeline_sends_block_on_the_wall_clock_and_not_in_a_replay(monkeypatch):
    """A wall-clock pipeline row is priced with each send holding its rank; the same plan
    held to a replay keeps sends as latencies (the replay's convention), so it is sooner."""
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: RUN_CAL)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    pipe = {
        **_truth(2),
        "dp": 1,
        "pp": 2,
        "microbatches": 8,
        "optimizer": False,
        "link": (1e-3, 1e-9),
    }
    wall = ranks.run(CFG, SimpleNamespace(carry=pipe))
    replayed = ranks.run(CFG, SimpleNamespace(carry={**pipe, "ground_truth": "replayed"}))
    assert (wall["p2p_blocking"], replayed["p2p_blocking"]) == (True, False)
    assert wall["predicted_compute_s"] == replayed["predicted_compute_s"]
    assert wall["predicted_pp_s"] > replayed["predicted_pp_s"] > 0


def test_each_row_is_predicted_on_the_fit_to_its_own_statistic(monkeypatch):
    """A replay priced at each action's fastest (pipeline_utilization) is predicted on the
    fit to the reference's fastest step; every other row on the fit to its median."""
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: RUN_CAL)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    rows = {
        stat: ranks.run(CFG, SimpleNamespace(carry={**_truth(2), "statistic": stat}))
        for stat in ("median", "fastest")
    }
    assert (rows["median"]["fit_scale"], rows["fastest"]["fit_scale"]) == (1.5, 1.2)
    assert rows["fastest"]["fit_median_scale"] == 1.5 and rows["median"]["fit_fastest_scale"] == 1.2
    # the faster fit predicts a shorter step
    assert rows["fastest"]["predicted_compute_s"] < rows["median"]["predicted_compute_s"]


def test_optimizer_is_the_measured_adamw_cost_per_parameter(monkeypatch):
    """Dropping the AdamW calibration (the simulator's bandwidth price) fails this."""
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: RUN_CAL)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads, 1e-8))
    params = sum(p.numel() for p in GPT(GPTConfig(**MODEL)).parameters())
    for truth, share in ((_truth(2), 1.0), (_truth(2, zero_stage=1), 0.5)):
        assert ranks.optimizer_params(truth) == pytest.approx(params * share)
        row = ranks.run(CFG, SimpleNamespace(carry=truth))
        assert row["predicted_optimizer_s"] == pytest.approx(1e-8 * params * share)
    # 8 ranks on 2 cores: each rank's optimizer runs on a quarter of a core
    crowded = _truth(8, label="wall clock, 8 ranks on 2 cores (modelled core sharing)")
    row = ranks.run(CFG, SimpleNamespace(carry=crowded))
    assert row["predicted_optimizer_s"] == pytest.approx(4 * 1e-8 * params)
    # the simulator's memory-bandwidth price is far below it
    hw = calibration.host_hardware(RUN_CAL, LINK)
    assert ranks.predict(_truth(2), hw)["predicted_optimizer_s"] < 1e-8 * params / 10


def test_threads_run_at_the_measured_speedup_bounded(monkeypatch):
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: RUN_CAL)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    row = ranks.run(CFG, SimpleNamespace(carry=_truth(1)))
    assert row["threads_per_rank"] == 2
    assert row["compute_rate"] == pytest.approx(0.08 / 0.05) == row["cal_thread_speedup"]
    assert calibration.thread_speedup(_local(2, one=0.08, at=0.5), "fp32") == 1.0  # disturbed
    assert calibration.thread_speedup(_local(2, one=0.08, at=0.01), "bf16") == 2.0
    assert calibration.thread_speedup(_local(1), "fp32") == 1.0


def test_rank_calibration_times_adamw_and_both_thread_counts():
    cfg = SimpleNamespace(repeats=1)
    one = calibration.rank_calibration(cfg, 1)
    assert 0 < one["adamw_s_per_param"] < 1e-6 and one["reference_fp32_at_threads_s"] is None
    two = calibration.rank_calibration(cfg, 2)
    assert two["reference_bf16_one_thread_s"] > 0 and two["reference_bf16_at_threads_s"] > 0
    assert calibration.rank_calibration(cfg, 2) is two  # cached per thread count


def test_spearman_and_prepare():
    up = pd.Series([1.0, 2.0, 3.0, 4.0])
    assert spearman(up, up * 10) == pytest.approx(1.0)
    assert spearman(up, -up) == pytest.approx(-1.0)
    assert spearman(up, pd.Series([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)  # 1 − 6·2/60
    assert math.isnan(spearman(up, pd.Series([1.0] * 4)))
    df = prepare(pd.DataFrame({"step_error": [-0.2, 0.1], "memory_error": [0.01, -0.03]}))
    assert df["abs_step_error"].tolist() == [0.2, 0.1]
    assert df["abs_memory_error"].tolist() == [0.01, 0.03]


def test_a_replayed_tp_row_pays_the_call_work_this_run_measured(monkeypatch):
    """A TP replay charges each all-reduce its own work plus α per round: spread over the
    ring's 2(t − 1) rounds, the work this run measured on t ranks at the row's activation
    size joins α, so one priced all-reduce costs what the replay charges. A wall-clock row
    (its ring fit already holds that work) and a row without TP keep the link's α and
    measure nothing."""
    from impls.costmodel.comm import collective_seconds

    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: RUN_CAL)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    measured = []

    def fake_work(cfg, tp, numel):
        measured.append((tp, numel))
        return 4e-4

    monkeypatch.setattr(calibration, "tp_call_work", fake_work)
    call, tp, numel = 4e-4, 4, 8 * 64 * 128
    truth = {**_truth(4, label="replayed"), "dp": 1, "tp": tp, "tp_call_numel": numel}
    alpha, carried = ranks.round_alpha(truth, LINK[0], call)
    assert carried == call and alpha == pytest.approx(LINK[0] + call / (2 * (tp - 1)))
    hw = calibration.host_hardware(RUN_CAL, (alpha, LINK[1]))
    nbytes = 1 << 16
    replay_price = call + 2 * (tp - 1) * LINK[0] + 2 * (tp - 1) / tp * nbytes * LINK[1]
    assert collective_seconds("all_reduce", nbytes, tp, hw) == pytest.approx(replay_price)
    with_work = ranks.run(CFG, SimpleNamespace(carry=truth))
    assert measured == [(tp, numel)]  # measured by this run at the row's size
    assert (with_work["tp_call_cpu_s"], with_work["round_alpha_s"]) == (call, alpha)
    monkeypatch.setattr(calibration, "tp_call_work", lambda cfg, tp, numel: 0.0)
    without = ranks.run(CFG, SimpleNamespace(carry=truth))
    assert with_work["predicted_tp_s"] > without["predicted_tp_s"] > 0
    assert without["round_alpha_s"] == LINK[0] and without["tp_call_cpu_s"] == 0
    for other in ({**truth, "ground_truth": "wall clock"}, {**truth, "tp": 1}):
        assert not ranks.carries_tp_calls(other)
        assert ranks.round_alpha(other, LINK[0], call) == (LINK[0], 0.0)


def test_this_runs_own_link_and_call_work_are_priced_at_the_source_hosts_speed(monkeypatch):
    """Measured in this run, the link probe and the TP call work are scaled like compute to
    the host speed of the row's source run; a ring fit read from a report is kept."""
    monkeypatch.setattr(
        calibration,
        "calibrate",
        lambda cfg, threads: {**RUN_CAL, "host_probe_s": 0.02, "link": LINK},
    )
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    monkeypatch.setattr(calibration, "tp_call_work", lambda cfg, tp, numel: 4e-4)
    tp = 4
    replayed = {
        **_truth(4, label="replayed"),
        "dp": 1,
        "tp": tp,
        "tp_call_numel": 1 << 15,
        "link": None,
        "host_probe_s": 0.03,
    }
    row = ranks.run(CFG, SimpleNamespace(carry=replayed))
    assert row["link_scale"] == pytest.approx(1.5)
    assert row["round_alpha_s"] == pytest.approx(1.5 * (LINK[0] + 4e-4 / (2 * (tp - 1))))
    assert (row["link_alpha_s"], row["tp_call_cpu_s"]) == (LINK[0], 4e-4)  # as measured
    ring = ranks.run(CFG, SimpleNamespace(carry={**_truth(2), "host_probe_s": 0.03}))
    assert ring["link_scale"] == 1.0 and ring["round_alpha_s"] == LINK[0]


def test_a_source_probe_leaves_out_the_probes_next_to_the_rows_cell():
    """The probe between two cells is recorded on both: a row's source probe is the median
    of the others, its own and its neighbours' left out."""
    probes = [1.0, 2.0, 30.0, 4.0, 5.0, math.nan, 7.0]
    assert experiment.source_host_probe(probes, 2) == 5.0  # of 1, 5, 7 (2 and 4 beside it)
    assert experiment.source_host_probe(probes, 0) == 6.0  # of 30, 4, 5, 7
    assert experiment.source_host_probe(probes, 6) == 4.0  # of 1, 2, 30, 4, 5
    assert math.isnan(experiment.source_host_probe([1.0, 2.0], 0))


def test_a_row_is_predicted_at_the_host_speed_of_its_source_run(monkeypatch):
    """The source's runner timed the host probe between its cells; the calibration timed
    it too. With `host_scaling`, a host 1.5× slower during the source's run gets 1.5× the
    compute and optimizer time (its link, read from a report, kept); without a probe on
    either side nothing is scaled. Without it (the default) the row is priced at the
    calibration's speed and the scaled prediction is kept beside."""
    monkeypatch.setattr(
        calibration, "calibrate", lambda cfg, threads: {**RUN_CAL, "host_probe_s": 0.02}
    )
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    truth = {**_truth(2), "zero_stage": 3}
    slow = ranks.run(CFG, SimpleNamespace(carry={**truth, "host_probe_s": 0.03}))
    plain = ranks.run(CFG, SimpleNamespace(carry=truth))  # no source probe
    assert slow["host_slowdown"] == pytest.approx(1.5) and plain["host_slowdown"] == 1.0
    assert (slow["host_probe_s"], slow["cal_host_probe_s"]) == (0.03, 0.02)
    for part in ("predicted_compute_s", "predicted_optimizer_s"):
        assert slow[part] == pytest.approx(1.5 * plain[part]), part
    assert slow["predicted_dp_s"] == pytest.approx(plain["predicted_dp_s"])  # the link's
    assert slow["predicted_unscaled_step_time_s"] == pytest.approx(plain["predicted_step_time_s"])
    assert plain["predicted_unscaled_step_time_s"] == plain["predicted_step_time_s"]
    assert slow["predicted_host_scaled_step_time_s"] == slow["predicted_step_time_s"]
    off = ranks.run(
        SimpleNamespace(host_scaling=False), SimpleNamespace(carry={**truth, "host_probe_s": 0.03})
    )
    assert off["predicted_step_time_s"] == pytest.approx(plain["predicted_step_time_s"])
    assert off["predicted_host_scaled_step_time_s"] == pytest.approx(slow["predicted_step_time_s"])
    assert (off["host_scaling"], slow["host_scaling"], off["host_slowdown"]) == (False, True, 1.5)
    for source, cal in ((math.nan, 0.02), (0.03, math.nan), (0.0, 0.02)):
        assert ranks.host_slowdown(source, cal) == 1.0


def _runtime_steps_run() -> list[float]:
    """Each runtime's reference step, timed once after a warm-up (on a one-rank world,
    which the executor's needs)."""
    return [
        calibration._timings(rounds.runtime_step(runtime, 1)[0], 1)[0]
        for runtime in rounds.RUNTIMES
    ]


def test_each_runtime_step_runs_the_reference_under_its_runtime():
    """The executor's step walks a one-stage plan of `EXECUTOR_MICROBATCHES` micro-batches;
    the ledger's counts the forward's saved activations. Both step and leave no error."""
    from bench.launch import run_on_ranks

    (times,) = run_on_ranks(_runtime_steps_run, 1, timeout_s=120.0)
    assert len(times) == len(rounds.RUNTIMES) and all(t > 0 for t in times)


def test_a_row_pays_its_runtime_once_per_compute_action(monkeypatch):
    """A row whose source steps under a runtime (`runtime`) pays that runtime's measured
    cost on each F and each B, stretched like a kernel's overhead under core sharing; a
    row without one pays nothing."""
    extra = 2e-4
    cal = {**RUN_CAL, "action_overhead_ledger_s": extra, "action_overhead_executor_s": 0.0}
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: cal)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    for truth, stretch in (
        (_truth(2), 1.0),
        (_truth(8, label="wall clock, 8 ranks on 2 cores (modelled core sharing)"), 4.0),
    ):
        plain = ranks.run(CFG, SimpleNamespace(carry=truth))
        ledger = ranks.run(CFG, SimpleNamespace(carry={**truth, "runtime": "ledger"}))
        assert (plain["action_overhead_s"], ledger["action_overhead_s"]) == (0.0, extra)
        assert ledger["runtime"] == "ledger" and plain["runtime"] is None
        assert ledger["predicted_step_time_s"] - plain["predicted_step_time_s"] == pytest.approx(
            2 * extra * stretch
        )  # one F and one B


def test_straggler_is_the_order_statistic_of_the_measured_spread():
    """The median of the slowest of N draws is the quantile at 0.5^(1/N): for a spread
    uniform on [1, 1.2], 1 + 0.2 · 0.5^(1/N)."""
    jitter = tuple(1 + 0.2 * i / 1000 for i in range(1001))
    cal = {"step_jitter": jitter}
    assert calibration.straggler(cal, 1) == 1.0
    for n in (2, 4, 8):
        assert calibration.straggler(cal, n) == pytest.approx(1 + 0.2 * 0.5 ** (1 / n))
    assert calibration.straggler({}, 8) == 1.0  # a calibration without it
    assert calibration.straggler({"step_jitter": (0.5, 0.9, 1.0)}, 2) == 1.0  # never < 1


def test_wall_clock_rows_of_several_ranks_pay_the_straggler_and_replays_do_not(monkeypatch):
    """A wall-clock row of N ≥ 2 ranks has its rank's compute × the straggler factor; the
    same rank replayed, or alone, has none; the links are not scaled."""
    jitter = tuple(1 + 0.2 * i / 100 for i in range(101))
    monkeypatch.setattr(
        calibration, "calibrate", lambda cfg, threads: {**RUN_CAL, "step_jitter": jitter}
    )
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    wall = ranks.run(CFG, SimpleNamespace(carry=_truth(2)))
    replayed = ranks.run(CFG, SimpleNamespace(carry={**_truth(2), "ground_truth": "replayed"}))
    single = ranks.run(CFG, SimpleNamespace(carry=_truth(1)))
    factor = calibration.straggler({"step_jitter": jitter}, 2)
    assert wall["straggler"] == pytest.approx(factor) and factor > 1
    assert replayed["straggler"] == 1.0 and single["straggler"] == 1.0
    assert wall["predicted_compute_s"] == pytest.approx(factor * replayed["predicted_compute_s"])
    assert wall["predicted_without_straggler_step_time_s"] == pytest.approx(
        replayed["predicted_step_time_s"]
    )  # the same rank, alone
    assert wall["predicted_dp_s"] == pytest.approx(replayed["predicted_dp_s"])  # links kept


def test_a_runtime_cost_floored_at_zero_says_so_in_the_table():
    """The executor's median excess came out ≤ 0 in one run: its 0 is a floor under the
    noise, not a measured cost of nothing."""
    from bench.experiments.planner_validation.report_calibration import _runtimes

    ok = pd.DataFrame(
        {
            "runtime": ["executor", "ledger"],
            "source": ["pc", "zm"],
            "cal_action_overhead_executor_s": [0.0, 0.0],
            "cal_action_overhead_ledger_s": [2.3e-4, 2.3e-4],
        }
    )
    ctx = SimpleNamespace(headline={})
    table = _runtimes(ctx, ok)
    assert "0 (median excess ≤ 0: under the noise)" in table and "230 µs" in table
    assert ctx.headline["runtimes"]["executor"]["per_action_s"] == 0.0


def test_collective_meeting_is_the_probe_call_less_the_links_price_of_it():
    """The probe's ring all-reduce of 4 bytes after compute, less what the row's link
    charges for it (2(N − 1) rounds of α, 2(N − 1)/N · 4 bytes of β), at least 0; nothing
    on a rank count the probe did not run on, or without a probe."""
    cal = {"meeting": {"after_compute_s": 3e-3, "world_size": 2}}
    alpha, beta = LINK
    assert calibration.collective_meeting(cal, 2, LINK) == pytest.approx(
        3e-3 - (2 * alpha + 4 * beta)
    )
    assert calibration.collective_meeting(cal, 2, (2e-3, beta)) == 0.0  # a link dearer than it
    assert calibration.collective_meeting(cal, 4, LINK) == 0.0
    assert calibration.collective_meeting({}, 2, LINK) == 0.0


def test_a_wall_clock_zero_row_on_two_ranks_pays_each_meeting(monkeypatch):
    """A ZeRO-3 row of 2 ranks on 2 cores, on the wall clock: each unit meets at its forward
    and its backward gather, each meeting priced at the probe's excess over the link. The
    same row replayed, or one rank, or more ranks than cores, pays none."""
    cal = {
        **RUN_CAL,
        "meeting": {"after_compute_s": 5e-3, "call_s": 1e-4, "segment_s": 4e-3, "world_size": 2},
    }
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: cal)
    monkeypatch.setattr(calibration, "rank_calibration", lambda cfg, threads: _local(threads))
    units = MODEL["n_layers"] + 1
    truth = {**_truth(2, zero_stage=3), "dp_collectives": units}
    row = ranks.run(CFG, SimpleNamespace(carry=truth))
    meet = calibration.collective_meeting(cal, 2, LINK)
    assert row["collective_meeting_s"] == pytest.approx(meet) and meet > 0
    assert row["cal_meeting_after_compute_s"] == 5e-3 and row["cal_meeting_world_size"] == 2
    monkeypatch.setattr(calibration, "collective_meeting", lambda *args: 0.0)
    without = ranks.run(CFG, SimpleNamespace(carry=truth))
    assert row["predicted_dp_s"] - without["predicted_dp_s"] == pytest.approx(2 * units * meet)
    monkeypatch.setattr(calibration, "collective_meeting", lambda *args: 1.0)
    crowded = "wall clock, 4 ranks on 2 cores (modelled core sharing)"
    for other in (
        {**truth, "ground_truth": "replayed"},
        {**truth, "ranks": 4, "dp": 4, "ground_truth": crowded},
    ):
        row = ranks.run(CFG, SimpleNamespace(carry=other))
        assert row["collective_meeting_s"] == 0.0


def test_the_meetings_table_counts_the_rows_that_pay_and_names_the_probe():
    """Only rows with collectives pay a meeting (a pipeline row on the same link has none);
    the text gives the probe's segment, the call after it and the call back to back."""
    from bench.experiments.planner_validation.report_calibration import _meetings

    probe = {
        "cal_meeting_after_compute_s": 2e-3,
        "cal_meeting_call_s": 1e-4,
        "cal_meeting_segment_s": 4e-3,
        "cal_meeting_world_size": 2,
    }
    ok = pd.DataFrame(
        {
            "link_source": ["ring, N=2"] * 3 + ["probe"],
            "collective_meeting_s": [1.5e-3, 1.5e-3, 1.5e-3, 0.0],
            "predicted_dp_s": [0.01, 0.0, 0.02, 0.0],
            **{k: [v] * 4 for k, v in probe.items()},
        }
    )
    ctx = SimpleNamespace(headline={})
    text = _meetings(ctx, ok)
    assert "took 4 ms" in text and "added 2 ms" in text and "took 100 µs" in text
    assert "| ring, N=2 | 1.5 ms" in text.replace("  ", " ").replace("  ", " ")
    assert ctx.headline["meetings"]["rows"] == 2
    assert ctx.headline["meetings"]["per_link"] == {"ring, N=2": 1.5e-3}
    unprobed = ok.assign(cal_meeting_after_compute_s=float("nan"))
    assert "not probed" in _meetings(SimpleNamespace(headline={}), unprobed)
