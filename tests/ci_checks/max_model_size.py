"""max_model_size on the CI grid: the cost model gives the lecture's 5B / 19B / 36B / 320B
(80 GB, N = 64, 16 bytes per parameter) and the ZeRO paper's Figure 1 (Ψ = 7.5B, N = 64:
120 / 31.4 / 16.6 / 1.9 GB), grows with N as the formulas say, every number of it goes to
the index as a model output (never as measured), and the report states how well the same
cost model matched zero_memory's measured runs: within the issue's 5%."""

from __future__ import annotations

import pandas as pd

from tests.ci_checks import ran, rows

ARTEFACTS = ("max_model_size_vs_n", "per_device_memory_vs_n")
LECTURE = {0: 5, 1: 19, 2: 36, 3: 320}
FIGURE1_GB = [120.0, 31.4, 16.6, 1.9]


def lecture_table_reproduced(df: pd.DataFrame, headline: dict) -> None:
    lecture = rows(ran(df), gpu_memory_gb=80, dp=64, mp=1)
    by_stage = lecture.set_index("stage")["max_params"] // 10**9
    assert by_stage.to_dict() == LECTURE, by_stage.to_dict()
    assert headline["lecture_reproduced"] is True
    figures = [f for f in headline["figures"] if f["figure"].startswith("largest trainable")]
    assert [(f["theory"], f["model"]) for f in figures] == [
        (f"{b}B",) * 2 for b in LECTURE.values()
    ]
    assert all(f["measured"] == "—" for f in figures), "a model output is not a measurement"


def largest_model_grows_as_the_formulas_say(df: pd.DataFrame, headline: dict) -> None:
    """floor(M / 16) without sharding at every N; floor(M·N / 16) with ZeRO-3; ZeRO-1 and
    ZeRO-2 in between; the Figure 1 model's per-device memory at N = 64."""
    done = rows(ran(df), gpu_memory_gb=80, mp=1)
    assert set(done["dp"]) >= {1, 64, 1024}
    for row in done.itertuples():
        if row.stage == 0:
            assert row.max_params == 5 * 10**9, row
        if row.stage == 3:
            assert row.max_params == 80 * 10**9 * row.dp // 16, row
    wide = done.pivot_table(index="dp", columns="stage", values="max_params")
    assert (wide[3] >= wide[2]).all() and (wide[2] >= wide[1]).all() and (wide[1] >= wide[0]).all()
    at64 = rows(done, dp=64).sort_values("stage")
    assert at64["per_device_gb"].round(1).tolist() == FIGURE1_GB
    assert ((at64["model_state_bytes"] / 1e9 - at64["per_device_gb"]).abs() < 1e-9).all()
    paper = [f for f in headline["figures"] if f["figure"].startswith("model states per device")]
    assert [float(f["theory"].split()[0]) for f in paper] == FIGURE1_GB
    assert all(f["measured"] == "—" and f["model"] != "—" for f in paper)


def cost_model_matches_the_measured_runs(df: pd.DataFrame, headline: dict) -> None:
    measured = headline["cost_model_vs_measured"]
    assert measured["available"], "zero_memory's results were not read"
    assert 0 <= measured["max_error"] <= 0.05, measured
    assert set(measured["max_error_by_stage"]) == {"0", "1", "2", "3"}
    (figure,) = [f for f in headline["figures"] if f["figure"].startswith("cost model vs")]
    assert figure["measured"] == f"{100 * measured['max_error']:.2f}%" and figure["model"] == "—"
    assert (ran(df)["model_state_bytes"] > 0).all()


CHECKS = (
    lecture_table_reproduced,
    largest_model_grows_as_the_formulas_say,
    cost_model_matches_the_measured_runs,
)
