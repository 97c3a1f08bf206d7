"""What ZeRO-2 and ZeRO-3 do *during* forward and backward, unit by unit.

ZeRO-2 (Rajbhandari et al., 2020, §5.2): as soon as backward has produced every gradient of
a unit, they are copied into one transient bucket (counted as `buffers`), reduce-scattered,
and only this rank's averaged shard is kept; the full gradient never exists for the whole
model at once. ZeRO-3 / FSDP (§5.3; Zhao et al., 2023) also keeps only a shard of each
unit's parameters: the unit is all-gathered before its forward and freed right after,
all-gathered again before its backward and freed once its gradients are reduced.
How freeing really frees: `UnitState`; the hooks that drive it: `UnitHooks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from impls.collectives import all_gather, reduce_scatter
from impls.comm import Communicator
from impls.memory import MemoryLedger
from impls.zero.flat import FlatUnit, ParamSlot

__all__ = ["UnitHooks", "UnitState"]


@dataclass(eq=False)
class UnitState:
    """One unit's buffers on this rank.

    `full`: the unit's padded parameters (the model's parameters are views of it; ZeRO-3
    frees its storage between uses). `shard`: this rank's parameter shard (a view of `full`,
    or for ZeRO-3 a view of the persistent shard buffer). `grad`: the gradient this rank
    keeps (full for stages 0/1, its averaged shard for 2/3). `master`: the fp32 segment
    the optimizer updates.

    Freeing must really free: autograd holds on to the weights it saved for backward, so
    dropping Python references would free nothing. The unit's parameters are views of one
    full buffer whose *storage* is resized to zero between uses and re-allocated before the
    next use (as FSDP1 does); the parameters and the tensors autograd saved see the data again
    once it is re-gathered. Their version counters are their own (`param.data = view`), so the
    gather's in-place writes do not trip autograd's saved-tensor checks.
    """

    unit: FlatUnit
    full: torch.Tensor
    shard: torch.Tensor
    grad: torch.Tensor
    master: torch.Tensor
    bucket: torch.Tensor | None = None  # full gradients of this unit, during backward only
    pending: int = 0  # parameters whose gradient has not arrived in this backward
    gathered: bool = True


class UnitHooks:
    """Backward-time gradient reduce-scatter (stages 2, 3) and parameter gathering (3).

    Hooks: forward pre/post hooks on the unit's module; the pre-backward gather is a
    `register_multi_grad_hook` on the unit's forward outputs (it fires when the first of their
    gradients arrives, i.e. just before the unit's backward); the post-backward is each
    parameter's `register_post_accumulate_grad_hook`, counting down the unit's parameters.
    """

    def __init__(
        self,
        states: list[UnitState],
        comm: Communicator,
        ledger: MemoryLedger,
        *,
        shard_params: bool,
    ) -> None:
        self.states, self.comm, self.ledger = states, comm, ledger
        self.shard_params = shard_params
        self._slot_of: dict[nn.Parameter, tuple[UnitState, ParamSlot]] = {}
        for state in states:
            state.pending = len(state.unit.slots)
            for slot in state.unit.slots:
                self._slot_of[slot.param] = (state, slot)
                slot.param.register_post_accumulate_grad_hook(self._on_grad)
            if shard_params:
                state.unit.module.register_forward_pre_hook(self._pre_forward_hook(state))
                state.unit.module.register_forward_hook(self._post_forward_hook(state))

    def gather(self, state: UnitState) -> None:
        """Re-allocate the unit's full buffer and all-gather every rank's shard into it."""
        if state.gathered:
            return
        full = state.full
        full.untyped_storage().resize_(full.numel() * full.element_size())
        self.ledger.track("gathered", full)
        with torch.no_grad():
            all_gather(full, state.shard, self.comm)
        state.gathered = True

    def release(self, state: UnitState) -> None:
        """Free the unit's full parameters (views and saved tensors keep the storage object)."""
        if not state.gathered:
            return
        self.ledger.untrack(state.full)
        state.full.untyped_storage().resize_(0)
        state.gathered = False

    def flush(self) -> None:
        """Reduce the units whose backward did not complete (a parameter got no gradient:
        it reads as zero) and free any unit still gathered. Every rank runs the same model,
        so all of them flush the same units."""
        for state in self.states:
            if state.bucket is not None:
                self._reduce(state)
            if self.shard_params:
                self.release(state)

    def _pre_forward_hook(self, state: UnitState):
        def hook(module: nn.Module, args: tuple) -> None:
            self.gather(state)

        return hook

    def _post_forward_hook(self, state: UnitState):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            self.release(state)
            needing_grad = [t for t in _tensors(output) if t.requires_grad]
            if needing_grad and torch.is_grad_enabled():
                torch.autograd.graph.register_multi_grad_hook(
                    needing_grad, lambda grads: self.gather(state), mode="any"
                )

        return hook

    @torch.no_grad()
    def _on_grad(self, param: nn.Parameter) -> None:
        state, slot = self._slot_of[param]
        if state.bucket is None:
            bucket = torch.zeros(state.unit.padded, dtype=param.dtype, device=param.device)
            state.bucket = self.ledger.track("buffers", bucket)
        state.bucket[slot.offset : slot.offset + slot.numel].copy_(param.grad.reshape(-1))
        param.grad = None
        state.pending -= 1
        if state.pending == 0:
            self._reduce(state)

    @torch.no_grad()
    def _reduce(self, state: UnitState) -> None:
        """Average the bucket over ranks into this rank's block (in place), keep that block."""
        bucket = state.bucket
        lo, hi = state.unit.shard_range(self.comm.rank)
        reduce_scatter(bucket[lo:hi], bucket, self.comm, op="avg")
        state.grad.add_(bucket[lo:hi])
        self.ledger.untrack(bucket)
        state.bucket = None
        state.pending = len(state.unit.slots)
        if self.shard_params:
            self.release(state)


def _tensors(output: object) -> Iterator[torch.Tensor]:
    """The tensors of a module output (a tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, tuple | list):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)
