"""`ZeroDataParallel`: data parallelism with ZeRO stage 0 (plain DP) to 3 (FSDP).

Per rank, with Ψ parameters (padded per unit to a multiple of N) and bytes per parameter
P (weights), G (gradients), O (optimizer state: fp32 m + v, plus the fp32 master copy under
mixed precision), the model states this rank holds and what it sends per step
(Rajbhandari et al., 2020, §5 and §7):

| stage | params | grads | optim | per step                                        |
|-------|--------|-------|-------|-------------------------------------------------|
| 0     | PΨ     | GΨ    | OΨ    | all-reduce grads: 2Ψ(N−1)/N                     |
| 1     | PΨ     | GΨ    | OΨ/N  | reduce-scatter grads + all-gather params: 2Ψ(N−1)/N |
| 2     | PΨ     | GΨ/N  | OΨ/N  | same, reduce-scatter per unit during backward   |
| 3     | PΨ/N   | GΨ/N  | OΨ/N  | all-gather fwd + all-gather bwd + reduce-scatter: 3Ψ(N−1)/N |

(P, G, O) = (4, 4, 8) in fp32 and (2, 2, 12) in fp16/bf16, the paper's K = 12."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from impls.collectives import all_gather, all_reduce, reduce_scatter
from impls.comm import Communicator, TrafficCounters
from impls.memory import MemoryLedger
from impls.precision import compute_dtype, make_loss_scaler
from impls.zero.adam import FlatAdam
from impls.zero.flat import FlatUnit, plan_units
from impls.zero.units import UnitHooks, UnitState

__all__ = ["STAGES", "StepReport", "ZeroDataParallel"]

STAGES = (0, 1, 2, 3)


@dataclass
class StepReport:
    """What one `step()` did on this rank."""

    stepped: bool  # False when the agreed loss-scaler check found an overflow
    traffic: TrafficCounters  # this rank's traffic from the step's first forward to its end
    memory: dict  # `MemoryLedger.snapshot()` at the end of the step (peaks over the step)
    loss_scale: float | None  # the scale for the next step (None without a scaler)


class ZeroDataParallel:
    """Train `module` data-parallel over `comm` with ZeRO stage `stage`.

    Usage, identical for every stage::

        zdp = ZeroDataParallel(model, comm, stage=3, optimizer="adamw", lr=1e-3)
        loss = loss_fn(zdp(inputs).float(), targets)   # inputs: this rank's part of the batch
        zdp.backward(loss)                              # scales the loss under fp16
        report = zdp.step()                             # reduce, update, gather
        zdp.zero_grad()

    Every rank must build `module` with identical weights. The module is changed in place
    and belongs to the wrapper from then on (hooks, parameter storage). Its parameters become
    views of flat buffers in the compute dtype of `precision`; under stage 3 their storage
    is freed outside their unit's forward and backward, so read them with
    `full_parameters()`. `units` are the submodules that form ZeRO-3 units and ZeRO-2
    buckets (default: every element of a top-level ModuleList/Sequential, plus one unit
    for the remaining parameters). Floating-point inputs are cast to the compute dtype.

    Parameters are flattened per unit (`flat.py`) into buffers padded to a multiple of the world
    size; rank r owns block r of every unit. `FlatAdam` (`adam.py`) is Adam/AdamW on those fp32
    blocks. Under fp16/bf16 the model's weights and gradients are 2 bytes and the optimizer
    keeps an fp32 master copy (K = 12 bytes per parameter with m and v); fp16 scales the loss,
    agrees on overflow across ranks and skips the step everywhere. `step()` returns a
    `StepReport`: whether it stepped, this rank's traffic over the step, and the
    `MemoryLedger` snapshot (per-category bytes and peaks).
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Communicator,
        *,
        stage: int = 0,
        optimizer: str = "adam",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        precision: str = "fp32",
        loss_scale: str | float | None = None,
        ledger: MemoryLedger | None = None,
        units: list[nn.Module] | None = None,
    ) -> None:
        if isinstance(stage, bool) or stage not in STAGES:
            raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed values: 0, 1, 2, 3")
        self.scaler = make_loss_scaler(precision, loss_scale)  # checks the pair first
        for name, p in module.named_parameters():
            if p.device != comm.device:
                raise ValueError(f"parameter {name!r} is on {p.device}; comm moves {comm.device}")
        self.module, self.comm, self.stage, self.precision = module, comm, stage, precision
        self.dtype = compute_dtype(precision)
        self.ledger = ledger if ledger is not None else MemoryLedger(comm.device)
        self.units = plan_units(module, units, comm.world_size)
        self.numel = sum(u.numel for u in self.units)
        self.padded_numel = sum(u.padded for u in self.units)
        # Built (and its settings checked) before the model's parameters are touched.
        self.optimizer = FlatAdam(
            [u.shard_numel if stage >= 1 else u.padded for u in self.units],
            optimizer=optimizer,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            device=comm.device,
        )
        self.ledger.track("optim", self.optimizer.exp_avg)
        self.ledger.track("optim", self.optimizer.exp_avg_sq)
        self.states = self._build_states()
        self._window: TrafficCounters | None = None
        module.register_forward_pre_hook(self._open_window)  # before the units' gathers
        self.hooks = (
            UnitHooks(self.states, comm, self.ledger, shard_params=stage == 3)
            if stage >= 2
            else None
        )
        self.ledger.reset_peak()

    def __call__(self, *args, **kwargs):
        """Forward; activations autograd saves are counted in the ledger."""
        if self.dtype != torch.float32:
            args = tuple(self._cast(a) for a in args)
            kwargs = {k: self._cast(v) for k, v in kwargs.items()}
        with self.ledger.saved_activations():
            return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of this rank's mean loss (scaled first when a loss scaler is set)."""
        (self.scaler.scale_loss(loss) if self.scaler is not None else loss).backward()

    def step(self) -> StepReport:
        """Average gradients over ranks, update this rank's share, make parameters whole."""
        start = self._window if self._window is not None else self.comm.counters.copy()
        if self.stage < 2:
            self._check_gradient_views()
        if self.hooks is not None:
            self.hooks.flush()
        self._reduce_gradients()
        grads, buffer = self._fp32_gradients()
        stepped = self._agree_to_step(grads)
        if stepped:
            self.optimizer.step([s.master for s in self.states], grads)
            self._publish_parameters()
        if buffer is not None:
            self.ledger.untrack(buffer)
        traffic = self.comm.counters - start
        scale = self.scaler.scale if self.scaler is not None else None
        report = StepReport(stepped, traffic, self.ledger.snapshot(), scale)
        self.ledger.reset_peak()
        self._window = None
        return report

    @torch.no_grad()
    def zero_grad(self) -> None:
        """Zero the gradients this rank keeps (stages 0/1: every parameter's `.grad`)."""
        for state in self.states:
            state.grad.zero_()
            if self.stage < 2:
                for slot, view in _grad_views(state):
                    slot.param.grad = view

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """A copy of every parameter, by name (all-gathers each unit under stage 3)."""
        out = {}
        for state in self.states:
            if self.stage == 3:
                self.hooks.gather(state)
            for slot in state.unit.slots:
                out[slot.name] = slot.param.detach().clone()
            if self.stage == 3:
                self.hooks.release(state)
        return out

    def bytes_per_param(self) -> dict[str, float]:
        """Measured model-state bytes per (unpadded) parameter, per ledger category."""
        return {c: self.ledger.current[c] / self.numel for c in ("params", "grads", "optim")}

    def _check_gradient_views(self) -> None:
        """Stages 0/1 reduce the flat gradient buffer; a `.grad` that is no longer a view
        of it (e.g. after `model.zero_grad()`, which sets them to None) would be ignored."""
        for state in self.states:
            for slot, view in _grad_views(state):
                grad = slot.param.grad
                if grad is None or grad.data_ptr() != view.data_ptr():
                    raise RuntimeError(
                        f"the gradient of {slot.name!r} is not ZeRO's buffer any more; "
                        "zero gradients with ZeroDataParallel.zero_grad(), not the model's"
                    )

    def _open_window(self, module: nn.Module, args: tuple) -> None:
        if self._window is None:
            self._window = self.comm.counters.copy()

    def _cast(self, value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(self.dtype)
        return value

    @torch.no_grad()
    def _build_states(self) -> list[UnitState]:
        """Allocate the flat buffers (each counted in the ledger), copy the model's weights
        in, and point its parameters (and, for stages 0/1, their gradients) at them."""
        n, dev, dtype = self.comm.world_size, self.comm.device, self.dtype
        keep_full_params, keep_full_grads = self.stage < 3, self.stage < 2
        sharded_optim = self.stage >= 1
        track = self.ledger.track
        full_numel, shard_numel = self.padded_numel, self.padded_numel // n
        params_numel = full_numel if keep_full_params else shard_numel
        grads_numel = full_numel if keep_full_grads else shard_numel
        params = track("params", torch.zeros(params_numel, dtype=dtype, device=dev))
        self.flat_grads = track("grads", torch.zeros(grads_numel, dtype=dtype, device=dev))
        masters = None
        if dtype != torch.float32:  # fp32 parameters are their own master copy
            numel = shard_numel if sharded_optim else full_numel
            masters = track("optim", torch.zeros(numel, dtype=torch.float32, device=dev))
        states = []
        for unit in self.units:
            values = _flatten(unit)  # fp32, padded
            lo, hi = unit.shard_range(self.comm.rank)
            if keep_full_params:
                full = _segment(params, unit, sharded=False)
                shard = full[lo:hi]
                full.copy_(values)
            else:
                full = torch.empty(unit.padded, dtype=dtype, device=dev)  # freed below
                shard = _segment(params, unit, sharded=True)
                shard.copy_(values[lo:hi])
            grad = _segment(self.flat_grads, unit, sharded=not keep_full_grads)
            if masters is None:
                master = shard if sharded_optim else full
            else:
                master = _segment(masters, unit, sharded=sharded_optim)
                master.copy_(values[lo:hi] if sharded_optim else values)
            state = UnitState(unit, full, shard, grad, master, gathered=keep_full_params)
            for slot in unit.slots:
                slot.param.data = full[slot.offset : slot.offset + slot.numel].view(slot.shape)
            if keep_full_grads:
                for slot, view in _grad_views(state):
                    slot.param.grad = view
            if not keep_full_params:
                full.untyped_storage().resize_(0)
            states.append(state)
        return states

    @torch.no_grad()
    def _reduce_gradients(self) -> None:
        """Stage 0: all-reduce every gradient. Stage 1: reduce-scatter each unit in place,
        so this rank's block holds the averaged shard. Stages 2/3 reduced during backward."""
        if self.stage == 0:
            all_reduce(self.flat_grads, self.comm, op="avg")
        elif self.stage == 1:
            for state in self.states:
                lo, hi = state.unit.shard_range(self.comm.rank)
                reduce_scatter(state.grad[lo:hi], state.grad, self.comm, op="avg")

    def _fp32_gradients(self) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The averaged gradient segments matching the optimizer's, in fp32: the kept
        gradients themselves in fp32, else a transient fp32 copy (counted as `buffers`)."""
        segments = [state.grad for state in self.states]
        if self.stage == 1:
            ranges = [state.unit.shard_range(self.comm.rank) for state in self.states]
            segments = [grad[lo:hi] for grad, (lo, hi) in zip(segments, ranges, strict=True)]
        if self.dtype == torch.float32:
            return segments, None
        numel = sum(s.numel() for s in segments)
        buffer = torch.empty(numel, dtype=torch.float32, device=self.comm.device)
        self.ledger.track("buffers", buffer)
        copies = list(buffer.split([s.numel() for s in segments]))
        for copy, segment in zip(copies, segments, strict=True):
            copy.copy_(segment)
        return copies, buffer

    def _agree_to_step(self, grads: list[torch.Tensor]) -> bool:
        """Unscale; skip the step on every rank if any rank's gradients overflowed."""
        if self.scaler is None:
            return True
        flag = torch.tensor([float(self.scaler.unscale_(grads))], device=self.comm.device)
        all_reduce(flag, self.comm, op="max", algorithm="tree")
        return self.scaler.update(bool(flag.item()))

    @torch.no_grad()
    def _publish_parameters(self) -> None:
        """Round the fp32 master into the model's parameters, then make every rank's copy
        whole: all-gather for stages 1/2 (stage 3 gathers at the next forward)."""
        mixed = self.dtype != torch.float32
        for state in self.states:
            if mixed:
                (state.shard if self.stage >= 1 else state.full).copy_(state.master)
            if self.stage in (1, 2):
                all_gather(state.full, state.shard, self.comm)


def _flatten(unit: FlatUnit) -> torch.Tensor:
    """The unit's current parameter values as one padded fp32 vector."""
    values = torch.zeros(unit.padded, dtype=torch.float32, device=unit.slots[0].param.device)
    for slot in unit.slots:
        values[slot.offset : slot.offset + slot.numel].copy_(slot.param.detach().reshape(-1))
    return values


def _grad_views(state: UnitState):
    """(slot, view of the unit's full gradient buffer shaped like the parameter)."""
    for slot in state.unit.slots:
        yield slot, state.grad[slot.offset : slot.offset + slot.numel].view(slot.shape)


def _segment(flat: torch.Tensor, unit: FlatUnit, *, sharded: bool) -> torch.Tensor:
    """The unit's part of a buffer laid out unit after unit: whole units or shards."""
    if sharded:
        return flat[unit.shard_start : unit.shard_start + unit.shard_numel]
    return flat[unit.start : unit.start + unit.padded]
