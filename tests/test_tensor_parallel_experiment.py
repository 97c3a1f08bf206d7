"""Experiment `tensor_parallel`: its config, its grid and its rows.

A failure here means a grid that cannot work (a TP degree that does not divide the
model's heads, MLP width or vocabulary) would start ranks instead of being refused
naming the key, or a row whose traffic, collective counts, memory, prediction or speed
ratio are not what the ranks reported; or, in the small real run, a split model whose
update leaves the single-process reference or whose counted traffic leaves Megatron's
count. The CI profile's report is checked in tests/ci_checks/tensor_parallel.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.experiments import experiments
from bench.experiments.tensor_parallel.config import TensorParallelConfig
from bench.experiments.tensor_parallel.experiment import (
    EXPERIMENT,
    cells,
    to_row,
)
from bench.experiments.tensor_parallel.ranks import measure
from tests.rank_support import prefix_communicator

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 16, "n_layers": 2, "n_heads": 4, "seq_len": 8, "vocab_size": 32}


def test_registered():
    assert experiments()["tensor_parallel"] is EXPERIMENT


@pytest.mark.parametrize(
    "values, needles",
    [
        ({"tp_degrees": [2, 3]}, ["tp_degrees", "GPTConfig.n_heads=4", "tp=3", "[1, 2, 4]"]),
        ({"tp_degrees": [8]}, ["tp_degrees", "n_heads"]),
        ({"tp_degrees": [2], "model": {**TINY, "vocab_size": 33}}, ["GPTConfig.vocab_size"]),
        ({"tp_degrees": [4], "model": {**TINY, "d_ff": 18}}, ["GPTConfig.d_ff=18"]),
        ({"tp_degrees": [0]}, ["tp_degrees", "≥ 1"]),
        ({"methods": ["megatron"]}, ["methods", "megatron", "torch_dtensor"]),
        ({"model": {**TINY, "n_heads": 3}}, ["model", "n_heads"]),
        ({"steps": 0}, ["steps", "≥ 1"]),
        ({"lr": -1.0}, ["lr"]),
    ],
)
def test_bad_config_is_refused_naming_the_key(values, needles):
    with pytest.raises(ValueError) as error:
        EXPERIMENT.parse({"model": TINY, **values})
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_grid_runs_each_method_at_each_degree_on_t_ranks():
    grid = cells(TensorParallelConfig(tp_degrees=[4, 1, 2], model=TINY))
    assert [(c.world_size, c.key["method"]) for c in grid] == [
        (t, m) for t in (1, 2, 4) for m in ("distbench", "torch_dtensor")
    ]
    assert all(c.key["tp"] == c.world_size and c.carry.twin is not None for c in grid)
    assert {c.carry.method: c.carry.twin for c in grid} == {
        "distbench": "torch_dtensor",
        "torch_dtensor": "distbench",
    }
    assert all((c.carry.predicted is None) == (c.world_size == 1) for c in grid)
    unpaired = cells(TensorParallelConfig(tp_degrees=[2], model=TINY, paired=False))
    assert all(c.carry.twin is None for c in unpaired)


def _rank(rank: int, method: str) -> dict:
    ours = method == "distbench"
    nan = math.nan
    return {
        "rank": rank,
        "params": 5000,
        "losses": [3.0, 2.9],
        "loss_diff": 1e-7 if rank == 0 else nan,
        "update_error": 3e-7 if rank == 0 else nan,
        "bytes_sent_fwd": 2048 + rank if ours else nan,
        "bytes_sent_bwd": 2048 if ours else nan,
        "rounds_fwd": 4 if ours else nan,
        "rounds_bwd": 4 if ours else nan,
        "messages_fwd": 4 if ours else nan,
        "messages_bwd": 4 if ours else nan,
        "collectives_fwd": {"all_reduce": 2},
        "collectives_bwd": {"all_reduce": 2 if ours else 4},
        "memory": {
            "current": {"params": 400},
            "peak": {"activations": 900 + rank},
            "peak_total": 1500 + rank,
        },
        "step_times_s": [0.2, 0.4, 0.3],
        "twin_step_times_s": [0.1, 0.2, 0.3],
    }


def test_row_holds_what_the_ranks_measured_beside_megatrons_count():
    """t = 2, b·s·h = 2·8·16 = 256 floats: a ring all-reduce sends 2·(1/2)·1 KiB = 1 KiB."""
    cfg = TensorParallelConfig(tp_degrees=[2], model=TINY, batch_size=2)
    ours, theirs = cells(cfg)
    row = to_row(cfg, ours, [_rank(r, "distbench") for r in range(2)])
    assert row["impl"] == "distbench" and row["tp"] == 2 and row["wrong"] == 0
    assert row["comm_bytes_per_layer_fwd"] == 2049  # the busiest rank
    assert row["predicted_comm_bytes_per_layer_fwd"] == 2 * 1024  # attention + MLP
    assert row["allreduces_per_layer_fwd"] == row["allreduces_per_layer_bwd"] == 2
    assert row["allreduces_per_layer"] == row["predicted_allreduces_per_layer"] == 4
    assert row["peak_bytes"] == 1501 and row["activation_bytes"] == 901
    assert row["param_bytes"] == 400
    assert row["step_time_s"] == 0.3 and row["twin_step_time_s"] == 0.2
    assert row["step_time_vs_twin"] == pytest.approx(1.5) and row["twin"] == "torch_dtensor"
    row = to_row(cfg, theirs, [_rank(r, "torch_dtensor") for r in range(2)])
    assert row["impl"] == "torch" and math.isnan(row["comm_bytes_per_layer_fwd"])
    assert row["allreduces_per_layer_bwd"] == 4 and row["collectives_per_layer"] == 6


def test_at_t_1_nothing_is_predicted_to_move():
    cfg = TensorParallelConfig(tp_degrees=[1], model=TINY)
    (cell, _) = cells(cfg)
    per_rank = [_rank(0, "distbench")]
    per_rank[0].update(collectives_fwd={}, collectives_bwd={}, twin_step_times_s=None)
    row = to_row(cfg, cell, per_rank)
    assert row["predicted_comm_bytes_per_layer_fwd"] == 0
    assert row["predicted_allreduces_per_layer"] == row["allreduces_per_layer"] == 0
    assert row["twin"] == "" and math.isnan(row["step_time_vs_twin"])


def test_an_update_off_the_reference_marks_the_row_wrong():
    cfg = TensorParallelConfig(tp_degrees=[2], model=TINY)
    (cell, _) = cells(cfg)
    per_rank = [_rank(r, "distbench") for r in range(2)]
    per_rank[0]["update_error"] = 1e-3
    assert to_row(cfg, cell, per_rank)["wrong"] == 1
    per_rank[0]["update_error"] = math.nan
    assert to_row(cfg, cell, per_rank)["wrong"] == 1


def measure_on_prefix(cfg: TensorParallelConfig, cell) -> dict | None:
    """Run inside pool ranks: the cell on the first t ranks (the others sit it out)."""
    comm = prefix_communicator(cell.world_size)
    return None if comm is None else measure(cfg, cell, comm)


@pytest.mark.timeout(180)
def test_small_real_run_equals_the_reference_and_megatrons_count(ranks8):
    """Both methods at t = 2 on the tiny GPT: the update equals one process's, distbench's
    counters equal Megatron's count, DTensor's collectives are counted but not its bytes,
    and each side was timed beside its twin."""
    cfg = TensorParallelConfig(tp_degrees=[2], model=TINY, batch_size=2, warmup=0, repeats=1)
    for cell in cells(cfg):
        row = to_row(cfg, cell, ranks8.run(measure_on_prefix, cfg, cell)[:2])
        method = cell.key["method"]
        assert row["wrong"] == 0 and row["update_error"] < 1e-5, (method, row["update_error"])
        assert row["allreduces_per_layer_fwd"] == 2, method
        if method == "distbench":
            assert row["allreduces_per_layer_bwd"] == 2
            for way in ("fwd", "bwd"):
                want = row[f"predicted_comm_bytes_per_layer_{way}"]
                assert row[f"comm_bytes_per_layer_{way}"] == want > 0, way
        else:
            assert math.isnan(row["comm_bytes_per_layer_fwd"])
        assert 0 < row["param_bytes"] < row["peak_bytes"]
        assert row["step_time_s"] > 0 and row["step_time_vs_twin"] > 0
