"""What a device can do, measured on it: the microbenchmarks a hardware preset is made of.

Each benchmark is split into *what runs* (a step builder: the tensors made once, a
callable that runs the kernel, and a check of its result against a reference:
`gemm_step`, `copy_step`, `launch_step`) and *how it is timed* (`timed`, through
`bench.kit.timing`: barrier-opened windows of calls, the slowest rank's time, the median
window), so a caller with its own timing can reuse the steps. `fit_ring` (from
`bench.kit.fit`, the one α–β fit) turns a ring all-reduce timed at several sizes
(`bench.kit.collectives`) into a link's (α, β).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from bench.kit.fit import fit_ring
from bench.kit.timing import alternate, calibrate_iters

__all__ = [
    "GEMM_DTYPES",
    "TOLERANCE",
    "Step",
    "copy_step",
    "device_name",
    "device_memory_bytes",
    "fit_ring",
    "gemm_step",
    "launch_step",
    "resolve_device",
    "timed",
]

GEMM_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
"""The GEMM dtypes a profile times, by the names `Hardware.peak_flops` uses."""


def resolve_device(device: str) -> str:
    """`auto` → `cuda` where a GPU is visible, else `cpu`; any other name unchanged."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def device_name(device: str) -> str:
    """What the device is, in words: the GPU's name, or the CPU's model."""
    if device.startswith("cuda"):
        return f"cuda: {torch.cuda.get_device_name(torch.device(device))}"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()}"


def device_memory_bytes(device: str) -> float:
    """Memory of the device: a GPU's own, or the host's physical memory."""
    if device.startswith("cuda"):
        return float(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextmanager
def gemm_mode(dtype: str, device: str) -> Iterator[None]:
    """TF32 tensor cores on for "tf32" (off for "fp32"), restored after; tf32 only on CUDA."""
    if dtype not in GEMM_DTYPES:
        raise ValueError(f"dtype={dtype!r}: allowed values {', '.join(GEMM_DTYPES)}")
    if not device.startswith("cuda"):
        if dtype == "tf32":
            raise ValueError("dtype='tf32': a CUDA tensor-core mode; a CPU has none")
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


Step = tuple[Callable[[], Any], Callable[[], int]]
"""(the call to time, a check after it: how many result elements are off their reference)."""

TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 2e-2, "fp16": 5e-3}
"""A GEMM element's allowed error ÷ (√k · its inputs' scale), per dtype: a few units of
the output's last place (bf16 keeps 8 bits, fp16 11, TF32 10, fp32 24) for random
inputs, whose rounding errors add up as √k."""


def gemm_step(m: int, n: int, k: int, dtype: str, device: str) -> Step:
    """One (m × k)·(k × n) product into an (m × n) buffer made once: 2mnk FLOPs a call;
    the check compares the first rows with the same product in float64. Call both inside
    `gemm_mode(dtype, device)` (tf32 is fp32 with CUDA's TF32 tensor cores on)."""
    kind = GEMM_DTYPES[dtype]
    a = torch.randn(m, k, device=device).to(kind)  # (m, k)
    b = torch.randn(k, n, device=device).to(kind)  # (k, n)
    out = torch.empty(m, n, dtype=kind, device=device)  # (m, k) @ (k, n) -> (m, n)

    def check() -> int:
        rows = min(m, 8)
        torch.matmul(a, b, out=out)
        exact = a[:rows].double() @ b.double()  # (rows, k) @ (k, n) -> (rows, n)
        error = (out[:rows].double() - exact).abs()
        return int((error > TOLERANCE[dtype] * k**0.5).sum().item())

    return (lambda: torch.matmul(a, b, out=out)), check


def copy_step(nbytes: int, device: str) -> Step:
    """A copy of `nbytes` of fp32 from one buffer into another: 2·nbytes through memory,
    whose rate is the achieved memory bandwidth (chsasank/device-benchmarks measures a
    GPU's the same way); the check counts the elements of the target that differ."""
    source = torch.arange(max(1, nbytes // 4), device=device, dtype=torch.float32)
    target = torch.empty_like(source)
    return (lambda: target.copy_(source)), lambda: int((target != source).sum().item())


def launch_step(device: str) -> Step:
    """An in-place add of 1 on one element: a kernel with nothing to do but be launched;
    the check: the element counts the calls made (1 if it does not)."""
    x = torch.zeros(1, dtype=torch.float64, device=device)
    calls = [0]

    def step() -> None:
        calls[0] += 1
        x.add_(1.0)

    return step, lambda: int(x.item() != calls[0])


def timed(
    fn: Callable[[], Any],
    *,
    device: str,
    warmup: int,
    repeats: int,
    window_s: float,
    max_iters: int,
    per_call: int = 1,
    group: Any = None,
) -> dict[str, float]:
    """Seconds per `fn` call: `per_call` calls and a device synchronisation make a step,
    timed as every experiment times one (`bench.kit.timing`: `warmup` untimed steps, then
    `repeats` barrier-opened windows of as many steps as fill `window_s`, each the slowest
    rank's). The median window (`seconds`) and the fastest (`fastest_s`), per call.

    On CUDA a timed step ends with `torch.cuda.synchronize()`, so a window's clock stops only
    when its kernels have run; `per_call` kernels run back to back before it (the launch
    probe: the rate at which the host issues kernels, not a synchronisation's round trip).
    """

    def step() -> None:
        for _ in range(per_call):
            fn()
        _sync(device)

    for _ in range(warmup):
        step()
    iters = calibrate_iters(step, window_s, max_iters, group)
    timing = alternate(
        {"step": step}, warmup=0, repeats=repeats, group=group, iters={"step": iters}
    )["step"]
    return {
        "seconds": timing.median / per_call,
        "fastest_s": min(timing.seconds) / per_call,
        "iters": iters * per_call,
    }
