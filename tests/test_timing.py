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


def test_calibrate_iters_sizes_the_window_from_the_median_probe_not_one_slow_call(monkeypatch):
    """A 4 KiB all-reduce here reads ~0.1 ms, or several ms when a rank is waking up: one
    such probe had set 3 calls a window where the next cell got 150."""
    probes = iter([0.008, 0.0001, 0.0001])
    monkeypatch.setattr(timing, "timed_step", lambda step, group: (None, next(probes), 0.0))
    assert timing.calibrate_iters(lambda: None, window_s=0.02, max_iters=500) == 200
    probes = iter([0.008])
    assert timing.calibrate_iters(lambda: None, 0.02, 500, probes=1) == 3  # one probe: fooled
    probes = iter([1e-7] * 3)
    assert timing.calibrate_iters(lambda: None, 0.02, 500) == 500  # capped at max_iters
    probes = iter([1.0] * 3)
    assert timing.calibrate_iters(lambda: None, 0.02, 500) == 1  # a window is one call at least


def test_a_paired_collective_cell_gives_both_sides_one_count_and_a_balanced_order(monkeypatch):
    """ring ÷ torch at N = 2, 4 MiB read 0.36x in CI and 0.79–1.04x in seven runs here
    once both sides ran one count of calls per window in turns AB, BA, …"""
    from types import SimpleNamespace

    from bench.experiments.allreduce_scaling.config import AllReduceScalingConfig
    from bench.kit import collectives as kit

    counts = iter([6, 59])  # each side's own probe: ring read slow, torch fast
    seen = {}

    def spy_alternate(sides, *, warmup, repeats, group, iters, balanced):
        seen.update(iters=dict(iters), balanced=balanced, sides=list(sides))
        return {name: timing.Timed(seconds=[1e-3] * repeats) for name in sides}

    bufs = SimpleNamespace(
        run_distbench=lambda: None,
        run_torch=lambda: None,
        expected=None,
        run_algorithm=None,
        fill=lambda pattern: None,
    )
    spec = SimpleNamespace(build=lambda comm, numel, dtype, algorithm: bufs)
    comm = SimpleNamespace(
        group=None, reset_counters=lambda: None, counters=SimpleNamespace(as_dict=lambda: {})
    )
    monkeypatch.setattr(kit, "Communicator", lambda: comm)
    monkeypatch.setitem(kit.COLLECTIVES, "all_reduce", spec)
    monkeypatch.setattr(kit, "calibrate_iters", lambda step, window_s, top, group: next(counts))
    monkeypatch.setattr(kit, "alternate", spy_alternate)
    cfg = AllReduceScalingConfig(
        algorithms=["ring"], world_sizes=[2], message_bytes=[4 << 20], repeats=5, warmup=0
    )
    cell = SimpleNamespace(
        carry=kit.CollectiveCall("all_reduce", "distbench", "ring"), key={"message_bytes": 4 << 20}
    )
    row = kit.measure_collective(cfg, cell)
    assert seen == {
        "iters": {"time_s": 6, "torch_time_s": 6},
        "balanced": True,
        "sides": ["time_s", "torch_time_s"],
    }
    assert row["iters"] == 6 and row["time_s"] == row["torch_time_s"] == 1e-3
