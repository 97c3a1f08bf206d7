"""What one rank does in a `zero_memory` cell: train a few steps, account memory, time.

Every method trains the same GPT (one seed on every rank) on the same batch, each of the
N ranks on its contiguous 1/N of it, with AdamW:

- distbench: `dp`, `zero1`, `zero2`, `zero3` (`impls.zero.ZeroDataParallel`, stage 0–3,
  its `MemoryLedger` counting every byte), and `ddp` / `ddp_no_overlap`
  (`impls.data_parallel.DDP`, bucketed, with and without overlapping backward);
- torch.distributed: `torch_ddp` (DistributedDataParallel), `torch_zero_redundancy`
  (DDP + ZeroRedundancyOptimizer: ZeRO-1) and `torch_fsdp2` (FSDP2 `fully_shard` per
  block and on the root: ZeRO-3). torch has no ZeRO-2 proper (FSDP2 with
  `reshard_after_forward=False` keeps parameters gathered only within a step and rests
  sharded), so `zero2` has no twin.

After `steps` training steps, rank 0 compares every parameter with a single-process
AdamW reference trained on the whole batch (`max_param_diff`, and `update_error`: the
relative error of each parameter's update, which decides `wrong`). Model-state bytes of the
distbench ZeRO stages come from the ledger; for the DDP and torch methods they are read
off the tensors the rank holds at the end of a step (parameters, `.grad`s, optimizer
state; a DTensor counts its local shard), which is exact for those tensors but, unlike
the ledger, sees no transient buffers. The `ddp` rows are about speed (overlap) and leave
memory empty: distbench's DDP drops its gradients at the end of a step, so no moment
outside the step shows them. Then `repeats` timed steps (barrier, slowest rank,
median); with `paired`, the method's torch twin (`TWINS`) is built on a twin model and
timed in steps alternating with it, so the speed ratio is measured side by side; a paired
`ddp` cell also alternates with `ddp_no_overlap`, for what the overlap buys.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.kit.timing import slowest
from bench.kit.workloads import lm_loss, seeded_batch
from impls.models import GPT, GPTConfig

__all__ = [
    "DISTBENCH_METHODS",
    "METHODS",
    "STAGE_OF",
    "TORCH_METHODS",
    "TWINS",
    "ZeroCell",
    "held_bytes",
    "paired_step_times",
    "run_zero_cell",
]

ZERO_METHODS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
DISTBENCH_METHODS = (*ZERO_METHODS, "ddp", "ddp_no_overlap")
TORCH_METHODS = ("torch_ddp", "torch_zero_redundancy", "torch_fsdp2")
METHODS = (*DISTBENCH_METHODS, *TORCH_METHODS)
# The ZeRO stage whose memory footprint each method has.
STAGE_OF = {
    **ZERO_METHODS,
    "ddp": 0,
    "ddp_no_overlap": 0,
    "torch_ddp": 0,
    "torch_zero_redundancy": 1,
    "torch_fsdp2": 3,
}
# Each distbench method's torch.distributed counterpart, timed beside it when `paired`.
TWINS = {
    "dp": "torch_ddp",
    "zero1": "torch_zero_redundancy",
    "zero3": "torch_fsdp2",
    "ddp": "torch_ddp",
    "ddp_no_overlap": "torch_ddp",
}


@dataclass(kw_only=True)
class ZeroCell:
    """One measured configuration, as shipped to every rank."""

    method: str
    model: dict[str, Any]
    """`GPTConfig` keyword arguments."""
    precision: str = "fp32"
    loss_scale: str | float | None = None
    batch_size: int = 8
    steps: int = 3
    """Training steps compared with the single-process reference."""
    warmup: int = 1
    repeats: int = 5
    lr: float = 1e-3
    weight_decay: float = 0.01
    bucket_cap_bytes: int = 2 << 20
    """DDP's gradient bucket size (distbench's `ddp` / `ddp_no_overlap`)."""
    seed: int = 0
    paired: bool = False


class _Trainer:
    """One method on this rank: `step()` trains once on this rank's shard."""

    def __init__(self, step: Callable[[], dict], state_bytes: Callable[[], dict | None],
                 params: Callable[[], dict[str, torch.Tensor]],
                 close: Callable[[], None] = lambda: None,
                 units: list[int] | None = None) -> None:  # fmt: skip
        self.step, self.state_bytes, self.params, self.close = step, state_bytes, params, close
        self.units = units  # the flat units' sizes (ZeRO pads each to a multiple of N)
        self.numel = 0  # the model's parameter count Ψ, set by `_trainer`


