"""What the data-parallel tests run *inside* pool ranks (module-level, so ranks can unpickle it).

Every rank of the pool calls these with the same arguments; the first N ranks train (a
prefix sub-group) and the others return None. Each case also gets a second prefix group
for DDP's communication thread; creating groups is collective, so every rank creates
both for every case, in the same order, before the non-members drop out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from impls.comm import Communicator
from impls.data_parallel import DDP, AllReduceDP, ParameterServerDP, ReplicaOptimizer, shard_batch
from impls.models import GPT, MLP, GPTConfig, MLPConfig
from tests.rank_support import prefix_communicator

BATCH = 24  # divisible by every world size tested: 1, 2, 3, 4, 8
MLP_CFG = MLPConfig(in_dim=8, hidden_dim=16, out_dim=4, n_layers=3)
GPT_CFG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2)

_SYNC_GROUPS: dict[int, dist.ProcessGroup] = {}


@dataclass(frozen=True)
class Case:
    """One data-parallel training run on N ranks."""

    variant: str  # "ps", "allreduce", "ddp" or "torch_ddp"
    world_size: int
    optimizer: str = "sgd"  # "sgd" or "adam"
    algorithm: str = "ring"
    bucket_cap_bytes: int = 300
    overlap: bool = True
    model: str = "mlp"  # "mlp" or "gpt"
    precision: str = "fp32"
    loss_scale: str | float | None = None
    overflow_step: int | None = None  # the last rank's input holds an inf at this step
    loss_weight: float = 1.0  # the loss is multiplied by it; SGD's lr is divided by it
    steps: int = 3

    @property
    def name(self) -> str:
        extra = ""
        if self.variant == "ddp":
            extra = f"-cap{self.bucket_cap_bytes}-{'overlap' if self.overlap else 'serial'}"
        if self.overflow_step is not None:
            extra += f"-inf@{self.overflow_step}"
        return (
            f"{self.variant}-N{self.world_size}-{self.model}-{self.optimizer}-{self.algorithm}"
            f"-{self.precision}{extra}"
        )

    def build_model(self) -> nn.Module:
        return GPT(GPT_CFG, seed=0) if self.model == "gpt" else MLP(MLP_CFG, seed=0)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = GPT.loss(outputs, targets) if self.model == "gpt" else MLP.loss(outputs, targets)
        return self.loss_weight * loss

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=1e-2)
        return torch.optim.SGD(params, lr=0.1 / self.loss_weight)

    def batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The global batch of every step, identical on every rank and in the reference."""
        g = torch.Generator().manual_seed(99)
        out = []
        for _ in range(self.steps):
            if self.model == "gpt":
                tokens = torch.randint(
                    0, GPT_CFG.vocab_size, (BATCH, GPT_CFG.seq_len + 1), generator=g
                )
                out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
            else:
                x = torch.randn(BATCH, MLP_CFG.in_dim, generator=g)
                out.append((x, torch.randn(BATCH, MLP_CFG.out_dim, generator=g)))
        return out

    def reference(self) -> tuple[list[float], dict[str, torch.Tensor]]:
        """One process, the whole batch, fp32: per-step losses and the final parameters.

        A step the case overflows on purpose is one the scaler skips: not applied here.
        """
        model = self.build_model()
        optimizer = self.make_optimizer(list(model.parameters()))
        losses = []
        for step, (x, y) in enumerate(self.batches()):
            loss = self.loss(model(x), y)
            losses.append(loss.item())
            loss.backward()
            if step != self.overflow_step:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def sync_group(k: int) -> dist.ProcessGroup:
    """A second group over ranks 0..k-1 for DDP's communication thread (all ranks call)."""
    if k not in _SYNC_GROUPS:
        _SYNC_GROUPS[k] = dist.new_group(list(range(k)))
    return _SYNC_GROUPS[k]


def run_cases(cases: list[Case]) -> list[dict | None]:
    """Train every case; per case, what this rank measured (None if it is not a member)."""
    return [_run(case) for case in cases]


def _run(case: Case) -> dict | None:
    comm = prefix_communicator(case.world_size)
    group = sync_group(case.world_size)
    if comm is None:
        return None
    if case.variant == "torch_ddp":
        return _run_torch_ddp(case, comm)
    dp = _build(case, comm, group)
    losses, stats = [], []
    try:
        for step, (x, y) in enumerate(case.batches()):
            x = shard_batch(x, comm.rank, comm.world_size)
            y = shard_batch(y, comm.rank, comm.world_size)
            if step == case.overflow_step and comm.rank == comm.world_size - 1:
                x = x.clone()
                x[0, 0] = math.inf
            s = dp.train_step(x, y, case.loss)
            losses.append(s.loss)
            stats.append(s)
    finally:
        if isinstance(dp, DDP):
            dp.close()
    return {
        "losses": losses,
        "stepped": [s.stepped for s in stats],
        "scales": [s.loss_scale for s in stats],
        "traffic": [s.traffic.as_dict() for s in stats],
        "timelines": [s.timeline for s in stats],
        "params": {n: p.detach().float().clone() for n, p in dp.module.named_parameters()},
        "numel": sum(p.numel() for p in dp.params),
        "buckets": dp.bucket_param_names() if isinstance(dp, DDP) else None,
        "bucket_numels": [b.buffer.numel() for b in dp.buckets] if isinstance(dp, DDP) else None,
    }


