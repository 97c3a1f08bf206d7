"""auto_parallel and at_scale: the rank side on small configs, in process (no ranks).

A failure here means a cell reports a plan the simulator did not price that way (columns
copied from the wrong plan, a breakdown that no longer adds up), a grid of slots that
searches more than once per GPU count, a model that fits nowhere turned into an error
instead of a report, or a lecture figure priced on the wrong device.
"""

from __future__ import annotations

import math

import pytest

from bench.experiments.at_scale import ranks as at_scale_ranks
from bench.experiments.at_scale.config import AtScaleConfig
from bench.experiments.auto_parallel import experiment, ranks
from bench.experiments.auto_parallel.config import AutoParallelConfig
from bench.experiments.base import Cell
from impls.simulator import simulate

SMALL = {"preset": "gpt3_1_3b"}


def _run(cfg: AutoParallelConfig, gpus: int, kind: str, rank: int) -> dict:
    key = {"gpus": gpus, "list": kind, "rank": rank}
    return ranks.run(cfg, Cell(world_size=1, key=key, fn=ranks.run))


def test_cells_are_slots_of_one_search_per_gpu_count():
    cfg = AutoParallelConfig(model=SMALL, gpus=[8, 16], global_batch=64, top_k=2, rejected_k=1)
    cells = experiment.cells(cfg)
    assert [(c.key["gpus"], c.key["list"], c.key["rank"]) for c in cells] == [
        (8, "best", 1),
        (8, "best", 2),
        (8, "rejected", 1),
        (16, "best", 1),
        (16, "best", 2),
        (16, "rejected", 1),
    ]
    assert all(c.world_size == 1 for c in cells)


def test_published_runs_of_the_model_get_their_own_slots():
    """GPT-3 175B on A100 80GB: Megatron-LM's 175B row (the same shape under another
    preset name) is priced in its own plan beside its published MFU; the 1.3B has none."""
    cfg = AutoParallelConfig(gpus=[64], top_k=1, rejected_k=0)
    names = [run.name for run in ranks.published_runs(cfg)]
    assert "megatron_readme_175b" in names
    published = [c for c in experiment.cells(cfg) if c.key["list"] == "published"]
    assert [c.key["run"] for c in published] == names
    row = ranks.run(cfg, published[0])
    assert row["found"] and row["published_metric"] == "MFU"
    assert row["dp"] * row["tp"] * row["pp"] == published[0].key["gpus"]
    assert 0 < row["predicted_mfu_low"] < row["predicted_mfu_high"]
    small = AutoParallelConfig(model=SMALL, gpus=[8], global_batch=64)
    assert ranks.published_runs(small) == []


def test_context_parallel_degrees_are_searched_when_asked():
    cfg = AutoParallelConfig(
        model={**SMALL, "seq_len": 8192},
        gpus=[8],
        global_batch=16,
        top_k=1,
        rejected_k=0,
        cp=[2],
        tp=1,
    )
    row = _run(cfg, 8, "best", 1)
    assert row["cp"] == 2 and row["dp"] * row["cp"] * row["tp"] * row["pp"] == 8
    with pytest.raises(ValueError, match=r"cp=\[3\].*seq_len=8192"):
        AutoParallelConfig(model={**SMALL, "seq_len": 8192}, gpus=[8], cp=[3])
    with pytest.raises(ValueError, match="cp="):
        AutoParallelConfig(model=SMALL, gpus=[8], cp=[0])


def test_a_slot_reports_the_plan_the_simulator_priced():
    cfg = AutoParallelConfig(model=SMALL, gpus=[8], global_batch=64, top_k=2)
    first, second = _run(cfg, 8, "best", 1), _run(cfg, 8, "best", 2)
    assert first["search_s"] == second["search_s"]  # one search, cached for the grid
    assert first["found"] and first["fits"]
    assert first["predicted_tokens_per_s"] >= second["predicted_tokens_per_s"] > 0
    assert first["dp"] * first["tp"] * first["pp"] == 8
    parts = ("compute_s", "bubble_s", "exposed_tp_s", "exposed_pp_s", "exposed_dp_s", "optimizer_s")
    assert math.isclose(sum(first[p] for p in parts), first["predicted_step_time_s"], rel_tol=1e-9)
    plan = ranks._search(cfg, 8).best[0].plan
    again = simulate(cfg.spec(), plan, cfg.cluster(), dtype=cfg.dtype)
    assert math.isclose(again.step_time_s, first["predicted_step_time_s"], rel_tol=1e-12)


def test_fixing_every_axis_evaluates_exactly_that_plan():
    fixed = {
        "dp": 2,
        "tp": 2,
        "pp": 2,
        "sp": "none",
        "zero_stage": 1,
        "microbatch_size": 1,
        "schedule": "1f1b",
        "virtual_stages": 1,
        "recompute": "none",
    }
    cfg = AutoParallelConfig(model=SMALL, gpus=[8], global_batch=16, top_k=3, **fixed)
    row = _run(cfg, 8, "best", 1)
    assert {k: row[k] for k in fixed} == fixed
    assert all(_run(cfg, 8, "best", k).get("dp", 2) == 2 for k in (1, 2, 3))


def test_a_model_that_fits_nowhere_is_reported_not_refused():
    cfg = AutoParallelConfig(
        model={"preset": "llama2_70b"},
        hardware="v100_summit",
        gpus=[6],
        global_batch=12,
        dtype="fp16",
        top_k=1,
        rejected_k=1,
    )
    best = _run(cfg, 6, "best", 1)
    assert best["found"] is False
    assert best["smallest_memory_gb"] > best["device_memory_gb"] == 16
    rejected = _run(cfg, 6, "rejected", 1)
    assert rejected["found"] and not rejected["fits"] and rejected["reason"].startswith("memory")


def test_the_lecture_gpt3_row_prices_the_lectures_own_device():
    """On a V100 at Lambda's 28 TFLOP/s with every GEMM at 100%, the simulator can only add
    time to C ÷ 28 TFLOP/s; on an A100 it is several times faster than the lecture's 3.1M."""
    hw = at_scale_ranks.lambda_v100()
    assert hw.peak("fp16") == 28e12 and hw.efficiency(1e6) == hw.efficiency(1e15) == 1.0
    cfg = AtScaleConfig(lecture=["gpt3_gpu_hours_lambda"], published=[], gpt3_gpus=512)
    row = at_scale_ranks.run(
        cfg,
        Cell(
            world_size=1,
            key={"kind": "lecture", "name": "gpt3_gpu_hours_lambda"},
            fn=at_scale_ranks.run,
        ),
    )
    assert row["predicted"] >= row["lecture_arithmetic"] > 3.0e6
    assert row["dp"] * row["tp"] * row["pp"] == 512


@pytest.mark.parametrize("name", ["summit_6", "summit_1536"])
def test_summit_rows_scale_from_the_six_gpu_node(name):
    cfg = AtScaleConfig(lecture=[name], published=[])
    row = at_scale_ranks.run(
        cfg, Cell(world_size=1, key={"kind": "lecture", "name": name}, fn=at_scale_ranks.run)
    )
    assert row["predicted"] > 0 and 0 < row["predicted_scaling_efficiency"] <= 1 + 1e-12
    if name == "summit_6":
        assert row["predicted_scaling_efficiency"] == pytest.approx(1.0)
