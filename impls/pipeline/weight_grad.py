"""The zero-bubble backward split: `I` computes input gradients, `W` only the weight GEMMs.

Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR), §2 and Fig. 1: a linear layer
y = x Wᵀ + b has two backward GEMMs, grad_x = grad_y W (needed by the previous stage,
so on the critical path) and grad_W = grad_yᵀ x (needed only by the optimizer step).
Their `B` pass runs the first and keeps (x, grad_y); their `W` pass runs only the second.
Together they cost one backward, where running `autograd.grad` twice walks the graph twice.

Here `reroute_linears(module)` points every `nn.Linear` under a stage at
`_LinearDeferringWeight` once (an instance-level `forward`, so models need no change and
no other op pays for it), and `DeferWeightGrads(slot)` names the slot those linears
record into while it is active; outside it they are plain `F.linear`. Its backward
returns grad_x and the bias gradient at once and, while the slot is `deferring`, appends
(weight, x, grad_y) to the slot instead of computing grad_W; `WeightGradSlot.run` later
does the GEMMs and adds them into `.grad`. Everything else (LayerNorm, embeddings,
biases) gets its gradient in the one backward, as the paper's reference implementation
does. Activation recomputation keeps the deferral: a checkpoint's forward and its
recomputation in backward (inside `DeferWeightGrads` during `I`) take the same rerouted
path, so they save the same tensors. (A first version used a `TorchFunctionMode`, which
sent every op of the forward through Python: on this host's small kernels it cost F
~20% and made I + W ~1.3 B against autograd's own backward.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DeferWeightGrads", "WeightGradSlot", "reroute_linears"]


@dataclass
class WeightGradSlot:
    """The deferred weight GEMMs of one (stage, micro-batch): (weight, x, grad_y) each.

    `deferring` is read when a linear's backward runs: True during `I` (store the GEMM),
    False during a fused `B` (compute it at once).
    """

    deferring: bool = False
    pending: list[tuple[nn.Parameter, Tensor, Tensor]] = field(default_factory=list)

    def nbytes(self, excluded: set[int] = frozenset()) -> int:
        """Bytes of the storages the stored x and grad_y tensors hold, each storage once."""
        seen: dict[int, int] = {}
        for _, x, grad_y in self.pending:
            for t in (x, grad_y):
                storage = t.untyped_storage()
                if storage.data_ptr() not in excluded:
                    seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def run(self) -> None:
        """Compute every stored grad_W = grad_yᵀ x, add it into `.grad`, empty the slot."""
        with torch.no_grad():
            for weight, x, grad_y in self.pending:
                # (n, out)ᵀ @ (n, in) -> (out, in), n = every leading dim flattened; added
                # into an existing .grad by the GEMM itself (addmm_), not by a second pass
                if weight.grad is None:
                    weight.grad = torch.mm(grad_y.t(), x)
                else:
                    weight.grad.addmm_(grad_y.t(), x)
        self.pending.clear()


class _LinearDeferringWeight(torch.autograd.Function):
    """y = x Wᵀ + b whose backward may leave grad_W to its slot."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, slot: WeightGradSlot):
        ctx.save_for_backward(x, weight)
        # The parameter itself, for `.grad`: saved-tensor hooks may unpack a plain alias.
        ctx.param, ctx.slot = weight, slot
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = grad_y @ weight if need_x else None  # (..., out) @ (out, in) -> (..., in)
        grad_y2 = grad_y.reshape(-1, grad_y.shape[-1])  # (n, out), n = leading dims
        grad_b = grad_y2.sum(0) if need_b else None
        grad_w = None
        if need_w and ctx.slot.deferring:  # flattened now: W runs one mm per linear
            ctx.slot.pending.append((ctx.param, x.reshape(-1, x.shape[-1]), grad_y2))
        elif need_w:
            grad_w = grad_y2.t() @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_w, grad_b, None


_ACTIVE: list[WeightGradSlot] = []  # the slot of the innermost DeferWeightGrads


class DeferWeightGrads:
    """While active, rerouted linears (`reroute_linears`) record into `slot`."""

    def __init__(self, slot: WeightGradSlot) -> None:
        self.slot = slot

    def __enter__(self) -> WeightGradSlot:
        _ACTIVE.append(self.slot)
        return self.slot

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.pop()


def reroute_linears(module: nn.Module) -> int:
    """Point every `nn.Linear` under `module` (not a subclass with its own forward) at the
    deferring path; idempotent. Returns how many linears are rerouted."""
    count = 0
    for sub in module.modules():
        if isinstance(sub, nn.Linear) and type(sub).forward is nn.Linear.forward:
            if "forward" not in sub.__dict__:
                sub.forward = partial(_linear_forward, sub)
            count += 1
    return count


def _linear_forward(linear: nn.Linear, x: Tensor) -> Tensor:
    weight = linear.weight
    if _ACTIVE and torch.is_grad_enabled() and weight.requires_grad:
        return _LinearDeferringWeight.apply(x, weight, linear.bias, _ACTIVE[-1])
    return F.linear(x, weight, linear.bias)
