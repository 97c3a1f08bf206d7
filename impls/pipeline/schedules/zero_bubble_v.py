"""ZB-V: two chunks per rank placed in a V, the split backward filling every ramp.

Qi, Wan, Huang & Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024), §6 / Fig. 8
(ZB-V), and "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024),
§3 and Fig. 3 (the V-shape building block). The model is cut into 2P stages and rank r
holds stages r and 2P−1−r (`impls.pipeline.dataflow.v_shape`): the forward runs down the
ranks and back up, so rank 0 holds both the first stage and the last (the loss), stage
P−1 hands its activation to stage P without a message, and the first input gradient is
produced on the rank that also starts the forward. Every chunk is half a rank's layers,
so each ramp step costs half a 1F1B one.

The order comes from the unit-time list scheduler of `_greedy` (input gradients first,
then forwards, the later chunk first, under a limit; then weight gradients). With equal
chunk costs T_F = T_I = T_W it leaves no rank idle between its first and last action and
the step takes 6M + P − 1 chunk units. Here that needs each rank to hold up to 3P
(chunk, micro-batch) pairs, 1.5 P micro-batches' worth of activations; the paper's
hand-built ZB-V reaches it with 1F1B's P (2P chunk pairs), which this greedy order does
not (at 2P pairs it idles up to P chunk units per rank). The order is fixed for equal
costs, as the paper's ZB-V is; it is the most sensitive to T_I ≠ T_F of the zero-bubble
schedules here (replayed at T_I = 1.8 T_F it falls below ZB-H1), where the paper's
automatic scheduler would rebuild the order from the measured costs.
"""

from __future__ import annotations

from impls.pipeline.actions import Plan
from impls.pipeline.dataflow import v_shape
from impls.pipeline.schedules._checks import require_count
from impls.pipeline.schedules._greedy import greedy_plan

__all__ = ["zero_bubble_v"]


def zero_bubble_v(stages: int, microbatches: int, virtual_stages: int = 2) -> Plan:
    """Rank r runs stages r and 2P−1−r, at most 3P (stage, micro-batch) pairs held."""
    require_count("stages", stages)
    require_count("microbatches", microbatches)
    if virtual_stages != 2:
        raise ValueError(
            f"virtual_stages={virtual_stages!r}: schedule 'zero_bubble_v' places exactly 2 "
            "chunks on each rank (stages r and 2P−1−r), so virtual_stages must be 2"
        )
    return greedy_plan(v_shape(stages), microbatches, [3 * stages] * stages)
