"""Bucketed data parallelism whose all-reduces overlap backward (torch's DDP design).

Li et al., VLDB 2020, "PyTorch Distributed"; the lecture's "overlapping communication
and computation": while backward computes the gradients of earlier layers, the gradients
of later layers, already final, are all-reduced.
How the hooks, buckets and communication thread do it: `DDP`. Each step records every
bucket's ready / start / finish times and the end of backward (`SyncTimeline`), so a run
can show the overlap happened.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from impls.collectives import all_reduce, check_algorithm
from impls.comm import Communicator
from impls.data_parallel.buckets import Bucket, assign_buckets
from impls.data_parallel.comm_thread import CommThread
from impls.data_parallel.common import (
    BucketTiming,
    DataParallelBase,
    OptimizerFactory,
    ReplicaOptimizer,
    SyncTimeline,
    broadcast_parameters,
    release_group,
    thread_communicator,
)

__all__ = ["DDP", "DEFAULT_BUCKET_CAP_BYTES"]

DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb=25


class DDP(DataParallelBase):
    """Distributed data parallel with gradient buckets all-reduced during backward.

    `comm`: the data-parallel group (initial weight broadcast, overflow agreement).
    `sync_group`: the group the bucket all-reduces use — a `ProcessGroup` or a
    `Communicator` with the same ranks as `comm` but a different group. None: with
    `overlap`, one is created with `dist.new_group`, which is collective over the *whole*
    job (every process must construct its DDP, in the same order); without, `comm`.
    Use as a context manager, or call `close()`, to stop the communication thread.

    - Each parameter's `register_post_accumulate_grad_hook` fires once its gradient is
      final for this backward. The hook copies the gradient, divided by N, into its
      bucket's flat buffer and makes `param.grad` a view of that slot (one copy; after the
      all-reduce the gradients are already in place, like torch's `gradient_as_bucket_view`).
    - When every gradient of a bucket has arrived, the bucket is handed to the communication
      thread — buckets strictly in index order, so all ranks issue the same collectives in
      the same order. Our collectives block, so overlap needs that thread: it all-reduces
      buckets from a queue with its own `Communicator` over a *separate* process group
      (two threads must never share a group's message stream).
    - `finish_gradient_sync()` waits for the queue to drain. `train_step` calls it after
      backward; a training loop of its own must call it after every backward, before
      reading gradients or stepping.
    - `overlap=False` is the baseline: the same buckets, all-reduced one after the other on
      the calling thread once backward has returned.
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Communicator,
        optimizer: OptimizerFactory,
        *,
        bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
        algorithm: str = "ring",
        overlap: bool = True,
        sync_group: dist.ProcessGroup | Communicator | None = None,
        precision: str = "fp32",
        loss_scale: str | float | None = None,
    ) -> None:
        super().__init__(module, comm, precision, loss_scale)
        self.algorithm = check_algorithm(algorithm)
        self.overlap = overlap
        groups = assign_buckets(
            [p.numel() * p.element_size() for p in self.params],
            [p.dtype for p in self.params],
            bucket_cap_bytes,
        )
        self._owned_group: dist.ProcessGroup | None = None  # made here, destroyed by close
        self.sync_comm = self._sync_communicator(sync_group)
        broadcast_parameters(self.params, comm)
        self.updater = ReplicaOptimizer(self.params, optimizer, precision, loss_scale)
        self.buckets = [Bucket(b, members, self.params) for b, members in enumerate(groups)]
        self._bucket_of = {i: bucket for bucket in self.buckets for i in bucket.members}
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._arrived = [False] * len(self.params)
        self._next_bucket = 0  # the first bucket not yet handed over this step
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self.params
        ]
        self._thread: CommThread[Bucket] | None = None
        if overlap:
            self._thread = CommThread(
                self._all_reduce, name="ddp-bucket-sync", failure="a bucket all-reduce"
            )

    @property
    def loss_scale(self) -> float | None:
        return self.updater.loss_scale

    def bucket_param_names(self) -> list[list[str]]:
        """The parameters of each bucket, in the order their gradients arrive."""
        return [[self.param_names[i] for i in b.members] for b in self.buckets]

    def finish_gradient_sync(self) -> SyncTimeline:
        """Wait until every bucket is all-reduced; `param.grad` then holds the average.

        Call it right after backward returns: the moment of the call is recorded as the
        end of backward in the returned timeline.
        """
        backward_end = time.perf_counter()
        if self._thread is not None:
            self._thread.wait_all()
        missing = [
            n for n, arrived in zip(self.param_names, self._arrived, strict=True) if not arrived
        ]
        if missing:
            self._reset()
            raise RuntimeError(
                f"parameters without a gradient in this backward: {', '.join(missing)}; "
                "DDP needs every parameter that requires grad to take part in the loss"
            )
        if self._thread is None:
            for bucket in self.buckets:
                self._all_reduce(bucket)
        timings = [
            BucketTiming(b.index, b.nbytes, b.ready, b.started, b.finished) for b in self.buckets
        ]
        self._reset()
        return SyncTimeline(backward_end, timings)

    def close(self) -> None:
        """Stop the communication thread, remove the gradient hooks, and destroy the sync
        group if this DDP created it (its transport threads would outlive it otherwise)."""
        if self._thread is not None:
            self._thread.close()
            self._thread = None
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._owned_group is not None:
            release_group(self._owned_group)
            self._owned_group = None

    def __enter__(self) -> DDP:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def synchronize_and_step(self) -> tuple[bool, SyncTimeline | None]:
        timeline = self.finish_gradient_sync()
        return self.updater.step(self.comm), timeline

    def _communicators(self) -> list[Communicator]:
        return [self.comm, self.sync_comm]

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        i = self._index[id(param)]
        if self._arrived[i]:
            raise RuntimeError(
                f"{self.param_names[i]} got a second gradient before finish_gradient_sync(); "
                "call it after every backward"
            )
        self._arrived[i] = True
        bucket = self._bucket_of[i]
        slot = bucket.views[i]
        with torch.no_grad():
            torch.div(param.grad, self.comm.world_size, out=slot)
        param.grad = slot
        bucket.pending -= 1
        if bucket.pending == 0:
            bucket.ready = time.perf_counter()
            self._hand_over_ready_buckets()

    def _hand_over_ready_buckets(self) -> None:
        while (
            self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0
        ):
            if self._thread is not None:
                self._thread.submit(self.buckets[self._next_bucket])
            self._next_bucket += 1

    def _all_reduce(self, bucket: Bucket) -> None:
        bucket.started = time.perf_counter()
        all_reduce(bucket.buffer, self.sync_comm, op="sum", algorithm=self.algorithm)
        bucket.finished = time.perf_counter()

    def _reset(self) -> None:
        for bucket in self.buckets:
            bucket.reset()
        self._arrived = [False] * len(self.params)
        self._next_bucket = 0

    def _sync_communicator(
        self, sync_group: dist.ProcessGroup | Communicator | None
    ) -> Communicator:
        if sync_group is None and not self.overlap:
            return self.comm  # no second thread: the training thread's group serves
        sync, self._owned_group = thread_communicator(self.comm, sync_group, exclusive=self.overlap)
        return sync
