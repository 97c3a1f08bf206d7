"""Experiment `tensor_parallel`: its config, its grid and its rows.

A failure here means a grid that cannot work (a TP degree that does not divide the
model's heads, MLP width or vocabulary) would start ranks instead of being refused
naming the key, or a row whose traffic, collective counts, memory, prediction or speed
ratio are not what the ranks reported. The real run is checked against Megatron's count in
tests/test_reports_ci.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.experiments import EXPERIMENTS
from bench.experiments.common import parse_config
from bench.experiments.tensor_parallel import EXPERIMENT, TensorParallelConfig, cells, to_row

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 16, "n_layers": 2, "n_heads": 4, "seq_len": 8, "vocab_size": 32}


def test_registered():
    assert EXPERIMENTS["tensor_parallel"] is EXPERIMENT


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
        parse_config(EXPERIMENT, {"model": TINY, **values})
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_grid_runs_each_method_at_each_degree_on_t_ranks():
    grid = cells(TensorParallelConfig(tp_degrees=[4, 1, 2], model=TINY))
    assert [(c.world_size, c.key["method"]) for c in grid] == [
        (t, m) for t in (1, 2, 4) for m in ("distbench", "torch_dtensor")
    ]
    assert all(c.key["tp"] == c.world_size and c.task.paired for c in grid)


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
        },  # fmt: skip
        "step_times_s": [0.2, 0.4, 0.3],
        "twin_step_times_s": [0.1, 0.2, 0.3],
    }


def test_row_holds_what_the_ranks_measured_beside_megatrons_count():
    """t = 2, b·s·h = 2·8·16 = 256 floats: a ring all-reduce sends 2·(1/2)·1 KiB = 1 KiB."""
    cfg = TensorParallelConfig(tp_degrees=[2], model=TINY, batch_size=2)
    ours, theirs = cells(cfg)
    row = to_row(ours, [_rank(r, "distbench") for r in range(2)])
    assert row["impl"] == "distbench" and row["tp"] == 2 and row["wrong"] == 0
    assert row["comm_bytes_per_layer_fwd"] == 2049  # the busiest rank
    assert row["predicted_comm_bytes_per_layer_fwd"] == 2 * 1024  # attention + MLP
    assert row["allreduces_per_layer_fwd"] == row["allreduces_per_layer_bwd"] == 2
    assert row["allreduces_per_layer"] == row["predicted_allreduces_per_layer"] == 4
    assert row["peak_bytes"] == 1501 and row["activation_bytes"] == 901
    assert row["param_bytes"] == 400
    assert row["step_time_s"] == 0.3 and row["twin_step_time_s"] == 0.2
    assert row["step_time_vs_twin"] == pytest.approx(1.5) and row["twin"] == "torch_dtensor"
    row = to_row(theirs, [_rank(r, "torch_dtensor") for r in range(2)])
    assert row["impl"] == "torch" and math.isnan(row["comm_bytes_per_layer_fwd"])
    assert row["allreduces_per_layer_bwd"] == 4 and row["collectives_per_layer"] == 6


def test_at_t_1_nothing_is_predicted_to_move():
    (cell, _) = cells(TensorParallelConfig(tp_degrees=[1], model=TINY))
    per_rank = [_rank(0, "distbench")]
    per_rank[0].update(collectives_fwd={}, collectives_bwd={}, twin_step_times_s=None)
    row = to_row(cell, per_rank)
    assert row["predicted_comm_bytes_per_layer_fwd"] == 0
    assert row["predicted_allreduces_per_layer"] == row["allreduces_per_layer"] == 0
    assert row["twin"] == "" and math.isnan(row["step_time_vs_twin"])


def test_an_update_off_the_reference_marks_the_row_wrong():
    (cell, _) = cells(TensorParallelConfig(tp_degrees=[2], model=TINY))
    per_rank = [_rank(r, "distbench") for r in range(2)]
    per_rank[0]["update_error"] = 1e-3
    assert to_row(cell, per_rank)["wrong"] == 1
    per_rank[0]["update_error"] = math.nan
    assert to_row(cell, per_rank)["wrong"] == 1
