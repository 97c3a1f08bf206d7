"""What the ranks of a `device_profile` cell do: one measurement each.

- `gemm`, `copy`, `launch` (one rank): the step from `bench.kit.profile`, timed on the
  profiled device (`device`, resolved here: a rank sees the GPUs its machine has) at the
  device's threads (CPU), with what a preset needs to know about the device beside it;
- `all_reduce` (N ranks): this repo's ring all-reduce at one size, timed and checked by
  `bench.kit.collectives.measure_collective`, as `allreduce_scaling` times it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from bench.experiments.base import Cell
from bench.experiments.device_profile.config import DeviceProfileConfig
from bench.kit import profile
from bench.kit.collectives import measure_collective

__all__ = ["run"]

CHAIN = 100
"""Tiny kernels per step of the launch cell: issued back to back, then one synchronisation
(on CUDA), so the time per kernel is the issue rate, not a synchronisation's round trip."""


@contextmanager
def _threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _device_facts(cfg: DeviceProfileConfig, device: str) -> dict[str, Any]:
    """The device as a preset describes it: its name, memory, threads and how many of it
    a node holds (a GPU machine's GPUs; on a CPU host, the ranks of the largest ring cell,
    each a share of the host's cores)."""
    cuda = device.startswith("cuda")
    devices = torch.cuda.device_count() if cuda else max(cfg.world_sizes)
    memory = profile.device_memory_bytes(device)
    return {
        "profiled_device": profile.device_name(device),
        "device_kind": "cuda" if cuda else "cpu",
        "threads": torch.get_num_threads(),
        "devices_per_node": devices,
        # a CPU host's memory is shared by its ranks: each device holds its share
        "device_memory_bytes": memory if cuda else memory / devices,
    }


def _measure(cfg: DeviceProfileConfig, key: dict[str, Any], device: str) -> dict[str, Any]:
    """Time the cell's step, then check its result (`wrong`: elements off the reference)."""
    timing = {
        "warmup": cfg.warmup,
        "repeats": cfg.repeats,
        "window_s": cfg.window_s,
        "max_iters": cfg.max_iters,
        "device": device,
    }
    kind = key["measurement"]
    if kind == "gemm":
        m, n, k = key["m"], key["n"], key["k"]
        with profile.gemm_mode(key["dtype"], device):
            step, check = profile.gemm_step(m, n, k, key["dtype"], device)
            out = {**profile.timed(step, **timing), "wrong": check(), "flops": 2.0 * m * n * k}
        out["flop_rate"] = out["flops"] / out["seconds"]
    elif kind == "copy":
        step, check = profile.copy_step(key["message_bytes"], device)
        out = {**profile.timed(step, **timing), "wrong": check()}
        out["bytes_moved"] = 2.0 * key["message_bytes"]
        out["bandwidth"] = out["bytes_moved"] / out["seconds"]
    elif kind == "launch":
        step, check = profile.launch_step(device)
        out = {**profile.timed(step, per_call=CHAIN, **timing), "wrong": check()}
    else:
        raise ValueError(f"measurement={kind!r}: no such cell")
    out["time_s"] = out.pop("seconds")
    return out


def run(cfg: DeviceProfileConfig, cell: Cell) -> dict[str, Any]:
    """One rank's part of `cell`: the measurement and (device cells) the device's facts."""
    if cell.key["measurement"] == "all_reduce":
        return measure_collective(cfg, cell)
    device = profile.resolve_device(cfg.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda: this rank sees no GPU (torch.cuda.is_available())")
    with _threads(cfg.threads() if device == "cpu" else torch.get_num_threads()):
        return {**_measure(cfg, cell.key, device), **_device_facts(cfg, device)}
