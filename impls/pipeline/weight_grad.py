"""The zero-bubble backward split: `I` computes input gradients, `W` only the weight GEMMs.

Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR), §2 and Fig. 1: a linear layer
y = x Wᵀ + b has two backward GEMMs, grad_x = grad_y W (needed by the previous stage,
so on the critical path) and grad_W = grad_yᵀ x (needed only by the optimizer step).
Their `B` pass runs the first and keeps (x, grad_y); their `W` pass runs only the second.
Together they cost one backward, where running `autograd.grad` twice walks the graph twice.

`reroute_linears` and `DeferWeightGrads` make a stage's linears record their deferred
GEMMs (the two paths are described there); `WeightGradSlot.run` is the `W` action.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge

__all__ = ["DeferWeightGrads", "WeightGradSlot", "reroute_linears"]


@dataclass
class WeightGradSlot:
    """The deferred weight GEMMs of one (stage, micro-batch): (weight, x, grad_y) each.

    `captured` holds, from the forward to `I`, the captured-path linears' (weight, x,
    y.grad_fn, y.output_nr); `pending` holds, from `I` to `W`, every GEMM to run.
    `deferring` is read when a backward runs: True during `I` (store the GEMM), False
    during a fused `B` (compute it at once).
    """

    deferring: bool = False
    pending: list[tuple[nn.Parameter, Tensor, Tensor]] = field(default_factory=list)
    captured: list[tuple[nn.Parameter, Tensor, object, int]] = field(default_factory=list)

    def nbytes(self, excluded: set[int] = frozenset()) -> int:
        """Bytes of the storages the stored x and grad_y tensors hold, each storage once."""
        seen: dict[int, int] = {}
        for _, x, grad_y in self.pending:
            for t in (x, grad_y):
                storage = t.untyped_storage()
                if storage.data_ptr() not in excluded:
                    seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def backward(
        self,
        output: Tensor,
        grad_output: Tensor | None = None,
        *,
        params: list[nn.Parameter],
        stage_input: Tensor | None = None,
    ) -> Tensor | None:
        """The stage's backward from `output` (`grad_output`: its gradient; None for a
        scalar loss); returns `stage_input`'s gradient (None if it needs none).

        Fused (`deferring` False): autograd's own backward, every gradient into `.grad`.
        `I` (`deferring` True): every gradient but the linear layers' weight GEMMs, which
        go to `pending` for `run`. `params` are the stage's parameters.
        """
        captured, self.captured = self.captured, []
        wants_input = stage_input is not None and stage_input.requires_grad
        try:
            with DeferWeightGrads(self):  # a recomputed forward defers as the first did
                if not (self.deferring and captured):
                    torch.autograd.backward(output, grad_output)
                    return stage_input.grad if wants_input else None
                deferred = {id(weight) for weight, *_ in captured}
                rest = [p for p in params if p.requires_grad and id(p) not in deferred]
                firsts = [stage_input] if wants_input else []
                edges = [GradientEdge(node, nr) for _, _, node, nr in captured]
                grads = torch.autograd.grad(
                    output, [*firsts, *rest, *edges], grad_output, allow_unused=True
                )
        finally:  # what a recomputation captured in backward is not a forward of this slot
            self.captured = []
        rest_grads, y_grads = (
            grads[len(firsts) : len(firsts) + len(rest)],
            grads[len(firsts) + len(rest) :],
        )
        with torch.no_grad():
            for p, g in zip(rest, rest_grads, strict=True):
                if g is None:
                    continue
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
        for (weight, x, _, _), grad_y in zip(captured, y_grads, strict=True):
            if grad_y is not None:  # flattened now: W runs one mm per linear
                self.pending.append(
                    (weight, x.reshape(-1, x.shape[-1]), grad_y.reshape(-1, grad_y.shape[-1]))
                )
        return grads[0] if wants_input else None

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


def reroute_linears(*modules: nn.Module) -> int:
    """Point every `nn.Linear` under `modules` (not a subclass with its own forward) at a
    deferring path; idempotent. Give every module of a rank at once, so that a weight two
    of them share is seen as shared. Returns how many linears are rerouted.

    The path is an instance-level `forward` (models need no change, no other op pays for
    it); `DeferWeightGrads(slot)` names the slot those linears record into while it is
    active, and outside it they are plain `F.linear`. Two paths, one result:

    - **Captured** (the usual one). The forward stays autograd's own `F.linear`; the linear
      only notes (weight, x, where y's gradient arrives) in `slot.captured`. `slot.backward`
      in `I` asks autograd for the gradients of the stage input, of every other parameter and
      of each noted y (`torch.autograd.grad` with `GradientEdge` inputs), so the engine's own
      addmm backward skips grad_W, which no requested input needs; the y gradients become
      the (x, grad_y) pairs of `W`. Nothing extra is kept alive: x is saved by autograd anyway,
      and an edge holds the graph node, not y.
    - **Through a Function** (`_LinearDeferringWeight`), for linears under a block with
      `recompute="full"` (a checkpoint recomputes them in backward, and a reference to their
      forward's x would keep what the checkpoint frees) and for a weight shared with another
      module (its gradient has other parts, so it cannot be left out of `I`). Its backward
      returns grad_x and the bias gradient and, while the slot is `deferring`, appends
      (weight, x, grad_y) instead of computing grad_W.

    `WeightGradSlot.run` (the `W` action) does the GEMMs and adds them into `.grad`. Everything
    else (LayerNorm, embeddings, biases) gets its gradient in `I`, as the paper's reference
    implementation does.
    """
    uses = Counter(id(p) for m in modules for _, p in m.named_parameters(remove_duplicate=False))
    count = 0
    for module in modules:
        for sub, recomputed in _walk(module, False):
            if not (isinstance(sub, nn.Linear) and type(sub).forward is nn.Linear.forward):
                continue
            if "forward" not in sub.__dict__:
                through_function = recomputed or uses[id(sub.weight)] > 1
                path = _function_forward if through_function else _capturing_forward
                sub.forward = partial(path, sub)
            count += 1
    return count


def _walk(module: nn.Module, recomputed: bool):
    """(module, whether a block above it, or it, recomputes its forward in backward)."""
    recomputed = recomputed or getattr(module, "recompute", None) == "full"
    yield module, recomputed
    for child in module.children():
        yield from _walk(child, recomputed)


def _capturing_forward(linear: nn.Linear, x: Tensor) -> Tensor:
    y = F.linear(x, linear.weight, linear.bias)
    if _ACTIVE and y.grad_fn is not None and linear.weight.requires_grad:
        _ACTIVE[-1].captured.append((linear.weight, x, y.grad_fn, y.output_nr))
    return y


def _function_forward(linear: nn.Linear, x: Tensor) -> Tensor:
    weight = linear.weight
    if _ACTIVE and torch.is_grad_enabled() and weight.requires_grad:
        return _LinearDeferringWeight.apply(x, weight, linear.bias, _ACTIVE[-1])
    return F.linear(x, weight, linear.bias)
