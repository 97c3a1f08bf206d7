"""`bench.kit.timing.alternate`: the order sides take their turns in.

A failure means a side would always run in the same position of a round (after the same
other side), so whatever that side leaves behind would bias one measurement only."""

from __future__ import annotations

from bench.kit import timing


def test_rotation_puts_every_side_in_every_position(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(timing, "timed_step", lambda step, group, iters: (step(), 1.0, 1.0))
    sides = {name: (lambda name=name: order.append(name)) for name in "abc"}
    timed = timing.alternate(sides, warmup=1, repeats=3, rotate=True)
    assert "".join(order) == "abc" + "bca" + "cab" + "abc"  # a warm-up round, then 3
    assert all(len(t.seconds) == 3 for t in timed.values())
    order.clear()
    timing.alternate(sides, warmup=0, repeats=2)
    assert "".join(order) == "abcabc"  # without rotate: the listed order every round
