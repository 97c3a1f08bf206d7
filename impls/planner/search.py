"""Search the plan space for the highest predicted throughput, screening with exact bounds.

Every plan of `plan_space` is a candidate with equal slicing; every plan with one stage
per rank and pp > 1 is also a candidate with Alpa's slicing (`alpa_stage_slicing` over the
simulator's per-layer seconds and the memory each stage needs with its schedule's
in-flight micro-batches; Zheng et al. 2022 §5). Candidates are ranked by the simulator's
tokens/s (`impls.simulator.simulate`).

Simulating all of them is too slow at scale (tens of thousands of plans for a 1T model on
3072 GPUs), so `search` is a best-first branch and bound whose screens never drop a plan
that could enter the answer (`impls.planner.bounds`); `tests/planner/test_search.py`
checks it against simulating every plan of small spaces.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, replace

from impls.costmodel.compute import TransformerSpec
from impls.costmodel.hardware import Hardware
from impls.planner.bounds import (
    LayerTable,
    MemoryModel,
    inflight,
    layer_table,
    memory_bound,
    memory_bound_any_cut,
    time_bound,
    time_bound_any_cut,
)
from impls.planner.explain import explain
from impls.planner.slicing import alpa_chain_slicing, alpa_stage_slicing
from impls.planner.space import plan_space
from impls.simulator import ParallelPlan, Prediction, simulate, stage_slices

__all__ = ["LOSERS_KEPT", "Candidate", "SearchResult", "alpa_candidate", "search"]

LOSERS_KEPT = 5
"""Fitting plans ranked just below the top_k, and non-fitting ones, kept in `rejected`."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    plan: ParallelPlan
    prediction: Prediction
    reason: str = ""
    """Why it ranks where it does against the best plan (empty for the best itself)."""


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    best: list[Candidate]
    """The top_k fitting candidates, highest tokens/s first."""
    rejected: list[Candidate]
    """The next fitting candidates and the fastest that do not fit, each with its reason."""
    evaluated: int
    """Candidates considered: the plans of the space plus the Alpa cuts that differ."""
    seconds: float
    smallest_memory_bytes: float
    """The smallest simulated peak memory over the plans of the space (equal slicing), also
    when nothing fits."""
    simulated: int = 0
    screened_by_memory: int = 0
    screened_by_time: int = 0
    space: int = 0
    """Plans in the space."""


_EQUAL, _ALPA_PENDING, _ALPA_READY = 0, 1, 2


def alpa_candidate(
    spec: TransformerSpec, plan: ParallelPlan, hw: Hardware, table: LayerTable, dtype: str = "bf16"
) -> ParallelPlan | None:
    """The plan with Alpa's cut (one stage per rank), or None when no cut fits.

    The layers are the embedding, n identical transformer layers and the head, so the
    cut is `alpa_chain_slicing` (the same optimum as the DP of `alpa_stage_slicing`, in
    O(P log L) instead of O(P L²) per t_max; `tests/planner/test_slicing.py` checks they
    agree); the DP runs if the transformer layers ever differ.
    """
    memory = MemoryModel(spec, plan, table, dtype)
    counts = inflight(plan.schedule, plan.pp, plan.num_microbatches)
    seconds = [sum(table.work(layer, layer + 1)) for layer in range(table.layers)]
    n, limit = spec.n_layers, hw.memory_bytes
    body = seconds[1 : n + 1]
    if max(body) - min(body) <= 1e-9 * max(body):

        def fits(stage: int, k: int) -> bool:
            if stage == 0:
                span = (0, 1 + k)
            elif stage == plan.pp - 1:
                span = (n + 1 - k, n + 2)
            else:
                span = (1, 1 + k)
            return memory.rank([span], counts[stage]) <= limit

        cut = alpa_chain_slicing(seconds[0], body[0], seconds[-1], n, plan.pp, fits)
    else:

        def stage_bytes(first: int, last: int, stage: int) -> float:
            return memory.rank([(first, last + 1)], counts[stage])

        cut = alpa_stage_slicing(seconds, stage_bytes, plan.pp, plan.num_microbatches, limit)
    return None if cut is None else replace(plan, stage_layers=cut)


