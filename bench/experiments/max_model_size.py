"""Experiment `max_model_size`: the largest trainable model per ZeRO stage, from the cost model.

The lecture's table (80 GB, N = 64: 5B / 19B / 36B / 320B) and the ZeRO paper's per-device
memory of a given model (its Figure 1: Ψ = 7.5B), over GPU memories × data-parallel
degrees N × stages 0–3, all computed by `impls.costmodel.memory` — the model whose
prediction the `zero_memory` experiment holds against measured runs (the report states how
well it matched).

Nothing here needs more than one process, but the runner only knows how to run a cell on
ranks. Each cell is therefore a grid cell like any other on a world of one rank: the
runner's one-rank pool evaluates the formulas and returns the row, so results.csv gets the
same run metadata, atomic writes, `resume` and failure handling as every experiment, at the
cost of starting one rank process (seconds). The metadata's `world_size` is that 1; the
data-parallel degree the formulas are evaluated at is the `dp` column. Under an external
`torchrun` of more than one rank the runner skips one-rank cells (with a warning): run this
experiment with `cluster=local`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from bench.experiments.common import Cell, Experiment, check_positive
from bench.reports import max_model_size as report
from impls.costmodel import (
    STAGES,
    BytesPerParam,
    comm_bytes_per_step,
    comm_psi_multiple,
    floor_billions,
    max_trainable_params,
    model_state_bytes,
)

__all__ = ["EXPERIMENT", "MaxModelSizeCell", "MaxModelSizeConfig", "predict"]

GB = 1e9  # the lecture's GB (80 GB / 16 B = 5.0B parameters), not GiB
BYTES_KEYS = ("weights", "gradients", "optimizer")


def _lecture_bytes() -> dict[str, float]:
    return {"weights": 2, "gradients": 2, "optimizer": 12}


@dataclass(kw_only=True)
class MaxModelSizeConfig:
    gpu_memory_gb: list[float] | float = field(default_factory=lambda: [80.0])
    """Memory per device M in GB (1e9 bytes), one value or a list."""
    dp: list[int] | int = field(default_factory=lambda: [2**k for k in range(11)])
    """Data-parallel degrees N (1 … 1024 by default; 64 is the lecture's)."""
    mp: int = 1
    """Model-parallel degree: every model state split evenly over mp devices."""
    bytes_per_param: dict[str, float] = field(default_factory=_lecture_bytes)
    """Bytes per parameter of weights / gradients / optimizer state (lecture: 2 / 2 / 12)."""
    params: float = 7.5e9
    """Ψ of the given model whose per-device memory is tabulated (the ZeRO paper's 7.5B)."""
    timeout_s: float = 60.0
    """A cell not finished by then is recorded as failed (the formulas take microseconds)."""

    def __post_init__(self) -> None:
        self.gpu_memory_gb = _as_list(self.gpu_memory_gb)
        self.dp = _as_list(self.dp)
        bad = [m for m in self.gpu_memory_gb if not _positive_number(m)]
        if bad or not self.gpu_memory_gb:
            raise ValueError(
                f"gpu_memory_gb={self.gpu_memory_gb}: every value must be a number > 0 (GB)"
            )
        self.gpu_memory_gb = [float(m) for m in self.gpu_memory_gb]
        check_positive("dp", self.dp)
        self.dp = sorted(set(self.dp))
        check_positive("mp", [self.mp])
        if not _positive_number(self.params):
            raise ValueError(f"params={self.params!r}: must be a number > 0 (parameters)")
        self.params = float(self.params)
        if not isinstance(self.bytes_per_param, dict):
            raise ValueError(
                f"bytes_per_param={self.bytes_per_param!r}: must be a mapping with keys "
                f"{', '.join(BYTES_KEYS)}"
            )
        unknown = sorted(set(self.bytes_per_param) - set(BYTES_KEYS))
        if unknown:
            raise ValueError(
                f"bytes_per_param has unknown key(s) {', '.join(unknown)}; "
                f"allowed keys: {', '.join(BYTES_KEYS)}"
            )
        self.bytes_per_param = {**_lecture_bytes(), **self.bytes_per_param}
        self.costs()  # BytesPerParam refuses values ≤ 0, naming bytes_per_param.<key>
        if not _positive_number(self.timeout_s):
            raise ValueError(f"timeout_s={self.timeout_s}: must be > 0")

    def costs(self) -> BytesPerParam:
        """`bytes_per_param` as the cost model's type."""
        return BytesPerParam(**self.bytes_per_param)


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _positive_number(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@dataclass(frozen=True, kw_only=True)
class MaxModelSizeCell:
    """One stage × memory × N point of the grid (picklable: it travels to the rank)."""

    stage: int
    gpu_memory_gb: float
    dp: int
    mp: int
    params: float
    bytes_per_param: BytesPerParam


def predict(task: MaxModelSizeCell) -> dict[str, Any]:
    """The cost model at one grid point: largest model, and the given model's memory."""
    b, stage, dp = task.bytes_per_param, task.stage, task.dp
    largest = max_trainable_params(task.gpu_memory_gb * GB, stage, dp, task.mp, b)
    share = task.params / task.mp  # what one model-parallel slice holds
    states = model_state_bytes(share, stage, dp, b)
    return {
        "max_params": largest,
        "max_params_billions": floor_billions(largest),
        "param_bytes": states.weights,
        "grad_bytes": states.gradients,
        "optim_bytes": states.optimizer,
        "model_state_bytes": states.total,
        "per_device_gb": states.total / GB,
        "fits": states.total <= task.gpu_memory_gb * GB,
        # Collectives move the weights' dtype (half precision under mixed precision).
        "comm_bytes_per_step": comm_bytes_per_step(share, stage, dp, b.weights),
        "comm_psi_multiple": comm_psi_multiple(stage, dp),
    }


def cells(cfg: MaxModelSizeConfig) -> list[Cell]:
    b = cfg.costs()
    out = []
    for memory in cfg.gpu_memory_gb:
        for dp in cfg.dp:
            for stage in STAGES:
                key = {
                    "stage": stage,
                    "gpu_memory_gb": memory,
                    "dp": dp,
                    "mp": cfg.mp,
                    "params": cfg.params,
                    "weight_bytes_per_param": b.weights,
                    "grad_bytes_per_param": b.gradients,
                    "optim_bytes_per_param": b.optimizer,
                }
                task = MaxModelSizeCell(
                    stage=stage, gpu_memory_gb=memory, dp=dp, mp=cfg.mp, params=cfg.params,
                    bytes_per_param=b,
                )  # fmt: skip
                out.append(Cell(world_size=1, key=key, fn=predict, task=task))
    return out


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    return {**cell.key, **per_rank[0]}


EXPERIMENT = Experiment(
    name="max_model_size",
    schema=MaxModelSizeConfig,
    key_columns=[
        "stage",
        "gpu_memory_gb",
        "dp",
        "mp",
        "params",
        "weight_bytes_per_param",
        "grad_bytes_per_param",
        "optim_bytes_per_param",
    ],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
    reads=("zero_memory",),
)
