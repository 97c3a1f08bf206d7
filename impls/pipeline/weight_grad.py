"""The zero-bubble backward split: `I` computes input gradients, `W` only the weight GEMMs.

Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR), §2 and Fig. 1: a linear layer
y = x Wᵀ + b has two backward GEMMs, grad_x = grad_y W (needed by the previous stage,
so on the critical path) and grad_W = grad_yᵀ x (needed only by the optimizer step).
Their `B` pass runs the first and keeps (x, grad_y); their `W` pass runs only the second.
Together they cost one backward, where running `autograd.grad` twice walks the graph twice.

Here a stage's forward runs inside `DeferWeightGrads(slot)`, a `TorchFunctionMode` that
reroutes `torch.nn.functional.linear` (what `nn.Linear` calls) through
`_LinearDeferringWeight`, so models need no change. Its backward returns grad_x and the
bias gradient at once and, while the slot is `deferring`, appends (weight, x, grad_y) to
the slot instead of computing grad_W; `WeightGradSlot.run` later does the GEMMs and adds
them into `.grad`. Everything else (LayerNorm, embeddings, biases) gets its gradient in
the one backward, as the paper's reference implementation does. A linear the mode does
not reach computes its weight gradient at once: correct, only not deferred. That covers a
linear inside another custom Function, and activation recomputation: a reentrant
checkpoint recomputes in backward, outside the mode; inside a non-reentrant checkpoint the
mode stands aside, because the recomputation (in backward, without the mode) must save the
same tensors as the forward did, which torch checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = ["DeferWeightGrads", "WeightGradSlot"]


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
                # (n, out)ᵀ @ (n, in) -> (out, in), n = every leading dim flattened
                grad = grad_y.reshape(-1, grad_y.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
                if weight.grad is None:
                    weight.grad = grad
                else:
                    weight.grad.add_(grad)
        self.pending.clear()


class _LinearDeferringWeight(torch.autograd.Function):
    """y = x Wᵀ + b whose backward may leave grad_W to its slot."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, slot: WeightGradSlot):
        ctx.save_for_backward(x, weight)
        # The parameter itself, for `.grad`: saved-tensor hooks may unpack a plain alias.
        ctx.param, ctx.slot = weight, slot
        return F.linear(x, weight, bias)  # the mode is off inside its own handler

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = grad_y @ weight if need_x else None  # (..., out) @ (out, in) -> (..., in)
        grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0) if need_b else None
        grad_w = None
        if need_w and ctx.slot.deferring:
            ctx.slot.pending.append((ctx.param, x, grad_y))
        elif need_w:
            grad_w = grad_y.reshape(-1, grad_y.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_w, grad_b, None


class DeferWeightGrads(TorchFunctionMode):
    """Inside this mode, `F.linear` on a weight that needs a gradient records into `slot`."""

    def __init__(self, slot: WeightGradSlot) -> None:
        super().__init__()
        self.slot = slot

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and torch.is_grad_enabled() and not _in_checkpoint():
            x, weight, bias = _linear_args(*args, **kwargs)
            if isinstance(weight, nn.Parameter) and weight.requires_grad:
                return _LinearDeferringWeight.apply(x, weight, bias, self.slot)
        return func(*args, **kwargs)


def _in_checkpoint() -> bool:
    """Whether a non-reentrant `torch.utils.checkpoint` region is packing saved tensors."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    pack = getattr(hooks[0], "__qualname__", "") if hooks is not None else ""
    return pack.startswith("_checkpoint_hook.")


def _linear_args(input: Tensor, weight: Tensor, bias: Tensor | None = None):  # noqa: A002
    return input, weight, bias
