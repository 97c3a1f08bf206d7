"""What a blocking collective costs where the ranks computed before it: their meeting.

A collective that follows compute is a meeting of the ranks: the first to arrive waits
for the last, and on this repo's host (2 vCPUs under KVM) a rank that waited long enough
for its core to go idle is slow to run again. Back-to-back calls measure neither: both
ranks arrive together and never idle. `probe` times, on every rank of a pool, in rounds
of `per_round` iterations each, three loops taking turns in every round (each started
after a barrier; the rounds in `impls.pairing.turns`' balanced orders, whole designs of
three sides every six rounds):

- *segment*: `gemms` 128 × 128 fp32 matmuls on one thread (≈ `segment_s` seconds; the
  count agreed over the ranks), the ranks computing side by side without meeting;
- *meeting*: the same segment, then a one-element ring all-reduce (`impls.collectives`);
- *call*: that all-reduce alone, back to back (what a ring fit of back-to-back calls sees).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from impls.pairing import turns

__all__ = ["CALL", "MEETING_SEGMENT_S", "measure", "probe"]

MEETING_SEGMENT_S = 0.004
"""Compute before each meeting of the probe (seconds): about what a ZeRO rank of
`zero_memory` computes between two of its collectives."""
_SIDE = 128  # the probe's matmul: (128 × 128)·(128 × 128)
CALL = "ring all-reduce of one float32"
"""The probe's collective: 2(N − 1) rounds of 4 bytes or less, on a link α–β priced
2(N − 1)·α + 2(N − 1)/N · 4 bytes · β."""


def probe(segment_s: float = MEETING_SEGMENT_S, rounds: int = 12, per_round: int = 20) -> dict:
    """The meeting's cost on this pool (collective: every rank calls it; see the module
    docstring). Returns every rank the same dict: `after_compute_s`, the medians over the
    rounds of each loop's seconds per iteration (`segment_s`, `iteration_s`, `call_s`),
    the call (`"ring all-reduce of one float32"`), `gemms`, `rounds`, `per_round` and
    `world_size`.

    What one call costs after compute is, per round, meeting − segment (the slowest rank's
    time of each loop), and the median over the rounds (`after_compute_s`); the same call back
    to back is `call_s`. On a shared host the first stays high in the host's fast phases and
    slow ones alike, while the second swings with them: what a link fitted to back-to-back
    calls leaves out is after_compute_s less that link's price of the call (`planner_validation`
    prices it as `Hardware.collective_meeting_s`). The rounds are short and take turns, so the
    host's drift between phases hits the three loops alike.
    """
    from impls.collectives import all_reduce
    from impls.comm import Communicator

    _check(segment_s, rounds, per_round)
    comm, before = Communicator(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(_SIDE, _SIDE, generator=torch.Generator().manual_seed(0))
        flag = torch.zeros(1)
        for _ in range(20):
            torch.mm(a, a)
        start = time.perf_counter()
        for _ in range(50):
            torch.mm(a, a)
        each = torch.tensor([(time.perf_counter() - start) / 50], dtype=torch.float64)
        dist.all_reduce(each, op=dist.ReduceOp.MAX)
        gemms = max(1, round(segment_s / float(each)))

        def segment() -> None:
            for _ in range(gemms):
                torch.mm(a, a)

        def call() -> None:
            all_reduce(flag, comm, op="sum", algorithm="ring")

        def meeting() -> None:
            segment()
            call()

        loops: dict[str, Callable[[], None]] = {
            "segment": segment,
            "meeting": meeting,
            "call": call,
        }
        for loop in loops.values():  # warm-up, and the all-reduce's first connection
            loop()
        names = list(loops)
        times = torch.zeros(len(names), rounds, dtype=torch.float64)
        for r, i in turns(len(names), rounds):  # the project's balanced orders of turns
            dist.barrier()
            start = time.perf_counter()
            for _ in range(per_round):
                loops[names[i]]()
            times[i, r] = (time.perf_counter() - start) / per_round
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # each loop: the slowest rank's
    finally:
        torch.set_num_threads(before)
    seg, met, one = (times[names.index(n)].tolist() for n in ("segment", "meeting", "call"))
    after = [m - s for s, m in zip(seg, met, strict=True)]  # paired within each round
    return {
        "after_compute_s": statistics.median(after),
        "segment_s": statistics.median(seg),
        "iteration_s": statistics.median(met),
        "call_s": statistics.median(one),
        "call": CALL,
        "gemms": gemms,
        "rounds": rounds,
        "per_round": per_round,
        "world_size": comm.world_size,
    }


def _check(segment_s: float, rounds: int, per_round: int) -> None:
    if not segment_s > 0 or rounds < 1 or per_round < 1:
        raise ValueError(
            f"segment_s={segment_s}, rounds={rounds}, per_round={per_round}: "
            "need segment_s > 0 and at least one round of one iteration"
        )


def measure(
    world_size: int = 2,
    segment_s: float = MEETING_SEGMENT_S,
    rounds: int = 12,
    per_round: int = 20,
    timeout_s: float = 300.0,
) -> dict:
    """`probe` on a fresh pool of `world_size` gloo ranks, in a child interpreter.

    `measure` runs the probe on a fresh pool in a child interpreter (`python -m
    bench.kit.meeting`): a rank of another pool is a daemonic process, which may not start
    processes of its own.
    """
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: a meeting needs at least 2 ranks")
    _check(segment_s, rounds, per_round)
    args = [
        sys.executable,
        "-m",
        "bench.kit.meeting",
        f"--world-size={world_size}",
        f"--segment-s={segment_s}",
        f"--rounds={rounds}",
        f"--per-round={per_round}",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"the meeting probe on {world_size} ranks failed: " + " | ".join(tail))
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--segment-s", type=float, default=MEETING_SEGMENT_S)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--per-round", type=int, default=20)
    args = parser.parse_args(argv)
    from bench.launch import run_on_ranks

    results = run_on_ranks(probe, args.world_size, args.segment_s, args.rounds, args.per_round)
    print(json.dumps(results[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
