"""planner_validation held out from itself: no number a ground-truth cell measured prices
that cell, and the rows are split into a development and a held-out half, the step-time
target judged on the held-out half alone.

A failure of the first test means a row's prediction reads something its source measured
in the row's own cell (its step time, its memory, its link probe, its TP call work, the
host probes around it): the prediction would then be partly the answer it is judged
against. The others mean the split is not what the config says, or the report judges the
target on rows the model was developed on."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bench.experiments.planner_validation import calibration, experiment, ranks
from bench.experiments.planner_validation.config import (
    HELD_OUT,
    SOURCES,
    SPLITS,
    PlannerValidationConfig,
    repository_reports,
)

LINK = (5e-5, 3e-10)
CAL = {
    "threads": 1,
    "peak_fp32_flops": 1e11,
    "peak_bf16_flops": 4e11,
    "gemm_table": ((1e5, 0.5), (1e8, 1.0)),
    "memory_bandwidth": 5e10,
    "kernel_overhead_s": 2e-6,
    "host_probe_s": 0.02,
    "link": LINK,
    "step_jitter": (0.9, 1.0, 1.1),
    "action_overhead_executor_s": 1e-5,
    "action_overhead_ledger_s": 2e-5,
    "meeting": {"after_compute_s": 2e-3, "call_s": 1e-4, "segment_s": 4e-3, "world_size": 2},
    **{
        f"reference_{d}{k}_s": {1: 1e-3, 16: 1e-2}
        for d in ("fp32", "bf16")
        for k in ("", "_fastest")
    },
    **{
        f"fit_{d}{k}": {"scale": 1.5, "overhead_s": 4e-6, "kernels": 1.0, "two_point": True}
        for d in ("fp32", "bf16")
        for k in ("", "_fastest")
    },
}
LOCAL = {
    "adamw_s_per_param": 3e-9,
    **{
        f"reference_{d}_{k}_s": 0.05 for d in ("fp32", "bf16") for k in ("one_thread", "at_threads")
    },
}
READ = (*SOURCES, "allreduce_scaling")


def _committed(root: Path) -> None:
    """The committed reports the experiment reads, copied under `root`."""
    for name in READ:
        path = repository_reports() / name / "results.csv"
        if not path.is_file():
            pytest.skip(f"no committed {name}/results.csv")
        (root / name).mkdir(parents=True)
        shutil.copy(path, root / name / "results.csv")


def _perturbed(value: str) -> str:
    """Another value of the same kind: a number scaled and shifted, any text changed."""
    if not value:
        return value
    try:
        return repr(float(value) * 1.37 + 0.011)
    except ValueError:
        return value + "-perturbed"


def _rewrite(path: Path, change) -> None:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    change(rows)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _perturb_row(root: Path, source: str, position: int) -> None:
    """Every column of one of `source`'s finished rows that is not its configuration,
    changed (the row at `position` among the ok rows, in file order)."""
    keep = set(experiment.CONFIGURATION_COLUMNS[source])

    def change(rows: list[dict[str, str]]) -> None:
        row = [r for r in rows if r.get("status") == "ok"][position]
        for column in row:
            if column not in keep:
                row[column] = _perturbed(row[column])

    _rewrite(root / source / "results.csv", change)


def _predict(root: Path, want: set[tuple[str, str]]) -> dict[tuple[str, str], tuple]:
    """{(source, config): (the row's carry, its row)} of the wanted cells, on the fixed
    calibration the caller patched in."""
    cfg = PlannerValidationConfig(reports_root=str(root))
    out = {}
    for cell in experiment.cells(cfg):
        key = (cell.key["source"], cell.key["config"])
        if key in want:
            out[key] = (cell.carry, experiment.to_row(cfg, cell, [ranks.run(cfg, cell)]))
    return out


def _patch_calibration(monkeypatch) -> None:
    monkeypatch.setattr(calibration, "calibrate", lambda cfg, threads: CAL)
    monkeypatch.setattr(
        calibration, "rank_calibration", lambda cfg, threads: {**LOCAL, "threads": threads}
    )
    monkeypatch.setattr(calibration, "tp_call_work", lambda cfg, tp, numel: 1e-7 * numel / tp)


def _chosen(root: Path) -> list[tuple[str, int, tuple[str, str]]]:
    """(source, position, key) of the rows to perturb: per source its first, middle and
    last predicted row, and every replayed TP row (priced on call work)."""
    cfg = PlannerValidationConfig(reports_root=str(root))
    chosen = []
    for source in SOURCES:
        truths = [t for t in experiment.ground_truth(cfg) if t["source"] == source]
        picks = {0, len(truths) // 2, len(truths) - 1}
        picks |= {
            i for i, t in enumerate(truths) if t["tp"] > 1 and t["ground_truth"] == "replayed"
        }
        positions = _positions(root, source)
        chosen += [
            (source, positions[truths[i]["config"]], (source, truths[i]["config"]))
            for i in sorted(picks)
        ]
    return chosen


def _positions(root: Path, source: str) -> dict[str, int]:
    """{config: its position among the source's ok rows}, by parsing one row at a time."""
    rows = experiment._read(root, source)
    out = {}
    for position, row in enumerate(rows):
        row[experiment._POSITION] = position
        for truth in experiment._PARSERS[source]([row]):
            out[truth["config"]] = position
    return out


def test_no_measured_column_of_a_row_changes_its_prediction(tmp_path, monkeypatch):
    """One row at a time, every column of it but its configuration perturbed (its times,
    memory, link probe, TP call work, host probes): its carry differs only in its measured
    step time and peak memory, every predicted column of it is the same to the last bit,
    and its errors move with the measurement. Rows: the first, middle and last of each
    source and every replayed TP row."""
    original = tmp_path / "original"
    _committed(original)
    _patch_calibration(monkeypatch)
    chosen = _chosen(original)
    assert any(key[1].startswith("tp") for _, _, key in chosen)  # a TP replay among them
    before = _predict(original, {key for _, _, key in chosen})
    for i, (source, position, key) in enumerate(chosen):
        perturbed = tmp_path / f"perturbed{i}"
        shutil.copytree(original, perturbed)
        _perturb_row(perturbed, source, position)
        (carry, row), (carry_after, row_after) = before[key], _predict(perturbed, {key})[key]
        differs = {k for k in carry if carry[k] != carry_after[k]}
        assert differs == {"measured_step_time_s", "measured_peak_bytes"}, (key, differs)
        predicted = [c for c in row if c.startswith("predicted_")]
        assert len(predicted) >= 10
        for column in predicted:
            assert row[column] == row_after[column], (key, column)
        assert row["step_error"] != row_after["step_error"], key


def test_the_split_is_by_source_and_fixed_in_the_config(tmp_path):
    cfg = PlannerValidationConfig()
    assert cfg.held_out == list(HELD_OUT) == ["pipeline_utilization"]
    assert [cfg.split(s) for s in SOURCES] == ["development", "development", "held_out"]
    assert set(SPLITS) == {"development", "held_out"}
    with pytest.raises(ValueError, match=r"held_out=\['zero'\].*allowed values"):
        PlannerValidationConfig(held_out=["zero"])


PARTS = (
    "predicted_compute_s",
    "predicted_bubble_s",
    "predicted_tp_s",
    "predicted_pp_s",
    "predicted_dp_s",
    "predicted_optimizer_s",
)


def _rows(split_of: dict[str, str], errors: dict[str, list[float]]) -> pd.DataFrame:
    """Result rows of each source with the given step errors (memory exact)."""
    rows = []
    for source, values in errors.items():
        for i, error in enumerate(values):
            rows.append(
                {
                    "source": source,
                    "config": f"c{i}",
                    "split": split_of[source],
                    "status": "ok",
                    "error": "",
                    "git_sha": "abc1234",
                    "host_cores": 2,
                    "world_size": 1,
                    "ranks": 1,
                    "measured_step_time_s": 0.1 * (i + 1),
                    "predicted_step_time_s": 0.1 * (i + 1) * (1 + error),
                    "step_error": error,
                    "measured_peak_bytes": 1e6,
                    "predicted_peak_bytes": 1e6,
                    "memory_error": 0.0,
                    "ground_truth": "wall clock",
                    "statistic": "median",
                    "source_git_sha": "abc1234",
                    "memory_measure": "activations",
                    **dict.fromkeys(PARTS, 0.01),
                }
            )
    return pd.DataFrame(rows)


def test_the_target_is_judged_on_the_held_out_half_alone(tmp_path):
    """A development half far off and a held-out half within 15%: the step target and the
    finding are met, judged on the held-out rows only; both halves appear side by side,
    with their signs. Swap which half is off and the target fails."""
    split_of = {
        "parallelism_comparison": "development",
        "zero_memory": "development",
        "pipeline_utilization": "held_out",
    }
    errors = {
        "parallelism_comparison": [0.5, -0.6, 0.7],
        "zero_memory": [-0.4, 0.45],
        "pipeline_utilization": [-0.05, 0.1, -0.12, 0.02],
    }
    headline = experiment.EXPERIMENT.report_on(_rows(split_of, errors), tmp_path, None)
    (step, memory) = headline["targets"]
    assert step["where"] == {"split": "held_out"} and step["cells"] == 4 and step["met"]
    assert memory["cells"] == 9  # memory is judged on every row
    accuracy = headline["accuracy"]
    assert accuracy["held_out"]["rows"] == 4 and accuracy["development"]["rows"] == 5
    assert accuracy["held_out"]["median_abs_step_error"] == pytest.approx(0.075)
    assert accuracy["held_out"]["optimistic_rows"] == 2
    assert accuracy["development"]["rows_over_bound"] == 5
    assert accuracy["development"]["median_step_error"] == pytest.approx(0.45)
    target = headline["held_out_step_target"]
    assert target["met"] and target["rows"] == 4
    report = (tmp_path / "report.md").read_text()
    assert "| development" in report and "| held_out" in report
    assert "held out only from then on" in report  # which half development looked at
    assert not [f for f in headline["findings"] if not f["holds"] and "held-out" in f["claim"]]
    swapped = {s: "held_out" if h == "development" else "development" for s, h in split_of.items()}
    headline = experiment.EXPERIMENT.report_on(_rows(swapped, errors), tmp_path, None)
    assert not headline["targets"][0]["met"] and not headline["held_out_step_target"]["met"]
    assert math.isclose(headline["held_out_step_target"]["median_abs_step_error"], 0.5)


def test_the_pool_probes_take_medians_over_ranks_and_keep_a_finite_link(monkeypatch):
    """What replaces the sources' own link and call work: medians over the pool's ranks
    (as `parallelism_comparison` took them); a 1 MiB exchange timed no slower than the
    4-byte one (a disturbed α) leaves β at its floor, never 0 (an infinite bandwidth)."""
    import bench.kit.host
    from bench.experiments.planner_validation import pool_probes

    per_rank = [
        {"tp_call_cpu_s": {64: t}, "link": (a, 1e-10)}
        for t, a in ((1e-4, 3e-5), (3e-4, 5e-5), (2e-4, 4e-5))
    ]
    merged = pool_probes._merge(per_rank, [64])
    assert merged == {"world_size": 3, "tp_call_cpu_s": {64: 2e-4}, "link": (4e-5, 1e-10)}
    times = {1: 2e-3, 1 << 18: 1e-3}  # by float32 elements: 4 bytes, 1 MiB
    monkeypatch.setattr(
        bench.kit.host, "probe_pairs", lambda tensor, exchange, trials: times[tensor.numel()]
    )
    assert pool_probes.probe_link() == (2e-3, 1e-15)
    times[1 << 18] = 2e-3 + (1 << 20) * 1e-9
    assert pool_probes.probe_link() == pytest.approx((2e-3, 1e-9 * (1 << 20) / ((1 << 20) - 4)))
