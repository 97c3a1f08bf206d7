"""The methods a `zero_memory` cell can train, their ZeRO stage and their torch twin, and
`Plan`, what a cell trains and times beside it (the cell's `carry`).

Plain data, no torch: the config, the rank side and the report all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "DDP_METHODS",
    "DISTBENCH_METHODS",
    "EXTRA_METHODS",
    "METHOD_OF_STAGE",
    "Plan",
    "STAGE_OF",
    "TOLERANCE",
    "TORCH_METHODS",
    "TWINS",
    "ZERO_METHODS",
]

ZERO_METHODS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
"""`impls.zero.ZeroDataParallel` at stage 0–3."""
METHOD_OF_STAGE = {stage: method for method, stage in ZERO_METHODS.items()}
DDP_METHODS = ("ddp", "ddp_no_overlap")
"""`impls.data_parallel.DDP`, bucketed, with and without overlapping backward."""
DISTBENCH_METHODS = (*ZERO_METHODS, *DDP_METHODS)
TORCH_METHODS = ("torch_ddp", "torch_zero_redundancy", "torch_fsdp2")
EXTRA_METHODS = (*DDP_METHODS, *TORCH_METHODS)
"""What `methods` may add to the ZeRO stages."""
STAGE_OF = {
    **ZERO_METHODS,
    "ddp": 0,
    "ddp_no_overlap": 0,
    "torch_ddp": 0,
    "torch_zero_redundancy": 1,
    "torch_fsdp2": 3,
}
"""The ZeRO stage whose memory footprint each method has."""
TOLERANCE = {"fp32": 1e-3, "bf16": 0.15, "fp16": 0.08}
"""The largest update error (`bench.kit.reference.compare`: ‖θ − θ_ref‖ / ‖θ_ref − θ₀‖ after
`steps` AdamW steps against the fp32 single-process reference) a cell may show. fp32: the
same arithmetic in another order, rounding only (2e-5 on the default GPT at N = 2, torch's
DDP alike). bf16/fp16: weights and gradients rounded to 8/11 significant bits (bf16
measured 0.064 here; the ZeRO tests measured 0.071 for bf16 and 0.031 for fp16)."""
TWINS = {
    "dp": "torch_ddp",
    "zero1": "torch_zero_redundancy",
    "zero3": "torch_fsdp2",
    "ddp": "torch_ddp",
    "ddp_no_overlap": "torch_ddp",
}
"""Each distbench method's torch.distributed counterpart. torch has no ZeRO-2 proper (FSDP2
with `reshard_after_forward=False` keeps parameters gathered only within a step and rests
sharded), so `zero2` has none."""


@dataclass(frozen=True)
class Plan:
    """What one cell trains, built once by `cells` and shared by its ranks and `to_row`."""

    method: str
    precision: str
    loss_scale: Any = None
    """fp16's loss scaling ("dynamic" or a fixed scale); None in fp32 and bf16."""
    twin: str = ""
    """torch's method timed in steps alternating with this one ("" when unpaired)."""
    no_overlap: bool = False
    """Also time `ddp_no_overlap` alternately (a paired `ddp` cell: what overlap buys)."""

    @property
    def stage(self) -> int:
        return STAGE_OF[self.method]

    @property
    def impl(self) -> str:
        return "torch" if self.method in TORCH_METHODS else "distbench"
