"""`max_model_size`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas,
plotting or report code."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from bench.config import bounded, cell_timeout, check_positive
from impls.costmodel import BytesPerParam

__all__ = ["BYTES_KEYS", "MaxModelSizeConfig"]


BYTES_KEYS = ("weights", "gradients", "optimizer")


def _lecture_bytes() -> dict[str, float]:
    return {"weights": 2, "gradients": 2, "optimizer": 12}


@dataclass(kw_only=True)
class MaxModelSizeConfig:
    gpu_memory_gb: Any = bounded([80.0], ge=0, le=100_000, why="100 TB on one device")
    """Memory per device M in GB (1e9 bytes), one value or a list."""
    dp: Any = bounded([2**k for k in range(11)], ge=1, le=2**17, why="auto_parallel's gpus bound")
    """Data-parallel degrees N, one value or a list (1 … 1024 by default; 64 is the
    lecture's)."""
    mp: int = bounded(1, ge=1, le=2**17, why="auto_parallel's gpus bound")
    """Model-parallel degree: every model state split evenly over mp devices."""
    bytes_per_param: Any = field(default_factory=_lecture_bytes)
    """Bytes per parameter of weights / gradients / optimizer state (lecture: 2 / 2 / 12:
    mixed-precision Adam, the lecture's K = 12 — fp16 weights and gradients, fp32 master
    weights, momentum and variance; fp32 Adam is 4 / 4 / 8). A mapping; keys left out keep
    the lecture's value."""
    params: float = bounded(7.5e9, ge=0, le=1e15, why="a quadrillion parameters")
    """Ψ of the given model whose per-device memory is tabulated (the ZeRO paper's 7.5B)."""
    timeout_s: float = cell_timeout(60.0)
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
