"""`device_profile`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas, plotting or
report code."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from bench.config import (
    bounded,
    bytes_key,
    check_choice,
    check_choices,
    check_positive,
    check_unique,
    ranks_key,
)
from bench.kit.collectives import TimedGridConfig

__all__ = ["DEVICES", "GEMM_DTYPE_NAMES", "DeviceProfileConfig"]

DEVICES = ("auto", "cpu", "cuda")
GEMM_DTYPE_NAMES = ("fp32", "tf32", "bf16", "fp16")  # bench.kit.profile.GEMM_DTYPES
MESSAGE_DTYPES = ("float32", "float16", "bfloat16")


def _cpu_shapes() -> list[list[int]]:
    """Squares, then a GPT layer's GEMMs at 2048 tokens and width 1024: QKV (d → 3d), the
    attention output (d → d), the MLP's up (d → 4d) and down (4d → d) projections."""
    squares = [[n, n, n] for n in (128, 256, 512, 1024, 2048)]
    return [
        *squares,
        [2048, 3072, 1024],
        [2048, 1024, 1024],
        [2048, 4096, 1024],
        [2048, 1024, 4096],
    ]


def _gpu_shapes() -> list[list[int]]:
    """The same at a GPU's scale: squares to 8192 (where MAMF's best shapes sit), and a
    GPT layer's GEMMs at 8192 tokens and width 4096."""
    squares = [[n, n, n] for n in (512, 1024, 2048, 4096, 8192)]
    return [
        *squares,
        [8192, 12288, 4096],
        [8192, 4096, 4096],
        [8192, 16384, 4096],
        [8192, 4096, 16384],
    ]


DEFAULT_DTYPES = {"cpu": ["fp32", "bf16"], "cuda": ["bf16", "fp16", "tf32", "fp32"]}
"""Per device: the first is the preset's efficiency table (what training runs in there)."""


def _check_shapes(shapes: list) -> None:
    """[m, n, k] triples of integers ≥ 1, none repeated."""
    if not shapes or any(
        not isinstance(s, list)
        or len(s) != 3
        or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in s)
        for s in shapes
    ):
        raise ValueError(f"gemm_shapes={shapes}: give [m, n, k] triples of integers ≥ 1")
    check_unique("gemm_shapes", [tuple(s) for s in shapes])


@dataclass(kw_only=True)
class DeviceProfileConfig(TimedGridConfig):
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("message_bytes", "copy_mib", "gemm_shapes")

    device: str = "auto"
    """Where the GEMM, copy and launch cells run: cuda (a GPU of this machine), cpu, or
    auto (cuda where one is visible, else cpu)."""
    gemm_shapes: list[list[int]] | None = None
    """GEMMs to time, each [m, n, k]: an (m × k)·(k × n) product, 2mnk FLOPs; null: the
    device's own grid (squares and a GPT layer's GEMMs, to 2048 on a CPU, to 8192 on a GPU,
    where the best rate reaches the plateau)."""
    gemm_dtypes: list[str] | None = None
    """GEMM dtypes (fp32, tf32, bf16, fp16; tf32 on CUDA only); null: the device's (cpu:
    fp32, bf16; cuda: bf16, fp16, tf32, fp32). Each one's best rate is its peak in the
    preset; the first one's rates by shape are the preset's efficiency table."""
    copy_mib: int = bounded(256, ge=1, le=4096, why="two copies of it in 8 GiB")
    """MiB copied by the memory-bandwidth cell (well beyond every cache)."""
    threads_per_device: int | None = bounded(None, ge=1, le=1024, why="threads of one rank")
    """CPU threads the GEMM, copy and launch cells run on; null: the cores ÷ the largest
    world size, the share each rank of the ring cells has (the preset's device is one
    rank). Ignored on CUDA."""
    world_sizes: list[int] = ranks_key([2], ge=2)
    """Ranks of the ring all-reduce cells (N ≥ 2); the preset's link is fitted at the
    largest."""
    message_bytes: list[int] = bytes_key([4 << 10 << 2 * i for i in range(8)])
    """Ring all-reduce sizes in bytes (≥ 2 distinct: α and β are fitted to them): 4 KiB …
    64 MiB, where the bytes' time dwarfs α."""
    paired: bool = False
    """Also time torch.distributed's all-reduce beside the ring (context only)."""

    def __post_init__(self) -> None:
        check_choice("device", self.device, DEVICES)
        if self.gemm_dtypes is not None:
            check_choices("gemm_dtypes", self.gemm_dtypes, GEMM_DTYPE_NAMES)
            check_unique("gemm_dtypes", self.gemm_dtypes)
            if self.device == "cpu" and "tf32" in self.gemm_dtypes:
                raise ValueError(
                    "gemm_dtypes=[..., tf32]: tf32 is a CUDA tensor-core mode; device=cpu has none"
                )
        if self.gemm_shapes is not None:
            _check_shapes(self.gemm_shapes)
        check_positive("copy_mib", [self.copy_mib])
        if self.threads_per_device is not None:
            check_positive("threads_per_device", [self.threads_per_device])
        check_positive("world_sizes", self.world_sizes, minimum=2)
        check_choice("dtype", self.dtype, MESSAGE_DTYPES)
        if len(set(self.message_bytes)) < 2:
            raise ValueError(
                f"message_bytes={self.message_bytes}: give at least 2 distinct "
                "sizes (the link's α and β are fitted to them)"
            )
        super().__post_init__()

    def on_cuda(self) -> bool:
        """Whether the device cells run on a GPU (`auto`: whether this process sees one)."""
        if self.device != "auto":
            return self.device == "cuda"
        import torch

        return torch.cuda.is_available()

    def shapes(self) -> list[list[int]]:
        """`gemm_shapes`, or the device's own grid."""
        if self.gemm_shapes is not None:
            return self.gemm_shapes
        return _gpu_shapes() if self.on_cuda() else _cpu_shapes()

    def dtypes(self) -> list[str]:
        """`gemm_dtypes`, or the device's own."""
        if self.gemm_dtypes is not None:
            return self.gemm_dtypes
        return DEFAULT_DTYPES["cuda" if self.on_cuda() else "cpu"]

    def threads(self) -> int:
        """CPU threads of the device cells (see `threads_per_device`)."""
        if self.threads_per_device is not None:
            return self.threads_per_device
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return max(1, (cores or os.cpu_count() or 1) // max(self.world_sizes))

    def rank_bytes(self) -> int:
        """An upper bound on one rank's allocation: the larger of a ring cell's buffers, the
        copy's two buffers and the largest GEMM's three fp32 matrices."""
        shapes = self.gemm_shapes or _cpu_shapes()  # a GPU's GEMMs live in its own memory
        gemm = max(4 * (m * k + k * n + m * n) for m, n, k in shapes)
        return max(super().rank_bytes(), 2 * self.copy_mib * 2**20, gemm)
