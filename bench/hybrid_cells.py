"""What one rank does in a `parallelism_comparison` cell: train one mesh layout, then
count, compare, time and profile it.

Every layout trains the same GPT (one seed on every rank) on the same batch with AdamW
through `impls.hybrid.HybridTrainer` on a `Mesh` of degrees (dp, pp, tp). A degree of 1
leaves an axis out, so `{dp: 4}` is plain data parallelism, `{tp: 4}` Megatron tensor
parallelism, `{pp: 4}` a pipeline, and the others their 2D and 3D compositions (PTD-P,
Narayanan et al. 2021, arXiv 2104.04473). On each rank a cell:

1. trains `steps` steps, reading each step's traffic on the mesh's dp, pp and tp
   communicators and the pipeline executor's peak of saved activations; then the bytes of
   model state the rank holds (its parameters, their gradients, AdamW's moments);
2. checks losses, parameters and the last gradients against single-device AdamW on the
   whole batch (rank 0 trains it and broadcasts it; each rank compares its own shard);
3. times `repeats` steps after `warmup`: barrier-opened, slowest rank, and per rank its
   own step and its wall seconds inside communication rounds (the wall-clock utilization);
4. measures the thread CPU one TP all-reduce of an activation spends outside its rounds
   (the clone Megatron's f/g make, the ring's slicing and additions): communication's own
   work, which the experiment must not count as compute;
5. profiles `profile_steps` steps in which the ranks of the host compute one at a time
   (`bench.pipeline_cells.HostComputeLock`, handed back while a rank waits in a round, so
   that TP's all-reduces inside a forward cannot deadlock on it): each compute action's
   thread CPU time, inside rounds and in all, and the TP traffic it made; the step's CPU
   time and traffic in all — what the experiment replays as if every rank had its own
   device;
6. probes α and β of this host's link: the fastest exchange of 4 bytes and of 1 MiB
   between two ranks while the others wait (`probe_exchange_s`).

Rounds are timed by giving the mesh's three communicators (the instances this cell built,
nothing global) a `round_type` that clocks each round from its creation to the end of its
wait: every collective and transfer in `impls` posts its messages through
`Communicator.round`.
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

from bench.kit.host import HostComputeLock
from bench.kit.memory import held_bytes
from bench.kit.timing import slowest
from bench.kit.workloads import lm_loss, seeded_batch
from impls.collectives import all_reduce
from impls.comm import Communicator, Round
from impls.hybrid import HybridTrainer, Mesh
from impls.models import GPT, GPTConfig
from impls.pipeline.actions import COMPUTE_KINDS
from impls.tensor_parallel import sharded_dims

__all__ = ["AXES", "PROBE_BYTES", "HybridCell", "probe_exchange_s", "run_hybrid_cell"]

AXES = ("dp", "pp", "tp")
PROBE_BYTES = (4, 1 << 20)  # the α probe's message and the β probe's


@dataclass(kw_only=True)
class HybridCell:
    """One layout, as shipped to every rank."""

    dp: int
    pp: int
    tp: int
    model: dict[str, Any]
    """`GPTConfig` keyword arguments."""
    batch_size: int
    """Sequences per step over all replicas."""
    microbatches: int
    """Micro-batches per replica and step."""
    schedule: str = "1f1b"
    steps: int = 3
    """Training steps checked against single-device training."""
    warmup: int = 1
    repeats: int = 3
    """Timed steps after `warmup` untimed ones."""
    profile_steps: int = 2
    """Steps with the host's compute serialised (the replay's costs)."""
    lr: float = 1e-3
    weight_decay: float = 0.01
    seed: int = 0


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
    """Wall and thread-CPU seconds this rank spends in rounds of `comms`, each round from
    its creation (posting its messages) to the end of its wait; while `turns` is set, the
    host's compute lock is handed back for the duration of each wait."""

    def __init__(self, comms: list[Communicator]) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.turns: _Turns | None = None
        for comm in comms:
            comm.round_type = partial(_ClockedRound, clock=self)  # this instance only