def _model_and_batch(cell: ZeroCell) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    cfg = GPTConfig(**cell.model)
    return GPT(cfg, seed=cell.seed), *seeded_batch(cfg, cell.batch_size, cell.seed)


def _shard(batch: torch.Tensor) -> torch.Tensor:
    n, r = dist.get_world_size(), dist.get_rank()
    per = batch.shape[0] // n
    return batch[r * per : (r + 1) * per]


def _adamw(cell: ZeroCell) -> Callable[[Any], torch.optim.Optimizer]:
    return lambda params: torch.optim.AdamW(params, lr=cell.lr, weight_decay=cell.weight_decay)


def _tensor_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _optim_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _tensor_bytes(
        v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
    )


def held_bytes(params, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Model states a rank holds: `params`, their gradients and the optimizer's state
    tensors (a DTensor counts its local shard)."""
    params = list(params)
    return {
        "params": _tensor_bytes(params),
        "grads": _tensor_bytes(p.grad for p in params),
        "optim": _optim_bytes(optimizer),
    }


def _zero_trainer(cell: ZeroCell, model: GPT, x: torch.Tensor, y: torch.Tensor) -> _Trainer:
    from impls.comm import Communicator
    from impls.zero import ZeroDataParallel

    zdp = ZeroDataParallel(
        model,
        Communicator(),
        stage=ZERO_METHODS[cell.method],
        optimizer="adamw",
        lr=cell.lr,
        weight_decay=cell.weight_decay,
        precision=cell.precision,
        loss_scale=cell.loss_scale,
    )

    def step() -> dict:
        loss = lm_loss(zdp(x).float(), y)
        zdp.backward(loss)
        report = zdp.step()
        zdp.zero_grad()
        return {"loss": loss.item(), "bytes_sent": report.traffic.bytes_sent,
                "memory": report.memory}  # fmt: skip

    def state_bytes() -> dict:
        return {k: zdp.ledger.current[k] for k in ("params", "grads", "optim")}

    return _Trainer(step, state_bytes, zdp.full_parameters, units=[u.numel for u in zdp.units])


def _ddp_trainer(cell: ZeroCell, model: GPT, x: torch.Tensor, y: torch.Tensor) -> _Trainer:
    from impls.comm import Communicator
    from impls.data_parallel import DDP

    ddp = DDP(
        model,
        Communicator(),
        _adamw(cell),
        bucket_cap_bytes=cell.bucket_cap_bytes,
        overlap=cell.method == "ddp",
        precision=cell.precision,
        loss_scale=cell.loss_scale,
    )

    def step() -> dict:
        stats = ddp.train_step(x, y, lm_loss)
        return {"loss": stats.loss, "bytes_sent": stats.traffic.bytes_sent}

    def state_bytes() -> None:
        return None  # gradients are dropped after each step: see the module docstring

    def params() -> dict[str, torch.Tensor]:
        return {n: p.detach().float().clone() for n, p in model.named_parameters()}

    return _Trainer(step, state_bytes, params, ddp.close)


def _torch_trainer(cell: ZeroCell, model: GPT, x: torch.Tensor, y: torch.Tensor) -> _Trainer:
    from torch.nn.parallel import DistributedDataParallel

    method = cell.method
    if method == "torch_fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        wrapped, optimizer = model, _adamw(cell)(model.parameters())
    elif method == "torch_zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        wrapped = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(
            model.parameters(),
            optimizer_class=torch.optim.AdamW,
            lr=cell.lr,
            weight_decay=cell.weight_decay,
        )
    else:
        wrapped = DistributedDataParallel(model)
        optimizer = _adamw(cell)(model.parameters())

    def step() -> dict:
        loss = lm_loss(wrapped(x), y)
        loss.backward()
        optimizer.step()
        held = held_bytes(model.parameters(), optimizer.optim if method == "torch_zero_redundancy"
                           else optimizer)  # fmt: skip
        optimizer.zero_grad(set_to_none=False)
        return {"loss": loss.item(), "bytes_sent": math.nan, "held": held}

    def params() -> dict[str, torch.Tensor]:
        out = {}
        for name, p in model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[name] = full.detach().float().clone()
        return out

    last: dict[str, dict] = {}

    def tracked_step() -> dict:
        result = step()
        last["held"] = result.pop("held")
        return result

    return _Trainer(tracked_step, lambda: last["held"], params)


def _trainer(cell: ZeroCell) -> _Trainer:
    model, inputs, targets = _model_and_batch(cell)
    numel = sum(p.numel() for p in model.parameters())  # before any wrapper shards them
    x, y = _shard(inputs), _shard(targets)
    if cell.method in ZERO_METHODS:
        trainer = _zero_trainer(cell, model, x, y)
    elif cell.method in ("ddp", "ddp_no_overlap"):
        trainer = _ddp_trainer(cell, model, x, y)
    else:
        trainer = _torch_trainer(cell, model, x, y)
    trainer.numel = numel
    return trainer


def _reference(cell: ZeroCell) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Single-process fp32 AdamW on the whole batch: the parameters before and after
    `steps` steps."""
    model, inputs, targets = _model_and_batch(cell)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = _adamw(cell)(model.parameters())
    for _ in range(cell.steps):
        lm_loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    return start, {n: p.detach().clone() for n, p in model.named_parameters()}


def _compare(params: dict[str, torch.Tensor], cell: ZeroCell) -> tuple[float, float]:
    """(largest |parameter − reference|, relative error of the update).

    The second is ‖p − p_ref‖ / ‖p_ref − p_start‖ over all parameters at once: how far
    training ended from where the reference went, relative to how far the reference
    moved. Absolute differences alone mislead under Adam: its normalised first steps turn
    the rounding of near-zero gradient elements into sizeable steps (one process
    accumulating the same batch in two halves already ends 1.8e-5 away from itself). And
    in bf16/fp16 the model's weights are the rounded copy of fp32 masters, so a weight
    near 1 (LayerNorm) does not move at all for a 1e-3 update; taken over the whole model
    that counts for what it weighs.
    """
    start, reference = _reference(cell)
    diff = max(float((params[n] - w).abs().max()) for n, w in reference.items())
    off = sum(float((params[n] - w).square().sum()) for n, w in reference.items())
    moved = sum(float((w - start[n]).square().sum()) for n, w in reference.items())
    return diff, (off / moved) ** 0.5 if moved else math.inf


def _mean_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def _timed(step: Callable[[], dict]) -> tuple[dict, float]:
    dist.barrier()
    start = time.perf_counter()
    result = step()
    return result, slowest(time.perf_counter() - start)


def _as(cell: ZeroCell, method: str) -> ZeroCell:
    """The same cell for another method (unpaired)."""
    return ZeroCell(**{**cell.__dict__, "method": method, "paired": False})


def _alternate(sides: dict[str, _Trainer], warmup: int, repeats: int) -> dict[str, list[float]]:
    """Each side's step times over `repeats` rounds after `warmup`; within a round the
    sides take turns, so drift hits them alike. Closes the trainers."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(warmup + repeats):
        for name, side in sides.items():
            _, seconds = _timed(side.step)
            if i >= warmup:
                times[name].append(seconds)
    for side in sides.values():
        side.close()
    return times


def paired_step_times(cell: ZeroCell, other: str) -> dict[str, float]:
    """`cell.method` and method `other` on twin models, timed in alternating steps:
    medians and their ratio (for the benchmarks)."""
    sides = {cell.method: _trainer(cell), other: _trainer(_as(cell, other))}
    times = _alternate(sides, cell.warmup, cell.repeats)
    a, b = (statistics.median(times[name]) for name in (cell.method, other))
    return {f"{cell.method}_s": a, f"{other}_s": b, "ratio": a / b}


def run_zero_cell(cell: ZeroCell) -> dict[str, Any]:
    """One rank of a cell: losses, memory, traffic, parameter check, step times."""
    trainer = _trainer(cell)
    results = [trainer.step() for _ in range(cell.steps)]
    losses = [_mean_over_ranks(r["loss"]) for r in results]
    held = trainer.state_bytes()
    params = trainer.params()
    max_diff = update_error = math.nan
    if dist.get_rank() == 0:
        max_diff, update_error = _compare(params, cell)
    sides = {"method": trainer}
    if cell.paired:
        sides["torch"] = _trainer(_as(cell, TWINS[cell.method]))
        if cell.method == "ddp":  # what the overlap buys, measured side by side too
            sides["no_overlap"] = _trainer(_as(cell, "ddp_no_overlap"))
    times = _alternate(sides, cell.warmup, cell.repeats)
    return {
        "rank": dist.get_rank(),
        "params": trainer.numel,
        "units": trainer.units,
        "losses": losses,
        "held": held,
        "memory": results[-1].get("memory"),
        "bytes_sent": results[-1]["bytes_sent"],
        "max_param_diff": max_diff,
        "update_error": update_error,
        "step_times_s": times["method"],
        "torch_step_times_s": times.get("torch"),
        "no_overlap_step_times_s": times.get("no_overlap"),
        "median_step_s": statistics.median(times["method"]),
    }
