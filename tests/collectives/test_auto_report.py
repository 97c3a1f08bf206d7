"""allreduce_scaling's report on `auto`, from a synthetic frame with known answers.

A failure here means the report would misjudge auto: compare it with the wrong cell's
best algorithm, count a choice as the best when it is not, or drop the issue #14 figures
from the headline the index and CI read."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.ci_checks import allreduce_scaling as ci
from tests.test_report_writers import _allreduce_row, write_allreduce

# busbw ÷ torch of each fixed algorithm per (N, M); auto's pick and its own cell's ratio.
RATIOS = {
    (2, 4096): {"parameter_server": 2.0, "ring": 1.0, "tree": 1.5},
    (2, 1 << 20): {"parameter_server": 1.0, "ring": 1.2, "tree": 0.9},
    (4, 4096): {"parameter_server": 3.0, "ring": 0.5, "tree": 2.0},
    (4, 1 << 20): {"parameter_server": 1.0, "ring": 0.8, "tree": 1.1},
}
AUTO = {
    (2, 4096): ("parameter_server", 1.9),
    (2, 1 << 20): ("parameter_server", 0.6),
    (4, 4096): ("parameter_server", 3.0),
    (4, 1 << 20): ("tree", 1.0),
}


def auto_frame() -> pd.DataFrame:
    rows = []
    for (n, m), ratios in RATIOS.items():
        for algorithm, ratio in ratios.items():
            rows.append({**_allreduce_row(algorithm, n, m), "busbw_vs_torch": ratio})
        choice, ratio = AUTO[(n, m)]
        auto = {**_allreduce_row(choice, n, m), "algorithm": "auto", "busbw_vs_torch": ratio}
        rows.append({**auto, "auto_choice": choice, "auto_predicted_s": 1e-3})
        rows.append(_allreduce_row("torch", n, m))
    return pd.DataFrame(rows)


def sides_beside_auto(auto_s: float, **alternatives: float) -> tuple[pd.DataFrame, pd.Series]:
    """`auto_frame()` whose auto row at N = 2, 4 KiB carries its own time and each
    alternative's, timed beside it (`alt_<algorithm>_s`); and the mask of that row."""
    frame = auto_frame()
    picks = (
        (frame["algorithm"] == "auto")
        & (frame["world_size"] == 2)
        & (frame["message_bytes"] == 4096)
    )
    columns = ["time_s", *(f"alt_{name}_s" for name in alternatives)]
    frame.loc[picks, columns] = [auto_s, *alternatives.values()]
    return frame, picks


def test_auto_is_judged_against_each_cells_best(tmp_path: Path) -> None:
    headline = write_allreduce(auto_frame(), tmp_path)
    (target,) = [t for t in headline["targets"] if t["column"] == "auto_vs_best"]
    assert (target["cells"], target["measured"]) == (4, 4)
    # 1.9/2.0, 0.6/1.2, 3.0/3.0, 1.0/1.1: the worst is N=2, 1 MiB, where ring was best.
    assert target["worst"] == pytest.approx(0.5) and "message_bytes=1048576" in target["worst_key"]
    assert not target["met"] and target["missing"] == [target["worst_key"]]
    assert headline["auto_best_choice_share"] == pytest.approx(0.75)  # all but (2, 1 MiB)
    assert headline["auto_vs_best_worst"] == pytest.approx(0.5)
    assert headline["auto_choice_vs_best_median"] == pytest.approx(1.0)  # 1, 1/1.2, 1, 1
    (finding,) = [f for f in headline["findings"] if "80%" in f["claim"]]
    assert not finding["holds"] and "3 of 4 cells" in finding["detail"]
    report = (tmp_path / "report.md").read_text()
    assert "| 2   | 1 MiB | parameter_server | ring" in report
    assert "traffic_vs_n" in report and "| auto " not in report.split("reproduced")[1][:4000]


