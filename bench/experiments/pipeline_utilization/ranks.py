"""What one rank does in a `pipeline_utilization` cell: a timed pipeline step, two ways.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.experiments.base import Cell
from bench.experiments.pipeline_utilization.config import PipelineUtilizationConfig
from bench.kit.host import HostComputeLock, probe_pairs
from bench.kit.reference import compare, train_reference
from bench.kit.timing import alternate
from bench.kit.workloads import lm_loss, seeded_gpt_and_batch
from impls.comm import Communicator
from impls.models import GPT, split_into_stages, split_into_virtual_stages, stages_of_rank
from impls.pipeline import PipelineExecutor
from impls.pipeline.dataflow import rank_of
from impls.pipeline.schedules import stage_ranks

__all__ = ["paired_step_times", "run"]

Side = tuple[Callable[..., Any], list[nn.Module], GPT]  # (one step, modules it trains, model)


def run(cfg: PipelineUtilizationConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell: a distbench cell (`cell.carry.plan`) or a torch one.

    A distbench cell drives distbench's executor (`impls.pipeline.executor`) over the plan its
    parent built (`cell.carry.plan`); a torch cell drives `torch.distributed.pipelining`
    (`PipelineStage` with `ScheduleGPipe`, `Schedule1F1B` or `ScheduleInterleaved1F1B`) on
    the same GPT, the same stage split (equal, or the cell's carried Alpa cut), the same
    ranks, batch and micro-batches. Both build the model from one seed on every rank
    (`bench.kit.workloads`) and are timed by the kit (`bench.kit.timing.alternate`): `warmup`
    untimed steps, then `repeats` barrier-opened steps, each the slowest rank's time. A paired
    distbench cell also builds torch's twin schedule on a twin model and the two take turns
    step by step, so the speed ratio is measured side by side (machine drift hits both alike).

    Weights are not updated between steps (gradients are cleared at the start of each step,
    no optimizer step): every step sees the same weights and batch, so the timed steps are
    alike, and every row's loss is the same full-batch loss. After the timed steps each rank
    checks its gradients and the loss against one process computing the whole batch
    (`bench.kit.reference`).

    Replaying a timeline needs what each action costs with the host to itself. Inside a
    timed step ranks that share a core slow each other down, and a transfer mostly measures
    the wait for a descheduled peer; so a distbench cell then runs profiling steps (at least
    two, `profile_samples` of each stage's action kind) under a
    `bench.kit.host.HostComputeLock` (one rank computes at a time; the replay prices each
    action at those steps' thread CPU times) and times one activation between each pair of
    neighbouring ranks alone (`bench.kit.host.probe_pairs`).
    """
    if cell.carry.plan is None:
        return _run_torch(cfg, cell)
    return _run_distbench(cfg, cell)


def _shape(cell: Cell) -> tuple[int, int, int]:
    return cell.key["stages"], cell.key["microbatches"], cell.key["virtual_stages"]


def _model(
    cfg: PipelineUtilizationConfig, cell: Cell
) -> tuple[GPT, list[nn.Module], torch.Tensor, torch.Tensor]:
    """The seeded GPT, cut into P·V stages (or the carried cut), and the batch: identical
    on every rank."""
    model, inputs, targets = seeded_gpt_and_batch(cfg.model(), cfg.batch_size, cfg.seed)
    p, _, v = _shape(cell)
    if cell.carry.stage_layers is not None:
        return model, split_into_stages(model, p, cell.carry.stage_layers), inputs, targets
    return model, split_into_virtual_stages(model, p, v), inputs, targets


def _activation(cfg: PipelineUtilizationConfig, cell: Cell) -> torch.Tensor:
    """A tensor of the shape every stage boundary carries: (b / M, s, h)."""
    return torch.zeros(cfg.batch_size // cell.key["microbatches"], cfg.seq_len, cfg.d_model)


def _distbench(cfg: PipelineUtilizationConfig, cell: Cell, twin: bool = False) -> Side:
    """This rank's distbench step (a `StepResult` per call) on the carried plan, or with
    `twin` on the carried 1F1B twin's (`Carry.fused_twin`, a model of its own)."""
    p, m, v = _shape(cell)
    model, stages, inputs, targets = _model(cfg, cell)
    schedule, plan = (
        ("1f1b", cell.carry.fused_twin) if twin else (cell.key["schedule"], cell.carry.plan)
    )
    placed = stage_ranks(schedule, p, v)  # ZB-V: stages r and 2P−1−r on rank r
    mine = {s: stages[s] for s in range(p * v) if rank_of(s, p, placed) == dist.get_rank()}
    executor = PipelineExecutor(
        Communicator(),
        mine,
        plan,
        num_stages=p * v,
        microbatches=m,
        loss_fn=lm_loss,
        stage_ranks=placed,
        activation_shape=_activation(cfg, cell).shape,
    )
    first, last = 0 in mine, p * v - 1 in mine

    def step(**kw: Any) -> Any:
        return executor.step(inputs if first else None, targets if last else None, **kw)

    return step, list(mine.values()), model


def _torch(cfg: PipelineUtilizationConfig, cell: Cell) -> Side:
    """This rank's torch.distributed.pipelining step (`cell.carry.torch_schedule`); its
    outcome is the loss on the last stage's rank, None elsewhere."""
    from torch.distributed import pipelining

    p, m, v = _shape(cell)
    model, stages, inputs, targets = _model(cfg, cell)
    indices = stages_of_rank(dist.get_rank(), p, v)
    device = torch.device("cpu")
    wrapped = [pipelining.PipelineStage(stages[s], s, p * v, device) for s in indices]
    schedule_class = getattr(pipelining, cell.carry.torch_schedule)
    schedule = schedule_class(wrapped if v > 1 else wrapped[0], m, loss_fn=lm_loss)
    first, last = 0 in indices, p * v - 1 in indices

    def step() -> float | None:
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if last else {}
        schedule.step(*([inputs] if first else []), **kwargs)
        # torch's losses are each micro-batch's mean; their mean is the batch's mean loss.
        return float(torch.stack(losses).mean().detach()) if last else None

    return step, [stages[s] for s in indices], model


def _fresh(step: Callable[[], Any], modules: list[nn.Module]) -> Callable[[], Any]:
    """`step` with the gradients of `modules` cleared first (every step the same work)."""

    def cleared() -> Any:
        for module in modules:
            module.zero_grad(set_to_none=True)
        return step()

    return cleared


def _against_reference(
    cfg: PipelineUtilizationConfig, model: GPT, modules: list[nn.Module]
) -> dict[str, float]:
    """The loss of one process on the whole batch, and this rank's gradients' relative
    error against its (no optimizer step here, so the reference takes one with lr = 0)."""
    reference_model, inputs, targets = seeded_gpt_and_batch(cfg.model(), cfg.batch_size, cfg.seed)
    sgd = torch.optim.SGD(reference_model.parameters(), lr=0.0)
    reference = train_reference(reference_model, inputs, targets, sgd, steps=1)
    held = {id(p) for module in modules for p in module.parameters()}
    params = {name: p for name, p in model.named_parameters() if id(p) in held}
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in params.items()}
    error = compare(params, reference, grads=grads)["grad_error"]
    return {"reference_loss": reference.losses[0], "grad_error": error}


