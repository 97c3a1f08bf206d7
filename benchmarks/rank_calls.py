"""Functions the benchmarks run inside the ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from bench.kit.timing import alternate
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
    """ring and torch timed in alternating steps (drift hits both): medians and ratio."""
    x, comm = _buffer(numel), Communicator()
    sides = {"torch": lambda: dist.all_reduce(x), "ring": lambda: all_reduce(x, comm)}
    timed = alternate(sides, warmup=1, repeats=repeats)
    return {
        "torch_s": timed["torch"].median,
        "ring_s": timed["ring"].median,
        "ring_vs_torch": timed["torch"].median / timed["ring"].median,
    }