class _Progress:
    def __init__(self, enabled: bool, total: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="planner", unit="plan")

    def update(self, n: int = 1, **postfix) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(**postfix, refresh=False)

    def close(self) -> None:
        """Count the plans screened out as done, then close."""
        if self.bar is not None:
            self.bar.update(self.bar.total - self.bar.n)
            self.bar.close()


def search(
    spec: TransformerSpec,
    hw: Hardware,
    *,
    gpus: int,
    global_batch: int,
    fixed: dict | None = None,
    dtype: str = "bf16",
    top_k: int = 10,
    progress: bool = False,
    allow_cross_node_tp: bool = False,
    cps: tuple[int, ...] = (1,),
) -> SearchResult:
    """The top_k plans by predicted tokens/s; `cps`: the context-parallel degrees to search
    (`plan_space`), 1 alone by default. The screens:

    1. Memory: `memory_bound` is the simulator's peak exactly with one stage per rank and a
       lower bound with interleaving; a plan above the device memory cannot fit and is not
       simulated (it counts in `screened_by_memory`). The Alpa candidate of a plan is dropped
       when even the average rank (`memory_bound_any_cut`) does not fit.
    2. Time: `time_bound` (the pipeline's fill + steady state + drain with free transfers,
       no DP, no optimizer) is at most the simulated step time, so sequences · seq_len /
       bound is an upper bound on tokens/s. Candidates are taken in decreasing order of that
       bound and simulated; the search stops when the next bound is below the K-th best
       simulated tokens/s among fitting plans (K = top_k + the losers kept for `rejected`):
       nothing left can enter the top K.
    3. The Alpa candidate enters with `time_bound_any_cut`, a bound for every cut; when it
       comes up its cut is computed, it re-enters with `time_bound` of that cut, and only then
       is simulated (a cut equal to the equal slicing, or none that fits, is dropped).

    `rejected` keeps the LOSERS_KEPT fitting plans ranked just below the top_k and the
    LOSERS_KEPT fastest plans that do not fit (the memory-screened plans with the highest
    time bounds are simulated for it), each with `explain`'s reason against the best.
    `smallest_memory_bytes` is found the same way over the memory bounds (ascending, stop when
    the next bound reaches the smallest simulated peak).
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}: must be an integer ≥ 1")
    start = time.perf_counter()
    hw.peak(dtype)
    plans = plan_space(
        spec,
        hw,
        gpus=gpus,
        global_batch=global_batch,
        fixed=fixed,
        allow_cross_node_tp=allow_cross_node_tp,
        cps=cps,
    )
    bar = _Progress(progress, len(plans))
    tables: dict[tuple, LayerTable] = {}
    tokens = global_batch * spec.seq_len
    heap: list[tuple[float, int, int, ParallelPlan]] = []
    by_memory: list[tuple[float, int]] = []  # (memory bound, plan index)
    too_big: list[tuple[float, int]] = []  # (-tokens/s bound, plan index): screened by memory
    any_cut_bounds: dict[tuple, float] = {}
    for index, plan in enumerate(plans):
        key = _key(plan)
        if key not in tables:
            tables[key] = layer_table(spec, plan, hw, dtype)
        table = tables[key]
        ranges = stage_slices(spec.n_layers, plan)
        need = memory_bound(spec, plan, table, dtype, ranges)
        bound = tokens / time_bound(plan, table, ranges)
        by_memory.append((need, index))
        if need <= hw.memory_bytes:
            heap.append((-bound, len(heap), _EQUAL, plan))
        else:
            too_big.append((-bound, index))
        alpa = plan.pp > 1 and plan.virtual_stages == 1
        if alpa and memory_bound_any_cut(plan, table, dtype) <= hw.memory_bytes:
            split = plan.schedule == "zero_bubble_h1"
            cut_key = (key, plan.pp, plan.num_microbatches, split)
            if cut_key not in any_cut_bounds:  # shared by ZeRO stages, GPipe and 1F1B
                any_cut_bounds[cut_key] = time_bound_any_cut(plan, table)
            any_cut = tokens / any_cut_bounds[cut_key]
            heap.append((-any_cut, len(heap), _ALPA_PENDING, plan))
    heapq.heapify(heap)
    counter = len(heap)
    keep = top_k + LOSERS_KEPT
    fitting: list[Candidate] = []
    kth: list[float] = []  # min-heap of the best `keep` fitting tokens/s
    misfits: list[Candidate] = []
    simulated: dict[ParallelPlan, Prediction] = {}
    alpa_cuts = 0

    def run(plan: ParallelPlan) -> Prediction:
        if plan not in simulated:
            simulated[plan] = simulate(spec, plan, hw, dtype=dtype)
        return simulated[plan]

    while heap:
        neg_bound, _, kind, plan = heap[0]
        if len(kth) >= keep and -neg_bound < kth[0] * (1 - 1e-9):
            break
        heapq.heappop(heap)
        if kind == _ALPA_PENDING:
            sliced = alpa_candidate(spec, plan, hw, tables[_key(plan)], dtype)
            bar.update(0, alpa=alpa_cuts)
            if sliced is None or _same_cut(spec, sliced, plan):
                continue
            alpa_cuts += 1
            table = tables[_key(plan)]
            ranges = stage_slices(spec.n_layers, sliced)
            bound = tokens / time_bound(sliced, table, ranges)
            counter += 1
            heapq.heappush(heap, (-bound, counter, _ALPA_READY, sliced))
            continue
        prediction = run(plan)
        bar.update(1 if kind == _EQUAL else 0, simulated=len(simulated))
        candidate = Candidate(plan=plan, prediction=prediction)
        if prediction.fits:
            fitting.append(candidate)
            heapq.heappush(kth, prediction.tokens_per_s)
            if len(kth) > keep:
                heapq.heappop(kth)
        else:
            misfits.append(candidate)
    screened_by_time = sum(1 for entry in heap if entry[2] == _EQUAL)
    # the fastest plans that cannot fit, simulated so that `rejected` can say by how much
    for _, index in heapq.nsmallest(LOSERS_KEPT, too_big):
        misfits.append(Candidate(plan=plans[index], prediction=run(plans[index])))
    smallest = _smallest_memory(by_memory, plans, run, simulated)
    bar.close()
    fitting.sort(key=lambda c: -c.prediction.tokens_per_s)
    misfits.sort(key=lambda c: -c.prediction.tokens_per_s)
    best, losers = fitting[:top_k], fitting[top_k:keep]
    winner = best[0] if best else None
    best = [replace(c, reason=explain(c, winner, hw)) for c in best]
    rejected = [replace(c, reason=explain(c, winner, hw)) for c in losers + misfits[:LOSERS_KEPT]]
    return SearchResult(
        best=best,
        rejected=rejected,
        evaluated=len(plans) + alpa_cuts,
        seconds=time.perf_counter() - start,
        smallest_memory_bytes=smallest,
        simulated=len(simulated),
        screened_by_memory=len(too_big),
        screened_by_time=screened_by_time,
        space=len(plans),
    )


def _key(plan: ParallelPlan) -> tuple:
    return (plan.microbatch_size, plan.tp, plan.sp, plan.recompute, plan.cp)


def _same_cut(spec: TransformerSpec, sliced: ParallelPlan, plan: ParallelPlan) -> bool:
    return stage_slices(spec.n_layers, sliced) == stage_slices(spec.n_layers, plan)


def _smallest_memory(by_memory, plans, run, simulated) -> float:
    """Simulate in increasing memory bound until the bound reaches the smallest peak seen."""
    smallest = min(
        (p.peak_memory_bytes for plan, p in simulated.items() if plan.stage_layers is None),
        default=math.inf,
    )
    for need, index in sorted(by_memory):
        if need >= smallest * (1 - 1e-9):
            break
        smallest = min(smallest, run(plans[index]).peak_memory_bytes)
    return smallest
