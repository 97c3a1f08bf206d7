"""What the 3D-step tests run inside pool ranks (module-level, so ranks can unpickle it).

Every rank builds the same meshes in the same order; ranks outside a smaller mesh only
join its group creation. Each rank also trains the single-device reference itself (the
model is tiny), so the comparison needs no gathering.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.hybrid import HybridTrainer, Mesh
from impls.models import GPT, GPTConfig
from impls.tensor_parallel import sharded_dims

VOCAB, SEQ, BATCH = 32, 8, 8


@dataclass(frozen=True)
class Case:
    """One hybrid run: mesh degrees, schedule, micro-batches, optimizer, steps."""

    dp: int
    pp: int
    tp: int
    schedule: str = "1f1b"
    microbatches: int = 2
    optimizer: str = "sgd"
    steps: int = 3
    n_layers: int = 2
    bias: bool = True
    tie: bool = False

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def config(self) -> GPTConfig:
        return GPTConfig(
            vocab_size=VOCAB,
            seq_len=SEQ,
            d_model=16,
            n_heads=2,
            n_layers=self.n_layers,
            bias=self.bias,
            tie_embeddings=self.tie,
        )

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        if self.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
        return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fresh (inputs, next-token targets) batch per step, the same on every rank."""
    g = torch.Generator().manual_seed(99)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


def reference(case: Case) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-device training on the full batch: losses before each update, final weights."""
    model = GPT(case.config(), seed=0)
    optimizer = case.make_optimizer(list(model.parameters()))
    losses = []
    for inputs, targets in batches(case.steps):
        optimizer.zero_grad()
        loss = GPT.loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def run_cases(cases: list[Case], tol: dict) -> list[str]:
    """Train every case on its mesh; return what disagreed with the reference on this rank."""
    errors = []
    for case in cases:
        mesh = Mesh(case.world, dp=case.dp, pp=case.pp, tp=case.tp)
        if mesh.rank is None:
            mesh.create_groups()
            mesh.close()
            continue
        trainer = HybridTrainer(
            GPT(case.config(), seed=0),
            mesh,
            case.make_optimizer,
            global_batch_size=BATCH,
            microbatches=case.microbatches,
            schedule=case.schedule,
        )
        results = [trainer.step(x, y) for x, y in batches(case.steps)]
        losses = [r.loss for r in results]
        want_losses, want_params = reference(case)
        where = f"{case} rank {mesh.rank} {mesh.coords()}"
        # One ring all-reduce of every gradient plus the loss: 2(n-1)/n of it sent per rank.
        dp = mesh.size("dp")
        flat_bytes = 4 * (sum(p.numel() for p in trainer.params) + 1)
        sent = results[-1].dp_traffic.bytes_sent
        if dp > 1 and sent != 2 * (dp - 1) * flat_bytes // dp:
            errors.append(f"{where}: dp all-reduce sent {sent} bytes of {flat_bytes}")
        got = torch.tensor(losses, dtype=torch.float64)
        errors += _mismatch(
            f"{where} losses", got, torch.tensor(want_losses, dtype=torch.float64), tol
        )
        dims = sharded_dims(trainer.model)
        tp, tp_rank = mesh.size("tp"), mesh.coords()["tp"]
        for name, param in trainer.named_parameters():
            want = want_params[name]
            if name in dims:
                want = want.chunk(tp, dim=dims[name])[tp_rank]
            errors += _mismatch(f"{where} {name}", param.detach(), want, tol)
        if not trainer.named_parameters():
            errors.append(f"{where}: the rank trains no parameters")
        mesh.close()
    return errors


def _mismatch(name: str, got: torch.Tensor, want: torch.Tensor, tol: dict) -> list[str]:
    try:
        torch.testing.assert_close(got, want, **tol)
    except AssertionError as err:
        return [f"{name}: {str(err).splitlines()[0]} {str(err).splitlines()[-1]}"]
    return []
