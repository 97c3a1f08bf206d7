"""What one rank does in a `zero_memory` cell: train a few steps, account memory, time.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from bench.experiments.base import Cell
from bench.experiments.zero_memory.config import ZeroMemoryConfig
from bench.experiments.zero_memory.methods import DDP_METHODS, ZERO_METHODS, Plan
from bench.kit.memory import held_bytes
from bench.kit.reference import compare, parameters, train_reference
from bench.kit.timing import Timed, alternate
from bench.kit.workloads import lm_loss, rank_shard, seeded_gpt_and_batch

__all__ = ["paired_step_times", "run"]

WEIGHT_DECAY = 0.01


@dataclass
class _Trainer:
    """One method on this rank: `step()` trains once on this rank's shard."""

    step: Callable[[], dict]
    state_bytes: Callable[[], dict | None]
    """The model states this rank holds between steps (None where unobservable)."""
    params: Callable[[], dict[str, torch.Tensor]]
    """Every parameter, whole and in fp32, for the reference check."""
    numel: int
    """The model's parameter count Ψ, read before any wrapper sharded it."""
    close: Callable[[], None] = lambda: None
    units: list[int] | None = field(default=None)
    """The flat units' sizes (ZeRO pads each to a multiple of N)."""


def _adamw(cfg: ZeroMemoryConfig, params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=WEIGHT_DECAY)


def _zero_trainer(cfg: ZeroMemoryConfig, plan: Plan, model, x, y) -> dict:
    from impls.comm import Communicator
    from impls.zero import ZeroDataParallel

    zdp = ZeroDataParallel(
        model,
        Communicator(),
        stage=ZERO_METHODS[plan.method],
        optimizer="adamw",
        lr=cfg.lr,
        weight_decay=WEIGHT_DECAY,
        precision=plan.precision,
        loss_scale=plan.loss_scale,
    )

    def step() -> dict:
        loss = lm_loss(zdp(x).float(), y)
        zdp.backward(loss)
        report = zdp.step()
        zdp.zero_grad()
        return {
            "loss": loss.item(),
            "bytes_sent": report.traffic.bytes_sent,
            "memory": report.memory,
        }

    def state_bytes() -> dict:
        return {k: zdp.ledger.current[k] for k in ("params", "grads", "optim")}

    return {
        "step": step,
        "state_bytes": state_bytes,
        "params": zdp.full_parameters,
        "units": [u.numel for u in zdp.units],
    }


def _ddp_trainer(cfg: ZeroMemoryConfig, plan: Plan, model, x, y) -> dict:
    from impls.comm import Communicator
    from impls.data_parallel import DDP

    ddp = DDP(
        model,
        Communicator(),
        lambda params: _adamw(cfg, params),
        bucket_cap_bytes=cfg.bucket_cap_bytes,
        overlap=plan.method == "ddp",
        precision=plan.precision,
        loss_scale=plan.loss_scale,
    )

    def step() -> dict:
        stats = ddp.train_step(x, y, lm_loss)
        return {"loss": stats.loss, "bytes_sent": stats.traffic.bytes_sent}

    # Gradients are dropped after each step: see `run`.
    return {
        "step": step,
        "state_bytes": lambda: None,
        "params": lambda: parameters(model),
        "close": ddp.close,
    }


def _torch_wrap(
    cfg: ZeroMemoryConfig, method: str, model
) -> tuple[Any, torch.optim.Optimizer, Any]:
    """(the wrapped model, its optimizer, the optimizer whose state the rank holds)."""
    from torch.nn.parallel import DistributedDataParallel

    if method == "torch_fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = _adamw(cfg, model.parameters())
        return model, optimizer, optimizer
    if method == "torch_zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(
            model.parameters(),
            optimizer_class=torch.optim.AdamW,
            lr=cfg.lr,
            weight_decay=WEIGHT_DECAY,
        )
        return DistributedDataParallel(model), optimizer, optimizer.optim
    optimizer = _adamw(cfg, model.parameters())
    return DistributedDataParallel(model), optimizer, optimizer


