"""Run any valid pipeline plan on P ranks over `impls.comm`, recording a timeline.

One executor for every schedule, as torch.distributed.pipelining does it: the schedule is
data (a `Plan`), `insert_communication` adds its transfers, and the executor walks this
rank's list. A compute action runs the stage; consecutive `SEND_*`/`RECV_*` actions form
one round, posted together and waited on together — exactly the semantics under which the
dry run (`impls.pipeline.validate`) proved the plan free of deadlock, gloo's rendezvous
sends included.

Per action (stage s, micro-batch m):

- `F`: run stage s on its input — micro-batch m of the batch on stage 0, else the received
  (or, when stage s−1 is on this rank, handed-on) activation, made a leaf that requires
  grad. Keep (input, output) for the backward. The last stage returns
  `loss_fn(output, targets_m) / M`, so the gradients summed over micro-batches are those of
  the full batch's mean loss (for equal micro-batches and a mean loss).
- `B`: `torch.autograd.backward(output, grad_output)`; parameter gradients accumulate in
  `.grad`, the input's gradient is what `SEND_B` ships to stage s−1.
- `I` / `W` (zero bubble, Qi et al. 2024): `I` is `autograd.grad(output, input,
  retain_graph=True)`, `W` is `autograd.grad(output, params)` added to `.grad`. Correct but
  not free: `W` walks the stage's graph again, so I + W costs about 1.5–2 B where the
  paper's split costs one B. Stage 0 has no input gradient, so its `I` does nothing and its
  `W` is the whole backward.

Activation memory is an exact accounting, not an allocator reading: while (s, m) is held
(from its `F` until its `B`, or its `W` when split), it counts the bytes of every tensor
autograd saved for its backward (`saved_tensors_hooks`), each storage once, parameters
and the caller's batch excluded (they are held whatever the schedule). `peak_activation_bytes` is the largest sum over the step; `max_inflight` the
most (stage, micro-batch) pairs held at once — the same count as the plan-side
`max_inflight_microbatches`, so with virtual stages a pair is one chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from impls.collectives import barrier
from impls.comm import Communicator, TrafficCounters
from impls.pipeline.actions import Action, Plan
from impls.pipeline.dataflow import message_peer, rank_of
from impls.pipeline.validate import PlanError, dry_run, insert_communication, validate

__all__ = ["ActionRecord", "PipelineExecutor", "StepResult"]

# Activation dtypes a shape header can name (index in this tuple is sent).
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_MAX_DIMS = 8


@dataclass
class ActionRecord:
    """One executed action on this rank; times in seconds from the step's start."""

    action: str  # str(Action), e.g. "1F0" or "0SEND_F2"
    kind: str  # F B I W SEND_F RECV_F SEND_B RECV_B
    start_s: float  # time.perf_counter() since the post-barrier start of the step
    end_s: float
    cpu_s: float  # compute: thread CPU time; transfer: wall time of its whole round


@dataclass
class StepResult:
    """What one `PipelineExecutor.step` did on this rank."""

    loss: float | None  # mean loss over micro-batches (last stage's rank only)
    records: list[ActionRecord]
    peak_activation_bytes: int  # saved-for-backward bytes, max over the step
    max_inflight: int  # most (stage, micro-batch) pairs forwarded, not yet fully backwarded
    step_time_s: float  # wall time from the post-barrier start to the last action's end
    traffic: TrafficCounters = field(default_factory=TrafficCounters)  # step's messages only


@dataclass
class _Held:
    """What a forwarded (stage, micro-batch) keeps until its backward is complete."""

    inputs: Tensor
    output: Tensor  # the stage output, or the scaled loss on the last stage
    saved_bytes: int
    grad_output: Tensor | None = None  # kept between I and W


@dataclass
class _StepState:
    batch: list[Tensor] | None  # micro-batch inputs of stage 0
    targets: list[Tensor] | None
    guard: Callable[[], AbstractContextManager] = nullcontext  # entered around each compute
    ready_inputs: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    ready_grads: dict[tuple[int, int], Tensor] = field(default_factory=dict)  # d loss/d output
    outbox: dict[Action, Tensor] = field(default_factory=dict)  # send action -> its tensor
    held: dict[tuple[int, int], _Held] = field(default_factory=dict)
    losses: list[Tensor] = field(default_factory=list)
    records: list[ActionRecord] = field(default_factory=list)
    caller_storages: set[int] = field(default_factory=set)  # the batch: held regardless
    held_bytes: int = 0
    peak_bytes: int = 0
    max_inflight: int = 0


