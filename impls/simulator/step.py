"""One training step of a plan, predicted: price the stages, replay the schedule, add DP.

`simulate` lists the three parts (layer pricing, the schedule replayed with free and with
priced transfers, the data-parallel tail and the optimizer) and the breakdown of the
critical rank's step, whose parts add up to the step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

from impls.costmodel.activations import activation_bytes_per_layer
from impls.costmodel.comm import p2p_seconds
from impls.costmodel.compute import TransformerSpec, hfu, mfu, step_flops
from impls.costmodel.hardware import Hardware
from impls.costmodel.memory import model_state_bytes
from impls.pipeline.schedules import SPLIT_BACKWARD  # zero-bubble schedules: I and W apart
from impls.simulator.context_parallel import local_spec
from impls.simulator.costs import DTYPE_BYTES, LayerPrice, layer_prices, logit_gradient_bytes
from impls.simulator.memory import (
    WORKSPACE_BYTES,
    bytes_per_param,
    held_activation_peak,
    rank_memory,
)
from impls.simulator.plan import ParallelPlan, Prediction, stage_slices, validate_plan
from impls.simulator.timeline import compile_schedule, evaluate
from impls.simulator.zero_comm import StageDataParallel, dp_group, end_of_step, per_action

__all__ = ["LayerCost", "layer_costs", "simulate"]

OPTIMIZERS = ("adam",)


class LayerCost(NamedTuple):
    """One layer for the planner's stage slicing: seconds per micro-batch (TP included)."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    activation_bytes: float
    """Saved per micro-batch."""
    state_bytes: float
    """Model states (weights, gradients, optimizer) on one rank under the plan's ZeRO."""


@dataclass(frozen=True)
class _Stage:
    """A (virtual) stage's layers summed: compute and TP seconds, parameters, activations."""

    forward: float
    input: float
    weight: float
    tp_forward: float
    tp_backward: float
    params: float
    activation_bytes: float
    largest_layer: float
    """Parameters of its largest layer (ZeRO-3 gathers one layer at a time)."""
    transformer_layers: int
    has_head: bool
    layers: int
    """Layers of the stage, embedding and head counted: its ZeRO / FSDP units by default."""


def _stage(prices: Sequence[LayerPrice], start: int, stop: int, total: int) -> _Stage:
    chunk = prices[start:stop]
    return _Stage(
        forward=sum(p.forward_s for p in chunk),
        input=sum(p.input_s for p in chunk),
        weight=sum(p.weight_s for p in chunk),
        tp_forward=sum(p.tp_forward_s for p in chunk),
        tp_backward=sum(p.tp_backward_s for p in chunk),
        params=sum(p.params for p in chunk),
        activation_bytes=sum(p.activation_bytes for p in chunk),
        largest_layer=max(p.params for p in chunk),
        transformer_layers=len(range(max(start, 1), min(stop, total - 1))),
        has_head=stop == total,
        layers=stop - start,
    )


@lru_cache(maxsize=4096)
def _spans_nodes(group: int, rank_a: int, rank_b: int, per_node: int) -> bool:
    """Whether pipeline ranks a and b (each `group` = tp·dp devices) share no node."""
    return any(
        (i + group * rank_a) // per_node != (i + group * rank_b) // per_node for i in range(group)
    )


def _transfers(plan: ParallelPlan, spec: TransformerSpec, hw: Hardware, dtype: str) -> tuple:
    """Seconds of each stage's SEND_F (to s+1) and SEND_B (to s−1)."""
    nbytes = plan.microbatch_size * spec.seq_len // plan.cp * spec.d_model * DTYPE_BYTES[dtype]
    if plan.sp != "none":
        nbytes /= plan.tp
    group, per_node = plan.tp * plan.cp * plan.dp, hw.devices_per_node

    def seconds(a: int, b: int) -> float:
        spans = _spans_nodes(group, a % plan.pp, b % plan.pp, per_node)
        return p2p_seconds(nbytes, hw.link(spans))

    stages = range(plan.stages)
    forward = tuple(seconds(s, s + 1) if s + 1 < plan.stages else 0.0 for s in stages)
    backward = tuple(seconds(s, s - 1) if s > 0 else 0.0 for s in stages)
    return forward, backward


def _optimizer_seconds(params: float, plan: ParallelPlan, hw: Hardware, dtype: str) -> float:
    bpp = bytes_per_param(dtype)
    per_param = 2 * bpp.optimizer + bpp.gradients + bpp.weights
    if dtype in ("fp32", "tf32"):
        per_param += bpp.weights
    if plan.zero_stage >= 1:
        params /= dp_group(plan)[0]
    return hw.elementwise_seconds(params * per_param, 1)


