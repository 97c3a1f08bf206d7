"""Functions the benchmarks run inside the ranks."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from impls.collectives import all_reduce
from impls.comm import Communicator

_BUFFERS: dict[int, torch.Tensor] = {}


def _buffer(numel: int) -> torch.Tensor:
    if numel not in _BUFFERS:
        _BUFFERS.clear()
        _BUFFERS[numel] = torch.zeros(numel)
    return _BUFFERS[numel]


def one_call(algorithm: str, numel: int) -> None:
    """One all-reduce, bracketed by barriers so the parent's clock sees the slowest rank."""
    x = _buffer(numel)
    dist.barrier()
    if algorithm == "torch":
        dist.all_reduce(x)
    else:
        all_reduce(x, Communicator(), algorithm=algorithm)
    dist.barrier()


def interleaved_ratio(numel: int, repeats: int) -> dict:
    """ring and torch timed in alternating windows (drift hits both): medians and ratio."""
    x, comm = _buffer(numel), Communicator()
    calls = {"torch": lambda: dist.all_reduce(x), "ring": lambda: all_reduce(x, comm)}
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            dist.barrier()
            start = time.perf_counter()
            call()
            t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times[name].append(float(t.item()))
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "torch_s": med["torch"],
        "ring_s": med["ring"],
        "ring_vs_torch": med["torch"] / med["ring"],
    }
