"""Cheap bounds on what `impls.simulator.simulate` will predict, for screening a search.

Both bounds read the simulator's own per-layer pricing (`layer_prices`, cached per
(micro-batch, tp, sp, recompute)) and never exceed the simulated value, so a plan they
screen out could not have won: `time_bound` and `time_bound_any_cut` for the step time, `memory_bound` for the peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from impls.costmodel.activations import activation_bytes_per_layer
from impls.costmodel.compute import TransformerSpec
from impls.costmodel.hardware import Hardware
from impls.costmodel.memory import model_state_bytes
from impls.pipeline.schedules import (  # SPLIT_BACKWARD: zero-bubble, I and W apart
    COUNTED_ON_PLAN,
    SPLIT_BACKWARD,
    schedule_spec,
)
from impls.simulator import ParallelPlan
from impls.simulator.context_parallel import local_spec
from impls.simulator.costs import DTYPE_BYTES, layer_prices, logit_gradient_bytes
from impls.simulator.memory import WORKSPACE_BYTES, bytes_per_param
from impls.simulator.zero_comm import dp_group

__all__ = [
    "LayerTable",
    "MemoryModel",
    "inflight",
    "layer_table",
    "memory_bound",
    "memory_bound_any_cut",
    "time_bound",
    "time_bound_any_cut",
]


def inflight(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> list[int]:
    """Per rank, the most (stage, micro-batch) pairs a schedule holds at once: its spec's
    in-flight count (`ScheduleSpec.inflight`, a closed form per rank or counted on the
    plan), one pair on a single rank for the closed forms."""
    spec = schedule_spec(schedule)
    if pp == 1 and spec.inflight != COUNTED_ON_PLAN:
        return [1]
    return spec.held(pp, microbatches, virtual_stages)


@dataclass(frozen=True)
class LayerTable:
    """Per layer (embedding, transformer layers, head) of one (b, tp, sp, recompute), as
    prefix sums (entry l = the sum over layers < l)."""

    forward: tuple[float, ...]
    """F seconds, TP included."""
    backward: tuple[float, ...]
    """I + W seconds, TP included."""
    activation: tuple[float, ...]
    params: tuple[float, ...]
    largest: float
    """Parameters of the largest layer (ZeRO-3 gathers two at a time; every stage's
    largest layer is this one unless the stage is the embedding or head alone)."""
    layer_params: tuple[float, ...]
    remat_bytes: float
    """Full recompute's rematerialised layer (0 otherwise)."""
    logit_bytes: float

    @property
    def layers(self) -> int:
        return len(self.forward) - 1

    def work(self, first: int, stop: int) -> tuple[float, float]:
        """(F, I + W) of layers [first, stop)."""
        return (
            self.forward[stop] - self.forward[first],
            self.backward[stop] - self.backward[first],
        )


def _prefix(values) -> tuple[float, ...]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return tuple(out)


def layer_table(spec: TransformerSpec, plan: ParallelPlan, hw: Hardware, dtype: str) -> LayerTable:
    """The simulator's pricing of the plan's (b, tp, sp, recompute), summed for screening."""
    prices = layer_prices(
        spec, plan.microbatch_size, plan.tp, plan.sp, plan.recompute, hw, dtype, plan.cp
    )
    remat = 0.0
    if plan.recompute == "full":
        remat = activation_bytes_per_layer(
            local_spec(spec, plan.cp),
            plan.microbatch_size,
            tp=plan.tp,
            sp=plan.sp,
            recompute="none",
            dtype_bytes=DTYPE_BYTES[dtype],
        )
    return LayerTable(
        forward=_prefix(p.forward_s + p.tp_forward_s for p in prices),
        backward=_prefix(p.input_s + p.weight_s + p.tp_backward_s for p in prices),
        activation=_prefix(p.activation_bytes for p in prices),
        params=_prefix(p.params for p in prices),
        largest=max(p.params for p in prices),
        layer_params=tuple(p.params for p in prices),
        remat_bytes=remat,
        logit_bytes=logit_gradient_bytes(spec, plan.microbatch_size, plan.tp, plan.sp, plan.cp),
    )


def time_bound(plan: ParallelPlan, table: LayerTable, ranges) -> float:
    """Seconds the simulated step takes at least; `ranges` the [start, stop) of each stage
    (`impls.simulator.stage_slices`).

    Every rank runs its actions one after another, and its first action (a forward of
    its lowest stage r) waits for that micro-batch's forwards on stages 0 … r − 1; with the
    backward not split (GPipe, 1F1B, interleaved) its last action is a backward of stage r,
    after which stages r − 1 … 0 still run that micro-batch's backward. So with free
    transfers, DP and optimizer costs left out (each only adds time),

        makespan ≥ maxᵣ ( Σ_{s<r} F_s + M · Σ_{s on r} (F_s + B_s) + Σ_{s<r} B_s )

    which is exactly 1F1B's (M + P − 1)(F + B) on equal stages.
    """
    work = [table.work(a, b) for a, b in ranges]
    split = plan.schedule in SPLIT_BACKWARD
    best = before_f = before_b = 0.0
    for r in range(plan.pp):
        busy = plan.num_microbatches * sum(sum(work[s]) for s in range(r, plan.stages, plan.pp))
        best = max(best, before_f + busy + (0.0 if split else before_b))
        before_f += work[r][0]
        before_b += work[r][1]
    return best


