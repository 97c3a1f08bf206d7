"""Timing several sides in turns: the order of the turns and one time per side.

A host whose speed drifts between phases lasting seconds ranks whatever it times partly by
which phase each side landed in. Two remedies, used wherever sides are compared (the
all-reduce tuner's calibration, `bench.kit.timing.alternate`, planner_validation's
reference rounds):

- `balanced_orders`: in each round every side takes one turn, in an order under which,
  over the rounds, each side runs in every position and right after every other side
  equally often, so no side always follows the same one;
- `paired_times`: each round's phase is taken out before the sides are compared across
  rounds;
- `turns`: the (round, side) turns of a whole run, round after round in those orders;
- `calls_per_window`: how many calls fill a window, from a probe's time per call;
- `common_count`: one count of calls per window for every side."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch

__all__ = ["balanced_orders", "calls_per_window", "common_count", "paired_times", "turns"]


def balanced_orders(k: int) -> list[list[int]]:
    """Orders of k sides for rounds of turns in which each side runs in every position,
    and right after every other side, equally often over the returned rounds: a Williams
    design (E. J. Williams 1949, "Experimental designs balanced for the estimation of
    residual effects of treatments", Australian J. Sci. Res. A 2(3)). Row 0 is
    0, 1, k−1, 2, k−2, …; row i adds i mod k. For even k those k rows are balanced; for
    odd k the k rows and their reverses (2k rows). A plain rotation (round r starts at
    side r mod k) is not: it keeps each side's predecessor the same in every round."""
    if k < 1:
        raise ValueError(f"k={k}: need at least one side")
    first = [(j + 1) // 2 if j % 2 else (k - j // 2) % k for j in range(k)]
    rows = [[(a + i) % k for a in first] for i in range(k)]
    return rows if k % 2 == 0 or k == 1 else rows + [row[::-1] for row in rows]


def turns(k: int, rounds: int, *, balanced: bool = True) -> Iterator[tuple[int, int]]:
    """The turns of `rounds` rounds of k sides, as (round, side) pairs in the order they
    are taken: round r in order r mod len(orders) of `balanced_orders(k)`, or, without
    `balanced`, sides 0 … k−1 every round."""
    if rounds < 0:
        raise ValueError(f"rounds={rounds}: need zero or more rounds")
    orders = balanced_orders(k) if balanced else [list(range(k))]
    for r in range(rounds):
        for side in orders[r % len(orders)]:
            yield r, side


def calls_per_window(probe_s: float, window_s: float, max_iters: int) -> int:
    """The calls that fill `window_s` at `probe_s` seconds a call: at least one, at most
    `max_iters`."""
    return max(1, min(max_iters, math.ceil(window_s / max(probe_s, 1e-9))))


def common_count(counts: Iterable[int]) -> int:
    """The calls per window every side takes: the median of the counts their probes asked
    for (the lower middle one of an even number).

    A window's fixed costs (ranks leaving the barrier apart, the first call's wake-up) are
    shared by its calls, so a side given more calls per window reads faster per call: at
    8 ranks on 2 cores the parameter server at 64 KiB read 2.50 ms per call at 7 calls and
    3.85 ms at 3, and one probe call's luck scattered the counts from 1 to 12 between
    algorithms at one size; ring ÷ torch at N = 2, 4 MiB read 0.36x in CI with each side
    on its own count. With one count those costs weigh alike on every side."""
    ordered = sorted(counts)
    if not ordered:
        raise ValueError("common_count of no counts")
    return ordered[(len(ordered) - 1) // 2]


def paired_times(windows: torch.Tensor) -> torch.Tensor:
    """One time per side from `windows[side, round]` (seconds, > 0), paired by round: each
    round's host phase, the median log-time of its sides, is taken out before the median
    over rounds, and the median phase put back. Medians are torch's: the lower of the two
    middle values for an even count. Sides timed in the same rounds are then ranked by how
    they compare within a round (as `allreduce_scaling` judges them), not by which rounds
    fell in a slow phase of a host whose speed drifts."""
    logs = windows.log()
    phase = logs.median(dim=0).values  # per round
    relative = (logs - phase).median(dim=-1).values  # per side
    return (relative + phase.median()).exp()
