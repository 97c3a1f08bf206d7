"""How every experiment times a step, written once (the nccl-tests pattern: the harness
owns timing and checking, the experiment supplies the step).

A timed step opens with a barrier, so every rank starts together, and its time is the
slowest rank's: a distributed step is done only when every rank is done. `alternate`
times several *sides* — the implementation under test and its twin (torch's, or the
same code with another setting) — in rounds: within a round each side takes one step in
turn, so whatever drifts on the host (load, caches, frequency) hits every side alike and
the ratio of their medians is a side-by-side measurement. Warm-up rounds run first and
are not recorded.

The harness's own synchronisation (barrier, max over ranks) uses torch.distributed's
collectives: they bracket the timed region and are the same for every side compared.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from impls.pairing import calls_per_window, turns

__all__ = ["Timed", "alternate", "calibrate_iters", "slowest", "timed_step"]


def slowest(seconds: float, group: Any = None) -> float:
    """The largest of every rank's `seconds` (the slowest rank sets a step's time)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def timed_step(
    step: Callable[[], Any], group: Any = None, iters: int = 1
) -> tuple[Any, float, float]:
    """Barrier, then `iters` calls of `step`: (the last outcome, the slowest rank's seconds
    per call, this rank's own seconds per call)."""
    dist.barrier(group=group)
    start = time.perf_counter()
    outcome = None
    for _ in range(iters):
        outcome = step()
    own = (time.perf_counter() - start) / iters
    return outcome, slowest(own, group), own


@dataclass
class Timed:
    """One side's recorded steps: outcomes, slowest-rank seconds and this rank's own."""

    outcomes: list[Any] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else math.nan


def alternate(
    sides: Mapping[str, Callable[[], Any]],
    *,
    warmup: int,
    repeats: int,
    group: Any = None,
    iters: Mapping[str, int] | None = None,
    balanced: bool = False,
) -> dict[str, Timed]:
    """Time every side over `repeats` rounds after `warmup` unrecorded ones; within a round
    the sides take turns. A side's step may be repeated `iters[side]` times back to back
    (a window, for calls too short to time one by one); its time is then per call. With
    `balanced`, round r takes the order r mod len(orders) of `balanced_orders` (a Williams
    design), so every side runs in every position, and right after every other side,
    equally often over k rounds (2k for an odd number k of sides): whatever one side
    leaves behind (sockets, caches, a rank descheduled) falls on each side alike. Without,
    the listed order every round."""
    timed = {name: Timed() for name in sides}
    listed = list(sides.items())
    for round_, i in turns(len(listed), warmup + repeats, balanced=balanced):
        name, step = listed[i]
        outcome, seconds, own = timed_step(step, group, (iters or {}).get(name, 1))
        if round_ >= warmup:
            timed[name].outcomes.append(outcome)
            timed[name].seconds.append(seconds)
            timed[name].own.append(own)
    return timed


def calibrate_iters(
    step: Callable[[], Any], window_s: float, max_iters: int, group: Any = None, probes: int = 3
) -> int:
    """Calls per window so that a window lasts about `window_s`, from the median of `probes`
    timed calls (each the slowest rank's, so every rank agrees on the count): one call
    alone can land on a rank waking up and read several times its usual time."""
    probe = statistics.median(timed_step(step, group)[1] for _ in range(max(1, probes)))
    return calls_per_window(probe, window_s, max_iters)