def time_bound_any_cut(plan: ParallelPlan, table: LayerTable) -> float:
    """A bound for every cut of the layers into the plan's stages (the Alpa candidate):
    the smallest `time_bound` any cut can have, found by bisection on its value.

    For a plan whose slicing is
    not chosen yet (the Alpa candidate) the bound is the smallest that any cut can have:
    a rank with layers [i, j) contributes g(i, j) = (F + B)[0, i) + M · (F + B)[i, j) (only
    F[0, i) for zero_bubble_h1), which grows with j and shrinks with i, so the cuts with every
    g ≤ C exist iff the greedy front-to-back cut needs ≤ P ranks (a finer cut stays within
    C), and bisection on C finds the smallest such C (its lower end is returned). Interleaved
    ranks hold stages from both ends of the model; there the bound is M·W/P (the average rank).
    """
    total = table.forward[-1] + table.backward[-1]
    m, pp, layers = plan.num_microbatches, plan.pp, table.layers
    if plan.virtual_stages > 1 or pp == 1:
        return m * total / pp
    split = plan.schedule in SPLIT_BACKWARD
    work = [f + b for f, b in zip(table.forward, table.backward, strict=True)]
    before = table.forward if split else work

    def parts_within(limit: float) -> bool:
        """Greedy from the front: each rank takes layers while g(i, j) ≤ limit."""
        i = parts = 0
        while i < layers:
            j = i
            while j < layers and before[i] + m * (work[j + 1] - work[i]) <= limit:
                j += 1
            if j == i:
                return False
            parts, i = parts + 1, j
        return parts <= pp

    lo, hi = m * total / pp, m * total + total  # hi: one rank doing everything, plus fill
    if parts_within(lo):
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        if parts_within(mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo


class MemoryModel:
    """Bytes of a rank holding a range of layers, as `impls.simulator` counts them."""

    def __init__(
        self, spec: TransformerSpec, plan: ParallelPlan, table: LayerTable, dtype: str
    ) -> None:
        bpp = bytes_per_param(dtype)
        # model_state_bytes is linear in the parameters (no padding): bytes per parameter
        self.per_param = model_state_bytes(1.0, plan.zero_stage, dp_group(plan)[0], bpp).total
        self.gathered = 2 * bpp.weights if plan.zero_stage == 3 else 0.0
        self.table, self.n_layers = table, spec.n_layers

    def rank(self, ranges, held: float, smallest_only: bool = False) -> float:
        """Peak of a rank with stages `ranges` ([start, stop) each) and `held` micro-batch
        pairs in flight: weighted by each stage for one stage, by the smallest for several."""
        t = self.table
        params = sum(t.params[b] - t.params[a] for a, b in ranges)
        acts = [t.activation[b] - t.activation[a] for a, b in ranges]
        transient = 0.0
        if t.remat_bytes and any(a <= self.n_layers and b - 1 >= 1 for a, b in ranges):
            transient += t.remat_bytes
        if self.gathered:
            transient += self.gathered * max(max(t.layer_params[a:b]) for a, b in ranges)
        if any(b == self.n_layers + 2 for _, b in ranges):
            transient += t.logit_bytes
        return params * self.per_param + held * min(acts) + transient + WORKSPACE_BYTES


def memory_bound(
    spec: TransformerSpec, plan: ParallelPlan, table: LayerTable, dtype: str, ranges
) -> float:
    """The simulator's peak memory: exact with one stage per rank, a lower bound with
    interleaving (held pairs × the rank's smallest chunk).

    The simulator's peak of rank r is its model states (ZeRO over the dp group),
    the activations it holds, transients and the workspace (`impls.simulator.memory`). With
    one stage per rank the held activations are n_r · (what stage r saves per micro-batch),
    n_r the schedule's in-flight count (`inflight`, pinned to
    `impls.pipeline.replay.max_inflight_microbatches` by the tests); with interleaving at
    least n_r held pairs, each ≥ the rank's smallest chunk. So the bound is exact for one
    stage per rank and a lower bound with interleaving.
    """
    model = MemoryModel(spec, plan, table, dtype)
    counts = inflight(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages)
    return max(model.rank(ranges[r :: plan.pp], counts[r]) for r in range(plan.pp))


def memory_bound_any_cut(plan: ParallelPlan, table: LayerTable, dtype: str) -> float:
    """Memory at least one rank needs under every cut: the average rank's model states
    and, held at least once, its largest stage's activations (≥ the average stage's)."""
    states = model_state_bytes(
        table.params[-1] / plan.pp, plan.zero_stage, dp_group(plan)[0], bytes_per_param(dtype)
    ).total
    return states + table.activation[-1] / plan.stages + WORKSPACE_BYTES
