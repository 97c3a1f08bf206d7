"""What a `max_model_size` cell computes: the cost model at one grid point. Nothing is
measured; the runner calls it in its own process (`in_process`)."""

from __future__ import annotations

from typing import Any

from bench.experiments.base import Cell
from bench.experiments.max_model_size.config import MaxModelSizeConfig
from impls.costmodel import (
    comm_bytes_per_step,
    comm_psi_multiple,
    floor_billions,
    max_trainable_params,
    model_state_bytes,
)

__all__ = ["GB", "run"]

GB = 1e9  # the lecture's GB (80 GB / 16 B = 5.0B parameters), not GiB


def run(cfg: MaxModelSizeConfig, cell: Cell) -> dict[str, Any]:
    """The cost model at `cell`: the largest model that fits, and the given model's memory.
    `cell.carry` is the config's bytes per parameter as the cost model's `BytesPerParam`."""
    b, key = cell.carry, cell.key
    stage, dp, memory = key["stage"], key["dp"], key["gpu_memory_gb"] * GB
    largest = max_trainable_params(memory, stage, dp, cfg.mp, b)
    share = cfg.params / cfg.mp  # what one model-parallel slice holds
    states = model_state_bytes(share, stage, dp, b)
    return {
        "max_params": largest,
        "max_params_billions": floor_billions(largest),
        "param_bytes": states.weights,
        "grad_bytes": states.gradients,
        "optim_bytes": states.optimizer,
        "model_state_bytes": states.total,
        "per_device_gb": states.total / GB,
        "fits": states.total <= memory,
        # Collectives move the weights' dtype (half precision under mixed precision).
        "comm_bytes_per_step": comm_bytes_per_step(share, stage, dp, b.weights),
        "comm_psi_multiple": comm_psi_multiple(stage, dp),
    }