class _SavedBytes:
    """A pack hook that adds up the storages autograd saves, each once, parameters excluded."""

    def __init__(self, parameter_storages: set[int]) -> None:
        self.excluded = parameter_storages
        self.seen: set[int] = set()
        self.nbytes = 0

    def pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.excluded and key not in self.seen:
            self.seen.add(key)
            self.nbytes += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: Tensor) -> Tensor:
        return tensor


class PipelineExecutor:
    """Runs `plan` (rank -> compute actions, for all ranks) on this rank's stages.

    `comm` spans the P pipeline ranks; `stage_modules` maps this rank's global stage
    indices (r, r+P, …) to their modules; `num_stages` = P·V. `loss_fn(output, targets)`
    must return a mean over its micro-batch. `activation_shape` / `activation_dtype` give
    the tensor every stage boundary carries (e.g. (mb, seq, d_model)); when omitted, the
    first `step` sends one shape header per boundary along the pipeline (counted traffic,
    outside that step's `traffic`). A plan that already holds transfers is used as given.
    The plan is validated (dry run, rendezvous sends) before any message is sent.
    """

    def __init__(
        self,
        comm: Communicator,
        stage_modules: dict[int, nn.Module],
        plan: Plan,
        *,
        num_stages: int,
        microbatches: int,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        activation_shape: tuple[int, ...] | None = None,
        activation_dtype: torch.dtype = torch.float32,
    ) -> None:
        ranks, rank = comm.world_size, comm.rank
        if len(plan) != ranks:
            raise ValueError(f"stages={len(plan)} (plan ranks) != the group's {ranks} ranks")
        if num_stages < ranks or num_stages % ranks:
            raise ValueError(f"num_stages={num_stages} must be a positive multiple of {ranks}")
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches!r}: must be an integer >= 1")
        virtual = num_stages // ranks
        mine = set(range(rank, num_stages, ranks))
        if set(stage_modules) != mine:
            raise ValueError(
                f"stage_modules has stages {sorted(stage_modules)}; rank {rank} holds {sorted(mine)}"
            )
        self.comm, self.rank, self.ranks = comm, rank, ranks
        self.num_stages, self.microbatches, self.loss_fn = num_stages, microbatches, loss_fn
        self.stage_modules = stage_modules
        self.plan = _with_transfers(plan, ranks, microbatches, virtual)
        self.actions = self.plan[rank]
        self._segments = _segments(self.actions)
        self._params = {
            s: [p for p in m.parameters() if p.requires_grad] for s, m in stage_modules.items()
        }
        self._param_storages = {
            p.untyped_storage().data_ptr() for m in stage_modules.values() for p in m.parameters()
        }
        self._shapes: dict[int, tuple[torch.Size, torch.dtype]] | None = None
        if activation_shape is not None:
            size = torch.Size(activation_shape)
            self._shapes = {b: (size, activation_dtype) for b in range(num_stages - 1)}

    # ---- the step -------------------------------------------------------------------

    def step(
        self,
        inputs: Tensor | None,
        targets: Tensor | None,
        *,
        align_clocks: bool = True,
        compute_guard: Callable[[], AbstractContextManager] | None = None,
    ) -> StepResult:
        """Run this rank's actions once; gradients accumulate into `.grad`.

        `inputs` (the whole batch, split into `microbatches` along dim 0) is needed on
        stage 0's rank, `targets` on the last stage's rank; elsewhere they are ignored.
        Every rank of the group must call `step` together. A barrier opens the step so
        that every rank's records share one time origin; `align_clocks=False` skips it
        (for timing back-to-back steps against an executor without one), and the ranks'
        records then have unrelated origins. `compute_guard`, if given, is entered around
        each compute action, outside its timing (e.g. a host-wide lock, so that ranks
        sharing cores compute one at a time and each action's cost is measured alone).
        """
        state = _StepState(
            batch=self._split("inputs", inputs, 0),
            targets=self._split("targets", targets, -1),
            guard=compute_guard or nullcontext,
        )
        for given in (inputs, targets):
            if given is not None:
                state.caller_storages.add(given.untyped_storage().data_ptr())
        if self._shapes is None:
            self._shapes = self._exchange_shapes(state)
        if align_clocks:
            barrier(self.comm)  # one time origin for every rank's records
        with self.comm.measure() as traffic:
            start = time.perf_counter()
            for segment in self._segments:
                if isinstance(segment, Action):
                    self._compute(state, segment, start)
                else:
                    self._round(state, segment, start)
            step_time = time.perf_counter() - start
        leftover = list(state.held) + list(state.outbox) + list(state.ready_grads)
        if leftover:
            raise PlanError(f"rank {self.rank} ended the step still holding {leftover[:4]}")
        loss = float(torch.stack(state.losses).sum()) if state.losses else None
        return StepResult(
            loss=loss,
            records=state.records,
            peak_activation_bytes=state.peak_bytes,
            max_inflight=state.max_inflight,
            step_time_s=step_time,
            traffic=traffic,
        )

    def _split(self, key: str, batch: Tensor | None, stage: int) -> list[Tensor] | None:
        """Micro-batches of `batch` if this rank holds `stage` (-1: the last), else None."""
        stage = stage % self.num_stages
        if rank_of(stage, self.ranks) != self.rank:
            return None
        if batch is None:
            raise ValueError(f"{key} is required on rank {self.rank}, which holds stage {stage}")
        if batch.shape[0] % self.microbatches:
            raise ValueError(
                f"microbatches={self.microbatches} must divide the batch size {batch.shape[0]}"
            )
        return list(batch.tensor_split(self.microbatches))

    def _compute(self, state: _StepState, action: Action, origin: float) -> None:
        with state.guard():
            start, cpu = time.perf_counter(), time.thread_time()
            if action.kind == "F":
                self._forward(state, action.stage, action.microbatch)
            else:
                self._backward(state, action)
            end, cpu = time.perf_counter(), time.thread_time() - cpu
        state.records.append(
            ActionRecord(str(action), action.kind, start - origin, end - origin, cpu)
        )

    def _forward(self, state: _StepState, s: int, m: int) -> None:
        last = s == self.num_stages - 1
        inputs = state.batch[m] if s == 0 else state.ready_inputs.pop((s, m))
        saved = _SavedBytes(self._param_storages | state.caller_storages)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            output = self.stage_modules[s](inputs)
            if last:
                output = self.loss_fn(output, state.targets[m]) / self.microbatches
        if last:
            state.losses.append(output.detach())
        elif rank_of(s + 1, self.ranks) == self.rank:  # next stage is local: hand it on
            state.ready_inputs[(s + 1, m)] = output.detach().requires_grad_()
        else:
            state.outbox[Action(s, "SEND_F", m)] = output.detach().contiguous()
        state.held[(s, m)] = _Held(inputs, output, saved.nbytes)
        state.held_bytes += saved.nbytes
        state.peak_bytes = max(state.peak_bytes, state.held_bytes)
        state.max_inflight = max(state.max_inflight, len(state.held))

    def _backward(self, state: _StepState, action: Action) -> None:
        s, m = action.stage, action.microbatch
        held = state.held[(s, m)]
        if action.kind in ("B", "I"):
            last = s == self.num_stages - 1
            held.grad_output = None if last else state.ready_grads.pop((s, m))
        input_grad = None
        if action.kind == "B":
            torch.autograd.backward(held.output, held.grad_output)
            input_grad = held.inputs.grad if s > 0 else None
        elif action.kind == "I" and s > 0:
            (input_grad,) = torch.autograd.grad(
                held.output, held.inputs, held.grad_output, retain_graph=True
            )
        elif action.kind == "W":
            params = self._params[s]
            grads = torch.autograd.grad(held.output, params, held.grad_output, allow_unused=True)
            for param, grad in zip(params, grads, strict=True):
                if grad is None:
                    continue
                if param.grad is None:
                    param.grad = grad
                else:
                    param.grad.add_(grad)
        if action.kind in ("B", "W"):
            del state.held[(s, m)]
            state.held_bytes -= held.saved_bytes
        if input_grad is None:
            return
        if rank_of(s - 1, self.ranks) == self.rank:
            state.ready_grads[(s - 1, m)] = input_grad
        else:
            state.outbox[Action(s, "SEND_B", m)] = input_grad.contiguous()

    def _round(self, state: _StepState, actions: tuple[Action, ...], origin: float) -> None:
        """Post every send and receive of the round, then wait for all of them."""
        start = time.perf_counter()
        rnd = self.comm.round()
        arriving: list[tuple[Action, Tensor]] = []
        for action in actions:
            peer, tag = message_peer(action, self.ranks), self._tag(action)
            if action.kind.startswith("SEND"):
                rnd.send(state.outbox.pop(action), peer, tag)
            else:
                size, dtype = self._shapes[self._boundary(action)]
                buffer = torch.empty(size, dtype=dtype, device=self.comm.device)
                rnd.recv(buffer, peer, tag)
                arriving.append((action, buffer))
        rnd.wait()
        for action, buffer in arriving:
            key = (action.stage, action.microbatch)
            if action.kind == "RECV_F":
                state.ready_inputs[key] = buffer.requires_grad_()
            else:
                state.ready_grads[key] = buffer
        end = time.perf_counter()
        for action in actions:
            state.records.append(
                ActionRecord(str(action), action.kind, start - origin, end - origin, end - start)
            )

    @staticmethod
    def _boundary(action: Action) -> int:
        """The stage whose output the transfer carries (or the gradient of it)."""
        return action.stage - 1 if action.kind in ("RECV_F", "SEND_B") else action.stage

    def _tag(self, action: Action) -> int:
        """The same tag at both ends, distinct per message, so no pairing relies on order."""
        gradient = int(action.kind.endswith("_B"))
        return (self._boundary(action) * self.microbatches + action.microbatch) * 2 + gradient

    # ---- shapes ---------------------------------------------------------------------

    def _exchange_shapes(self, state: _StepState) -> dict[int, tuple[torch.Size, torch.dtype]]:
        """Learn each stage boundary's tensor shape once, walking the stages in model order.

        Stage b's rank runs stage b without autograd on an example input (micro-batch 0 on
        stage 0, zeros of the received shape after) and sends the output's shape to stage
        b+1's rank. The RNG state is restored, so dropout draws are unaffected.
        """
        shapes: dict[int, tuple[torch.Size, torch.dtype]] = {}
        device = self.comm.device
        rng_devices = [device] if device.type == "cuda" else []
        for b in range(self.num_stages - 1):
            sender, receiver = rank_of(b, self.ranks), rank_of(b + 1, self.ranks)
            if self.rank == sender:
                if b == 0:
                    example = state.batch[0]
                else:
                    example = torch.zeros(shapes[b - 1][0], dtype=shapes[b - 1][1], device=device)
                with torch.no_grad(), torch.random.fork_rng(devices=rng_devices):
                    output = self.stage_modules[b](example)
                shapes[b] = (output.shape, output.dtype)
                if receiver != sender:
                    self.comm.send(_shape_header(*shapes[b]).to(device), receiver)
            elif self.rank == receiver:
                header = torch.empty(_MAX_DIMS + 2, dtype=torch.int64, device=device)
                self.comm.recv(header, sender)
                shapes[b] = _read_header(header)
        return shapes


