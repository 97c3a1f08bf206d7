"""Experiment `max_model_size`: config checks, the cells it computes, its report, the CLI.

A failure here means the experiment does not reproduce the lecture's 5B / 19B / 36B / 320B
for 80 GB at N = 64, that bad input (negative memory, N < 1, bytes ≤ 0, an unknown key)
gets past the config or fails without naming the key, that the report loses its lecture
table, prints the ZeRO paper's Figure 1 values whatever Ψ is, puts a model output in the
index's measured column, invents a comparison with measured runs that do not exist or
misreads the ones that do, crashes on figures that are all zero or all NaN, or that
`python -m bench experiment=max_model_size` does not run end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from bench.experiments import experiments
from bench.experiments.max_model_size import report
from bench.experiments.max_model_size.experiment import EXPERIMENT, cells, to_row

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUIRED = [
    "stage",
    "gpu_memory_gb",
    "dp",
    "mp",
    "max_params",
    "params",
    "per_device_gb",
    "param_bytes",
    "grad_bytes",
    "optim_bytes",
    "model_state_bytes",
]


def _frame(**overrides) -> pd.DataFrame:
    """The experiment's rows computed in this process (the runner would use one rank)."""
    cfg = EXPERIMENT.parse(overrides)
    return pd.DataFrame([{**to_row(cfg, c, [c.fn(cfg, c)]), "status": "ok"} for c in cells(cfg)])


def write(frame: pd.DataFrame, out: Path) -> dict:
    return EXPERIMENT.report_on(frame, out, None)


def test_registered_with_the_runner() -> None:
    assert experiments()["max_model_size"] is EXPERIMENT
    assert EXPERIMENT.reads == ("zero_memory",)


def test_default_grid_reproduces_the_lecture() -> None:
    df = _frame()
    assert set(REQUIRED) <= set(df.columns)
    assert len(df) == 11 * 4  # N = 1 … 1024 × stages 0–3 at 80 GB
    lecture = df[df["dp"] == 64].set_index("stage")
    assert lecture["max_params_billions"].tolist() == [5, 19, 36, 320]
    # The ZeRO paper's Figure 1 (Ψ = 7.5B, N = 64): 120, 31.4, 16.6, 1.9 GB, one decimal.
    assert lecture["per_device_gb"].round(1).tolist() == [120.0, 31.4, 16.6, 1.9]
    assert lecture["fits"].tolist() == [False, True, True, True]


def test_model_parallel_degree_and_custom_bytes() -> None:
    df = _frame(gpu_memory_gb=40, dp=[8], mp=4, bytes_per_param={"optimizer": 8}, params=2e9)
    stage0 = df.set_index("stage").loc[0]
    # Only the optimizer's bytes were overridden: 2 + 2 + 8 = 12 bytes, over mp = 4 devices.
    pairs = zip(df["weight_bytes_per_param"], df["optim_bytes_per_param"], strict=True)
    assert set(pairs) == {(2, 8)}
    assert stage0["max_params"] == 4 * 40_000_000_000 // 12
    # 2e9 / 4 parameters per device × 12 bytes: exact in floating point.
    assert stage0["model_state_bytes"] == 12 * 2e9 / 4


@pytest.mark.parametrize(
    "overrides, needles",
    [
        ({"gpu_memory_gb": [80, -80]}, ["gpu_memory_gb", "-80", "≥ 0"]),
        ({"gpu_memory_gb": "80GB"}, ["gpu_memory_gb", "80GB"]),
        ({"dp": [64, 0]}, ["dp=[64, 0]", "≥ 1"]),
        ({"dp": 2.5}, ["dp=[2.5]", "integer ≥ 1"]),
        ({"mp": 0}, ["mp=0", "≥ 1"]),
        ({"params": 0}, ["params=0", "> 0"]),
        ({"bytes_per_param": {"optimizer": 0}}, ["bytes_per_param.optimizer=0", "> 0"]),
        ({"bytes_per_param": {"master": 4}}, ["bytes_per_param", "master", "weights, gradients"]),
        ({"bytes_per_param": 16}, ["bytes_per_param=16", "mapping"]),
        ({"world_sizes": [2]}, ["unknown key(s) world_sizes", "gpu_memory_gb", "bytes_per_param"]),
    ],
)
def test_bad_config_names_the_key(overrides, needles) -> None:
    with pytest.raises(ValueError) as error:
        EXPERIMENT.parse(overrides)
    for needle in needles:
        assert needle in str(error.value)


