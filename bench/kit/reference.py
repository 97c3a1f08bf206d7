"""The single-process reference every distributed run is checked against.

`train_reference` trains the same seeded model on the whole batch in one process;
`compare` measures how far a distributed run ended from it. The headline number is the
relative error of the update, ‖θ − θ_ref‖ / ‖θ_ref − θ_0‖ over every parameter at once:
how far training ended from where the reference went, relative to how far the reference
moved. Absolute differences alone mislead under Adam, whose normalised first steps turn
the rounding of near-zero gradient elements into sizeable steps, and in bf16/fp16, where
a weight near 1 does not move at all for a small update; taken over the whole model each
parameter counts for what it weighs. Adam's step is also blind to a gradient's scale, so
`grad_error` = ‖g − g_ref‖ / ‖g_ref‖ of the last step's gradients catches what it would
miss (a sum over replicas where a mean was due).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from bench.kit.workloads import lm_loss

__all__ = ["Reference", "compare", "parameters", "train_reference"]


def parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (a DTensor gathered) and detached, as an fp32 copy."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = full.detach().float().clone()
    return out


@dataclass
class Reference:
    """A single-process run: its losses, parameters before and after, last gradients."""

    losses: list[float]
    start: dict[str, torch.Tensor]
    end: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]


def train_reference(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    steps: int,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss,
) -> Reference:
    """`steps` steps of `optimizer` on the whole batch, one process."""
    start = parameters(model)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        value = loss(model(inputs), targets)
        value.backward()
        optimizer.step()
        losses.append(value.item())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return Reference(losses, start, parameters(model), grads)


def compare(
    params: Mapping[str, torch.Tensor],
    reference: Reference,
    *,
    grads: Mapping[str, torch.Tensor] | None = None,
    part: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """`max_param_diff`, `update_error` (and `grad_error` when `grads` are given) of
    `params` against `reference`. `part(name, tensor)` maps a whole reference tensor to
    the part this rank holds (a tensor-parallel shard); by default the whole."""
    pick = part or (lambda _name, tensor: tensor)
    diff, off, moved, grad_off, grad_norm = 0.0, 0.0, 0.0, 0.0, 0.0
    for name, got in params.items():
        end = pick(name, reference.end[name])
        start = pick(name, reference.start[name])
        got = got.detach().float()
        diff = max(diff, float((got - end).abs().max()))
        off += float((got - end).square().sum())
        moved += float((end - start).square().sum())
        if grads is not None:
            want = pick(name, reference.grads[name])
            grad_off += float((grads[name] - want).square().sum())
            grad_norm += float(want.square().sum())
    out = {"max_param_diff": diff, "update_error": _relative(off, moved)}
    if grads is not None:
        out["grad_error"] = _relative(grad_off, grad_norm)
    return out


def _relative(off: float, norm: float) -> float:
    return math.sqrt(off / norm) if norm else math.inf