def _shape_header(size: torch.Size, dtype: torch.dtype) -> Tensor:
    if len(size) > _MAX_DIMS or dtype not in _DTYPES:
        raise ValueError(
            f"stage output {tuple(size)} {dtype}: activations must have <= {_MAX_DIMS} dims "
            f"and a dtype in {_DTYPES}; pass activation_shape/activation_dtype instead"
        )
    padded = list(size) + [0] * (_MAX_DIMS - len(size))
    return torch.tensor([len(size), *padded, _DTYPES.index(dtype)], dtype=torch.int64)


def _read_header(header: Tensor) -> tuple[torch.Size, torch.dtype]:
    values = header.tolist()
    return torch.Size(values[1 : 1 + values[0]]), _DTYPES[values[-1]]


def _with_transfers(plan: Plan, ranks: int, microbatches: int, virtual: int) -> Plan:
    """Validate `plan` and return it with its transfers (inserted unless already there)."""
    has_transfers = any(a.is_comm for actions in plan.values() for a in actions)
    compute_only = {r: [a for a in actions if a.is_compute] for r, actions in plan.items()}
    validate(compute_only, ranks, microbatches, virtual)
    if not has_transfers:
        return insert_communication(plan, ranks, virtual)
    dry_run(plan, ranks, virtual)
    return plan


def _segments(actions: list[Action]) -> list[Action | tuple[Action, ...]]:
    """Compute actions one by one; each run of consecutive transfers as one round."""
    segments: list[Action | tuple[Action, ...]] = []
    pending: list[Action] = []
    for action in actions:
        if action.is_comm:
            pending.append(action)
            continue
        if pending:
            segments.append(tuple(pending))
            pending = []
        segments.append(action)
    if pending:
        segments.append(tuple(pending))
    return segments