class _ClockedRound(Round):
    def __init__(self, comm: Communicator, clock: _RoundClock) -> None:
        super().__init__(comm)
        self._clock = clock
        self._start = (time.perf_counter(), time.thread_time())

    def wait(self) -> None:
        turns = self._clock.turns
        if turns is not None:
            turns.give()
        try:
            super().wait()
        finally:
            if turns is not None:
                turns.take()
            self._clock.wall_s += time.perf_counter() - self._start[0]
            self._clock.cpu_s += time.thread_time() - self._start[1]


def _adamw(cell: HybridCell) -> Callable[[list], torch.optim.Optimizer]:
    return lambda params: torch.optim.AdamW(params, lr=cell.lr, weight_decay=cell.weight_decay)


@contextmanager
def _axis_traffic(comms: dict[str, Communicator]) -> Iterator[dict[str, Any]]:
    """Each axis's counters over the enclosed operations (filled in on exit)."""
    out: dict[str, Any] = {}
    with ExitStack() as stack:
        measured = {axis: stack.enter_context(comm.measure()) for axis, comm in comms.items()}
        yield out
    out.update({axis: counters.as_dict() for axis, counters in measured.items()})


def _reference(cell: HybridCell, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """Single-device AdamW on the whole batch: losses, parameters before and after, and
    the last step's gradients."""
    model = GPT(GPTConfig(**cell.model), seed=cell.seed)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = _adamw(cell)(list(model.parameters()))
    losses = []
    for _ in range(cell.steps):
        optimizer.zero_grad()
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    end = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {"losses": losses, "start": start, "end": end, "grads": grads}


def _compare(trainer: HybridTrainer, reference: dict) -> dict[str, float]:
    """This rank's parameters and last gradients against its shard of the reference's.

    `update_error` is ‖p − p_ref‖ / ‖p_ref − p_start‖ over the rank's parameters: how far
    training ended from where the reference went, relative to how far it moved (Adam's
    normalised steps turn rounding of near-zero gradients into absolute differences that
    say nothing on their own; see `bench.zero_cells._compare`). Adam's step is also blind
    to a gradient's scale, so `grad_error` = ‖g − g_ref‖ / ‖g_ref‖ of the last step's
    gradients catches what it would miss (a sum over replicas instead of a mean).
    """
    dims, tp = sharded_dims(trainer.model), trainer.tp_comm.world_size
    sums = dict.fromkeys(("off", "moved", "grad_off", "grad"), 0.0)
    diff = 0.0
    for name, param in trainer.named_parameters():
        want = {k: reference[k][name] for k in ("end", "start", "grads")}
        if name in dims:
            want = {k: v.chunk(tp, dim=dims[name])[trainer.tp_comm.rank] for k, v in want.items()}
        got = param.detach()
        diff = max(diff, float((got - want["end"]).abs().max()))
        sums["off"] += float((got - want["end"]).square().sum())
        sums["moved"] += float((want["end"] - want["start"]).square().sum())
        sums["grad_off"] += float((param.grad - want["grads"]).square().sum())
        sums["grad"] += float(want["grads"].square().sum())
    return {
        "max_param_diff": diff,
        "update_error": _relative(sums["off"], sums["moved"]),
        "grad_error": _relative(sums["grad_off"], sums["grad"]),
    }


def _relative(off: float, norm: float) -> float:
    return (off / norm) ** 0.5 if norm else float("inf")


def _timed_steps(trainer, clock, inputs, targets, warmup: int, repeats: int) -> dict:
    """Slowest rank's step seconds; this rank's own step seconds and seconds in rounds."""
    out: dict[str, list[float]] = {"step_times_s": [], "own_s": [], "round_s": []}
    for i in range(warmup + repeats):
        dist.barrier()
        start, in_rounds = time.perf_counter(), clock.wall_s
        trainer.step(inputs, targets)
        own = time.perf_counter() - start
        step = slowest(own)
        if i >= warmup:
            out["step_times_s"].append(step)
            out["own_s"].append(own)
            out["round_s"].append(clock.wall_s - in_rounds)
    return out


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
        {"action": r.action, "cpu_s": r.cpu_s, "round_cpu_s": in_rounds,
         "tp_bytes": t.bytes_sent, "tp_rounds": t.rounds}
        for r, (t, in_rounds) in zip(computes, per_action, strict=True)
    ]  # fmt: skip
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
    `calls` calls on zeros (every group of the axis calls it at once)."""
    if comm.world_size == 1:
        return 0.0
    x, spent = torch.zeros(numel), []
    for call in range(calls + 1):  # the first call is a warm-up
        cpu, in_rounds = time.thread_time(), clock.cpu_s
        all_reduce(x.clone(), comm)
        if call:
            spent.append(time.thread_time() - cpu - (clock.cpu_s - in_rounds))
    return statistics.median(spent)


def probe_exchange_s(nbytes: int, trials: int = 20) -> float | None:
    """Seconds of one round in which two ranks each send the other `nbytes` — what every
    ring round does — with the pair alone: the fastest of `trials`, median over the
    neighbouring pairs (r, r+1) this rank is in. Pairs take turns while the other ranks wait
    at a barrier; on shared cores a slower round is one in which a peer was descheduled,
    the interference a replay "as if every rank had its own device" removes (as
    `bench.pipeline_cells.probe_transfer_s` argues for one-way transfers)."""
    comm = Communicator()
    outbox = torch.zeros(max(1, nbytes // 4))
    inbox = torch.empty_like(outbox)
    fastest = []
    for first in range(comm.world_size - 1):
        dist.barrier()
        if comm.rank not in (first, first + 1):
            continue
        peer = first + 1 if comm.rank == first else first
        rounds = []
        for trial in range(trials + 1):  # the first exchange is a warm-up
            start = time.perf_counter()
            with comm.round() as rnd:
                rnd.recv(inbox, peer)
                rnd.send(outbox, peer)
            if trial:
                rounds.append(time.perf_counter() - start)
        fastest.append(min(rounds))
    dist.barrier()
    return statistics.median(fastest) if fastest else None


def run_hybrid_cell(cell: HybridCell) -> dict[str, Any]:
    """One rank of a layout: traffic, memory, correctness, step times, profile, link."""
    cfg = GPTConfig(**cell.model)
    mesh = Mesh(dist.get_world_size(), dp=cell.dp, pp=cell.pp, tp=cell.tp)
    trainer = HybridTrainer(GPT(cfg, seed=cell.seed), mesh, _adamw(cell),
                            global_batch_size=cell.batch_size, microbatches=cell.microbatches,
                            schedule=cell.schedule)  # fmt: skip
    comms = {axis: mesh.communicator(axis) for axis in AXES}
    clock = _RoundClock(list(comms.values()))
    inputs, targets = seeded_batch(cfg, cell.batch_size, cell.seed)
    losses, traffic, activations = [], [], []
    for _ in range(cell.steps):
        with _axis_traffic(comms) as counted:
            result = trainer.step(inputs, targets)
        losses.append(result.loss)
        traffic.append(counted)
        activations.append(result.pipeline.peak_activation_bytes)
    held = held_bytes(trainer.params, trainer.optimizer)
    reference = [_reference(cell, inputs, targets) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(reference, src=0)
    checked = _compare(trainer, reference[0])
    timed = _timed_steps(trainer, clock, inputs, targets, cell.warmup, cell.repeats)
    micro = cell.batch_size // (cell.dp * cell.microbatches)
    tp_call_cpu_s = _call_overhead_s(comms["tp"], clock, micro * cfg.seq_len * cfg.d_model)
    with HostComputeLock() as lock:
        profile = [_profiled_step(trainer, clock, comms, lock, inputs, targets)
                   for _ in range(cell.profile_steps)]  # fmt: skip
    probe_s = [probe_exchange_s(nbytes) for nbytes in PROBE_BYTES]
    mesh.close()  # the pool serves more cells: leave no idle groups behind
    return {
        "rank": dist.get_rank(),
        "coords": {axis: mesh.coords()[axis] for axis in AXES},
        "params": sum(p.numel() for p in reference[0]["start"].values()),
        "rank_params": sum(p.numel() for p in trainer.params),
        "losses": losses,
        "reference_losses": reference[0]["losses"],
        **checked,
        "held": held,
        "traffic": traffic[-1],
        "peak_activation_bytes": max(activations),
        **timed,
        "median_step_s": statistics.median(timed["step_times_s"]),
        "tp_call_cpu_s": tp_call_cpu_s,
        "profile": profile,
        "probe_s": probe_s,
    }