def _zero_memory_rows() -> pd.DataFrame:
    """A fixture shaped like zero_memory's results.csv: errors of 1%, 4% and a torch row."""
    base = {"impl": "distbench", "status": "ok", "predicted_model_state_bytes": 1000.0}
    rows = [
        {**base, "stage": 0, "world_size": 2, "model_state_bytes": 1010.0},
        {**base, "stage": 3, "world_size": 4, "model_state_bytes": 960.0},
        {**base, "stage": 3, "world_size": 8, "model_state_bytes": 1000.0},
        {**base, "stage": 1, "world_size": 2, "model_state_bytes": 1900.0, "status": "failed"},
        {**base, "impl": "torch", "stage": 3, "world_size": 8, "model_state_bytes": 5000.0},
    ]
    return pd.DataFrame(rows)


def test_report_without_measurements_says_so(tmp_path: Path) -> None:
    out = tmp_path / "max_model_size"
    headline = write(_frame(), out)
    text = (out / "report.md").read_text()
    assert text.index("The lecture's table") < text.index("What was computed")
    assert "| ZeRO-1       | 19B" in text and "19,104,477,611" in text
    assert "does not exist" in text and "No GPU was lent for this run" in text
    assert headline["lecture_reproduced"] is True
    assert headline["cost_model_vs_measured"] == {"available": False}
    for name in ("max_model_size_vs_n.png", "per_device_memory_vs_n.png", "headline.json"):
        assert (out / name).stat().st_size > 0, name
    # Every number here is a model output: the index's model column, never its measured one.
    lecture = headline["figures"][:4]
    assert [f["model"] for f in lecture] == [f"{b}B" for b in (5, 19, 36, 320)]
    assert [f["theory"] for f in lecture] == [f"{b}B" for b in (5, 19, 36, 320)]
    assert all(f["measured"] == "—" and "lecture" in f["source"] for f in lecture)
    assert not [f for f in headline["figures"] if f["measured"] != "—"]
    (finding,) = headline["findings"]
    assert finding["holds"] is True and "5B / 19B / 36B / 320B" in finding["claim"]


def test_report_reads_zero_memory_and_gpu_files(tmp_path: Path) -> None:
    (tmp_path / "zero_memory").mkdir()
    _zero_memory_rows().to_csv(tmp_path / "zero_memory" / "results.csv", index=False)
    out = tmp_path / "max_model_size"
    out.mkdir()
    gpu = {"device": ["H100"], "params_fit_measured": [4.1e9], "params_fit_predicted": [5.0e9]}
    pd.DataFrame(gpu).to_csv(out / report.GPU_FILE, index=False)
    headline = write(_frame(), out)
    measured = headline["cost_model_vs_measured"]
    # Failed and torch rows do not count: stage 0 is off by 1%, stage 3 by 4% at worst.
    assert measured["max_error"] == pytest.approx(0.04)
    assert measured["max_error_by_stage"] == {"0": pytest.approx(0.01), "3": pytest.approx(0.04)}
    text = (out / "report.md").read_text()
    assert "**4.00%**" in text
    section = text.split("## How well the cost model matched")[1].split("\n## ")[0]
    zero3 = next(line for line in section.splitlines() if line.startswith("| ZeRO-3 "))
    assert [cell.strip() for cell in zero3.split("|")[2:5]] == ["4, 8", "4.00%", "✓"]
    assert "4.10B" in text and "0.820×" in text and "No GPU was lent" not in text
    figures = {f["figure"]: f for f in headline["figures"]}
    h100 = figures["largest model on one H100 (no sharding)"]
    assert (h100["measured"], h100["model"], h100["gap"]) == ("4.10B", "5.00B", "0.820×")
    matched = figures["cost model vs measured model-state bytes (zero_memory), largest error"]
    assert (matched["measured"], matched["model"]) == ("4.00%", "—")


