"""What one rank does in a `parallelism_comparison` cell: train one mesh layout, then
count, compare, time and profile it.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from bench.experiments.base import Cell
from bench.experiments.parallelism_comparison.config import AXES, ParallelismComparisonConfig
from bench.kit.host import HostComputeLock, probe_pairs
from bench.kit.memory import held_bytes
from bench.kit.reference import Reference, compare, train_reference
from bench.kit.timing import alternate
from bench.kit.workloads import gpt, seeded_batch
from impls.collectives import all_reduce
from impls.comm import Communicator, Round
from impls.hybrid import HybridTrainer, Mesh
from impls.models import GPTConfig
from impls.pipeline import Plan
from impls.pipeline.actions import COMPUTE_KINDS
from impls.tensor_parallel import sharded_dims

__all__ = ["AXES", "PROBE_BYTES", "Layout", "run"]

PROBE_BYTES = (4, 1 << 20)  # the α probe's message and the β probe's
WEIGHT_DECAY = 0.01


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a cell derives once from its key (`Cell.carry`): the mesh degrees, the GPT,
    each replica's micro-batch and the pipeline plan every rank runs (the replay's graph)."""

    dp: int
    pp: int
    tp: int
    gpt: GPTConfig
    micro_batch: int
    """Sequences per micro-batch: batch_size / (dp · microbatches)."""
    plan: Plan

    @property
    def degrees(self) -> dict[str, int]:
        return {"dp": self.dp, "pp": self.pp, "tp": self.tp}


