"""What the ZeRO tests run *inside* pool ranks (module-level, so ranks can unpickle it).

Every rank of the pool calls these with the same arguments; for each case the first N
ranks form the data-parallel group (a prefix sub-group) and the others skip it. The same
module builds the single-process references the test process compares against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from impls.models import GPT, MLP, GPTConfig, MLPConfig
from impls.zero import ZeroDataParallel
from tests.rank_support import _GROUPS, prefix_communicator

PER_RANK_BATCH = 2
SEQ_LEN = 6
LR = 1e-2


@dataclass(frozen=True)
class Case:
    """One training run: model, ZeRO stage, N ranks, precision, optimizer, steps."""

    model: str  # "gpt" | "mlp"
    stage: int
    world: int
    precision: str = "fp32"
    optimizer: str = "adam"
    steps: int = 3
    loss_scale: str | float | None = None  # fp16 needs "dynamic" or a number
    overflow_at: int | None = None  # step whose gradient rank 0 poisons with an inf

    @property
    def weight_decay(self) -> float:
        return 0.1 if self.optimizer == "adamw" else 0.01

    def __str__(self) -> str:
        extra = f"-overflow{self.overflow_at}" if self.overflow_at is not None else ""
        return (
            f"{self.model}-zero{self.stage}-N{self.world}-{self.precision}-{self.optimizer}{extra}"
        )


def build_model(kind: str) -> nn.Module:
    """Small models whose unit sizes divide by few of 1..8 (padding is exercised):
    GPT units 650 (root) and 1220 (block) parameters, MLP layers 42, 56 and 24.

    The GPT has no biases: a key projection's bias cannot change the softmax, so its exact
    gradient is zero and its float gradient is rounding noise, which Adam normalises to
    updates of ±lr that differ with any change in summation order (measured: 1e-2 apart).
    """
    if kind == "gpt":
        cfg = GPTConfig(
            vocab_size=29, seq_len=SEQ_LEN, d_model=10, n_heads=2, n_layers=2, bias=False
        )
        return GPT(cfg, seed=0)
    return MLP(MLPConfig(in_dim=5, hidden_dim=7, out_dim=3, n_layers=3), seed=0)


def batch(kind: str, world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch of `step` (PER_RANK_BATCH rows per rank), the same on every rank."""
    g = torch.Generator().manual_seed(100 + step)
    rows = PER_RANK_BATCH * world
    if kind == "gpt":
        tokens = torch.randint(0, 29, (rows, SEQ_LEN + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return torch.randn(rows, 5, generator=g), torch.randn(rows, 3, generator=g)


def loss_of(kind: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss_fn = GPT.loss if kind == "gpt" else MLP.loss
    return loss_fn(output.float(), target)


def reference(case: Case) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, whole batch, torch.optim.Adam/AdamW in fp32: losses and parameters."""
    model = build_model(case.model)
    opt_class = torch.optim.AdamW if case.optimizer == "adamw" else torch.optim.Adam
    opt = opt_class(model.parameters(), lr=LR, weight_decay=case.weight_decay)
    losses = []
    for step in range(case.steps):
        inputs, targets = batch(case.model, case.world, step)
        loss = loss_of(case.model, model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        if step != case.overflow_at:
            opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def run_zero(case: Case, comm) -> dict:
    """Train `case` on this rank; return what it measured (losses are this rank's own)."""
    model = build_model(case.model)
    zdp = ZeroDataParallel(
        model,
        comm,
        stage=case.stage,
        optimizer=case.optimizer,
        lr=LR,
        weight_decay=case.weight_decay,
        precision=case.precision,
        loss_scale=case.loss_scale,
    )
    poison = {"on": False}
    if case.overflow_at is not None and comm.rank == 0:
        # The last element of the last Linear's weight: after the reduction only the rank
        # owning that element's shard sees the inf (every rank under stage 0).
        last = model.blocks[-1].mlp.fc2 if case.model == "gpt" else model.layers[-1].linear
        last.weight.register_hook(lambda g: _poisoned(g) if poison["on"] else g)
    lo, hi = comm.rank * PER_RANK_BATCH, (comm.rank + 1) * PER_RANK_BATCH
    losses, reports, snapshots = [], [], []
    for step in range(case.steps):
        inputs, targets = batch(case.model, case.world, step)
        poison["on"] = step == case.overflow_at
        loss = loss_of(case.model, zdp(inputs[lo:hi]), targets[lo:hi])
        zdp.backward(loss)
        reports.append(zdp.step())
        zdp.zero_grad()
        losses.append(loss.item())
        if case.overflow_at is not None or step == case.steps - 1:
            snapshots.append(zdp.full_parameters())
    return {
        "losses": losses,
        "params": snapshots[-1],
        "param_history": snapshots,  # after every step when testing an overflow
        "reports": reports,
        "units": [(u.name, u.numel, u.padded) for u in zdp.units],
        "numel": zdp.numel,
        "bytes_per_param": zdp.bytes_per_param(),
    }


def _poisoned(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.clone()
    grad.view(-1)[-1] = float("inf")
    return grad


def run_cases(cases: list[Case]) -> list[dict | None]:
    """Every case in order; ranks outside a case's group return None for it."""
    out = []
    for case in cases:
        comm = prefix_communicator(case.world)
        out.append(run_zero(case, comm) if comm is not None else None)
    return out


def run_torch_baselines(world: int, steps: int) -> dict | None:
    """torch's own: DDP + ZeroRedundancyOptimizer(Adam) and FSDP2 `fully_shard` (per block,
    then the root), on the GPT of `build_model` with the same batches; parameters after
    `steps` steps. Torch collectives are allowed here: they are the references."""
    from torch.distributed._tensor import DTensor
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    comm = prefix_communicator(world)
    if comm is None:
        return None
    group = _GROUPS[world]
    lo, hi = comm.rank * PER_RANK_BATCH, (comm.rank + 1) * PER_RANK_BATCH

    def train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        for step in range(steps):
            inputs, targets = batch("gpt", world, step)
            loss = loss_of("gpt", model(inputs[lo:hi]), targets[lo:hi])
            opt.zero_grad()
            loss.backward()
            opt.step()

    ddp = DistributedDataParallel(build_model("gpt"), process_group=group)
    zero = ZeroRedundancyOptimizer(
        ddp.parameters(),
        optimizer_class=torch.optim.Adam,
        process_group=group,
        lr=LR,
        weight_decay=0.01,
    )
    train(ddp, zero)
    zero_params = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}

    model = build_model("gpt")
    mesh = DeviceMesh.from_group(group, "cpu")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(model, torch.optim.Adam(model.parameters(), lr=LR, weight_decay=0.01))
    fsdp_params = {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
    }
    dist.barrier(group)
    return {"zero_redundancy": zero_params, "fsdp2": fsdp_params}


def bad_inputs() -> list[str] | None:
    """Misconfigurations, each refused at construction; one error string per attempt."""
    comm = prefix_communicator(1)
    if comm is None:
        return None
    attempts = {
        "stage": {"stage": 4},
        "optimizer": {"optimizer": "sgd"},
        "precision": {"precision": "fp8"},
        "fp16 unscaled": {"precision": "fp16"},
        "nested units": {"units": "nested"},
    }
    errors = []
    for name, kwargs in attempts.items():
        model = build_model("gpt")
        if kwargs.get("units") == "nested":
            kwargs = {"units": [model.blocks[0], model.blocks[0].attn]}
        try:
            ZeroDataParallel(model, comm, **kwargs)
            errors.append(f"{name}: accepted")
        except ValueError as err:
            errors.append(f"{name}: {err}")
    return errors