def _torch_trainer(cfg: ZeroMemoryConfig, plan: Plan, model, x, y) -> dict:
    wrapped, optimizer, holder = _torch_wrap(cfg, plan.method, model)

    def step() -> dict:
        loss = lm_loss(wrapped(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients stay allocated, as held
        return {"loss": loss.item(), "bytes_sent": math.nan}

    return {
        "step": step,
        "state_bytes": lambda: held_bytes(model.parameters(), holder),
        "params": lambda: parameters(model),
    }


def _trainer(cfg: ZeroMemoryConfig, plan: Plan) -> _Trainer:
    model, inputs, targets = seeded_gpt_and_batch(cfg.model, cfg.batch_size, cfg.seed)
    numel = sum(p.numel() for p in model.parameters())  # before any wrapper shards them
    x, y = rank_shard(inputs), rank_shard(targets)
    if plan.method in ZERO_METHODS:
        build = _zero_trainer
    elif plan.method in DDP_METHODS:
        build = _ddp_trainer
    else:
        build = _torch_trainer
    return _Trainer(numel=numel, **build(cfg, plan, model, x, y))


def _reference_check(cfg: ZeroMemoryConfig, params: dict[str, torch.Tensor]) -> dict[str, float]:
    """Single-process fp32 AdamW on the whole batch, `steps` steps, against `params`."""
    model, inputs, targets = seeded_gpt_and_batch(cfg.model, cfg.batch_size, cfg.seed)
    reference = train_reference(model, inputs, targets, _adamw(cfg, model.parameters()), cfg.steps)
    return compare(params, reference)


def _mean_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def _timed(cfg: ZeroMemoryConfig, sides: dict[str, _Trainer]) -> dict[str, Timed]:
    """Each side's steps (slowest rank), the sides alternating; closes the trainers."""
    timed = alternate(
        {name: side.step for name, side in sides.items()}, warmup=cfg.warmup, repeats=cfg.repeats
    )
    for side in sides.values():
        side.close()
    return timed


def paired_step_times(cfg: ZeroMemoryConfig, cell: Cell, other: str) -> dict[str, float]:
    """The cell's method and method `other` on twin models, timed in alternating steps:
    medians and their ratio (for the benchmarks)."""
    plan: Plan = cell.carry
    sides = {plan.method: _trainer(cfg, plan), other: _trainer(cfg, replace(plan, method=other))}
    times = _timed(cfg, sides)
    a, b = times[plan.method].median, times[other].median
    return {f"{plan.method}_s": a, f"{other}_s": b, "ratio": a / b}


def run(cfg: ZeroMemoryConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell: losses, memory, traffic, parameter check, step times.

    Every method trains the same GPT (one seed on every rank, `bench.kit.workloads`) on the
    same batch, each of the N ranks on its contiguous 1/N of it, with AdamW:

    - distbench: `dp`, `zero1`, `zero2`, `zero3` (`impls.zero.ZeroDataParallel`, stage 0–3,
      its `MemoryLedger` counting every byte), and `ddp` / `ddp_no_overlap`
      (`impls.data_parallel.DDP`, bucketed, with and without overlapping backward);
    - torch.distributed: `torch_ddp` (DistributedDataParallel), `torch_zero_redundancy`
      (DDP + ZeroRedundancyOptimizer: ZeRO-1) and `torch_fsdp2` (FSDP2 `fully_shard` per
      block and on the root: ZeRO-3).

    After `steps` training steps, rank 0 compares every parameter with the single-process
    AdamW reference trained on the whole batch (`bench.kit.reference`: `max_param_diff`, and
    `update_error`, the relative error of the update, which decides `wrong`). Model-state
    bytes of the distbench ZeRO stages come from the ledger; for the torch methods they are
    read off the tensors the rank holds after the training steps (`bench.kit.memory.held_bytes`:
    parameters, `.grad`s, optimizer state; a DTensor counts its local shard), exact for those
    tensors but, unlike the ledger, blind to transient buffers. The `ddp` rows are about
    speed (overlap) and leave memory empty: distbench's DDP drops its gradients at the end of
    a step, so no moment outside the step shows them. Then `repeats` timed steps
    (`bench.kit.timing.alternate`: barrier, slowest rank, median); a paired cell builds its
    torch twin (`Plan.twin`) on a twin model and times it in steps alternating with its own,
    so the speed ratio is measured side by side; a paired `ddp` cell also alternates with
    `ddp_no_overlap`, for what the overlap buys.
    """
    plan: Plan = cell.carry
    trainer = _trainer(cfg, plan)
    results = [trainer.step() for _ in range(cfg.steps)]
    losses = [_mean_over_ranks(r["loss"]) for r in results]
    held = trainer.state_bytes()
    params = trainer.params()
    check = {"max_param_diff": math.nan, "update_error": math.nan}
    if dist.get_rank() == 0:
        check = _reference_check(cfg, params)
    sides = {"method": trainer}
    if plan.twin:
        sides["torch"] = _trainer(cfg, replace(plan, method=plan.twin))
    if plan.no_overlap:  # what the overlap buys, measured side by side too
        sides["no_overlap"] = _trainer(cfg, replace(plan, method="ddp_no_overlap"))
    times = _timed(cfg, sides)
    return {
        "rank": dist.get_rank(),
        "params": trainer.numel,
        "units": trainer.units,
        "losses": losses,
        "held": held,
        "memory": results[-1].get("memory"),
        "bytes_sent": results[-1]["bytes_sent"],
        "max_param_diff": check["max_param_diff"],
        "update_error": check["update_error"],
        "step_times_s": times["method"].seconds,
        "torch_step_times_s": times["torch"].seconds if "torch" in times else None,
        "no_overlap_step_times_s": times["no_overlap"].seconds if "no_overlap" in times else None,
    }
