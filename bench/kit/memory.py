"""Memory accounting a rank does around a step: what it holds, and what a pass saves.

`held_bytes` reads the model states a rank holds off its tensors (parameters, their
gradients, the optimizer's state; a DTensor counts its local shard) — exact for those
tensors, blind to transient buffers. `ledger_over_pass` runs one forward and backward
under an `impls.memory.MemoryLedger`: the rank's parameters, each gradient as it is
accumulated, and the tensors autograd saves for backward, with the peak of their sum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from impls.memory import MemoryLedger

__all__ = ["held_bytes", "ledger_over_pass", "local", "tensor_bytes"]


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the tensors this rank holds (a DTensor's local shard; None counts 0)."""
    total = 0
    for t in tensors:
        if t is not None:
            mine = local(t)
            total += mine.numel() * mine.element_size()
    return total


def held_bytes(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Model states a rank holds: `params`, their gradients and the optimizer's state."""
    params = list(params)
    state = (v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    return {
        "params": tensor_bytes(params),
        "grads": tensor_bytes(p.grad for p in params),
        "optim": tensor_bytes(state),
    }


def ledger_over_pass(
    params: Iterable[torch.nn.Parameter],
    forward: Callable[[], torch.Tensor],
    backward: Callable[[torch.Tensor], Any],
) -> tuple[MemoryLedger, int]:
    """Run `backward(forward())` with the ledger counting this rank's parameters, each
    gradient as it is accumulated, and what autograd saves in the forward (parameters
    excluded). Gradients are cleared first, so they are counted as they arrive. Returns
    the ledger and the bytes saved for backward when the forward ended."""
    params = list(params)
    for p in params:
        p.grad = None
    ledger = MemoryLedger()
    for p in params:
        ledger.track("params", local(p))

    def count_grad(param: torch.Tensor) -> None:  # a grad hook must return None
        ledger.track("grads", local(param.grad))

    hooks = [p.register_post_accumulate_grad_hook(count_grad) for p in params]
    try:
        ledger.reset_peak()
        with ledger.saved_activations(exclude=[local(p) for p in params]):
            output = forward()
        saved = ledger.current["activations"]
        backward(output)
    finally:
        for hook in hooks:
            hook.remove()
    return ledger, saved