def simulate(
    spec: TransformerSpec,
    plan: ParallelPlan,
    hw: Hardware,
    *,
    dtype: str = "bf16",
    optimizer: str = "adam",
    stage_costs: Sequence[tuple[float, float, float]] | None = None,
    workspace_bytes: float = WORKSPACE_BYTES,
    dp_collectives: int | None = None,
) -> Prediction:
    """Predict one step of `plan`.

    `stage_costs` overrides the pricing for tests: (F, I, W) compute seconds per (virtual)
    stage, TP communication then zero; memory and DP still come from the model.
    `dp_collectives`: the calls each ZeRO gather / reduce-scatter of a stage is split
    into (its ZeRO / FSDP units, `zero_comm`); None: one unit per layer of the stage (FSDP
    and `impls.zero` wrap each transformer block; the embedding and head are units too).

    1. Each layer is priced per micro-batch on one rank (`costs`); a stage's F, I, W are the
       sums over its layers, its TP collectives added to F and to the backward (exposed).
    2. The schedule (`impls.pipeline.schedules.build_plan`) is replayed twice (`timeline`, the
       compiled equivalent of `impls.pipeline.replay.replay`): once with free transfers (the
       schedule's own bubble) and once with each activation / gradient send priced as a
       point-to-point transfer of T·h·B bytes (÷ t when the sequence is sharded, ÷ cp under
       context parallelism) over the link between the two pipeline ranks: inter-node when, in
       the tp-innermost, then cp, then dp, then pp layout (`plan`), the two ranks' devices sit
       on different nodes. A send is a latency between the two ranks' actions, or, on `Hardware.p2p_blocking` hardware, time the
       sending action holds its rank for. ZeRO-2/3 communication that happens per micro-batch
       is added to the actions it overlaps (`zero_comm`). pp == 1 is M micro-batches of
       gradient accumulation on one rank, no bubble.
    3. After its last action each pipeline rank finishes its data-parallel reduction (the part
       the last backward could not hide) and then the optimizer: Adam reads and writes its
       states, reads the gradient and writes the weights, 2·O + G + P bytes per parameter
       (+ P more in fp32, whose weights are the master copy), fused into one kernel
       (assumption), on the rank's parameters, ÷ the DP group under ZeRO ≥ 1. The step ends
       when the last rank is done.

    The critical rank is the busiest one; the breakdown is its compute, TP and per-micro-batch
    DP time, its idle time with free transfers (bubble), what priced transfers add (PP), the
    DP and optimizer time beyond its makespan. The parts add up to the step time.
    """
    if dp_collectives is not None and (type(dp_collectives) is not int or dp_collectives < 1):
        raise ValueError(f"dp_collectives={dp_collectives!r}: must be an integer ≥ 1")
    validate_plan(spec, plan)
    hw.peak(dtype)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}: allowed values {', '.join(OPTIMIZERS)}")
    prices = layer_prices(
        spec, plan.microbatch_size, plan.tp, plan.sp, plan.recompute, hw, dtype, plan.cp
    )
    total = spec.n_layers + 2
    stages = [_stage(prices, a, b, total) for a, b in stage_slices(spec.n_layers, plan)]
    if stage_costs is not None:
        if len(stage_costs) != plan.stages:
            raise ValueError(f"stage_costs: needs {plan.stages} (F, I, W) entries")
        stages = [
            replace(st, forward=f, input=i, weight=w, tp_forward=0.0, tp_backward=0.0)
            for st, (f, i, w) in zip(stages, stage_costs, strict=True)
        ]
    split = plan.schedule in SPLIT_BACKWARD
    if hw.action_overhead_s:  # one per F and per backward action (I and W when split)
        extra = hw.action_overhead_s
        stages = [
            replace(
                st,
                forward=st.forward + extra,
                input=st.input + extra,
                weight=st.weight + extra if split else st.weight,
            )
            for st in stages
        ]
    bpp = bytes_per_param(dtype)
    dp_costs = [
        per_action(
            plan,
            hw,
            st.params,
            bpp.weights,
            bpp.gradients,
            st.forward,
            st.input,
            st.weight,
            split,
            dp_collectives or st.layers,
        )
        for st in stages
    ]
    table = []
    for st, dpc in zip(stages, dp_costs, strict=True):
        f = st.forward + st.tp_forward + dpc.forward
        i = st.input + st.tp_backward + dpc.input
        w = st.weight + dpc.weight
        table.append((f, i, w, i + w))  # the columns of timeline.KIND_INDEX
    schedule = compile_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages)
    free = evaluate(schedule, table)
    send_f, send_b = _transfers(plan, spec, hw, dtype)
    if hw.p2p_blocking:  # the sender waits out its send; the receiver has it at that end
        table = [
            (f + sf, i + sb, w, b + sb)  # F sends forward, I (or B) sends backward
            for (f, i, w, b), sf, sb in zip(table, send_f, send_b, strict=True)
        ]
        real = evaluate(schedule, table)
    else:
        real = evaluate(schedule, table, send_f, send_b)
    return _assemble(
        spec,
        plan,
        hw,
        dtype,
        stages,
        dp_costs,
        schedule.plan,
        free,
        real,
        workspace_bytes,
        dp_collectives,
    )


