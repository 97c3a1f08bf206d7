"""`bench.kit.timing.alternate`: the order sides take their turns in.

A failure means a side would always run in the same position of a round, or right after
the same other side, so whatever that side leaves behind would bias one measurement only."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.kit import timing
from impls.pairing import balanced_orders


def test_balanced_rounds_put_every_side_in_every_position_after_every_other(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(timing, "timed_step", lambda step, group, iters: (step(), 1.0, 1.0))
    sides = {name: (lambda name=name: order.append(name)) for name in "abcd"}
    timed = timing.alternate(sides, warmup=1, repeats=4, balanced=True)
    rounds = ["".join(order[i : i + 4]) for i in range(0, len(order), 4)]
    assert rounds == ["abdc", "bcad", "cdba", "dacb", "abdc"]  # the first is a warm-up
    recorded = rounds[1:]  # rows 1, 2, 3, 0 of the design: each order once
    assert all(len(t.seconds) == 4 for t in timed.values())
    assert set(Counter((r[j], j) for r in recorded for j in range(4)).values()) == {1}
    assert set(Counter((r[j], r[j + 1]) for r in recorded for j in range(3)).values()) == {1}
    order.clear()
    timing.alternate(sides, warmup=0, repeats=2)
    assert "".join(order) == "abcdabcd"  # unbalanced: the listed order every round


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
