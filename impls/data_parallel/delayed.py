"""Delayed gradient averaging: step on the local gradient now, fix it up D steps later.

Zhu, Lin, Lu, Han, NeurIPS 2021, "Delayed Gradient Averaging: Tolerate the
Communication Latency for Federated Learning" (DGA). Synchronous data parallelism makes
every step wait for its all-reduce; over a long link that wait is mostly latency, and
no amount of bandwidth removes it. DGA lets the all-reduce of step t take D steps:

    w_{t+1} = w_t − lr·g_t − lr·(ḡ_{t−D} − g_{t−D})

where g_t is this rank's gradient at step t and ḡ_t the average over ranks. Summed over a
run (with plain SGD) every rank applies Σ ḡ_t once the last D averages are in: replicas
differ during training by at most D steps' worth of local gradients and agree at the end.
With momentum or Adam the corrections pass through the optimizer like any gradient, so
the replicas need not agree at the end; the paper's guarantee is for the update above.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist
from torch import nn

from impls.collectives import all_reduce, check_algorithm
from impls.comm import Communicator, TrafficCounters
from impls.comm.network import SimulatedNetwork
from impls.data_parallel.comm_thread import CommThread
from impls.data_parallel.common import (
    DataParallelBase,
    LossFn,
    OptimizerFactory,
    ReplicaOptimizer,
    StepStats,
    SyncTimeline,
    broadcast_parameters,
    release_group,
    thread_communicator,
    unflatten_into,
)

__all__ = ["DelayedAveragingDP", "DelayedStepStats"]


@dataclass
class DelayedStepStats(StepStats):
    """A DGA step: `StepStats` plus which average it applied and how long it waited.

    `traffic` is that of the all-reduce whose average this step applied (it ran on the
    communication thread, possibly over several earlier steps).
    """

    applied_step: int | None = None  # the step whose average corrected this one (None: none yet)
    waited_s: float = 0.0  # exposed communication: the step blocked on that average this long
    simulated_s: float = 0.0  # simulated network seconds of that average's all-reduce


@dataclass
class _InFlight:
    """One step's gradient on its way to becoming the average."""

    step: int
    local: torch.Tensor  # g_t, this rank's own gradient (flat), kept for the correction
    buffer: torch.Tensor  # g_t / N, summed over ranks in place: ḡ_t once done
    done: threading.Event = field(init=False)  # `CommThread.submit`'s: set once it has run
    started: float = 0.0  # perf_counter when its all-reduce began
    finished: float = 0.0  # ... and when it returned
    simulated_s: float = 0.0  # what the simulated network added to it
    traffic: TrafficCounters = field(default_factory=TrafficCounters)

    @property
    def available_at(self) -> float:
        """When the average would have arrived over the simulated link."""
        return self.finished + self.simulated_s


