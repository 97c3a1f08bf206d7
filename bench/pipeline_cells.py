"""What one rank does in a `pipeline_utilization` cell: a timed pipeline step, two ways.

`run_distbench_pipeline` drives distbench's executor (`impls.pipeline.executor`) over a
schedule's plan; `run_torch_pipeline` drives `torch.distributed.pipelining`
(`PipelineStage` with `ScheduleGPipe`, `Schedule1F1B` or `ScheduleInterleaved1F1B`) on
the same GPT, the same stage split, the same ranks, batch and micro-batches. Both build
the model from one seed on every rank, run `warmup` untimed steps, then time `repeats`
steps, each opened by a barrier and taken as the slowest rank's time. A paired distbench
cell also builds torch's twin schedule on a twin model and times the two in alternating
steps, so the speed ratio is measured side by side (machine drift hits both alike).

Weights are not updated between steps (gradients are zeroed, no optimizer step): every
step sees the same weights and batch, so the timed steps are alike, and the loss of a
distbench row must equal the loss of the torch row at the same (P, M) — a check that the
two ran the same computation.

Replaying a timeline needs what one activation transfer costs. Measured inside the step
on a host whose ranks share cores, it mostly measures the wait for a descheduled peer (or
its transport thread), which a rank with a device of its own would not have; so after the
timed steps `probe_transfer_s` also times the same tensor between each pair of
neighbouring ranks while every other rank waits, and keeps each pair's fastest round trip:
on shared cores a slower trip is one where a peer was descheduled, which is the
interference the replay sets out to remove (the median moved 0.1–2 ms between runs on
2 busy cores; the fastest trip stayed within 0.1–0.3 ms).

The cost of each compute action has the same problem: inside a timed step, ranks that
share a core slow each other down (caches, memory bandwidth, a sibling hyperthread), and
by how much depends on how many ranks the schedule keeps busy at that moment. So after
the timed steps a distbench cell runs two more steps under a `HostComputeLock`, which
lets one rank compute at a time, and the replay prices each action at those steps' thread
CPU times: the cost of that work with the host to itself.

The harness around the step (barrier, max over ranks) uses torch.distributed's own
collectives; it brackets the timed region and is the same for both implementations.
"""

from __future__ import annotations

import fcntl
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bench.kit.timing import slowest
from impls.models import GPT, GPTConfig, Stage, split_into_virtual_stages, stages_of_rank

__all__ = [
    "TORCH_SCHEDULES",
    "HostComputeLock",
    "PipelineCell",
    "lm_loss",
    "paired_step_times",
    "probe_transfer_s",
    "run_distbench_pipeline",
    "run_torch_pipeline",
    "seeded_batch",
]

# distbench name of each torch.distributed.pipelining baseline -> torch's schedule class
TORCH_SCHEDULES = {
    "torch_gpipe": "ScheduleGPipe",
    "torch_1f1b": "Schedule1F1B",
    "torch_interleaved_1f1b": "ScheduleInterleaved1F1B",
}


@dataclass(kw_only=True)
class PipelineCell:
    """One measured configuration, as shipped to every rank."""

    schedule: str
    """A distbench schedule (`gpipe`, ...) or a torch baseline (`torch_gpipe`, ...)."""
    stages: int
    """Pipeline degree P: one rank per stage (V stages per rank when interleaved)."""
    microbatches: int
    virtual_stages: int = 1
    """Model chunks per rank; > 1 only for the interleaved schedules."""
    model: dict[str, Any]
    """`GPTConfig` keyword arguments."""
    batch_size: int
    warmup: int = 1
    repeats: int = 3
    seed: int = 0
    paired: bool = False
    """Also time torch's twin schedule on a twin model, in steps alternating with ours."""
    trace_path: str | None = None
    """Where the parent writes this cell's Chrome trace and Gantt spans (a path stem)."""


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: (b, s, vocab) logits against (b, s) ids."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def seeded_batch(cfg: GPTConfig, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) token ids of shape (batch_size, seq_len), the same on every rank."""
    generator = torch.Generator().manual_seed(seed + 1)
    shape = (batch_size, cfg.seq_len)
    inputs = torch.randint(0, cfg.vocab_size, shape, generator=generator)
    targets = torch.randint(0, cfg.vocab_size, shape, generator=generator)
    return inputs, targets


