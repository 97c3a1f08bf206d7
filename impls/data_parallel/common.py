"""What every data-parallel variant shares: the batch split, the per-step record, the
training step's skeleton, and the optimizer step of one full replica in any precision.

Each rank trains a full replica on its shard of the global batch: with N ranks and a
batch of B, rank r computes the mean loss over its B/N samples and the variants make
every replica step with the average of the N shard gradients — the gradient of the mean
loss over all B samples, so N ranks take exactly the step one process would (the
lecture's argument that data parallelism does not change the optimization).

Gradients are divided by N *before* they are summed over ranks (as torch's DDP does):
the sum is then already the average, and in fp16 it cannot overflow where the average
would not.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from impls.collectives import all_reduce, broadcast
from impls.comm import Communicator, SimulatedNetwork, TrafficCounters
from impls.precision import (
    MasterWeights,
    check_precision,
    compute_dtype,
    make_loss_scaler,
)

__all__ = [
    "BucketTiming",
    "DataParallelBase",
    "LossFn",
    "OptimizerFactory",
    "ReplicaOptimizer",
    "StepStats",
    "SyncTimeline",
    "release_group",
    "shard_batch",
    "thread_communicator",
]

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
"""Builds the optimizer over the parameters it must update, e.g.
`lambda params: torch.optim.Adam(params, lr=1e-3)`: the variant decides which parameters
those are (the model's in fp32, the fp32 master copy otherwise, only the server's in DP 1.0)."""

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`loss_fn(outputs, targets) -> scalar` averaged over the shard, e.g. `MLP.loss`, `GPT.loss`."""


@dataclass
class BucketTiming:
    """When one gradient bucket moved during a step (`time.perf_counter` seconds)."""

    index: int
    nbytes: int
    ready: float  # its last gradient arrived (backward produced it)
    started: float  # its all-reduce began
    finished: float  # its all-reduce returned


@dataclass
class SyncTimeline:
    """A DDP step's gradient synchronization against the end of backward."""

    backward_end: float
    buckets: list[BucketTiming]

    @property
    def overlapped(self) -> bool:
        """Whether the first bucket's all-reduce started while backward was still running."""
        return self.buckets[0].started < self.backward_end


@dataclass
class StepStats:
    """What one rank measured in one training step."""

    loss: float  # this rank's unscaled loss on its shard (average over ranks: the global loss)
    stepped: bool  # False when the loss scaler skipped the step on an overflow
    loss_scale: float | None  # the scale this step's loss was multiplied by (None: no scaling)
    traffic: TrafficCounters  # everything this rank sent and received during the step
    timeline: SyncTimeline | None = field(default=None)  # DDP only


def shard_batch(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/world_size of `batch` along dim 0."""
    size = batch.shape[0]
    if size % world_size:
        raise ValueError(
            f"batch size {size} is not divisible by world_size={world_size}: every rank "
            "needs an equal shard for the average of shard gradients to be the batch gradient"
        )
    per_rank = size // world_size
    return batch[rank * per_rank : (rank + 1) * per_rank]


class ReplicaOptimizer:
    """The optimizer step of one full model replica: fp32, or low precision + fp32 master.

    In fp16/bf16 the optimizer updates `MasterWeights` and the rounded result is copied
    into the model after every applied step. With a loss scaler the fp32 gradients are
    unscaled, the ranks agree on whether any overflowed, and an overflowing step is
    skipped on every rank alike. Gradients are cleared (set to None) after each step.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        optimizer: OptimizerFactory,
        precision: str,
        loss_scale: str | float | None,
    ) -> None:
        self.params = params
        self.scaler = make_loss_scaler(precision, loss_scale)
        low_precision = compute_dtype(precision) != torch.float32
        self.master = MasterWeights(params) if low_precision else None
        self.optimizer = optimizer(self.master.master_params if self.master else params)
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must return a torch.optim.Optimizer, got {self.optimizer!r}"
            )

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.scale if self.scaler else None

    def step(self, comm: Communicator | None) -> bool:
        """Apply the step unless the (agreed) gradients overflowed; returns whether it did.

        `comm`: the ranks that must take the same decision (None: this rank decides alone).
        """
        if self.master is not None:
            grads = [self.master.master_grads_from_model()]
        else:
            grads = [p.grad for p in self.params if p.grad is not None]
        stepped = True
        if self.scaler is not None:
            found_inf = self.scaler.unscale_(grads)
            if comm is not None:
                found_inf = agree_on_overflow(found_inf, comm)
            stepped = self.scaler.update(found_inf)
        if stepped:
            self.optimizer.step()
            if self.master is not None:
                self.master.copy_to_model()
        for p in self.params:
            p.grad = None
        return stepped


def agree_on_overflow(found_inf: bool, comm: Communicator) -> bool:
    """True on every rank if any rank found an inf/NaN (all-reduce "max" of the flag).

    "parallel" is one round of 4-byte messages: the latency-optimal choice for one element.
    """
    flag = torch.tensor([float(found_inf)], device=comm.device)
    all_reduce(flag, comm, op="max", algorithm="parallel")
    return bool(flag.item())


