"""The typed seam between runner and experiment (issue 34, part 3): every cell function
takes its experiment's own config class and a `Cell`, the runner's defaults live once in
`bench.config`, and arithmetic experiments run without a rank pool."""

from __future__ import annotations

import contextlib
import inspect
import time
import typing
from dataclasses import dataclass

import pandas as pd
import pytest

import bench.runner
from bench.config import ClusterConfig, WandbConfig
from bench.experiments import experiments
from bench.experiments.base import Cell, Experiment
from bench.report import Report
from bench.runner import run_experiment

ANALYTIC = ("at_scale", "auto_parallel", "max_model_size")


def _cell_functions(experiment: Experiment) -> set:
    return {cell.fn for cell in experiment.cells(experiment.parse({}))}


@pytest.mark.parametrize("name", sorted(experiments()))
def test_every_cell_function_takes_the_experiments_config_and_a_cell(name):
    experiment = experiments()[name]
    for fn in _cell_functions(experiment):
        hints = typing.get_type_hints(fn)
        cfg, cell = list(inspect.signature(fn).parameters)[:2]
        where = f"{fn.__module__}.{fn.__qualname__}"
        assert cfg in hints and cell in hints, f"{where}: unannotated parameters"
        assert hints[cfg] is not typing.Any, f"{where}: {cfg} is Any"
        assert isinstance(hints[cfg], type) and issubclass(experiment.schema, hints[cfg]), (
            f"{where}: {cfg} is {hints[cfg]}, not {experiment.schema.__name__} or a base of it"
        )
        is_cell = hints[cell] is Cell or typing.get_origin(hints[cell]) is Cell
        assert is_cell, f"{where}: {cell} is {hints[cell]}, not Cell"


def test_the_analytic_experiments_and_only_they_run_in_process():
    flagged = sorted(n for n, e in experiments().items() if e.in_process)
    assert flagged == sorted(ANALYTIC)


@dataclass(kw_only=True)
class _Config:
    fail: str = "b"
    hang: str = ""
    timeout_s: float = 30.0


def _compute(cfg: _Config, cell: Cell[_Config]) -> dict:
    if cell.key["cell"] == cfg.fail:
        raise ArithmeticError("no such plan")
    if cell.key["cell"] == cfg.hang:
        while True:  # a search that never ends, catching what it can
            with contextlib.suppress(Exception):
                time.sleep(0.01)
    return {"value": ord(cell.key["cell"])}


def _cells(cfg: _Config) -> list[Cell[_Config]]:
    return [Cell(world_size=1, key={"cell": c}, fn=_compute) for c in "abc"]


def _arithmetic() -> Experiment[_Config]:
    """An in-process experiment of three cells: `cfg.fail` raises, `cfg.hang` never ends."""
    return Experiment(
        name="arith",
        summary="arithmetic",
        schema=_Config,
        key_columns=("cell",),
        cells=_cells,
        to_row=lambda cfg, cell, per_rank: {**cell.key, **per_rank[0]},
        report=Report(title="arith", intro=""),
        in_process=True,
    )


def test_an_in_process_grid_starts_no_rank_pool_and_a_raising_cell_fails_its_row(
    tmp_path, monkeypatch
):
    def no_pool(*args, **kwargs):
        raise AssertionError("an in_process experiment started a RankPool")

    monkeypatch.setattr(bench.runner, "RankPool", no_pool)
    experiment = _arithmetic()
    df = run_experiment(
        experiment,
        _Config(),
        report_dir=tmp_path,
        cluster=ClusterConfig(),
        resume=False,
        wandb_cfg=WandbConfig(mode="disabled"),
    )
    rows = df.set_index("cell")
    assert list(rows["status"]) == ["ok", "failed", "ok"]
    assert "ArithmeticError: no such plan" in rows.loc["b", "error"]
    assert rows.loc["c", "value"] == ord("c")
    assert set(rows["backend"]) == {"none"}
    assert pd.read_csv(tmp_path / "results.csv")["cell"].tolist() == ["a", "b", "c"]


def test_an_in_process_cell_past_its_timeout_fails_and_the_grid_goes_on(tmp_path):
    experiment = _arithmetic()
    cfg = _Config(fail="", hang="a", timeout_s=0.5)
    df = run_experiment(
        experiment,
        cfg,
        report_dir=tmp_path,
        cluster=ClusterConfig(),
        resume=False,
        wandb_cfg=WandbConfig(mode="disabled"),
    )
    rows = df.set_index("cell")
    assert list(rows["status"]) == ["failed", "ok", "ok"]
    assert "timed out after 0.5 s" in rows.loc["a", "error"]


def test_auto_means_gloo_for_spawned_ranks():
    assert ClusterConfig(backend="auto").process_group_backend(spawned=True) == "gloo"
    assert ClusterConfig(backend="gloo").process_group_backend(spawned=False) == "gloo"
