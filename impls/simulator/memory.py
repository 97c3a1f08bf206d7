"""Peak memory of one pipeline rank: model states, held activations, transients, workspace.

Each part, with its source or assumption: `rank_memory`. The workspace constant,
`WORKSPACE_BYTES`, is an assumption (CUDA context, cuBLAS/NCCL buffers and allocator
fragmentation, ~1 GiB as commonly observed on A100/H100).
"""

from __future__ import annotations

from collections.abc import Sequence

from impls.costmodel.memory import (
    PRESETS,
    BytesPerParam,
    ModelStateBytes,
    model_state_bytes,
)
from impls.pipeline.actions import Action

__all__ = ["WORKSPACE_BYTES", "bytes_per_param", "held_activation_peak", "rank_memory"]

WORKSPACE_BYTES = float(2**30)


def bytes_per_param(dtype: str) -> BytesPerParam:
    """Adam's bytes per parameter for the training dtype."""
    return PRESETS["fp32"] if dtype in ("fp32", "tf32") else PRESETS["bf16"]


def held_activation_peak(actions: Sequence[Action], stage_bytes: Sequence[float]) -> float:
    """The most activation bytes a rank holds at once (weighted in-flight count)."""
    held: set[tuple[int, int]] = set()
    now = peak = 0.0
    for action in actions:
        key = (action.stage, action.microbatch)
        if action.kind == "F" and key not in held:
            held.add(key)
            now += stage_bytes[action.stage]
            peak = max(peak, now)
        elif action.kind in ("B", "W") and key in held:
            held.discard(key)
            now -= stage_bytes[action.stage]
    return peak


def rank_memory(
    *,
    params: float,
    zero_stage: int,
    dp_size: int,
    dtype: str,
    activations: float,
    transient: float,
    workspace: float = WORKSPACE_BYTES,
) -> dict:
    """The memory breakdown of one rank (bytes); `total` is its peak.

    - Model states: `impls.costmodel.memory.model_state_bytes` over the rank's own parameters
      (its tp shard of its stages) at the plan's ZeRO stage over the data-parallel group;
      Adam in mixed precision 2 + 2 + 12 bytes per parameter (bf16/fp16/fp8), fp32 Adam
      4 + 4 + 8 (Rajbhandari et al. 2019 §3.1).
    - Activations: walking the rank's action list in order, a (stage, micro-batch) is held from
      its F to its B (or its W when the backward is split), as
      `impls.pipeline.replay.max_inflight_microbatches` counts, each held pair weighing what its
      stage saves per micro-batch (`activation_bytes_per_layer` × the stage's layers, the
      embedding's and the head's own). GPipe therefore holds M micro-batches, 1F1B's first rank P.
    - Transients, alive during one backward: the full-recompute layer's rematerialised
      activations, ZeRO-3's two gathered layers (the current and the prefetched one) and the
      LM head's fp32 logit gradient on the rank that holds the head.
    - A workspace constant, `WORKSPACE_BYTES` (assumption: CUDA context, cuBLAS/NCCL buffers
      and allocator fragmentation, ~1 GiB as commonly observed on A100/H100).
    """
    states: ModelStateBytes = model_state_bytes(params, zero_stage, dp_size, bytes_per_param(dtype))
    parts = {
        "weights": states.weights,
        "gradients": states.gradients,
        "optimizer": states.optimizer,
        "activations": activations,
        "transient": transient,
        "workspace": workspace,
    }
    parts["total"] = sum(parts.values())
    return parts