def test_a_miss_says_whether_the_choice_moves_the_best_ones_traffic(tmp_path: Path) -> None:
    """At N = 2, 1 MiB auto chose the parameter server and ring was best; in this frame's
    counters both send M each way in two rounds, so the miss is one between algorithms
    with the same traffic. Once ring's counters differ (two messages), it is not."""
    frame = auto_frame()
    headline = write_allreduce(frame, tmp_path)
    assert headline["auto_misses_same_traffic"] == 1
    report = (tmp_path / "report.md").read_text()
    assert "Of the 1 miss, 1 chose an algorithm with the best's traffic counters" in report
    row = next(line for line in report.splitlines() if line.startswith("| 2   | 1 MiB"))
    assert "| yes " in row and "| 4   | 4 KiB" in report
    ring = (frame["algorithm"] == "ring") & (frame["world_size"] == 2)
    frame.loc[ring, "messages"] = 4
    headline = write_allreduce(frame, tmp_path / "other")
    assert headline["auto_misses_same_traffic"] == 0
    row = next(
        line
        for line in (tmp_path / "other" / "report.md").read_text().splitlines()
        if line.startswith("| 2   | 1 MiB")
    )
    assert "| no " in row


def with_rounds(frame: pd.DataFrame, repeats: int = 3) -> pd.DataFrame:
    """`frame` as a paired run writes it: each auto row with every round's time of auto and
    of each algorithm (here each round repeats the algorithm's own cell's time), the
    `alt_<algorithm>_s` medians beside them."""
    import json

    frame = frame.copy()
    frame["round_times_s"] = None
    ours = frame[~frame["algorithm"].isin(["auto", "torch"])]
    for i in frame.index[frame["algorithm"] == "auto"]:
        row = frame.loc[i]
        cell = ours[
            (ours["world_size"] == row["world_size"])
            & (ours["message_bytes"] == row["message_bytes"])
        ]
        rounds = {"time_s": [float(row["time_s"])] * repeats}
        for algorithm, time in zip(cell["algorithm"], cell["time_s"], strict=True):
            rounds[f"alt_{algorithm}_s"] = [float(time)] * repeats
            frame.loc[i, f"alt_{algorithm}_s"] = float(time)
        frame.loc[i, "round_times_s"] = json.dumps(rounds)
    return frame


def test_ci_check_passes_on_it_and_fails_without_auto(tmp_path: Path) -> None:
    frame = with_rounds(auto_frame())
    ci.auto_judged_against_the_best_in_every_cell(frame, write_allreduce(frame, tmp_path))
    unpaired = auto_frame()  # no rounds kept: the check wants them
    with pytest.raises((AssertionError, KeyError)):
        ci.auto_judged_against_the_best_in_every_cell(unpaired, write_allreduce(unpaired, tmp_path))
    no_auto = frame[frame["algorithm"] != "auto"]
    with pytest.raises((AssertionError, KeyError, ValueError)):
        ci.auto_judged_against_the_best_in_every_cell(no_auto, write_allreduce(no_auto, tmp_path))
    wrong_traffic = frame.copy()
    picks = wrong_traffic["algorithm"] == "auto"
    wrong_traffic.loc[picks, "auto_choice"] = "sequential"  # counters are parameter_server's
    with pytest.raises(AssertionError):
        ci.counters_equal_analytic_counts(wrong_traffic, {})


def test_alternatives_timed_beside_auto_decide_its_best() -> None:
    """An auto row carrying `alt_<algorithm>_s` (each alternative timed in the windows
    auto took turns in) is judged against the fastest of them, not against the other
    cells: here the separate cells say parameter_server, the same cell says ring."""
    from bench.experiments.allreduce_scaling.auto import prepare

    frame, picks = sides_beside_auto(2e-4, parameter_server=2.5e-4, ring=1e-4, tree=4e-4)
    got = prepare(frame)
    auto = got[picks].iloc[0]
    assert auto["best_basis"] == "same cell" and auto["best_algorithm"] == "ring"
    assert auto["auto_vs_best"] == pytest.approx(0.5)  # 1e-4 / 2e-4
    assert auto["choice_vs_best"] == pytest.approx(0.4)  # parameter_server: 1e-4 / 2.5e-4
    assert auto["auto_chose_best"] == 0.0
    others = got[(got["algorithm"] == "auto") & ~picks]
    assert set(others["best_basis"]) == {"separate cells"}