def broadcast_parameters(params: Sequence[nn.Parameter], comm: Communicator, src: int = 0) -> None:
    """Make every replica start from rank `src`'s weights (as torch's DDP does at wrap time)."""
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        broadcast(flat, comm, src=src)
        unflatten_into([p.data for p in params], flat)


def thread_communicator(
    comm: Communicator,
    sync_group: dist.ProcessGroup | Communicator | None,
    *,
    network: SimulatedNetwork | None = None,
    exclusive: bool = True,
) -> tuple[Communicator, dist.ProcessGroup | None]:
    """The communicator a communication thread works on, beside `comm`'s training thread,
    and the process group created for it here (None when `sync_group` was given).

    `sync_group`: a `ProcessGroup` or `Communicator` holding the ranks of `comm`; None
    creates one with `dist.new_group`, which is collective over the *whole* job (every
    process must call, in the same order). With `exclusive` it must not be `comm`'s own
    group: two threads must never share a group's message stream. Release a created
    group with `release_group` once no thread uses it.
    """
    owned = None
    if sync_group is None:
        sync_group = owned = dist.new_group(dist.get_process_group_ranks(comm.group))
    if isinstance(sync_group, Communicator):
        sync = sync_group
    else:
        sync = Communicator(sync_group, network=network)
    if sync.world_size != comm.world_size or sync.rank != comm.rank:
        raise ValueError(
            f"sync_group has this process as rank {sync.rank} of {sync.world_size}; it must "
            f"hold the ranks of comm (rank {comm.rank} of {comm.world_size})"
        )
    if exclusive and sync.group is comm.group:
        raise ValueError(
            "sync_group must be a different process group from comm's: the communication "
            "thread and the training thread would interleave messages"
        )
    return sync, owned


def release_group(group: dist.ProcessGroup) -> None:
    """Destroy a process group this process created (its gloo transport threads would
    outlive it otherwise), after a barrier so no peer is still sending on it."""
    dist.barrier(group=group)
    dist.destroy_process_group(group)


def unflatten_into(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy consecutive slices of 1-D `flat` into `tensors`, in order."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


class DataParallelBase(ABC):
    """One rank's replica and its training step; subclasses synchronize and step.

    The module is cast to the precision's dtype in place; floating-point inputs are cast
    on the way in, and the loss is computed in fp32 from the outputs; every replica starts
    from rank 0's weights. `optimizer` (each subclass takes one) is a factory: it receives
    the parameters to update (the model's in fp32, the fp32 master copy in fp16/bf16) and
    returns a `torch.optim.Optimizer`.

    `train_step` returns a `StepStats`: this rank's loss, whether the step was applied (a
    loss scaler skips overflowing steps on every rank alike), the loss scale used, the
    traffic this rank moved (`TrafficCounters`), and for DDP a `SyncTimeline` of every
    bucket's ready/start/finish times against the end of backward. A training loop of its
    own replaces `train_step` with its three parts: `out = dp(x)`;
    `(loss * dp.loss_scale).backward()` (or plain `loss.backward()` when `dp.loss_scale` is
    None); `stepped, timeline = dp.synchronize_and_step()` (for DDP, that call first waits
    for the bucket all-reduces).
    """

    def __init__(
        self, module: nn.Module, comm: Communicator, precision: str, loss_scale: str | float | None
    ) -> None:
        check_precision(precision, loss_scale)
        self.comm = comm
        self.precision = precision
        self.dtype = compute_dtype(precision)
        self.module = module.to(self.dtype)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("module has no parameters that require gradients")
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]

    @property
    @abstractmethod
    def loss_scale(self) -> float | None:
        """The scale the next step's loss is multiplied by (None: no loss scaling)."""

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.module(*(x.to(self.dtype) if x.is_floating_point() else x for x in inputs))

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn) -> StepStats:
        """Forward and backward on this rank's shard, synchronize, step; what it measured."""
        comms = list({id(c): c for c in self._communicators()}.values())
        before = [c.counters.copy() for c in comms]
        loss = loss_fn(self(inputs).float(), targets)
        scale = self.loss_scale
        (loss * scale if scale is not None else loss).backward()
        stepped, timeline = self.synchronize_and_step()
        traffic = TrafficCounters()
        for comm, start in zip(comms, before, strict=True):
            for key, value in (comm.counters - start).as_dict().items():
                setattr(traffic, key, getattr(traffic, key) + value)
        return StepStats(loss.item(), stepped, scale, traffic, timeline)

    def local_grads(self) -> list[torch.Tensor]:
        """This rank's gradients, in parameter order; every parameter must have one."""
        missing = [n for n, p in zip(self.param_names, self.params, strict=True) if p.grad is None]
        if missing:
            raise RuntimeError(
                f"parameters without a gradient after backward: {', '.join(missing)}; "
                "every parameter that requires grad must take part in the loss"
            )
        return [p.grad for p in self.params]

    @abstractmethod
    def synchronize_and_step(self) -> tuple[bool, SyncTimeline | None]:
        """After backward: average the gradients over ranks and step every replica alike.

        Returns whether the step was applied and, for DDP, the step's `SyncTimeline`.
        """

    def _communicators(self) -> list[Communicator]:
        return [self.comm]
