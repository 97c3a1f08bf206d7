"""`bench.kit.timing.alternate`: the order sides take their turns in.

A failure means a side would always run in the same position of a round, or right after
the same other side, so whatever that side leaves behind would bias one measurement only."""

from __future__ import annotations

from collections import Counter

from bench.kit import timing


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