def _build(case: Case, comm: Communicator, group: dist.ProcessGroup):
    common = {"precision": case.precision, "loss_scale": case.loss_scale}
    model = case.build_model()
    if case.variant == "ps":
        return ParameterServerDP(model, comm, case.make_optimizer, **common)
    if case.variant == "allreduce":
        return AllReduceDP(model, comm, case.make_optimizer, algorithm=case.algorithm, **common)
    return DDP(
        model,
        comm,
        case.make_optimizer,
        bucket_cap_bytes=case.bucket_cap_bytes,
        algorithm=case.algorithm,
        overlap=case.overlap,
        sync_group=group if case.overlap else None,
        **common,
    )


def _run_torch_ddp(case: Case, comm: Communicator) -> dict:
    """torch.nn.parallel.DistributedDataParallel on the same model, data and ranks."""
    model = nn.parallel.DistributedDataParallel(case.build_model(), process_group=comm.group)
    optimizer = case.make_optimizer(list(model.parameters()))
    losses = []
    for x, y in case.batches():
        x = shard_batch(x, comm.rank, comm.world_size)
        y = shard_batch(y, comm.rank, comm.world_size)
        loss = case.loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "losses": losses,
        "params": {n: p.detach().clone() for n, p in model.module.named_parameters()},
    }


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps: a stand-in for an expensive early layer."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(SLOW_BACKWARD_S)
        return grad


SLOW_BACKWARD_S = 0.05


class SlowFirstLayerMLP(nn.Module):
    """An MLP whose backward spends SLOW_BACKWARD_S between its last layers and its first."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP(MLP_CFG, seed=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, *rest = self.mlp.layers
        x = _SlowBackward.apply(first(x))
        for layer in rest:
            x = layer(x)
        return x


def overlap_timelines(k: int) -> dict[bool, list] | None:
    """Two DDP steps of the slow-first-layer MLP with and without overlap: their timelines."""
    comm = prefix_communicator(k)
    group = sync_group(k)
    if comm is None:
        return None
    case = Case("ddp", k)
    out = {}
    for overlap in (True, False):
        sync = group if overlap else None
        with DDP(
            SlowFirstLayerMLP(),
            comm,
            case.make_optimizer,
            bucket_cap_bytes=case.bucket_cap_bytes,  # 5 buckets, the last layer's first
            overlap=overlap,
            sync_group=sync,
        ) as ddp:
            timelines = []
            for x, y in case.batches()[:2]:
                x, y = shard_batch(x, comm.rank, k), shard_batch(y, comm.rank, k)
                timelines.append(ddp.train_step(x, y, MLP.loss).timeline)
        out[overlap] = timelines
    return out


def overflow_agreement(k: int) -> list[bool] | None:
    """Only the last rank's gradient overflows; per scaler kind, did this rank step?"""
    comm = prefix_communicator(k)
    if comm is None:
        return None
    stepped = []
    for loss_scale in ("dynamic", 8.0):
        param = nn.Parameter(torch.ones(3, dtype=torch.float16))
        updater = ReplicaOptimizer([param], Case("ddp", k).make_optimizer, "fp16", loss_scale)
        value = math.inf if comm.rank == k - 1 else 1.0
        param.grad = torch.full((3,), value, dtype=torch.float16)
        stepped.append(updater.step(comm))
    return stepped


def bad_inputs() -> list[str]:
    """Each misuse on 2 ranks; the error text, or 'accepted' if it was not refused."""
    comm = prefix_communicator(2)
    group, wider = sync_group(2), sync_group(4)
    if comm is None:
        return []
    sgd = Case("ddp", 2).make_optimizer
    attempts = {
        "fp16 without scale": lambda: AllReduceDP(MLP(MLP_CFG), comm, sgd, precision="fp16"),
        "bad precision": lambda: DDP(MLP(MLP_CFG), comm, sgd, precision="fp64", sync_group=group),
        "bad algorithm": lambda: AllReduceDP(MLP(MLP_CFG), comm, sgd, algorithm="butterfly"),
        "zero cap": lambda: DDP(MLP(MLP_CFG), comm, sgd, bucket_cap_bytes=0, sync_group=group),
        "same group": lambda: DDP(MLP(MLP_CFG), comm, sgd, sync_group=comm.group),
        "wrong group size": lambda: DDP(MLP(MLP_CFG), comm, sgd, sync_group=wider),
        "indivisible batch": lambda: shard_batch(torch.zeros(5, 2), comm.rank, 2),
        "not an optimizer": lambda: AllReduceDP(MLP(MLP_CFG), comm, lambda params: None),
    }
    errors = []
    for name, attempt in attempts.items():
        try:
            attempt()
            errors.append(f"{name}: accepted")
        except (ValueError, TypeError) as err:
            errors.append(f"{name}: {err}")
    errors.append(_unused_parameter(comm, group, DDP))
    errors.append(_unused_parameter(comm, group, AllReduceDP))
    return errors


def _unused_parameter(comm: Communicator, group: dist.ProcessGroup, variant: type) -> str:
    """A parameter outside the loss never gets a gradient: refused at sync time."""
    model = MLP(MLP_CFG)
    model.spare = nn.Linear(2, 2)  # registered last: in DDP, it sits in the first bucket
    case = Case("ddp", 2)
    extra = {"sync_group": group} if variant is DDP else {}
    dp = variant(model, comm, case.make_optimizer, **extra)
    x, y = case.batches()[0]
    try:
        dp.train_step(shard_batch(x, comm.rank, 2), shard_batch(y, comm.rank, 2), MLP.loss)
    except RuntimeError as err:
        return f"unused parameter {variant.__name__}: {err}"
    finally:
        if variant is DDP:
            dp.close()
    return f"unused parameter {variant.__name__}: accepted"
