"""DP 1.0: the parameter server (Li et al., OSDI 2014, "Scaling Distributed Machine
Learning with the Parameter Server"; the lecture's first data-parallel design).

Rank 0 is the server and also a worker; its step and its O(N) traffic: `ParameterServerDP`.
"""

from __future__ import annotations

import torch
from torch import nn

from impls.collectives import gather
from impls.comm import Communicator
from impls.data_parallel.common import (
    DataParallelBase,
    OptimizerFactory,
    ReplicaOptimizer,
    SyncTimeline,
    unflatten_into,
)

__all__ = ["ParameterServerDP"]

SERVER = 0
_WEIGHTS_TAG, _CONTROL_TAG = 0, 1


class ParameterServerDP(DataParallelBase):
    """Data parallelism through a parameter server on rank 0 of `comm` (DP 1.0).

    Rank 0 is the server: it alone holds the optimizer (and, in fp16/bf16, the fp32 master
    weights and the loss scaler). Every step:

    1. every rank computes gradients on its shard;
    2. Push & Sum: each worker sends its gradients to the server in one round (`gather`),
       and the server sums them;
    3. the server steps its optimizer;
    4. Replicate & Pull: the server sends the new weights to every worker in one round.

    The server is colocated with a worker: it also computes on a shard, as in the lecture's
    parameter-server all-reduce (`impls.collectives.central`), so N ranks split the batch N
    ways exactly like DP 1.1 and DDP, and the variants are compared on the same data. Per
    step and M gradient bytes, a worker sends M and receives M (O(1)); the server receives
    (N−1)·M and sends (N−1)·M (O(N)): the bottleneck the lecture points out. Under loss
    scaling, the pull also carries a 2-element message per worker (the loss scale for the
    next step and whether this one was applied), since only the server runs the scaler.
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Communicator,
        optimizer: OptimizerFactory,
        *,
        precision: str = "fp32",
        loss_scale: str | float | None = None,
    ) -> None:
        super().__init__(module, comm, precision, loss_scale)
        self.is_server = comm.rank == SERVER
        self.updater = (
            ReplicaOptimizer(self.params, optimizer, precision, loss_scale)
            if self.is_server
            else None
        )
        self._scaled = loss_scale not in (None, "none")
        numel = sum(p.numel() for p in self.params)
        # Server: one slot per rank for the pushed gradients; worker: the pulled weights.
        if self.is_server:
            self._pushed = torch.empty(comm.world_size, numel, dtype=self.dtype)
        else:
            self._pulled = torch.empty(numel, dtype=self.dtype)
        self._control = torch.zeros(2, dtype=torch.float64)  # (loss scale, step applied)
        self._worker_scale: float | None = None
        self._replicate(stepped=True)  # every worker starts from the server's weights

    @property
    def loss_scale(self) -> float | None:
        return self.updater.loss_scale if self.updater else self._worker_scale

    def synchronize_and_step(self) -> tuple[bool, SyncTimeline | None]:
        grads = self.local_grads()
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat.div_(self.comm.world_size)
        if not self.is_server:
            gather(flat, self.comm, dst=SERVER)  # Push
            for p in self.params:
                p.grad = None
            return self._replicate(stepped=True), None  # Pull
        gather(flat, self.comm, gather_list=list(self._pushed), dst=SERVER)
        unflatten_into(grads, self._pushed.sum(dim=0))  # Sum
        stepped = self.updater.step(comm=None)  # only the server decides
        return self._replicate(stepped), None

    def _replicate(self, stepped: bool) -> bool:
        """Replicate & Pull: the server's weights to every worker in one round.

        Returns whether the step was applied (workers learn it from the server).
        """
        comm = self.comm
        if self.is_server:
            weights = torch.cat([p.detach().reshape(-1) for p in self.params])
            if self._scaled:
                self._control.copy_(torch.tensor([self.updater.loss_scale, float(stepped)]))
            with comm.round() as rnd:
                for worker in range(comm.world_size):
                    if worker == SERVER:
                        continue
                    rnd.send(weights, worker, tag=_WEIGHTS_TAG)
                    if self._scaled:
                        rnd.send(self._control, worker, tag=_CONTROL_TAG)
            return stepped
        with comm.round() as rnd:
            rnd.recv(self._pulled, SERVER, tag=_WEIGHTS_TAG)
            if self._scaled:
                rnd.recv(self._control, SERVER, tag=_CONTROL_TAG)
        with torch.no_grad():
            unflatten_into([p.data for p in self.params], self._pulled)
        if not self._scaled:
            return True
        self._worker_scale = self._control[0].item()
        return bool(self._control[1].item())
