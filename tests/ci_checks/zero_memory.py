"""zero_memory on the CI grid (N ∈ {1, 2, 4}, fp32 and bf16; the full grid adds N = 8):
every method lands on the single-process reference; distbench's measured model states equal the cost model to the
byte for every stage, N and precision (the issue asks 5%), and shrink stage by stage as
the ZeRO paper's Figure 1 draws them; the counters read 2Ψ / 2Ψ / 2Ψ / 3Ψ × (N−1)/N per
rank per step (up to padding); torch's baselines ran and their traffic stays opaque; the
speed targets are judged on every N of the fp32 cells, side by side."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.experiments.zero_memory.methods import TOLERANCE, ZERO_METHODS
from tests.ci_checks import ran, rows

ARTEFACTS = ("memory_per_rank", "comm_per_rank")
REQUIRED = [
    "stage",
    "world_size",
    "params",
    "param_bytes",
    "grad_bytes",
    "optim_bytes",
    "peak_bytes",
    "predicted_model_state_bytes",
    "comm_bytes_per_step",
    "step_time_s",
]
ZERO = list(ZERO_METHODS)
WORLD_SIZES = {1, 2, 4}


def _zero(df: pd.DataFrame) -> pd.DataFrame:
    return ran(df)[df["method"].isin(ZERO)]


def _target(headline: dict, prefix: str) -> dict:
    (found,) = [t for t in headline["targets"] if t["figure"].startswith(prefix)]
    return found


def every_cell_ran_and_matches_one_process(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    assert set(REQUIRED) <= set(df.columns), set(REQUIRED) - set(df.columns)
    assert (done["wrong"] == 0).all(), done.loc[done["wrong"] != 0, ["method", "update_error"]]
    assert (done["update_error"] <= done["precision"].map(TOLERANCE)).all()
    assert (done["step_time_s"] > 0).all() and (done["loss"] > 0).all()
    assert headline["wrong_total"] == 0 and headline["failed_cells"] == 0
    zero = _zero(df)
    assert set(zero["world_size"]) == WORLD_SIZES and set(zero["precision"]) == {"fp32", "bf16"}
    assert set(zero["stage"]) == {0, 1, 2, 3}


def model_states_equal_the_cost_model(df: pd.DataFrame, headline: dict) -> None:
    """The issue's ≤ 5%, on every stage, N and precision; exact, in fact (padding included)."""
    zero = _zero(df)
    assert set(zero["world_size"]) == WORLD_SIZES
    parts = zero[["param_bytes", "grad_bytes", "optim_bytes"]].sum(axis=1)
    assert (zero["model_state_bytes"] == parts).all() and (parts > 0).all()
    error = zero["model_state_bytes"] / zero["predicted_model_state_bytes"] - 1
    assert (error.abs() <= 0.05).all() and (zero["model_state_error"].abs() <= 0.05).all()
    assert (zero["model_state_bytes"] == zero["predicted_model_state_bytes"]).all()
    target = _target(headline, "model-state bytes per rank")
    assert target["met"] and target["cells"] == target["measured"] == len(zero), target
    for (n, precision), cell in zero[zero["world_size"] > 1].groupby(["world_size", "precision"]):
        held = cell.set_index("method")["model_state_bytes"]  # ZeRO Fig. 1: each stage less
        assert held["dp"] > held["zero1"] > held["zero2"] > held["zero3"], (n, precision)


def counted_traffic_is_2psi_or_3psi(df: pd.DataFrame, headline: dict) -> None:
    zero = _zero(df)
    # Padded units: the counters equal the prediction to the byte.
    assert (zero["comm_bytes_per_step"] == zero["predicted_comm_bytes_per_step"]).all()
    multi = zero[zero["world_size"] > 1]
    assert set(multi["world_size"]) == WORLD_SIZES - {1}
    for row in multi.itertuples():
        collectives = 3 if row.method == "zero3" else 2
        ring = (row.world_size - 1) / row.world_size
        assert row.comm_psi_multiple == pytest.approx(collectives * ring, rel=0.02), row
    ddp = ran(df)[df["method"].isin(["ddp", "ddp_no_overlap"]) & (df["world_size"] > 1)]
    assert not ddp.empty
    for row in ddp.itertuples():  # a ring all-reduce: 2Ψ(N−1)/N, up to one element a chunk
        ring = (row.world_size - 1) / row.world_size
        assert row.comm_psi_multiple == pytest.approx(2 * ring, rel=0.02), row


def torch_baselines_ran_and_are_opaque(df: pd.DataFrame, headline: dict) -> None:
    torch_rows = rows(ran(df), impl="torch")
    assert set(torch_rows["method"]) == {"torch_ddp", "torch_zero_redundancy", "torch_fsdp2"}
    assert set(torch_rows["world_size"]) == WORLD_SIZES
    assert set(torch_rows["precision"]) == {"fp32"}  # torch's mixed precision is another recipe
    assert torch_rows["comm_bytes_per_step"].isna().all(), "torch's traffic is not observable"
    assert (torch_rows["step_time_s"] > 0).all()
    assert (torch_rows["update_error"] <= TOLERANCE["fp32"]).all()


def speed_is_judged_side_by_side_on_every_n(df: pd.DataFrame, headline: dict) -> None:
    """Each speed target covers every fp32 cell of its method (N > 1 for the overlap: one
    rank has nothing to overlap), crowded ones included, each with a paired ratio: a run
    that drops a world size, or loses its side-by-side timing, fails. Whether the targets
    are met is the report's verdict, not CI's: on this shared 2-core host the tiny CI
    model's step is a few milliseconds and its wall clock swings 2× between runs (DDP ÷
    torch DDP measured 1.3–2.2× in the median over N). The median is held to 4× the
    issue's bound, which only a gross slowdown (a lost overlap thread, a stall) breaks."""
    done = ran(df)
    paired = done[done["step_time_vs_torch"] > 0]
    assert set(paired["method"]) >= {"dp", "zero1", "zero3", "ddp"}, set(paired["method"])
    ddp = rows(done, method="ddp", precision="fp32")
    assert (ddp.loc[ddp["world_size"] > 1, "step_time_vs_no_overlap"] > 0).all()
    for prefix, method, cells in (
        ("ZeRO-3 step time", "zero3", len(WORLD_SIZES)),
        ("overlapped DDP step time ÷ torch DDP", "ddp", len(WORLD_SIZES)),
        ("overlapped DDP step time ÷ the same DDP", "ddp", len(WORLD_SIZES) - 1),
    ):
        target = _target(headline, prefix)
        assert target["cells"] == target["measured"] == cells, target
        assert f"method={method}" in target["worst_key"] and target["worst"] > 0
        assert 0 < target["median"] <= 4 * target["bound"], target
    (zero1,) = [f for f in headline["figures"] if f["figure"].startswith("ZeRO-1 step time")]
    assert zero1["measured"] != "—" and zero1["model"] == "—"


CHECKS = (
    every_cell_ran_and_matches_one_process,
    model_states_equal_the_cost_model,
    counted_traffic_is_2psi_or_3psi,
    torch_baselines_ran_and_are_opaque,
    speed_is_judged_side_by_side_on_every_n,
)
