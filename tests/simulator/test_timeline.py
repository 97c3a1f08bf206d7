"""The compiled replay against the reference `impls.pipeline.replay.replay`.

A failure means the simulator's fast path places actions differently from the replay the
pipeline package tests against the papers: its bubbles could no longer be trusted.
"""

from __future__ import annotations

import random

import pytest

from impls.pipeline.replay import replay
from impls.simulator.timeline import KIND_INDEX, compile_schedule, evaluate

CASES = [
    ("gpipe", 4, 6, 1),
    ("1f1b", 4, 6, 1),
    ("1f1b", 3, 2, 1),
    ("naive", 3, 1, 1),
    ("interleaved_1f1b", 2, 4, 3),
    ("interleaved_1f1b", 4, 8, 2),
    ("zero_bubble_h1", 4, 8, 1),
    ("zero_bubble_h1", 3, 2, 1),
    ("1f1b", 1, 5, 1),
]


@pytest.mark.parametrize(("name", "pp", "m", "v"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_reference_replay(name, pp, m, v, seed):
    rng = random.Random(seed)
    stages = pp * v
    table = []
    for _ in range(stages):
        f, i, w = (rng.uniform(0.5, 2.0) for _ in range(3))
        table.append((f, i, w, i + w))
    sends_f = [rng.uniform(0.0, 0.3) for _ in range(stages)]
    sends_b = [rng.uniform(0.0, 0.3) for _ in range(stages)]
    compiled = compile_schedule(name, pp, m, v)

    def duration(action):
        return table[action.stage][KIND_INDEX[action.kind]]

    def transfer(action):
        return (sends_f if action.kind == "SEND_F" else sends_b)[action.stage]

    for fast, slow in [
        (evaluate(compiled, table), replay(compiled.plan, duration, 0.0, stages)),
        (
            evaluate(compiled, table, sends_f, sends_b),
            replay(compiled.plan, duration, transfer, stages),
        ),
    ]:
        assert fast.makespan == pytest.approx(slow.makespan, rel=1e-12)
        assert fast.busy == pytest.approx(slow.busy, rel=1e-12)
        for r in range(pp):
            last = max(s.end for s in slow.spans if s.rank == r)
            assert fast.ends[r] == pytest.approx(last, rel=1e-12)
