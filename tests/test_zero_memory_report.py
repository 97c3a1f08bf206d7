"""The `zero_memory` report writer on a small synthetic results table.

The numbers below are fixtures shaped like the experiment's results.csv (one row per
method × N × precision), not measurements. A failure here means a generated report would
misstate a run: the worst model-state error taken from the wrong row or judged against
the wrong target, traffic not expressed in units of Ψ against the ZeRO paper's 2Ψ / 3Ψ,
a step-time ratio taken from the wrong torch baseline or judged on some world sizes only
(a cell with more ranks than cores must be judged and labelled, never dropped), a failed
cell that disappears, a report that crashes or meets a target on figures that are all zero
or all NaN, or plots that are not written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.experiments.zero_memory.experiment import EXPERIMENT
from bench.report.index import write_index

PSI = 10_000
METADATA = {
    "git_sha": "abc1234",
    "torch_version": "2.13.0",
    "backend": "gloo",
    "device": "cpu",
    "host": "testhost",
    "host_cores": 2,
    "timestamp": "2025-01-01T00:00:00",
}
STAGE = {"dp": 0, "ddp": 0, "ddp_no_overlap": 0, "zero1": 1, "zero2": 2, "zero3": 3}
TWIN = {
    "dp": "torch_ddp",
    "ddp": "torch_ddp",
    "ddp_no_overlap": "torch_ddp",
    "zero1": "torch_zero_redundancy",
    "zero3": "torch_fsdp2",
}
TORCH_STEP_S = {"torch_ddp": 0.010, "torch_zero_redundancy": 0.020, "torch_fsdp2": 0.030}
# Step time / twin's: the overlapped DDP beats torch DDP and its own no-overlap variant.
DEFAULT_RATIO = {"ddp": 0.9, "ddp_no_overlap": 1.2}


def _ours(method: str, n: int, error: float = 0.0, ratio: float | None = None) -> dict:
    """A distbench row: fp32 Adam model states (4 / 4 / 8 B), off the prediction by `error`,
    timed at `ratio` × its torch twin, side by side (paired)."""
    stage = STAGE[method]
    shard = math.ceil(PSI / n)
    predicted = {
        "param_bytes": 4 * (shard if stage == 3 else PSI),
        "grad_bytes": 4 * (shard if stage >= 2 else PSI),
        "optim_bytes": 8 * (shard if stage >= 1 else PSI),
    }
    measured = {k: v * (1 + error) for k, v in predicted.items()}
    multiple = (3 if stage == 3 else 2) * (n - 1) / n
    ratio = DEFAULT_RATIO.get(method, 1.0) if ratio is None else ratio
    twin = TWIN.get(method, "")  # ZeRO-2 has none: torch has no ZeRO-2 proper
    torch_s = TORCH_STEP_S[twin] if twin else np.nan
    return {
        "impl": "distbench",
        "method": method,
        "stage": stage,
        "world_size": n,
        "precision": "fp32",
        "params": PSI,
        **measured,
        "model_state_bytes": sum(measured.values()),
        "gathered_peak_bytes": 4 * PSI / 2 if stage == 3 else 0,
        "activation_peak_bytes": 50_000,
        "peak_bytes": sum(measured.values()) + 50_000,
        **{f"predicted_{k}": v for k, v in predicted.items()},
        "predicted_model_state_bytes": sum(predicted.values()),
        "model_state_error": error,
        "comm_bytes_per_step": multiple * PSI * 4,
        "predicted_comm_bytes_per_step": multiple * PSI * 4,
        "comm_psi_multiple": multiple,
        "step_time_s": torch_s * ratio if twin else 0.02,
        "torch_step_time_s": torch_s,
        "step_time_vs_torch": ratio if twin else np.nan,
        "twin": twin,
        "loss": 2.5,
        "max_param_diff": 1e-7,
        "wrong": 0,
        "status": "ok",
        "error": "",
        **METADATA,
    }


def _torch(method: str, n: int) -> dict:
    """A torch baseline row: only time, loss and correctness are observable."""
    row = {k: np.nan for k in _ours("dp", 1)}
    stage = {"torch_ddp": 0, "torch_zero_redundancy": 1}.get(method, 3)
    row.update(
        impl="torch",
        method=method,
        stage=stage,
        world_size=n,
        precision="fp32",
        params=PSI,
        step_time_s=TORCH_STEP_S[method],
        twin="",
        loss=2.5,
        max_param_diff=1e-7,
        wrong=0,
        status="ok",
        error="",
        **METADATA,
    )
    return row


def results(errors: dict | None = None, ratios: dict | None = None) -> pd.DataFrame:
    """Every method at N = 1, 2, 4, 8 and a failed ZeRO-3 cell at N = 16; `errors` and
    `ratios` override single (method, N) cells."""
    errors, ratios = errors or {}, ratios or {}
    rows = [
        _ours(m, n, errors.get((m, n), 0.0), ratios.get((m, n)))
        for m in STAGE
        for n in (1, 2, 4, 8)
    ]
    rows += [_torch(m, n) for m in TORCH_STEP_S for n in (1, 2, 4, 8)]
    failed = {k: np.nan for k in rows[0]}
    failed.update(
        impl="distbench",
        method="zero3",
        stage=3,
        world_size=16,
        precision="fp32",
        status="failed",
        error="RankFailure: rank 5 timed out after 300 s",
        **METADATA,
    )
    return pd.DataFrame([*rows, failed])


def write(frame: pd.DataFrame, out: Path) -> dict:
    return EXPERIMENT.report_on(frame, out, None)


def target(headline: dict, prefix: str) -> dict:
    (found,) = [t for t in headline["targets"] if t["figure"].startswith(prefix)]
    return found


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("zero_memory")
    frame = results(
        errors={("zero2", 8): 0.03, ("zero1", 4): -0.01},
        ratios={("zero3", 2): 1.4, ("zero3", 8): 1.9, ("dp", 2): 0.95},
    )
    headline = write(frame, tmp_path)
    return headline, (tmp_path / "report.md").read_text(), tmp_path


def test_files_and_headline_round_trip(report) -> None:
    headline, _, out = report
    for name in ("report.md", "headline.json", "memory_per_rank.png", "comm_per_rank.png"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "headline.json").read_text()) == headline


def test_model_state_error_is_the_worst_distbench_cell(report) -> None:
    headline, text, _ = report
    assert headline["model_state_error_max"] == pytest.approx(0.03)
    assert headline["model_state_error_by_method"]["zero1"] == pytest.approx(0.01)
    assert headline["model_state_error_by_method"]["dp"] == pytest.approx(0.0)
    states = target(headline, "model-state bytes per rank")
    assert states["met"] is True and states["worst"] == pytest.approx(0.03)
    assert states["cells"] == states["measured"] == 4 * 4  # every stage and N
    assert states["worst_key"] == "method=zero2, world_size=8, precision=fp32"
    assert (states["bound_text"], states["worst_text"].split(" (")[0]) == ("≤ 5.00%", "3.00%")
    assert "**3.00%** (within the 5% target)" in text


def test_model_state_error_outside_target(tmp_path: Path) -> None:
    headline = write(results(errors={("zero3", 2): 0.08}), tmp_path)
    assert headline["model_state_error_max"] == pytest.approx(0.08)
    states = target(headline, "model-state bytes per rank")
    assert states["met"] is False and states["missing"] == [
        "method=zero3, world_size=2, precision=fp32"
    ]
    assert "outside the 5% target" in (tmp_path / "report.md").read_text()


def test_comm_in_units_of_psi(report) -> None:
    headline, text, _ = report
    comm = headline["comm_psi_multiple"]
    assert set(comm) == set(STAGE)
    for method, limit in {"dp": 2, "ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3}.items():
        entry = comm[method]
        assert entry["world_size"] == 8 and entry["theory_limit"] == limit
        assert entry["measured"] == pytest.approx(limit * 7 / 8)
        assert entry["normalised"] == pytest.approx(limit)
    assert "3Ψ·(N−1)/N = 2.625Ψ" in text
    labels = {f["figure"]: f for f in headline["figures"]}
    assert labels["ZeRO-3 traffic per rank per step, N = 8"]["theory"].startswith("3Ψ")
    (exact,) = [f for f in headline["findings"] if "send exactly" in f["claim"]]
    assert exact["holds"] is True


def test_speed_targets_are_judged_on_every_world_size(report) -> None:
    """ZeRO-3 ÷ FSDP2 is 1.0× at N = 1 and 4, 1.4× at N = 2 and 1.9× at N = 8: the 8 ranks
    on the 2-core host are judged too, labelled, and the worst cell is shown with its key."""
    headline, text, _ = report
    zero3 = target(headline, "ZeRO-3 step time")
    assert (zero3["cells"], zero3["measured"]) == (4, 4)
    assert zero3["worst"] == pytest.approx(1.9) and zero3["median"] == pytest.approx(1.2)
    assert zero3["worst_key"] == "method=zero3, world_size=8, precision=fp32"
    assert zero3["worst_crowded"] is True and zero3["met"] is False
    assert zero3["missing"] == [
        "method=zero3, world_size=2, precision=fp32",
        "method=zero3, world_size=8, precision=fp32",
    ]
    assert zero3["status"] == "not met in 2 of 4 cells (1 with more ranks than cores)"
    ddp = target(headline, "overlapped DDP step time ÷ torch DDP")
    assert ddp["where"]["method"] == "ddp"  # the overlapped DDP's target, not plain DP's
    assert ddp["met"] and ddp["worst"] == pytest.approx(0.9) and ddp["measured"] == 4
    # Overlap: 0.9 × 10 ms against 1.2 × 10 ms without, in separate cells, at N = 2, 4, 8.
    overlap = target(headline, "overlapped DDP step time ÷ the same DDP without overlap")
    assert overlap["met"] and overlap["worst"] == pytest.approx(0.75) and overlap["cells"] == 3
    assert "(target ≤ 1.25×)" in text and "(target ≤ 1.1×)" in text and "(target < 1×)" in text
    assert not any(f["figure"].startswith("DP step time") for f in headline["figures"])


def test_step_time_ratios_take_the_worst_cell_of_every_n(report) -> None:
    headline, text, _ = report
    ratios = headline["step_time_vs_torch"]
    assert ratios["zero3"] == {
        "ratio": pytest.approx(1.9),
        "median": pytest.approx(1.2),
        "cells": 4,
        "world_size": 8,
        "precision": "fp32",
        "basis": "paired",
        "crowded": True,
        "twin": "torch_fsdp2",
    }
    assert ratios["dp"]["ratio"] == pytest.approx(1.0) and ratios["dp"]["cells"] == 4
    assert "zero2" not in ratios  # torch has no ZeRO-2 proper: no twin, no ratio
    assert ratios["ddp_vs_no_overlap"]["ratio"] == pytest.approx(0.75)
    assert ratios["ddp_vs_no_overlap"]["basis"] == "separate cells"
    assert "worst 1.90× (N = 8, fp32, paired; 2 cores shared by 8 ranks)" in text
    (zero1,) = [f for f in headline["figures"] if f["figure"].startswith("ZeRO-1 step time")]
    assert zero1["measured"] == "1.00×; worst 1.00× (N = 1, fp32, paired)" and zero1["model"] == "—"


def test_unpaired_ratio_falls_back_to_the_torch_rows(tmp_path: Path) -> None:
    frame = results()
    ours = frame["impl"] == "distbench"
    frame.loc[ours, ["torch_step_time_s", "step_time_vs_torch"]] = np.nan
    frame = frame.drop(columns="twin")  # without the column, the built-in pairing applies
    frame.loc[ours & (frame["method"] == "dp") & (frame["world_size"] == 2), "step_time_s"] = 0.03
    headline = write(frame, tmp_path)
    # 0.03 s against torch DDP's 0.01 s in its own cell at N = 2.
    assert headline["step_time_vs_torch"]["dp"] == {
        "ratio": pytest.approx(3.0),
        "median": pytest.approx(1.0),
        "cells": 4,
        "world_size": 2,
        "precision": "fp32",
        "basis": "separate cells",
        "crowded": False,
        "twin": "torch_ddp",
    }
    assert "zero2" not in headline["step_time_vs_torch"]


def test_no_torch_twin_rows_means_not_measured(tmp_path: Path) -> None:
    frame = results()
    frame = frame[frame["method"] != "torch_fsdp2"]
    frame.loc[frame["method"] == "zero3", ["torch_step_time_s", "step_time_vs_torch"]] = np.nan
    headline = write(frame, tmp_path)
    assert headline["step_time_vs_torch"]["zero3"] is None
    assert "- ZeRO-3 ÷ torch FSDP2: not measured" in (tmp_path / "report.md").read_text()
    zero3 = target(headline, "ZeRO-3 step time")
    assert zero3["met"] is False and zero3["measured"] == 0
    assert zero3["status"] == "not measured: no cell it applies to has a value"


def test_failed_cells_and_correctness(report) -> None:
    headline, text, _ = report
    assert headline["failed_cells"] == 1
    assert headline["failures"][0]["world_size"] == 16
    assert "Failed cells (1)" in text and "rank 5 timed out after 300 s" in text
    assert headline["wrong_total"] == 0 and "**0 wrong**" in text


def test_index_shows_the_headline(report, tmp_path_factory) -> None:
    headline, _, out = report
    root = tmp_path_factory.mktemp("reports")
    (root / "zero_memory").mkdir()
    (root / "zero_memory" / "headline.json").write_text(json.dumps(headline))
    index = write_index(root).read_text()
    assert "model-state bytes per rank" in index and "3.00%" in index
    assert "1.90× (method=zero3, world_size=8, precision=fp32; 2 cores" in index


def test_all_failed_still_writes_a_report(tmp_path: Path) -> None:
    frame = results()
    frame["status"], frame["error"] = "failed", "RankFailure: boom"
    headline = write(frame, tmp_path)
    assert headline["failed_cells"] == len(frame)
    assert headline.get("model_state_error_max") is None
    assert f"{len(frame)} cells, 0 ran" in (tmp_path / "report.md").read_text()
    assert not any(t["met"] for t in headline["targets"])


@pytest.mark.parametrize("fill", [0.0, np.nan], ids=["zero", "nan"])
def test_figures_all_zero_or_nan_meet_no_target(tmp_path: Path, fill: float) -> None:
    """A report on nothing but zeros (or NaN) must not crash, nor meet a target."""
    frame = results()
    keep = {"method", "world_size", "precision", "host_cores", "status", "error"}
    for column in frame.columns:
        if column not in keep and pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = fill
    headline = write(frame, tmp_path)
    assert [t["met"] for t in headline["targets"]] == [False] * 4
    assert (tmp_path / "report.md").stat().st_size > 0