def _model_and_batch(cell: PipelineCell) -> tuple[list[Stage], torch.Tensor, torch.Tensor]:
    """The GPT cut into P·V stages, and the batch: identical on every rank (seeded)."""
    cfg = GPTConfig(**cell.model)
    model = GPT(cfg, seed=cell.seed)
    stages = split_into_virtual_stages(model, cell.stages, cell.virtual_stages)
    return stages, *seeded_batch(cfg, cell.batch_size, cell.seed)


Step = tuple[Callable[[], Any], list[torch.nn.Module]]  # (run one step, modules it trains)


def _one_step(step: Step) -> tuple[Any, float]:
    """Zero the gradients, then one barrier-opened step: (its outcome, slowest rank's s)."""
    run, modules = step
    for module in modules:
        module.zero_grad(set_to_none=True)
    dist.barrier()
    start = time.perf_counter()
    outcome = run()
    return outcome, slowest(time.perf_counter() - start)


def _timed_steps(
    sides: dict[str, Step], warmup: int, repeats: int
) -> dict[str, tuple[list[Any], list[float]]]:
    """Each side's outcomes and step times over `repeats` timed rounds, after `warmup`
    untimed ones; within a round the sides take turns, so drift hits them alike."""
    timed: dict[str, tuple[list[Any], list[float]]] = {name: ([], []) for name in sides}
    for i in range(warmup + repeats):
        for name, step in sides.items():
            outcome, seconds = _one_step(step)
            if i >= warmup:
                timed[name][0].append(outcome)
                timed[name][1].append(seconds)
    return timed


def _distbench_step(cell: PipelineCell) -> Step:
    """This rank's distbench step (a `StepResult` per call) and the modules it trains."""
    from impls.comm import Communicator
    from impls.pipeline import build_plan
    from impls.pipeline.executor import PipelineExecutor

    rank, p, v = dist.get_rank(), cell.stages, cell.virtual_stages
    stages, inputs, targets = _model_and_batch(cell)
    mine = {s: stages[s] for s in stages_of_rank(rank, p, v)}
    num_stages = p * v
    executor = PipelineExecutor(
        Communicator(),
        mine,
        build_plan(cell.schedule, p, cell.microbatches, v),
        num_stages=num_stages,
        microbatches=cell.microbatches,
        loss_fn=lm_loss,
        activation_shape=_activation(cell).shape,
    )
    first, last = 0 in mine, num_stages - 1 in mine
    return (
        lambda **kw: executor.step(inputs if first else None, targets if last else None, **kw),
        list(mine.values()),
    )


def _torch_step(cell: PipelineCell) -> Step:
    """This rank's torch.distributed.pipelining step (the loss on the last stage's rank)."""
    from torch.distributed import pipelining

    rank, p, v = dist.get_rank(), cell.stages, cell.virtual_stages
    stages, inputs, targets = _model_and_batch(cell)
    num_stages = p * v
    device = torch.device("cpu")
    indices = stages_of_rank(rank, p, v)
    wrapped = [pipelining.PipelineStage(stages[s], s, num_stages, device) for s in indices]
    name = TORCH_SCHEDULES.get(cell.schedule) or TORCH_SCHEDULES[f"torch_{cell.schedule}"]
    schedule_class = getattr(pipelining, name)
    if v > 1:
        schedule = schedule_class(wrapped, cell.microbatches, loss_fn=lm_loss)
    else:
        schedule = schedule_class(wrapped[0], cell.microbatches, loss_fn=lm_loss)
    first, last = 0 in indices, num_stages - 1 in indices

    def step() -> float | None:
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if last else {}
        schedule.step(*([inputs] if first else []), **kwargs)
        # torch's losses are each micro-batch's mean; their mean is the batch's mean loss.
        return float(torch.stack(losses).mean().detach()) if last else None

    return step, [stages[s] for s in indices]


