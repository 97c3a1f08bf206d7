"""Alpa's inter-operator pass: cut a chain of layers into pipeline stages.

Zheng et al. 2022, "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed
Deep Learning" (OSDI '22), §5.1–5.2. With B micro-batches, a 1F1B/GPipe step takes about

    T* = Σᵢ tᵢ + (B − 1) · maxᵢ tᵢ                                   (Eq. 2)

where tᵢ is stage i's forward + backward time of one micro-batch: the first micro-batch
crosses every stage once, the other B − 1 queue behind the slowest stage. Alpa minimises
Eq. 2 by enumerating t_max, the bound on every tᵢ, over the distinct values a stage can
take (the sums of contiguous layer ranges, sorted), solving for each a DP that minimises
Σ tᵢ with every tᵢ ≤ t_max (Algorithm 1), keeping the best T* and stopping once
(B − 1) · t_max alone reaches it. How this repo's pass departs from it (one mesh, bisection, memory): `alpa_stage_slicing`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from itertools import accumulate

__all__ = ["alpa_chain_slicing", "alpa_stage_slicing", "pipeline_objective"]

StageBytes = Callable[[int, int, int], float]
"""(first layer, last layer (inclusive), stage index) -> bytes that stage needs."""


def pipeline_objective(
    layer_seconds: Sequence[float], counts: Sequence[int], microbatches: int
) -> float:
    """Eq. 2 of Alpa for the cut `counts` (layers per stage)."""
    times, start = [], 0
    for count in counts:
        times.append(sum(layer_seconds[start : start + count]))
        start += count
    return sum(times) + (microbatches - 1) * max(times)


def _stage_bytes(layer_bytes: Sequence[float] | StageBytes) -> StageBytes:
    if callable(layer_bytes):
        return layer_bytes
    prefix = [0.0, *accumulate(float(b) for b in layer_bytes)]
    return lambda first, last, _stage: prefix[last + 1] - prefix[first]


def _check(layer_seconds: Sequence[float], layer_bytes, stages: int, microbatches: int) -> None:
    layers = len(layer_seconds)
    for key, value in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}: must be an integer ≥ 1")
    if stages > layers:
        raise ValueError(f"stages={stages}: more stages than the {layers} layers")
    if any(not math.isfinite(t) or t < 0 for t in layer_seconds):
        raise ValueError("layer_seconds: every entry must be a finite number ≥ 0")
    if not callable(layer_bytes) and len(layer_bytes) != layers:
        raise ValueError(
            f"layer_bytes: needs {layers} entries (one per layer) or a callable "
            "(first, last, stage) -> bytes"
        )


_TOLERANCE = 1e-9
"""Range sums closer than this (relative) are one candidate t_max: equal layers summed in a
different order differ in the last bits, and would otherwise multiply the candidates."""


def _distinct(values) -> list[float]:
    out: list[float] = []
    for v in sorted(values):
        if not out or v > out[-1] * (1 + _TOLERANCE / 10):
            out.append(v)
    return out


def _cut(prefix: list[float], stages: int, t_max: float, fits) -> tuple[int, ...] | None:
    """Algorithm 1's DP for one t_max: a cut into `stages` stages, each ≤ t_max and fitting,
    of the smallest (Σ tᵢ, Σ tᵢ²); None when there is none.

    best[s][j] covers layers [0, j) with s stages; a stage [i, j) is allowed when its time
    prefix[j] − prefix[i] ≤ t_max (times ≥ 0, so i only needs to go back while it holds).
    """
    layers = len(prefix) - 1
    inf = (math.inf, math.inf)
    best = [[inf] * (layers + 1) for _ in range(stages + 1)]
    choice = [[-1] * (layers + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0.0)
    slack = t_max * _TOLERANCE
    for s in range(1, stages + 1):
        # stage s − 1 ends at j: leave ≥ 1 layer for each of the stages still to come
        for j in range(s, layers - (stages - s) + 1):
            i = j - 1
            while i >= s - 1 and prefix[j] - prefix[i] <= t_max + slack:
                before = best[s - 1][i]
                if before[0] < math.inf and fits(i, j - 1, s - 1):
                    t = prefix[j] - prefix[i]
                    value = (before[0] + t, before[1] + t * t)
                    if value < best[s][j]:
                        best[s][j], choice[s][j] = value, i
                i -= 1
    if best[stages][layers][0] == math.inf:
        return None
    counts, j = [], layers
    for s in range(stages, 0, -1):
        i = choice[s][j]
        counts.append(j - i)
        j = i
    return tuple(reversed(counts))


def alpa_stage_slicing(
    layer_seconds: Sequence[float],
    layer_bytes: Sequence[float] | StageBytes,
    stages: int,
    microbatches: int,
    memory_limit: float | None = None,
) -> tuple[int, ...] | None:
    """Layers per stage minimising Alpa's Eq. 2 with every stage within `memory_limit`.

    `layer_seconds[l]`: forward + backward seconds of layer l for one micro-batch;
    `layer_bytes`: per-layer bytes summed over a stage, or a callable
    (first, last, stage) -> bytes (`last` inclusive); `memory_limit` None: no limit.
    Returns None when no cut fits in memory (ValueError only for malformed arguments).

    Here every stage runs on the same mesh, so tᵢ is the sum of its layers' times and Σ tᵢ is
    the same for every cut (the whole model): the DP reduces to "is there a cut with every
    stage ≤ t_max that fits in memory", the smallest feasible t_max wins, and the early exit
    uses the lower bound Σ tᵢ ≥ Σ layers (so it stops at the first feasible t_max). Feasibility
    only grows with t_max, so the first feasible candidate is found by bisection rather than a
    linear scan (the same answer, log₂ of the work). Among cuts of equal T* the DP keeps the
    one with the smallest Σ tᵢ² (the most balanced), so equal layers give equal stages.

    Memory (Alpa §5.2 keeps a stage within its submesh's memory): a stage's bytes are the sum
    of `layer_bytes` over its layers, or, when `layer_bytes` is a callable
    (first, last, stage) -> bytes, whatever the caller computes, e.g. 1F1B's stage s holding
    P − s micro-batches in flight.
    """
    _check(layer_seconds, layer_bytes, stages, microbatches)
    stage_bytes = _stage_bytes(layer_bytes)
    limit = math.inf if memory_limit is None else memory_limit

    def fits(first: int, last: int, stage: int) -> bool:
        return stage_bytes(first, last, stage) <= limit

    prefix = [0.0, *accumulate(float(t) for t in layer_seconds)]
    layers = len(layer_seconds)
    candidates = _distinct(
        prefix[j] - prefix[i] for i in range(layers) for j in range(i + 1, layers + 1)
    )
    # the smallest feasible t_max (feasibility is monotone in t_max)
    lo, hi = 0, len(candidates) - 1
    if _cut(prefix, stages, candidates[hi], fits) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _cut(prefix, stages, candidates[mid], fits) is None:
            lo = mid + 1
        else:
            hi = mid
    best_value, best_cut = math.inf, None
    floor = prefix[-1]  # Σ tᵢ is at least the whole model
    for t_max in candidates[lo:]:
        if floor + (microbatches - 1) * t_max >= best_value * (1 - 1e-12):
            break  # Alpa's early exit, with Σ tᵢ bounded below by the whole model
        cut = _cut(prefix, stages, t_max, fits)
        if cut is None:
            continue
        value = pipeline_objective(layer_seconds, cut, microbatches)
        if value < best_value:
            best_value, best_cut = value, cut
    return best_cut


def alpa_chain_slicing(
    first_seconds: float,
    body_seconds: float,
    last_seconds: float,
    body_layers: int,
    stages: int,
    fits: Callable[[int, int], bool] | None = None,
) -> tuple[int, ...] | None:
    """`alpa_stage_slicing` for a chain of one first layer, `body_layers` identical layers
    and one last layer (a transformer's embedding, blocks and LM head), in O(S log L).

    A cut is then the number kₛ of body layers per stage (the first layer on stage 0, the
    last on stage S − 1), and `fits(stage, k)` says whether stage `stage` holding k body
    layers (and its end layer) fits; it must only turn False as k grows. For a t_max each
    stage takes kₛ in an interval [minₛ, maxₛ(t_max)], so a cut exists iff Σ minₛ ≤ L ≤
    Σ maxₛ: the smallest such t_max among the stage times a cut can have (bisection) is
    Eq. 2's optimum (Σ tᵢ is the whole chain for every cut, so the answer does not depend
    on B). The most balanced cut within it (least Σ tᵢ², as the DP's tie-break) is water-
    filling: add body layers one by one to the stage that is shortest now (ties: the
    earlier stage), which is exact for a sum of convex terms under box constraints.
    Returns stage layer counts including the end layers, or None when nothing fits.
    """
    n, s_count = body_layers, stages
    if s_count < 2 or n + 2 < s_count:
        raise ValueError(f"stages={stages}: needs 2 ≤ stages ≤ body_layers + 2 = {n + 2}")
    extra = [0.0] * s_count
    extra[0] += first_seconds
    extra[-1] += last_seconds
    low = [0 if s in (0, s_count - 1) else 1 for s in range(s_count)]

    def memory_cap(stage: int) -> int:
        """The most body layers the stage holds in memory (−1: not even its minimum)."""
        ok = (lambda k: True) if fits is None else (lambda k: fits(stage, k))
        if not ok(low[stage]):
            return -1
        lo, hi = low[stage], n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
        return lo

    caps = [memory_cap(s) for s in range(s_count)]
    if min(c - m for c, m in zip(caps, low, strict=True)) < 0 or sum(caps) < n:
        return None

    def cap(stage: int, t_max: float) -> int:
        if body_seconds <= 0:
            return caps[stage]
        room = (t_max - extra[stage]) / body_seconds
        return min(caps[stage], math.floor(room * (1 + _TOLERANCE) + _TOLERANCE))

    def feasible(t_max: float) -> bool:
        tops = [cap(s, t_max) for s in range(s_count)]
        return all(t >= m for t, m in zip(tops, low, strict=True)) and sum(tops) >= n

    candidates = _distinct(e + k * body_seconds for e in set(extra) for k in range(n + 1))
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if feasible(candidates[mid]) else (mid + 1, hi)
    t_max = candidates[lo]
    tops = [cap(s, t_max) for s in range(s_count)]
    counts = list(low)
    queue = [
        (extra[s] + counts[s] * body_seconds, s) for s in range(s_count) if counts[s] < tops[s]
    ]
    heapq.heapify(queue)
    for _ in range(n - sum(low)):
        _, s = heapq.heappop(queue)
        counts[s] += 1
        if counts[s] < tops[s]:
            heapq.heappush(queue, (extra[s] + counts[s] * body_seconds, s))
    return tuple(k + (s == 0) + (s == s_count - 1) for s, k in enumerate(counts))