def _assemble(
    spec, plan, hw, dtype, stages, dp_costs, schedule, free, real, workspace_bytes, dp_collectives
) -> Prediction:
    """Breakdown of the critical rank, end-of-step DP and optimizer, memory, rates."""
    m, bpp = plan.num_microbatches, bytes_per_param(dtype)
    per_rank = [[s for s in range(plan.stages) if s % plan.pp == r] for r in range(plan.pp)]
    critical = max(range(plan.pp), key=lambda r: real.busy[r])
    mine = [stages[s] for s in per_rank[critical]]
    compute = m * sum(st.forward + st.input + st.weight for st in mine)
    tp_time = m * sum(st.tp_forward + st.tp_backward for st in mine)
    dp_inside = m * sum(_dp_sum(dp_costs[s]) for s in per_rank[critical])
    dp_end = step = 0.0
    for r, own in enumerate(per_rank):
        params = sum(stages[s].params for s in own)
        after = real.ends[r] + end_of_step(
            plan,
            hw,
            params,
            bpp.weights,
            bpp.gradients,
            sum(stages[s].forward for s in own),
            sum(stages[s].input + stages[s].weight for s in own),
            dp_collectives or sum(stages[s].layers for s in own),
        )
        dp_end = max(dp_end, after)
        step = max(step, after + _optimizer_seconds(params, plan, hw, dtype))
    memory = _peak_memory(spec, plan, dtype, stages, schedule, per_rank, workspace_bytes)
    gpus = plan.gpus
    flops = step_flops(spec, plan.sequences_per_step, recompute=plan.recompute)
    peak = hw.peak(dtype)
    return Prediction(
        step_time_s=step,
        compute_s=compute,
        bubble_s=free.makespan - free.busy[critical],
        exposed_tp_s=tp_time,
        exposed_pp_s=real.makespan - free.makespan,
        exposed_dp_s=dp_inside + dp_end - real.makespan,
        optimizer_s=step - dp_end,
        peak_memory_bytes=memory["total"],
        fits=memory["total"] <= hw.memory_bytes,
        tokens_per_s=plan.sequences_per_step * spec.seq_len / step,
        tflops_per_gpu=flops.model / step / gpus / 1e12,
        mfu=mfu(flops.model, step, gpus, peak),
        hfu=hfu(flops.hardware, step, gpus, peak),
        memory_breakdown=memory,
        stage_times=tuple(
            st.forward + st.input + st.weight + st.tp_forward + st.tp_backward for st in stages
        ),
    )


def _dp_sum(cost: StageDataParallel) -> float:
    return cost.forward + cost.input + cost.weight


def _peak_memory(spec, plan, dtype, stages, schedule, per_rank, workspace_bytes) -> dict:
    """The breakdown of the rank with the highest peak (`rank` names it)."""
    stage_bytes = [st.activation_bytes for st in stages]
    weight_bytes = bytes_per_param(dtype).weights
    rematerialised = 0.0
    if plan.recompute == "full":
        rematerialised = activation_bytes_per_layer(
            local_spec(spec, plan.cp),
            plan.microbatch_size,
            tp=plan.tp,
            sp=plan.sp,
            recompute="none",
            dtype_bytes=DTYPE_BYTES[dtype],
        )
    best: dict = {}
    for r, own in enumerate(per_rank):
        mine = [stages[s] for s in own]
        transient = 0.0
        if any(st.transformer_layers for st in mine):
            transient += rematerialised
        if plan.zero_stage == 3:
            transient += 2 * max(st.largest_layer for st in mine) * weight_bytes
        if any(st.has_head for st in mine):
            transient += logit_gradient_bytes(spec, plan.microbatch_size, plan.tp, plan.sp, plan.cp)
        parts = rank_memory(
            params=sum(st.params for st in mine),
            zero_stage=plan.zero_stage,
            dp_size=dp_group(plan)[0],
            dtype=dtype,
            activations=held_activation_peak(schedule[r], stage_bytes),
            transient=transient,
            workspace=workspace_bytes,
        )
        if not best or parts["total"] > best["total"]:
            best = {**parts, "rank": r}
    return best


def layer_costs(
    spec: TransformerSpec, plan: ParallelPlan, hw: Hardware, dtype: str = "bf16"
) -> tuple[LayerCost, ...]:
    """Per layer of embedding + n_layers + head, what the planner slices stages by."""
    validate_plan(spec, plan)
    prices = layer_prices(
        spec, plan.microbatch_size, plan.tp, plan.sp, plan.recompute, hw, dtype, plan.cp
    )
    bpp, group = bytes_per_param(dtype), dp_group(plan)[0]
    return tuple(
        LayerCost(
            forward_s=p.forward_s + p.tp_forward_s,
            backward_input_s=p.input_s + p.tp_backward_s,
            backward_weight_s=p.weight_s,
            activation_bytes=p.activation_bytes,
            state_bytes=model_state_bytes(p.params, plan.zero_stage, group, bpp).total,
        )
        for p in prices
    )
