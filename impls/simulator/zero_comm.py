"""Data-parallel and ZeRO communication of one pipeline rank, and how much of it is exposed.

Volumes (Rajbhandari et al. 2019, ZeRO, §7): plain DP all-reduces the gradients (2Ψ);
ZeRO-1 and ZeRO-2 reduce-scatter the gradients and all-gather the updated weights (2Ψ);
ZeRO-3 all-gathers the weights for the forward and again for the backward and
reduce-scatters the gradients (3Ψ). Ψ here is what one rank holds (its tp shard of its
stages); the group is the dp ranks (stride tp in the layout), or the dp·tp ranks under
Ulysses, whose tp-axis ranks hold the same weights (DeepSpeed-Ulysses, Jacobs et al. 2023 §3).

When each collective runs is `per_action` (every micro-batch: ZeRO-2/3) and `end_of_step`
(once: ZeRO-0/1's reduction, ZeRO-1/2's gather); how much of it hides under compute, with
the rank's link as a shared resource and prefetch one unit ahead, is `exposed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from impls.costmodel.comm import collective_seconds
from impls.costmodel.hardware import Hardware
from impls.simulator.plan import ParallelPlan

__all__ = [
    "BUCKET_BYTES",
    "StageDataParallel",
    "bucketed",
    "dp_group",
    "end_of_step",
    "exposed",
    "per_action",
]

BUCKET_BYTES = 25 * 2**20  # DDP's bucket: PyTorch's `bucket_cap_mb` default, 25 MB


def dp_group(plan: ParallelPlan) -> tuple[int, int]:
    """(size, stride) of the group that reduces a rank's gradients: the dp·cp ranks that
    hold the same weights (Megatron-core reduces and shards gradients over its data-parallel
    group with context parallelism, `get_data_parallel_group(with_context_parallel=True)`),
    tp apart in the tp-innermost layout; under Ulysses the tp axis holds the same weights too."""
    if plan.sp == "ulysses":
        return plan.dp * plan.cp * plan.tp, 1
    return plan.dp * plan.cp, plan.tp


Transfer = tuple[str, float]
"""(kind, bytes of the full buffer) of one collective, as `collective_seconds` takes it."""


def exposed(
    transfers: tuple[Transfer, ...],
    plan: ParallelPlan,
    hw: Hardware,
    window: float,
    collectives: int = 1,
    meetings: int = 1,
) -> float:
    """Seconds `transfers`, sharing the rank's link, add to `window` seconds of compute.

    Each kind is sent as `collectives` equal calls (FSDP / ZeRO-3 units, one per layer by
    default; DDP's buckets), each paying its own rounds of α, and the window is split
    evenly among them. Every call of one unit goes over the rank's one link, so kinds that
    overlap the same compute queue on it (ZeRO-3's backward gather of the next unit and the
    reduce-scatter of the last: ℓ = t_gather + t_reduce_scatter, not the larger). A unit's
    transfer is issued one unit ahead of the compute that needs it (FSDP's backward and
    implicit forward prefetch: Zhao et al. 2023, arXiv 2304.11277), so the first is never
    hidden and each later one hides under one unit of compute:

        exposed = ℓ + (units − 1) · max(0, ℓ − window ÷ units)   (at most units · ℓ)

    A hidden collective is not free: NCCL's thread blocks hold whole SMs that no compute
    kernel shares (NVIDIA/nccl issue #689), so each hidden second costs
    `Hardware.comm_compute_share` of a second of compute (16 of an A100's 108 SMs on a DGX
    with 8 NICs). Where collectives block the computing thread (`Hardware.comm_overlap`
    False) nothing hides, and each of `meetings` calls that meet the ranks after compute
    adds `Hardware.collective_meeting_s` (the first rank to arrive waits for the last)."""
    size, stride = dp_group(plan)
    transfers = tuple((kind, nbytes) for kind, nbytes in transfers if nbytes > 0)
    if size == 1 or not transfers:
        return 0.0
    per_unit = sum(
        collective_seconds(kind, nbytes / collectives, size, hw, stride=stride)
        for kind, nbytes in transfers
    )
    total = collectives * per_unit
    if not hw.comm_overlap:
        return total + meetings * hw.collective_meeting_s
    hidden_under = window / collectives
    left = min(total, per_unit + (collectives - 1) * max(0.0, per_unit - hidden_under))
    # The compute that the hidden part runs beside loses the collective's SMs meanwhile.
    return left + (total - left) * hw.comm_compute_share


def bucketed(
    kind: str, nbytes: float, plan: ParallelPlan, hw: Hardware, window: float, collectives: int = 1
) -> float:
    """A gradient reduction or weight gather sent in DDP-style buckets: at least one call per
    `BUCKET_BYTES` on overlapping hardware (as `collectives` calls where calls block)."""
    calls = collectives
    if hw.comm_overlap:
        calls = max(collectives, math.ceil(nbytes / BUCKET_BYTES))
    return exposed(((kind, nbytes),), plan, hw, window, calls)


@dataclass(frozen=True)
class StageDataParallel:
    """Exposed DP seconds added to one stage's actions, per micro-batch."""

    forward: float = 0.0
    """ZeRO-3: the weight all-gather before F."""
    input: float = 0.0
    """ZeRO-3: the weight all-gather before the backward (B, or I when split)."""
    weight: float = 0.0
    """ZeRO-2/3: the gradient reduce-scatter after the weight gradient (B, or W when split)."""


def per_action(
    plan: ParallelPlan,
    hw: Hardware,
    params: float,
    weight_bytes: float,
    grad_bytes: float,
    forward_s: float,
    input_s: float,
    weight_s: float,
    split: bool,
    collectives: int = 1,
) -> StageDataParallel:
    """The ZeRO-2/3 communication of one stage of `params` parameters, per micro-batch.

    ZeRO-2/3 keep only a gradient shard, so they reduce-scatter during every micro-batch's
    backward (DeepSpeed's partitioned gradient accumulation); ZeRO-3 gathers the stage's
    weights for every micro-batch's forward and backward (FSDP and DeepSpeed re-gather
    under gradient accumulation). Meetings, as `impls.zero` issues its calls: ZeRO-3 one
    per unit at each gather (a unit's reduce-scatter follows its backward back to back with
    the next gather); ZeRO-2 one per unit at its reduce-scatter. `forward_s`, `input_s`,
    `weight_s` are the stage's compute seconds; with `split` False the backward is one
    action B and both of its halves overlap the collectives there.
    """
    if plan.zero_stage < 2:
        return StageDataParallel()
    backward = input_s + weight_s
    gather = (("all_gather", params * weight_bytes),)
    reduce = (("reduce_scatter", params * grad_bytes),)
    k = collectives
    if plan.zero_stage == 2:
        return StageDataParallel(
            weight=exposed(reduce, plan, hw, weight_s if split else backward, k, k)
        )
    forward = exposed(gather, plan, hw, forward_s, k, k)
    if split:  # the gathers before I, the reduce-scatters after W: two windows, two queues
        return StageDataParallel(
            forward=forward,
            input=exposed(gather, plan, hw, input_s, k, k),
            weight=exposed(reduce, plan, hw, weight_s, k, 0),
        )
    # One backward: each unit's gather (prefetched) and reduce-scatter share the link.
    shared = exposed(gather + reduce, plan, hw, backward, k, k)
    return StageDataParallel(forward=forward, input=shared)


def end_of_step(
    plan: ParallelPlan,
    hw: Hardware,
    params: float,
    weight_bytes: float,
    grad_bytes: float,
    forward_s: float,
    backward_s: float,
    collectives: int = 1,
) -> float:
    """Exposed seconds after a rank's last action: ZeRO-0/1's gradient reduction under the
    last micro-batch's backward (`backward_s`; whole gradients accumulate over the
    micro-batches and reduce once, bucketed, as DDP's `no_sync` does: Li et al. 2020 §3.2),
    ZeRO-1/2's weight all-gather under a forward (`forward_s`; the next step's first, as
    Megatron's distributed optimizer with `overlap_param_gather` does, charged to this
    step). Each meets the ranks once. ZeRO-3 has done all of its communication per
    micro-batch."""
    seconds = 0.0
    if plan.zero_stage == 0:
        seconds += bucketed("all_reduce", params * grad_bytes, plan, hw, backward_s)
    if plan.zero_stage == 1:
        seconds += bucketed(
            "reduce_scatter", params * grad_bytes, plan, hw, backward_s, collectives
        )
    if plan.zero_stage in (1, 2):
        seconds += bucketed("all_gather", params * weight_bytes, plan, hw, forward_s, collectives)
    return seconds