def _activation(cell: PipelineCell) -> torch.Tensor:
    """A tensor of the shape every stage boundary carries: (b / M, s, h)."""
    cfg = GPTConfig(**cell.model)
    return torch.zeros(cell.batch_size // cell.microbatches, cfg.seq_len, cfg.d_model)


def run_distbench_pipeline(cell: PipelineCell) -> dict[str, Any]:
    """One rank of a distbench cell: action records, peak memory, step times (and, with
    `cell.paired`, torch's twin schedule timed in alternating steps)."""
    sides = {"distbench": _distbench_step(cell)}
    if cell.paired:
        sides["torch"] = _torch_step(cell)
    timed = _timed_steps(sides, cell.warmup, cell.repeats)
    results, times = timed["distbench"]
    losses = [r.loss for r in results if r.loss is not None]
    run, modules = sides["distbench"]
    with HostComputeLock() as lock:
        alone = [_one_step((partial(run, compute_guard=lock), modules))[0] for _ in range(2)]
    return {
        "rank": dist.get_rank(),
        "step_times_s": times,
        "torch_step_times_s": timed["torch"][1] if cell.paired else None,
        "loss": statistics.median(losses) if losses else None,
        "records": [r.records for r in results],
        "isolated_records": [r.records for r in alone],
        "peak_activation_bytes": max(r.peak_activation_bytes for r in results),
        "max_inflight": max(r.max_inflight for r in results),
        "transfer_s": probe_transfer_s(_activation(cell), wraps=cell.virtual_stages > 1),
    }


def run_torch_pipeline(cell: PipelineCell) -> dict[str, Any]:
    """One rank of a torch.distributed.pipelining cell: step times and the loss."""
    losses, times = _timed_steps({"torch": _torch_step(cell)}, cell.warmup, cell.repeats)["torch"]
    kept = [loss for loss in losses if loss is not None]
    return {
        "rank": dist.get_rank(),
        "step_times_s": times,
        "loss": statistics.median(kept) if kept else None,
    }


def paired_step_times(cell: PipelineCell) -> dict[str, float]:
    """distbench's and torch's step, alternating on twin models: medians and their ratio.

    `cell.schedule` names the distbench schedule (`gpipe`, `1f1b`, `interleaved_1f1b`).
    """
    sides = {"distbench": _distbench_step(cell), "torch": _torch_step(cell)}
    timed = _timed_steps(sides, cell.warmup, cell.repeats)
    medians = {name: statistics.median(times) for name, (_, times) in timed.items()}
    return {
        "distbench_s": medians["distbench"],
        "torch_s": medians["torch"],
        "distbench_vs_torch": medians["distbench"] / medians["torch"],
    }


class HostComputeLock:
    """A lock every rank on this host shares (`fcntl.flock` on a file rank 0 names), taken
    around each compute action of a profiling step: ranks that share cores then compute
    one at a time, and each action's CPU time is what it costs with the host to itself.

    Entering is collective (rank 0 broadcasts the file's name); the lock itself is called
    (`with lock(): ...`) around each action. Ranks on other hosts lock their own file.
    """

    def __enter__(self) -> HostComputeLock:
        name = [None]
        if dist.get_rank() == 0:
            handle, name[0] = tempfile.mkstemp(prefix="distbench-compute-", suffix=".lock")
            os.close(handle)
        dist.broadcast_object_list(name, src=0)
        self._path = name[0]
        self._file = open(self._path, "a+b")  # noqa: SIM115 (held until __exit__)
        return self

    @contextmanager
    def __call__(self) -> Iterator[None]:
        fcntl.flock(self._file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._file, fcntl.LOCK_UN)

    def __exit__(self, *exc: object) -> None:
        self._file.close()
        dist.barrier()  # every rank is done with the file before rank 0 removes it
        if dist.get_rank() == 0:
            with suppress(FileNotFoundError):
                os.unlink(self._path)


def probe_transfer_s(tensor: torch.Tensor, *, wraps: bool, trials: int = 20) -> float | None:
    """One-way seconds to move `tensor` to the next rank, the pair alone: half the fastest
    of `trials` round trips.

    Pairs (r, r+1) take turns, every other rank waiting at a barrier; `wraps` adds the
    pair (P−1, 0) that interleaved schedules also use. Returns the median over the pairs
    this rank took part in of each pair's fastest trip (None on a single rank).
    """
    from impls.comm import Communicator

    comm = Communicator()
    rank, ranks = comm.rank, comm.world_size
    inbox = torch.empty_like(tensor)
    pairs = [(a, a + 1) for a in range(ranks - 1)] + ([(ranks - 1, 0)] if wraps else [])
    fastest = []
    for sender, receiver in pairs:
        dist.barrier()
        if rank not in (sender, receiver) or sender == receiver:
            continue
        trips = []
        for trial in range(trials + 1):  # the first round trip is a warm-up
            start = time.perf_counter()
            if rank == sender:
                comm.send(tensor, receiver)
                comm.recv(inbox, receiver)
            else:
                comm.recv(inbox, sender)
                comm.send(tensor, sender)
            if trial:
                trips.append((time.perf_counter() - start) / 2)
        fastest.append(min(trips))
    dist.barrier()
    return statistics.median(fastest) if fastest else None