class DelayedAveragingDP(DataParallelBase):
    """Data parallelism whose gradient averages arrive `delay` steps late (DGA, fp32).

    `comm`: the data-parallel group (initial weight broadcast). `delay`: D, the steps an
    all-reduce may take before its average is applied; 0 is synchronous DP.
    `algorithm`: any of `impls.collectives.ALGORITHMS`. `sync_group`: the process group
    the communication thread all-reduces over, with the ranks of `comm` but not `comm`'s
    group; None creates one with `dist.new_group`, which is collective over the *whole*
    job (every process must construct, in the same order), and `close()` destroys it.
    `network`: a `SimulatedNetwork` charged to those all-reduces (below). Use as a context
    manager, or call `close()`, to stop the communication thread.

    After backward the rank flattens its gradient g_t, keeps a copy (the correction needs
    g_{t−D}) and hands g_t/N to a communication thread that sums it over ranks on a
    *separate* process group (two threads must never share a group's message stream; see
    `DDP`). The optimizer then steps with d_t = g_t + (ḡ_{t−D} − g_{t−D}), the second term
    from step D on; `delay=0` waits for the step's own average: d_t = ḡ_t, synchronous DP.

    The simulated network is charged without blocking the thread (its communicator does
    not sleep, `hold_simulated=False`): an average counts as *available* at start + real
    duration + simulated seconds, so several all-reduces can be in flight at once, each at
    the link's full bandwidth (a latency model). A step that needs an average waits for
    the thread and then until it is available: the exposed communication time,
    `DelayedStepStats.waited_s` (with `delay=0`, the whole simulated time).
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Communicator,
        optimizer: OptimizerFactory,
        *,
        delay: int,
        algorithm: str = "parallel",
        sync_group: dist.ProcessGroup | None = None,
        network: SimulatedNetwork | None = None,
    ) -> None:
        super().__init__(module, comm, "fp32", None)
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ValueError(
                f"delay={delay!r}: must be an int ≥ 0, the number of steps an average may "
                "arrive late (0: synchronous data parallelism)"
            )
        if network is not None and not isinstance(network, SimulatedNetwork):
            raise TypeError(f"network must be a SimulatedNetwork or None, got {network!r}")
        if sync_group is not None and not isinstance(sync_group, dist.ProcessGroup):
            raise TypeError(f"sync_group must be a torch ProcessGroup or None, got {sync_group!r}")
        self.delay = delay
        self.algorithm = check_algorithm(algorithm)
        self._owned_group: dist.ProcessGroup | None = None  # made here, destroyed by close
        self.sync_comm = self._sync_communicator(sync_group, network)
        broadcast_parameters(self.params, comm)
        self.updater = ReplicaOptimizer(self.params, optimizer, "fp32", None)
        self._pending: deque[_InFlight] = deque()  # handed over, average not yet applied
        self._step = 0
        self._last: tuple[_InFlight | None, float] = (None, 0.0)  # applied this step, waited
        self._thread: CommThread[_InFlight] | None = CommThread(
            self._all_reduce, name="dga-average", failure="a gradient all-reduce"
        )

    @property
    def loss_scale(self) -> float | None:
        return None

    @property
    def in_flight(self) -> int:
        """Averages handed to the communication thread and not yet applied."""
        return len(self._pending)

    def train_step(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn
    ) -> DelayedStepStats:
        """Forward and backward on this rank's shard, hand the gradient over, step."""
        base = super().train_step(inputs, targets, loss_fn)
        applied, waited = self._last
        traffic = base.traffic
        if applied is not None:
            for key, value in applied.traffic.as_dict().items():
                setattr(traffic, key, getattr(traffic, key) + value)
        return DelayedStepStats(
            **{f.name: getattr(base, f.name) for f in fields(StepStats)},
            applied_step=applied.step if applied is not None else None,
            waited_s=waited,
            simulated_s=applied.simulated_s if applied is not None else 0.0,
        )

    def synchronize_and_step(self) -> tuple[bool, SyncTimeline | None]:
        """Hand this step's gradient to the thread and step with the corrected gradient."""
        self._check_open()
        grads = self.local_grads()
        local = torch.cat([g.detach().reshape(-1) for g in grads])
        job = _InFlight(self._step, local, local / self.comm.world_size)
        self._step += 1
        self._pending.append(job)
        job.done = self._thread.submit(job)
        applied, waited = None, 0.0
        step_with = local
        if len(self._pending) > self.delay:  # the average of step t − D is due now
            applied = self._pending.popleft()
            waited = self._wait(applied)
            if self.delay == 0:
                step_with = applied.buffer  # ḡ_t itself: synchronous DP, no rounding added
            else:
                step_with = local + (applied.buffer - applied.local)
        self._last = (applied, waited)
        for p, g in zip(self.params, grads, strict=True):
            p.grad = torch.empty_like(g)
        unflatten_into([p.grad for p in self.params], step_with)
        return self.updater.step(None), None

    def finish(self) -> float:
        """Wait for every average in flight and apply its correction; call it before
        evaluating. The seconds waited.

        Each correction is a plain SGD step, w −= lr·(ḡ_s − g_s) at the parameter's
        learning rate: with SGD at a constant rate every replica then holds
        w_0 − lr·Σ_s ḡ_s (up to rounding). Training may go on afterwards; the next D steps
        have no correction.
        """
        self._check_open()
        lr = {id(p): g["lr"] for g in self.updater.optimizer.param_groups for p in g["params"]}
        waited = 0.0
        while self._pending:
            job = self._pending.popleft()
            waited += self._wait(job)
            correction = job.buffer - job.local
            offset = 0
            with torch.no_grad():
                for p in self.params:
                    part = correction[offset : offset + p.numel()].view_as(p)
                    p.sub_(part, alpha=lr[id(p)])
                    offset += p.numel()
        return waited

    def close(self) -> None:
        """Stop the communication thread (after the all-reduces already handed over) and
        destroy the sync group if this instance created it. Averages not yet applied
        are dropped: call `finish()` first to apply them."""
        if self._thread is not None:
            self._thread.close()
            self._thread = None
        self._pending.clear()
        if self._owned_group is not None:
            release_group(self._owned_group)
            self._owned_group = None

    def __enter__(self) -> DelayedAveragingDP:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._thread is None:
            raise RuntimeError("this DelayedAveragingDP is closed")

    def _wait(self, job: _InFlight) -> float:
        """Block until `job`'s average is done and available; the seconds blocked."""
        start = time.perf_counter()
        self._thread.wait(job.done)
        remaining = job.available_at - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return time.perf_counter() - start

    def _all_reduce(self, job: _InFlight) -> None:
        sync = self.sync_comm
        counters, simulated = sync.counters.copy(), sync.simulated_s
        job.started = time.perf_counter()
        all_reduce(job.buffer, sync, op="sum", algorithm=self.algorithm)
        job.finished = time.perf_counter()
        job.simulated_s = sync.simulated_s - simulated
        job.traffic = sync.counters - counters

    def _sync_communicator(
        self, sync_group: dist.ProcessGroup | None, network: SimulatedNetwork | None
    ) -> Communicator:
        sync, self._owned_group = thread_communicator(self.comm, sync_group, network=network)
        sync.hold_simulated = False  # charged by availability times, not by sleeping
        return sync