def test_report_without_the_lecture_cell(tmp_path: Path) -> None:
    headline = write(_frame(dp=[2, 4]), tmp_path)
    assert headline["lecture_reproduced"] is None
    assert "has no 80 GB, N = 64" in (tmp_path / "report.md").read_text()


def test_figure1_values_come_from_the_runs_psi(tmp_path: Path) -> None:
    """At Ψ = 7.5B the paper's Figure 1 stands beside the computed values; at another Ψ the
    report computes that Ψ's and sets no paper value beside them."""
    paper = write(_frame(), tmp_path / "paper")
    figures = [f for f in paper["figures"] if f["figure"].startswith("model states per device")]
    assert [f["theory"] for f in figures] == ["120 GB", "31.4 GB", "16.6 GB", "1.9 GB"]
    assert [f["model"] for f in figures] == ["120 GB", "31.4 GB", "16.6 GB", "1.88 GB"]
    other = write(_frame(params=1e9), tmp_path / "other")
    figures = [f for f in other["figures"] if f["figure"].startswith("model states per device")]
    assert [f["model"] for f in figures] == ["16 GB", "4.19 GB", "2.22 GB", "0.25 GB"]
    assert {f["theory"] for f in figures} == {"—"}
    text = (tmp_path / "other" / "report.md").read_text()
    assert "16 GB / 4.19 GB / 2.22 GB / 0.25 GB" in text and "31.4" not in text
    assert other["per_device_gb"]["by_stage"]["3"] == pytest.approx(0.25)


@pytest.mark.parametrize("fill", [0.0, float("nan")], ids=["zero", "nan"])
def test_report_on_zero_or_nan_figures(tmp_path: Path, fill: float) -> None:
    frame = _frame()
    for column in (
        "max_params",
        "max_params_billions",
        "per_device_gb",
        "param_bytes",
        "grad_bytes",
        "optim_bytes",
        "model_state_bytes",
        "fits",
    ):
        frame[column] = fill
    headline = write(frame, tmp_path)
    assert headline["lecture_reproduced"] is not True
    assert (tmp_path / "report.md").stat().st_size > 0


def _bench(tmp: Path, name: str, *overrides: str) -> tuple[int, str, Path]:
    report_dir = tmp / name / "max_model_size"
    command = [
        sys.executable,
        "-m",
        "bench",
        "experiment=max_model_size",
        *overrides,
        f"report_dir={report_dir}",
        f"hydra.run.dir={tmp / name / 'hydra'}",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout + done.stderr, report_dir


@pytest.mark.slow
def test_cli_runs_and_refuses_bad_input(tmp_path: Path) -> None:
    """End to end through Hydra and the runner's one-rank pool, and one refusal."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        good = pool.submit(
            _bench,
            tmp_path,
            "good",
            "wandb.mode=disabled",
            "dp=[1,64,1024]",
            "bytes_per_param.optimizer=12",
        )
        bad = pool.submit(_bench, tmp_path, "bad", "gpu_memory_gb=[-80]")
        (code, output, out), (bad_code, bad_output, bad_out) = good.result(), bad.result()
    assert code == 0, output[-3000:]
    df = pd.read_csv(out / "results.csv")
    assert set(REQUIRED) <= set(df.columns) and (df["status"] == "ok").all()
    assert sorted(df.loc[df["dp"] == 64, "max_params_billions"]) == [5, 19, 36, 320]
    assert set(df["world_size"]) == {1}  # the runner's metadata: one rank per cell
    assert json.loads((out / "headline.json").read_text())["lecture_reproduced"] is True
    assert bad_code not in (0, None)
    assert "gpu_memory_gb" in bad_output and "-80" in bad_output
    assert not (bad_out / "results.csv").exists()
