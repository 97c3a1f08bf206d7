"""`impls.pairing`: the order sides take their turns in, and one time per side paired by
round.

A failure means a side would always run in the same position of a round, or right after
the same other side, or be ranked by which rounds fell in a slow phase of the host rather
than by how it compares with the others within a round: whatever the host does would
bias one side's measurement only."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from impls.pairing import balanced_orders, calls_per_window, common_count, paired_times, turns


@pytest.mark.parametrize("k", range(1, 10))
def test_balanced_orders_are_a_williams_design(k):
    rows = balanced_orders(k)
    assert len(rows) == (k if k % 2 == 0 or k == 1 else 2 * k)
    assert all(sorted(row) == list(range(k)) for row in rows)  # each a permutation
    repeats = len(rows) // k
    positions = Counter((row[j], j) for row in rows for j in range(k))
    assert set(positions.values()) == {repeats} and len(positions) == k * k
    followers = Counter((row[j], row[j + 1]) for row in rows for j in range(k - 1))
    assert len(followers) == k * (k - 1)  # every ordered pair of distinct sides …
    assert set(followers.values()) <= {repeats}  # … equally often


def test_a_rotation_would_not_be_balanced():
    """What the design fixes: rotating one order keeps each side's predecessor."""
    rotated = [[(j + i) % 4 for j in range(4)] for i in range(4)]
    followers = Counter((row[j], row[j + 1]) for row in rotated for j in range(3))
    assert len(followers) == 4  # only (0,1), (1,2), (2,3), (3,0): 4 of the 12 pairs


def test_balanced_orders_refuse_no_sides():
    with pytest.raises(ValueError, match="k=0"):
        balanced_orders(0)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_turns_take_the_rounds_in_the_balanced_orders(k):
    rounds = 2 * len(balanced_orders(k)) + 1  # wraps around the design, and a partial one
    taken = list(turns(k, rounds))
    assert len(taken) == k * rounds
    assert [r for r, _ in taken] == [r for r in range(rounds) for _ in range(k)]
    orders = balanced_orders(k)
    for r in range(rounds):
        assert [i for q, i in taken if q == r] == orders[r % len(orders)]
    plain = list(turns(k, 3, balanced=False))
    assert plain == [(r, i) for r in range(3) for i in range(k)]


def test_turns_refuse_a_negative_round_count_and_take_none_for_zero():
    with pytest.raises(ValueError, match="rounds=-1"):
        list(turns(3, -1))
    assert list(turns(3, 0)) == []


def test_paired_times_rank_sides_within_rounds_not_by_which_rounds_were_slow():
    # The host slows down round after round; side 1 is 10% faster than side 0 in every
    # round but the one where it was disturbed (2x). The medians of each side's windows
    # rank it behind side 0; paired by round, it is ahead, as in 4 of its 5 rounds.
    phase = torch.arange(1.0, 6.0, dtype=torch.float64) * 1e-3
    windows = torch.stack([phase, 0.9 * phase, 2 * phase])
    windows[1, 2] *= 2
    assert windows.median(dim=-1).values.argmin() == 0  # what calibrate used to keep
    times = paired_times(windows)
    assert times.argmin() == 1 and times[0] < times[2]
    torch.testing.assert_close(times[0] / times[1], torch.tensor(1 / 0.9, dtype=torch.float64))
    steady = torch.tensor([[2e-3] * 4, [1e-3] * 4], dtype=torch.float64)
    torch.testing.assert_close(
        paired_times(steady), torch.tensor([2e-3, 1e-3], dtype=torch.float64)
    )


def test_common_count_is_the_lower_median_of_the_sides_counts():
    assert common_count([7]) == 7 and common_count([3, 1, 8, 2]) == 2
    assert common_count({"time_s": 6, "torch_time_s": 59}.values()) == 6
    assert common_count(iter([150, 3, 90, 120])) == 90
    with pytest.raises(ValueError, match="no counts"):
        common_count([])


def test_calls_per_window_fill_the_window_within_one_and_max_iters():
    assert calls_per_window(0.008, 0.02, 500) == 3
    assert calls_per_window(1e-7, 0.02, 500) == 500
    assert calls_per_window(1.0, 0.02, 500) == 1
    assert calls_per_window(0.0, 0.02, 500) == 500  # a zero probe: the cap, not a division
