"""Data-parallel and ZeRO communication of one pipeline rank, and how much of it is exposed.

Volumes (Rajbhandari et al. 2019, ZeRO, §7): plain DP all-reduces the gradients (2Ψ);
ZeRO-1 and ZeRO-2 reduce-scatter the gradients and all-gather the updated weights (2Ψ);
ZeRO-3 all-gathers the weights for the forward and again for the backward and
reduce-scatters the gradients (3Ψ). Ψ here is what one rank holds (its tp shard of its
stages); the group is the dp ranks (stride tp in the layout), or the dp·tp ranks under
Ulysses, whose tp-axis ranks hold the same weights (DeepSpeed-Ulysses, Jacobs et al. 2023 §3).

When each happens (assumptions, stated):
- ZeRO-0/1 accumulate whole gradients over the micro-batches and reduce once, bucketed, during
  the last micro-batch's backward (PyTorch DDP's `no_sync` + buckets, Li et al. 2020 §3.2);
- ZeRO-2/3 keep only a gradient shard, so they reduce-scatter during every micro-batch's
  backward (DeepSpeed's partitioned gradient accumulation);
- ZeRO-3 gathers a stage's weights for every micro-batch's forward and backward (FSDP and
  DeepSpeed re-gather under gradient accumulation), prefetched under the same compute;
- ZeRO-1/2 all-gather the updated weights under the next step's first forward (Megatron's
  distributed optimizer with `overlap_param_gather`), charged to this step.
A collective of t seconds under a window of w seconds of compute exposes
min(t, max(0, t − w) + t_bucket): the last bucket (25 MB, DDP's `bucket_cap_mb` default)
cannot start before the compute that fills it ends. On hardware whose collectives block
the computing thread (`Hardware.comm_overlap` False) nothing hides: the whole t is exposed,
and each meeting of the ranks after compute adds `Hardware.collective_meeting_s` (the first
rank to arrive waits for the last; calls issued back to back meet once). Meetings, as
`impls.zero` issues its calls: ZeRO-3 one per unit at its forward gather and one per unit
at its backward gather (the unit's reduce-scatter follows the backward it reduces, back to
back with the next unit's gather); ZeRO-2 one per unit at its reduce-scatter; at the end of
the step one for the gradient reduction (ZeRO-0/1) and one for ZeRO-1/2's gathers after
the optimizer.

`collectives` splits a stage's volume into that many calls of each kind (ZeRO / FSDP
units, one gather or reduce-scatter each, as `impls.zero` issues them): every call pays
its own rounds of α, the bytes are the same. The default, one, prices the volume as one
call (its latency counted once: bandwidth-bound at scale).
"""

from __future__ import annotations

from dataclasses import dataclass

from impls.costmodel.comm import collective_seconds
from impls.costmodel.hardware import Hardware
from impls.simulator.plan import ParallelPlan

__all__ = ["BUCKET_BYTES", "StageDataParallel", "dp_group", "end_of_step", "exposed", "per_action"]

BUCKET_BYTES = 25 * 2**20


def dp_group(plan: ParallelPlan) -> tuple[int, int]:
    """(size, stride) of the group that reduces a rank's gradients."""
    if plan.sp == "ulysses":
        return plan.dp * plan.tp, 1
    return plan.dp, plan.tp


def exposed(kind: str, nbytes: float, plan: ParallelPlan, hw: Hardware, window: float,
            collectives: int = 1, meetings: int = 1) -> float:  # fmt: skip
    """Seconds of a bucketed collective left over after `window` seconds of compute, the
    volume sent as `collectives` calls of equal size, `meetings` of them after compute."""
    size, stride = dp_group(plan)
    if size == 1 or nbytes <= 0:
        return 0.0
    each = nbytes / collectives
    total = collectives * collective_seconds(kind, each, size, hw, stride=stride)
    if not hw.comm_overlap:
        return total + meetings * hw.collective_meeting_s
    bucket = collective_seconds(kind, min(BUCKET_BYTES, each), size, hw, stride=stride)
    return min(total, max(0.0, total - window) + bucket)


@dataclass(frozen=True)
class StageDataParallel:
    """Exposed DP seconds added to one stage's actions, per micro-batch."""

    forward: float = 0.0
    """ZeRO-3: the weight all-gather before F."""
    input: float = 0.0
    """ZeRO-3: the weight all-gather before the backward (B, or I when split)."""
    weight: float = 0.0
    """ZeRO-2/3: the gradient reduce-scatter after the weight gradient (B, or W when split)."""


def per_action(plan: ParallelPlan, hw: Hardware, params: float, weight_bytes: float,
               grad_bytes: float, forward_s: float, input_s: float,
               weight_s: float, split: bool, collectives: int = 1) -> StageDataParallel:  # fmt: skip
    """The ZeRO-2/3 communication of one stage of `params` parameters, per micro-batch.

    `forward_s`, `input_s`, `weight_s` are the stage's compute seconds; with `split` False
    the backward is one action B and both of its halves overlap the collectives there.
    """
    if plan.zero_stage < 2:
        return StageDataParallel()
    backward = input_s + weight_s
    reduce_window = weight_s if split else backward
    gather, grads = params * weight_bytes, params * grad_bytes
    if plan.zero_stage == 2:
        return StageDataParallel(weight=exposed("reduce_scatter", grads, plan, hw, reduce_window,
                                                collectives, collectives))  # fmt: skip
    before_backward = input_s if split else backward
    return StageDataParallel(
        forward=exposed("all_gather", gather, plan, hw, forward_s, collectives, collectives),
        input=exposed("all_gather", gather, plan, hw, before_backward, collectives, collectives),
        weight=exposed("reduce_scatter", grads, plan, hw, reduce_window, collectives, 0),
    )


def end_of_step(plan: ParallelPlan, hw: Hardware, params: float, weight_bytes: float,
                grad_bytes: float, forward_s: float, backward_s: float,
               collectives: int = 1) -> float:  # fmt: skip
    """Exposed seconds after a rank's last action: ZeRO-0/1's gradient reduction under the
    last micro-batch's backward (`backward_s`), ZeRO-1/2's weight all-gather under a
    forward (`forward_s`); ZeRO-3 has done all of its communication per micro-batch."""
    seconds = 0.0
    if plan.zero_stage == 0:
        seconds += exposed("all_reduce", params * grad_bytes, plan, hw, backward_s)
    if plan.zero_stage == 1:
        seconds += exposed("reduce_scatter", params * grad_bytes, plan, hw, backward_s, collectives)
    if plan.zero_stage in (1, 2):
        seconds += exposed("all_gather", params * weight_bytes, plan, hw, forward_s, collectives)
    return seconds
