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
How much is exposed (links as resources, prefetch one unit ahead). A rank sends each kind
of collective as `units` equal calls (FSDP / ZeRO-3 units, one per layer by default; DDP's
25 MB buckets, `BUCKET_BYTES`, PyTorch's `bucket_cap_mb` default) and the compute they
hide under is split evenly among the units. Every call of one unit goes over the rank's
one link, so the collectives that overlap the same compute share it: ZeRO-3's backward
all-gather of the next unit and the reduce-scatter of the unit just done queue on the same
NIC (per unit ℓ = t_gather + t_reduce_scatter, not the larger of the two). A unit's
transfer is issued one unit ahead of the compute that needs it (FSDP's default backward
prefetch and its implicit forward prefetch: Zhao et al. 2023, PyTorch FSDP,
arXiv 2304.11277, "communication optimizations"), so the first unit's
transfer is never hidden and each later one hides only under one unit of compute:

    exposed = ℓ + (units − 1) · max(0, ℓ − window ÷ units)

(at most units · ℓ, the whole transfer). With ℓ below a unit's compute only the first unit
is exposed; with ℓ above it the link is the bottleneck and the compute hides (units − 1)
of its units. A hidden collective is not free: NCCL's thread blocks hold whole SMs
that no compute kernel shares (NVIDIA/nccl issue #689), so the compute beside it runs on
the rest, and each hidden second costs `Hardware.comm_compute_share` of a second of
compute (16 of the A100's 108 SMs on a DGX with 8 NICs). On hardware whose collectives block the computing thread
(`Hardware.comm_overlap` False) nothing hides: the whole transfer is exposed, and each
meeting of the ranks after compute adds `Hardware.collective_meeting_s` (the first rank to
arrive waits for the last; calls issued back to back meet once). Meetings, as
`impls.zero` issues its calls: ZeRO-3 one per unit at its forward gather and one per unit
at its backward gather (the unit's reduce-scatter follows the backward it reduces, back to
back with the next unit's gather); ZeRO-2 one per unit at its reduce-scatter; at the end of
the step one for the gradient reduction (ZeRO-0/1) and one for ZeRO-1/2's gathers after
the optimizer.

`collectives` is how many calls each kind is sent as: every call pays its own rounds of α,
the bytes are the same. The simulator's default is one ZeRO / FSDP unit per layer of the
stage (`impls.zero` and FSDP wrap each transformer block); a bucketed reduction (ZeRO-0/1)
is sent as at least one call per 25 MB bucket on overlapping hardware.
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

BUCKET_BYTES = 25 * 2**20


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


def exposed(transfers: tuple[Transfer, ...], plan: ParallelPlan, hw: Hardware, window: float,
            collectives: int = 1, meetings: int = 1) -> float:  # fmt: skip
    """Seconds `transfers`, sharing the rank's link, add to `window` seconds of compute:
    the part left exposed (each kind sent as `collectives` equal calls, pipelined one unit
    ahead of the compute, module docstring) plus the compute the hidden part slows;
    `meetings` of the calls meet the ranks after compute."""
    size, stride = dp_group(plan)
    transfers = tuple((kind, nbytes) for kind, nbytes in transfers if nbytes > 0)
    if size == 1 or not transfers:
        return 0.0
    per_unit = sum(collective_seconds(kind, nbytes / collectives, size, hw, stride=stride)
                   for kind, nbytes in transfers)  # fmt: skip
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
    gather = (("all_gather", params * weight_bytes),)
    reduce = (("reduce_scatter", params * grad_bytes),)
    k = collectives
    if plan.zero_stage == 2:
        return StageDataParallel(
            weight=exposed(reduce, plan, hw, weight_s if split else backward, k, k)
        )
    forward = exposed(gather, plan, hw, forward_s, k, k)
    if split:  # the gathers before I, the reduce-scatters after W: two windows, two queues
        return StageDataParallel(forward=forward, input=exposed(gather, plan, hw, input_s, k, k),
                                 weight=exposed(reduce, plan, hw, weight_s, k, 0))  # fmt: skip
    # One backward: each unit's gather (prefetched) and reduce-scatter share the link.
    shared = exposed(gather + reduce, plan, hw, backward, k, k)
    return StageDataParallel(forward=forward, input=shared)


def end_of_step(plan: ParallelPlan, hw: Hardware, params: float, weight_bytes: float,
                grad_bytes: float, forward_s: float, backward_s: float,
               collectives: int = 1) -> float:  # fmt: skip
    """Exposed seconds after a rank's last action: ZeRO-0/1's gradient reduction under the
    last micro-batch's backward (`backward_s`), ZeRO-1/2's weight all-gather under a
    forward (`forward_s`); ZeRO-3 has done all of its communication per micro-batch."""
    seconds = 0.0
    if plan.zero_stage == 0:
        seconds += bucketed("all_reduce", params * grad_bytes, plan, hw, backward_s)
    if plan.zero_stage == 1:
        seconds += bucketed("reduce_scatter", params * grad_bytes, plan, hw, backward_s,
                            collectives)  # fmt: skip
    if plan.zero_stage in (1, 2):
        seconds += bucketed("all_gather", params * weight_bytes, plan, hw, forward_s, collectives)
    return seconds