class _Turns:
    """This rank's hold on a `HostComputeLock`: taken for a step, given back while blocked."""

    def __init__(self, lock: HostComputeLock) -> None:
        self._lock = lock
        self._held: AbstractContextManager | None = None

    def take(self) -> None:
        self._held = self._lock()
        self._held.__enter__()

    def give(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.__exit__(None, None, None)


class _RoundClock:
    """Wall and thread-CPU seconds this rank spends in rounds of `comms`: posting their
    messages and waiting for them, each period clocked on its own (a pipeline posts a
    round's receives a round ahead and waits for each just before the compute that reads
    it); while `turns` is set, the host's compute lock is handed back for each wait."""

    def __init__(self, comms: list[Communicator]) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.turns: _Turns | None = None
        for comm in comms:
            comm.round_type = partial(_ClockedRound, clock=self)  # this instance only

    @contextmanager
    def timed(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.wall_s += time.perf_counter() - wall
            self.cpu_s += time.thread_time() - cpu


class _ClockedRound(Round):
    def __init__(self, comm: Communicator, clock: _RoundClock) -> None:
        super().__init__(comm)
        self._clock = clock

    def _add(self, fn, tensor: torch.Tensor, peer: int, tag: int) -> None:
        with self._clock.timed():
            super()._add(fn, tensor, peer, tag)

    def _block(self, indices: list[int]) -> None:
        if not indices:  # nothing to wait for: keep the compute lock
            return
        with self._clock.timed():
            turns = self._clock.turns
            if turns is not None:
                turns.give()
            try:
                super()._block(indices)
            finally:
                if turns is not None:
                    turns.take()


def _adamw(lr: float) -> Callable[[list], torch.optim.Optimizer]:
    return lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY)


@contextmanager
def _axis_traffic(comms: dict[str, Communicator]) -> Iterator[dict[str, Any]]:
    """Each axis's counters over the enclosed operations (filled in on exit)."""
    out: dict[str, Any] = {}
    with ExitStack() as stack:
        measured = {axis: stack.enter_context(comm.measure()) for axis, comm in comms.items()}
        yield out
    out.update({axis: counters.as_dict() for axis, counters in measured.items()})


def _reference(
    cfg: ParallelismComparisonConfig, inputs: torch.Tensor, targets: torch.Tensor
) -> Reference:
    """Single-device AdamW on the whole batch, trained on rank 0 and sent to every rank."""
    reference = [None]
    if dist.get_rank() == 0:
        model = gpt(cfg.model, cfg.seed)
        optimizer = _adamw(cfg.lr)(list(model.parameters()))
        reference[0] = train_reference(model, inputs, targets, optimizer, cfg.steps)
    dist.broadcast_object_list(reference, src=0)
    return reference[0]


def _compare(trainer: HybridTrainer, reference: Reference) -> dict[str, float]:
    """This rank's parameters and last gradients against its TP shard of the reference's
    (`update_error`, `grad_error`: see `bench.kit.reference`)."""
    dims, tp = sharded_dims(trainer.model), trainer.tp_comm

    def part(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.chunk(tp.world_size, dim=dims[name])[tp.rank] if name in dims else tensor

    params = dict(trainer.named_parameters())
    grads = {name: p.grad for name, p in params.items()}
    return compare(params, reference, grads=grads, part=part)


def _timed_steps(
    trainer, clock: _RoundClock, inputs, targets, cfg: ParallelismComparisonConfig
) -> dict:
    """Slowest rank's step seconds; this rank's own step seconds and seconds in rounds."""

    def step() -> float:
        in_rounds = clock.wall_s
        trainer.step(inputs, targets)
        return clock.wall_s - in_rounds

    timed = alternate({"step": step}, warmup=cfg.warmup, repeats=cfg.repeats)["step"]
    return {"step_times_s": timed.seconds, "own_s": timed.own, "round_s": timed.outcomes}


def _profiled_step(trainer, clock, comms, lock, inputs, targets) -> dict[str, Any]:
    """One step with the host's compute serialised: per compute action its CPU seconds and
    TP traffic; the whole step's CPU seconds and per-axis traffic; the pipeline's own."""
    tp, per_action = trainer.tp_comm, []

    @contextmanager
    def count_tp() -> Iterator[None]:  # the executor enters it around each compute action
        before, cpu = tp.counters.copy(), clock.cpu_s
        yield
        per_action.append((tp.counters - before, clock.cpu_s - cpu))

    turns = _Turns(lock)
    dist.barrier()
    clock.turns = turns
    turns.take()
    try:
        cpu, round_cpu = time.thread_time(), clock.cpu_s
        with _axis_traffic(comms) as traffic:
            result = trainer.step(inputs, targets, compute_guard=count_tp)
        cpu, round_cpu = time.thread_time() - cpu, clock.cpu_s - round_cpu
    finally:
        turns.give()
        clock.turns = None
    computes = [r for r in result.pipeline.records if r.kind in COMPUTE_KINDS]
    actions = [
        {
            "action": r.action,
            "cpu_s": r.cpu_s,
            "round_cpu_s": in_rounds,
            "tp_bytes": t.bytes_sent,
            "tp_rounds": t.rounds,
        }
        for r, (t, in_rounds) in zip(computes, per_action, strict=True)
    ]
    return {
        "actions": actions,
        "cpu_s": cpu,
        "round_cpu_s": round_cpu,
        "traffic": traffic,
        "pipeline_traffic": result.pipeline.traffic.as_dict(),
    }


def _call_overhead_s(comm: Communicator, clock: _RoundClock, numel: int, calls: int = 20) -> float:
    """Thread CPU seconds one all-reduce of `numel` float32 on `comm` spends outside its
    rounds — the clone TP's `f`/`g` make, the ring's slicing and additions — the median of
    `calls` calls on zeros, after one warm-up (every group of the axis calls it at once)."""
    if comm.world_size == 1:
        return 0.0
    x = torch.zeros(numel)

    def call() -> float:
        cpu, in_rounds = time.thread_time(), clock.cpu_s
        all_reduce(x.clone(), comm)
        return time.thread_time() - cpu - (clock.cpu_s - in_rounds)

    return statistics.median(alternate({"call": call}, warmup=1, repeats=calls)["call"].outcomes)


def _train(trainer: HybridTrainer, comms, inputs, targets, steps: int) -> dict[str, Any]:
    """`steps` training steps: their losses, the last step's traffic per axis and the peak
    of saved activations."""
    losses, activations = [], []
    for _ in range(steps):
        with _axis_traffic(comms) as traffic:
            result = trainer.step(inputs, targets)
        losses.append(result.loss)
        activations.append(result.pipeline.peak_activation_bytes)
    return {"losses": losses, "traffic": traffic, "peak_activation_bytes": max(activations)}


def run(cfg: ParallelismComparisonConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a layout: traffic, memory, correctness, step times, profile, link.

    Every layout trains the same GPT (one seed on every rank) on the same batch with AdamW
    through `impls.hybrid.HybridTrainer` on a `Mesh` of degrees (dp, pp, tp). A degree of 1
    leaves an axis out, so `{dp: 4}` is plain data parallelism, `{tp: 4}` Megatron tensor
    parallelism, `{pp: 4}` a pipeline, and the others their 2D and 3D compositions (PTD-P,
    Narayanan et al. 2021, arXiv 2104.04473). On each rank a cell:

    1. trains `steps` steps, reading each step's traffic on the mesh's dp, pp and tp
       communicators and the pipeline executor's peak of saved activations; then the bytes of
       model state the rank holds (its parameters, their gradients, AdamW's moments);
    2. checks losses, parameters and the last gradients against single-device AdamW on the
       whole batch (`bench.kit.reference`: rank 0 trains it and broadcasts it; each rank
       compares its own TP shard);
    3. times `repeats` steps after `warmup` (`bench.kit.timing.alternate`, one side):
       barrier-opened, slowest rank, and per rank its own step and its wall seconds inside
       communication rounds (the wall-clock utilization);
    4. measures the thread CPU one TP all-reduce of an activation spends outside its rounds
       (the clone Megatron's f/g make, the ring's slicing and additions): communication's own
       work, which the experiment must not count as compute;
    5. profiles `profile_steps` steps in which the ranks of the host compute one at a time
       (`bench.kit.host.HostComputeLock`, handed back while a rank waits in a round, so that
       TP's all-reduces inside a forward cannot deadlock on it): each compute action's thread
       CPU time, inside rounds and in all, and the TP traffic it made; the step's CPU time
       and traffic in all — what the experiment replays as if every rank had its own device;
    6. probes α and β of this host's link: the fastest exchange of 4 bytes and of 1 MiB
       between two ranks while the others wait (`bench.kit.host.probe_pairs`).

    Rounds are timed by giving the mesh's three communicators (the instances this cell built,
    nothing global) a `round_type` that clocks each round's posting and each of its waits:
    every collective and transfer in `impls` posts its messages through `Communicator.round`.
    """
    layout: Layout = cell.carry
    mesh = Mesh(dist.get_world_size(), **layout.degrees)
    trainer = HybridTrainer(
        gpt(cfg.model, cfg.seed),
        mesh,
        _adamw(cfg.lr),
        global_batch_size=cfg.batch_size,
        microbatches=cfg.microbatches,
        schedule=cfg.schedule,
    )
    comms = {axis: mesh.communicator(axis) for axis in AXES}
    clock = _RoundClock(list(comms.values()))
    inputs, targets = seeded_batch(layout.gpt, cfg.batch_size, cfg.seed)
    trained = _train(trainer, comms, inputs, targets, cfg.steps)
    held = held_bytes(trainer.params, trainer.optimizer)
    reference = _reference(cfg, inputs, targets)
    checked = _compare(trainer, reference)
    timed = _timed_steps(trainer, clock, inputs, targets, cfg)
    activation = layout.micro_batch * layout.gpt.seq_len * layout.gpt.d_model
    tp_call_cpu_s = _call_overhead_s(comms["tp"], clock, activation)
    with HostComputeLock() as lock:
        profile = [
            _profiled_step(trainer, clock, comms, lock, inputs, targets)
            for _ in range(cfg.profile_steps)
        ]
    probe_s = [probe_pairs(torch.zeros(max(1, n // 4)), exchange=True) for n in PROBE_BYTES]
    mesh.close()  # the pool serves more cells: leave no idle groups behind
    return {
        "rank": dist.get_rank(),
        "coords": {axis: mesh.coords()[axis] for axis in AXES},
        "params": sum(p.numel() for p in reference.start.values()),
        "rank_params": sum(p.numel() for p in trainer.params),
        **trained,
        "reference_losses": reference.losses,
        **checked,
        "held": held,
        **timed,
        "median_step_s": statistics.median(timed["step_times_s"]),
        "tp_call_cpu_s": tp_call_cpu_s,
        "profile": profile,
        "probe_s": probe_s,
    }