def _run_distbench(cfg: PipelineUtilizationConfig, cell: Cell) -> dict[str, Any]:
    """Timed steps (alternating with torch's twin when paired), the profiling steps, the
    transfer probe and the reference check."""
    step, modules, model = _distbench(cfg, cell)
    sides = {"distbench": _fresh(step, modules)}
    if cell.carry.torch_schedule:
        twin, twin_modules, _ = _torch(cfg, cell)
        sides["torch"] = _fresh(twin, twin_modules)
    timed = alternate(sides, warmup=cfg.warmup, repeats=cfg.repeats)
    results = timed["distbench"].outcomes
    with HostComputeLock() as lock:
        profiling = {"alone": _fresh(partial(step, compute_guard=lock), modules)}
        if cell.carry.fused_twin is not None:  # ZB-H1's 1F1B twin, in alternating steps
            fused_step, fused_modules, _ = _distbench(cfg, cell, twin=True)
            profiling["fused"] = _fresh(partial(fused_step, compute_guard=lock), fused_modules)
            profiling["fused"]()  # its warm-up (shapes, buffers), as the timed steps had ours
        steps = cfg.profiling_steps(cell.key["microbatches"])
        profiled = alternate(profiling, warmup=0, repeats=steps)
        alone = profiled["alone"].outcomes
        fused = profiled["fused"].outcomes if "fused" in profiled else None
    losses = [r.loss for r in results if r.loss is not None]
    return {
        "rank": dist.get_rank(),
        "step_times_s": timed["distbench"].seconds,
        "torch_step_times_s": timed["torch"].seconds if "torch" in timed else None,
        "loss": statistics.median(losses) if losses else None,
        "records": [r.records for r in results],
        "isolated_records": [r.records for r in alone],
        "twin_isolated_records": None if fused is None else [r.records for r in fused],
        "peak_activation_bytes": max(r.peak_activation_bytes for r in results),
        "max_inflight": max(r.max_inflight for r in results),
        "transfer_s": probe_pairs(
            _activation(cfg, cell),
            exchange=False,
            wraps=cell.key["virtual_stages"] > 1 and cell.key["schedule"] != "zero_bubble_v",
        ),
        **_against_reference(cfg, model, modules),
    }


def _run_torch(cfg: PipelineUtilizationConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a torch.distributed.pipelining cell: step times, the loss, the check."""
    step, modules, model = _torch(cfg, cell)
    timed = alternate({"torch": _fresh(step, modules)}, warmup=cfg.warmup, repeats=cfg.repeats)
    kept = [loss for loss in timed["torch"].outcomes if loss is not None]
    return {
        "rank": dist.get_rank(),
        "step_times_s": timed["torch"].seconds,
        "loss": statistics.median(kept) if kept else None,
        **_against_reference(cfg, model, modules),
    }


def paired_step_times(cfg: PipelineUtilizationConfig, cell: Cell) -> dict[str, float]:
    """distbench's and torch's step of a paired cell, alternating on twin models: medians
    and their ratio (what `benchmarks/test_pipeline.py` records)."""
    step, modules, _ = _distbench(cfg, cell)
    twin, twin_modules, _ = _torch(cfg, cell)
    sides = {"distbench": _fresh(step, modules), "torch": _fresh(twin, twin_modules)}
    medians = {
        n: t.median for n, t in alternate(sides, warmup=cfg.warmup, repeats=cfg.repeats).items()
    }
    return {
        "distbench_s": medians["distbench"],
        "torch_s": medians["torch"],
        "distbench_vs_torch": medians["distbench"] / medians["torch"],
    }
