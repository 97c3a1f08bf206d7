"""Experiment `zero_memory`: its config, its grid and its rows.

A failure here means a grid that cannot work (a ZeRO stage that does not exist, a world
size that cannot split the batch, fp16 with no loss scaling) would start ranks instead of
being refused naming the key; a grid that pairs a method with the wrong torch twin or
runs torch's baselines in a precision they do not use; or a row whose memory, traffic or
prediction columns are not what the ranks reported. The real run is checked against the
issue's figures in tests/test_reports_ci.py.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.experiments import experiments
from bench.experiments.zero_memory.experiment import EXPERIMENT, ZeroMemoryConfig, cells, to_row
from bench.launch import RankPool
from bench.make_reports import run_order

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 16, "n_layers": 2, "n_heads": 2, "seq_len": 8, "vocab_size": 32}
SMALL = {"model": TINY, "batch_size": 16}  # the schema's defaults are the full run's


def test_registered_before_max_model_size_which_reads_its_results():
    names = run_order(list(experiments()))
    assert experiments()["zero_memory"] is EXPERIMENT
    assert "zero_memory" in experiments()["max_model_size"].reads
    assert names.index("zero_memory") < names.index("max_model_size")


def test_defaults_are_the_runs_users_made():
    """The schema is the one source of defaults: the values the YAML used to list."""
    cfg = EXPERIMENT.parse({})
    assert cfg.model == {
        "d_model": 128,
        "n_layers": 6,
        "n_heads": 4,
        "seq_len": 64,
        "vocab_size": 256,
        "bias": False,
    }
    assert (cfg.batch_size, cfg.warmup, cfg.repeats, cfg.timeout_s) == (32, 2, 15, 900.0)
    assert cfg.precision == ["fp32", "bf16"] and cfg.world_sizes == [1, 2, 4, 8]


@pytest.mark.parametrize(
    "values, needles",
    [
        ({"stages": [0, 4]}, ["stages", "4", "0, 1, 2, 3"]),
        ({"stages": [True]}, ["stages"]),
        ({"world_sizes": [2, 3], "batch_size": 16}, ["world_sizes=[3]", "batch_size=16"]),
        ({"world_sizes": [0]}, ["world_sizes", "≥ 1"]),
        ({"precision": ["fp8"]}, ["precision", "fp8", "fp32", "bf16"]),
        ({"precision": "fp16", "loss_scale": None}, ["loss_scale", "fp16"]),
        ({"precision": "fp16", "loss_scale": -2.0}, ["loss_scale"]),
        ({"methods": ["torch_fsdp1"]}, ["methods", "torch_fsdp1", "torch_fsdp2"]),
        ({"model": {**TINY, "n_heads": 3}}, ["model", "n_heads"]),
        ({"steps": 0}, ["steps", "≥ 1"]),
        ({"lr": 0.0}, ["lr"]),
    ],
)
def test_bad_config_is_refused_naming_the_key(values, needles):
    with pytest.raises(ValueError) as error:
        EXPERIMENT.parse({**SMALL, **values})
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_grid_pairs_each_method_with_its_twin_and_runs_torch_in_fp32_only():
    cfg = ZeroMemoryConfig(world_sizes=[2, 1], precision=["fp32", "bf16"], **SMALL)
    grid = cells(cfg)
    sizes = [c.world_size for c in grid]
    assert sizes == sorted(sizes)  # the runner keeps one pool per world size
    keys = {(c.key["method"], c.world_size, c.key["precision"]): c.carry for c in grid}
    assert ("torch_fsdp2", 2, "bf16") not in keys and ("torch_fsdp2", 2, "fp32") in keys
    assert ("zero3", 2, "bf16") in keys
    assert keys[("zero3", 2, "fp32")].twin == "torch_fsdp2" and not keys[("zero3", 2, "bf16")].twin
    assert not keys[("zero2", 2, "fp32")].twin  # torch has no ZeRO-2 proper
    assert keys[("ddp", 2, "fp32")].twin == "torch_ddp" and not keys[("torch_ddp", 2, "fp32")].twin
    assert (
        keys[("ddp", 2, "fp32")].no_overlap and not keys[("ddp_no_overlap", 2, "fp32")].no_overlap
    )
    assert keys[("zero1", 1, "fp32")].loss_scale is None
    assert not any(c.carry.twin for c in cells(ZeroMemoryConfig(paired=False, **SMALL)))
    fp16 = cells(ZeroMemoryConfig(world_sizes=[1], precision="fp16", methods=[], **SMALL))
    assert {c.carry.loss_scale for c in fp16} == {"dynamic"}


@pytest.fixture(scope="module")
def ranks2():
    with RankPool(2, timeout_s=180.0) as pool:
        yield pool


@pytest.mark.parametrize("method", ["zero3", "ddp"])
def test_ranks_train_like_one_process_and_count_what_the_cost_model_predicts(ranks2, method):
    """Two ranks of a paired fp32 cell, through the runner's interface (`run(cfg, cell)`):
    the parameters land on the single-process reference, ZeRO-3's ledger and counters
    equal the cost model to the byte, and the twins (torch's, and DDP without overlap)
    were timed beside the cell's own steps."""
    cfg = ZeroMemoryConfig(
        stages=[3], world_sizes=[2], precision="fp32", warmup=0, repeats=2, methods=["ddp"], **SMALL
    )
    cell = next(c for c in cells(cfg) if c.key["method"] == method and c.world_size == 2)
    fn, args = EXPERIMENT.rank_call(cfg, cell)
    per_rank = ranks2.run(fn, *args)
    row = to_row(cfg, cell, per_rank)
    assert row["wrong"] == 0 and row["update_error"] <= 1e-3, row["update_error"]
    assert row["comm_bytes_per_step"] == row["predicted_comm_bytes_per_step"] > 0
    assert row["step_time_s"] > 0 and row["torch_step_time_s"] > 0
    if method == "zero3":
        assert row["model_state_bytes"] == row["predicted_model_state_bytes"] > 0
        assert row["gathered_peak_bytes"] > 0 and row["peak_bytes"] > row["model_state_bytes"]
    else:
        assert row["step_time_vs_no_overlap"] > 0 and math.isnan(row["model_state_bytes"])


def _rank(rank: int, held: dict | None, sent: float, units: list[int] | None) -> dict:
    return {
        "rank": rank,
        "params": 1000,
        "units": units,
        "losses": [3.0, 2.9],
        "held": held,
        "memory": {"peak": {"gathered": 40 + rank, "activations": 300}, "peak_total": 900}
        if units
        else None,
        "bytes_sent": sent,
        "max_param_diff": 1e-7 if rank == 0 else math.nan,
        "update_error": 1e-6 if rank == 0 else math.nan,
        "step_times_s": [0.2, 0.4, 0.3],
        "torch_step_times_s": [0.1, 0.2, 0.3],
    }


def test_row_holds_what_the_ranks_measured_beside_the_prediction():
    """ZeRO-3, N = 2, fp32, two units of 499 and 501 parameters (padded to 500 and 502)."""
    cfg = ZeroMemoryConfig(stages=[3], world_sizes=[2], precision="fp32", methods=[], **SMALL)
    (cell,) = cells(cfg)
    shard = 250 + 251  # ceil(499 / 2) + ceil(501 / 2) parameters per rank
    held = {"params": 4 * shard, "grads": 4 * shard, "optim": 8 * shard}
    per_rank = [_rank(r, held, 3 * 4 * shard, [499, 501]) for r in range(2)]
    row = to_row(cfg, cell, per_rank)
    assert row["impl"] == "distbench" and row["stage"] == 3
    assert row["model_state_bytes"] == row["predicted_model_state_bytes"] == 16 * shard
    assert row["model_state_error"] == 0
    assert row["param_bytes"] == row["predicted_param_bytes"] == 4 * shard
    assert row["comm_bytes_per_step"] == row["predicted_comm_bytes_per_step"] == 3 * 4 * shard
    assert row["comm_psi_multiple"] == pytest.approx(3 * shard / 1000)
    assert row["predicted_comm_psi_multiple"] == pytest.approx(1.5)
    assert row["gathered_peak_bytes"] == 41 and row["peak_bytes"] == 900
    assert row["step_time_s"] == 0.3 and row["torch_step_time_s"] == 0.2
    assert row["step_time_vs_torch"] == pytest.approx(1.5)
    assert row["wrong"] == 0 and row["loss"] == 2.9


def test_row_of_a_method_without_a_ledger_leaves_memory_empty():
    cfg = ZeroMemoryConfig(stages=[0], world_sizes=[2], precision="fp32", methods=["ddp"], **SMALL)
    ddp = next(c for c in cells(cfg) if c.key["method"] == "ddp")
    per_rank = [_rank(r, None, 4000.0, None) for r in range(2)]
    per_rank[0]["no_overlap_step_times_s"] = [0.4, 0.6, 0.5]  # timed beside it, paired
    row = to_row(cfg, ddp, per_rank)
    assert row["step_time_vs_no_overlap"] == pytest.approx(0.3 / 0.5)
    assert math.isnan(row["model_state_bytes"]) and math.isnan(row["peak_bytes"])
    assert row["predicted_model_state_bytes"] == 16 * 1000  # fp32 Adam, unsharded
    assert row["comm_bytes_per_step"] == 4000.0


def test_a_parameter_far_from_the_reference_marks_the_row_wrong():
    cfg = ZeroMemoryConfig(stages=[1], world_sizes=[2], precision="fp32", methods=[], **SMALL)
    (cell,) = cells(cfg)
    per_rank = [_rank(r, {"params": 1, "grads": 1, "optim": 1}, 0.0, [1000]) for r in range(2)]
    per_rank[0]["update_error"] = 2e-3  # an update 0.2% off where the reference went
    assert to_row(cfg, cell, per_rank)["wrong"] == 1
    per_rank[0]["update_error"] = math.nan  # no comparison made counts as wrong too
    assert to_row(cfg, cell, per_rank)["wrong"] == 1


def test_command_line_refuses_a_stage_outside_0_to_3(tmp_path):
    command = [
        sys.executable,
        "-m",
        "bench",
        "experiment=zero_memory",
        "stages=[1,5]",
        f"report_dir={tmp_path / 'report'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "stages" in done.stderr + done.stdout and "0, 1, 2, 3" in done.stderr + done.stdout
    assert not (tmp_path / "report" / "results.csv").exists()