def test_rounds_pair_auto_with_each_alternative_and_bound_the_ratio() -> None:
    """With every round's times, each alternative is compared with auto round by round:
    here the host halves its speed every other round (a ratio of medians would see noise),
    yet ring is exactly 0.8 of auto's time in every round, so auto ÷ best is 0.8 with an
    interval of zero width; tree, slower every round, is never the best."""
    import json

    from bench.experiments.allreduce_scaling.auto import prepare

    frame = auto_frame()
    picks = (
        (frame["algorithm"] == "auto")
        & (frame["world_size"] == 4)
        & (frame["message_bytes"] == 4096)
    )
    auto = [1e-3 * (1 + r % 2) for r in range(9)]
    rounds = {
        "time_s": auto,
        "torch_time_s": [2 * t for t in auto],
        "alt_parameter_server_s": auto,
        "alt_ring_s": [0.8 * t for t in auto],
        "alt_tree_s": [1.5 * t for t in auto],
    }
    frame["round_times_s"] = None
    frame.loc[picks, "round_times_s"] = json.dumps(rounds)
    got = prepare(frame)
    row = got[picks].iloc[0]
    assert row["best_basis"] == "same cell, paired by round" and row["best_algorithm"] == "ring"
    assert row["auto_vs_best"] == pytest.approx(0.8)
    assert (row["auto_vs_best_lo"], row["auto_vs_best_hi"]) == pytest.approx((0.8, 0.8))
    assert row["choice_vs_best"] == pytest.approx(0.8)  # parameter_server's side: auto's times
    assert row["auto_chose_best"] == 0.0
    # a noisy alternative: the interval widens and contains the point estimate
    rounds["alt_ring_s"] = [t * (0.7 if r % 3 else 1.3) for r, t in enumerate(auto)]
    frame.loc[picks, "round_times_s"] = json.dumps(rounds)
    row = prepare(frame)[picks].iloc[0]
    assert row["auto_vs_best_lo"] <= row["auto_vs_best"] <= row["auto_vs_best_hi"]
    assert row["auto_vs_best_lo"] < row["auto_vs_best_hi"]
    others = got[(got["algorithm"] == "auto") & ~picks]
    assert set(others["best_basis"]) == {"separate cells"}  # no rounds, no alternatives
    assert others["auto_vs_best_lo"].isna().all()


def test_the_same_code_timed_twice_splits_a_shortfall_from_the_choice(tmp_path: Path) -> None:
    """auto ÷ choice compares auto with its own choice's side (the same code): here auto
    ran the parameter server, whose side read 1.25× faster than auto's, and ring was best,
    so auto ÷ best = 0.5 = 0.8 (auto ÷ choice) × 0.625 (choice ÷ best), exactly. Rows judged
    against separate cells have no same-code side and stay NaN."""
    from bench.experiments.allreduce_scaling.auto import prepare

    frame, picks = sides_beside_auto(2e-4, parameter_server=1.6e-4, ring=1e-4, tree=4e-4)
    got = prepare(frame)
    row = got[picks].iloc[0]
    assert row["auto_vs_choice"] == pytest.approx(0.8)  # 1.6e-4 / 2e-4
    assert row["choice_vs_best"] == pytest.approx(0.625)  # 1e-4 / 1.6e-4
    assert row["auto_vs_best"] == pytest.approx(row["auto_vs_choice"] * row["choice_vs_best"])
    assert got[(got["algorithm"] == "auto") & ~picks]["auto_vs_choice"].isna().all()
    headline = write_allreduce(frame, tmp_path)
    assert headline["auto_same_code_below_bound"] == 1
    assert headline["auto_same_code_worst"] == pytest.approx(0.8)
    report = (tmp_path / "report.md").read_text()
    assert "read below 0.9× of itself in 1 of 1 cell (worst 0.80× at N = 2, 4 KiB)" in report
    assert "auto ÷ choice" in report


def test_split_halves_say_how_reproducible_the_measured_best_is() -> None:
    """A side faster in every round is named best by every half of the rounds (100%); two
    sides with identical times but for a coin-flip per round are named by the halves about
    as often as a coin agrees with itself (well below 100%); one round cannot be split."""
    import numpy as np

    from bench.experiments.allreduce_scaling.paired_rounds import split_agreement

    own = np.full(24, 1e-3)
    clear = {"ring": own * 0.5, "tree": own * 0.9}
    assert split_agreement((own, clear)) == 1.0
    flips = np.random.default_rng(1).integers(0, 2, 24)
    coin = {"ring": own * np.where(flips, 0.9, 1.1), "tree": own * np.where(flips, 1.1, 0.9)}
    assert 0.2 < split_agreement((own, coin)) < 0.9
    assert np.isnan(split_agreement((own[:1], {"ring": own[:1]})))
