"""Run any valid pipeline plan on P ranks over `impls.comm`, recording a timeline.

One executor for every schedule, as torch.distributed.pipelining does it: the schedule is
data (a `Plan`), `insert_communication` adds its transfers, and the executor walks this
rank's list. Consecutive `SEND_*`/`RECV_*` actions form one round: its sends stay in flight
until the end of the step, its receives are posted a round earlier (gloo moves a message
only once both ends have posted it) and each is waited for just before the compute that
reads it, so a rank never waits for a message its next compute does not need. The dry run
(`impls.pipeline.validate`) proves the plan free of deadlock with each round posted and
waited on together; here every message is posted no later and every wait comes no
earlier, so none can deadlock either. What each compute action does is `_compute`; how
activation memory is counted is `PipelineExecutor`. The step's parts live beside this
file: `transfers` (messages in rounds), `shapes` (receive buffers) and `records` (timings).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from impls.collectives import barrier
from impls.comm import Communicator, Round
from impls.memory import SavedStorages, storage_key
from impls.pipeline.actions import Action, Plan
from impls.pipeline.dataflow import StageRanks, message_peer, rank_of
from impls.pipeline.records import ActionRecord, ActionTimer, StepResult
from impls.pipeline.shapes import BoundaryShapes, exchange_shapes, uniform_shapes
from impls.pipeline.transfers import boundary, message_tag, segments, with_transfers
from impls.pipeline.validate import PlanError
from impls.pipeline.weight_grad import DeferWeightGrads, WeightGradSlot, reroute_linears

__all__ = ["ActionRecord", "PipelineExecutor", "StepResult"]


@dataclass
class _Held:
    """What a forwarded (stage, micro-batch) keeps until its backward is complete."""

    inputs: Tensor
    output: Tensor  # the stage output, or the scaled loss on the last stage
    saved_bytes: int  # counted while held: saved for backward, then the slot's (x, grad_y)
    slot: WeightGradSlot  # the linear layers' weight GEMMs, deferred by I until W


_Receives = tuple[Round, list[tuple[Action, Tensor]]]  # a round and its receive buffers
_READS = {"F": "F", "B": "B", "I": "B"}  # what each compute action reads that may arrive


@dataclass
class _StepState:
    batch: list[Tensor] | None  # micro-batch inputs of stage 0
    targets: list[Tensor] | None
    guard: Callable[[], AbstractContextManager]  # entered around each compute
    caller_storages: set[int]  # the batch: held regardless
    timer: ActionTimer = field(default_factory=ActionTimer)  # its origin: the step's start
    ready_inputs: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    ready_grads: dict[tuple[int, int], Tensor] = field(default_factory=dict)  # d loss/d output
    outbox: dict[Action, Tensor] = field(default_factory=dict)  # send action -> its tensor
    held: dict[tuple[int, int], _Held] = field(default_factory=dict)
    losses: list[Tensor] = field(default_factory=list)
    held_bytes: int = 0
    peak_bytes: int = 0
    max_inflight: int = 0
    posted: dict[int, _Receives] = field(default_factory=dict)  # round segment -> receives
    # receives still in flight, by what they fill: ("F", stage, mb) an F's input, ("B", stage,
    # mb) a backward's output gradient
    arriving: dict[tuple[str, int, int], tuple[Round, Action]] = field(default_factory=dict)
    sending: list[Round] = field(default_factory=list)  # rounds whose sends are in flight


class PipelineExecutor:
    """Runs `plan` (rank -> compute actions, for all ranks) on this rank's stages.

    `comm` spans the P pipeline ranks; `stage_modules` maps this rank's global stage
    indices to their modules: r, r+P, … by default, or the stages s with
    `stage_ranks[s] == r` when a schedule places them otherwise (ZB-V's `v_shape`);
    `num_stages` = P·V. `loss_fn(output, targets)`
    must return a mean over its micro-batch. `activation_shape` / `activation_dtype` give
    the tensor every stage boundary carries (e.g. (mb, seq, d_model)); when omitted, the
    first `step` sends one shape header per boundary along the pipeline (counted traffic,
    outside that step's `traffic`). A plan that already holds transfers is used as given.
    The plan is validated (dry run, rendezvous sends) before any message is sent.

    Activation memory is an exact accounting, not an allocator reading: while (s, m) is
    held (from its `F` until its `B`, or its `W` when split), it counts the bytes of every
    tensor autograd saved for its backward until its `I`, and from `I` to `W` the storages
    of the (x, grad_y) pairs the deferred GEMMs keep (`impls.memory.SavedStorages`, as
    `MemoryLedger` counts them), each storage once within that forward, parameters and the
    caller's batch excluded (held whatever the schedule). `peak_activation_bytes` is the
    largest sum over the step; `max_inflight` the most (stage, micro-batch) pairs held at
    once, the same count as the plan-side `max_inflight_microbatches` (with virtual stages
    a pair is one chunk).
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
        stage_ranks: StageRanks | None = None,
    ) -> None:
        ranks, rank = comm.world_size, comm.rank
        if len(plan) != ranks:
            raise ValueError(f"stages={len(plan)} (plan ranks) != the group's {ranks} ranks")
        if num_stages < ranks or num_stages % ranks:
            raise ValueError(f"num_stages={num_stages} must be a positive multiple of {ranks}")
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches!r}: must be an integer >= 1")
        if stage_ranks is not None and (
            len(stage_ranks) != num_stages or not set(stage_ranks) <= set(range(ranks))
        ):
            raise ValueError(
                f"stage_ranks={tuple(stage_ranks)}: needs one rank in 0..{ranks - 1} for each "
                f"of the num_stages={num_stages} stages"
            )
        virtual = num_stages // ranks
        mine = {s for s in range(num_stages) if rank_of(s, ranks, stage_ranks) == rank}
        if set(stage_modules) != mine:
            raise ValueError(
                f"stage_modules has stages {sorted(stage_modules)}; "
                f"rank {rank} holds {sorted(mine)}"
            )
        self.comm, self.rank, self.ranks = comm, rank, ranks
        self.num_stages, self.microbatches, self.loss_fn = num_stages, microbatches, loss_fn
        self.stage_modules, self.stage_ranks = stage_modules, stage_ranks
        self.plan = with_transfers(plan, ranks, microbatches, virtual, stage_ranks)
        self.actions = self.plan[rank]
        # Only a plan that splits backward reroutes its linears (`weight_grad`): a fused B
        # stays autograd's own backward, the baseline that I + W is measured against.
        self._splits = any(a.kind in ("I", "W") for a in self.actions)
        if self._splits:
            reroute_linears(*stage_modules.values())  # at once: a weight two stages share
        self._segments = segments(self.actions)
        rounds = [i for i, seg in enumerate(self._segments) if not isinstance(seg, Action)]
        self._next_round = dict(zip(rounds, rounds[1:], strict=False))
        self._params = {
            s: [p for p in m.parameters() if p.requires_grad] for s, m in stage_modules.items()
        }
        self._param_storages = {
            storage_key(p) for m in stage_modules.values() for p in m.parameters()
        }
        self._shapes: BoundaryShapes | None = None
        if activation_shape is not None:
            self._shapes = uniform_shapes(activation_shape, activation_dtype, num_stages)

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
        batch = self._split("inputs", inputs, 0)
        targets_mb = self._split("targets", targets, -1)
        if self._shapes is None:
            example = batch[0] if batch is not None else None
            self._shapes = exchange_shapes(
                self.comm, self.stage_modules, self.num_stages, example, self.stage_ranks
            )
        if align_clocks:
            barrier(self.comm)  # one time origin for every rank's records
        given = {storage_key(t) for t in (inputs, targets) if t is not None}
        with self.comm.measure() as traffic:
            state = _StepState(batch, targets_mb, compute_guard or nullcontext, given)
            for i, segment in enumerate(self._segments):
                if isinstance(segment, Action):
                    self._compute(state, segment)
                else:
                    self._round(state, i)
            for rnd in state.sending:  # the step ends when its messages are out
                rnd.wait()
            step_time = state.timer.elapsed()
        leftover = list(state.held) + list(state.outbox) + list(state.ready_grads)
        leftover += [action for _, action in state.arriving.values()]
        if leftover:
            raise PlanError(f"rank {self.rank} ended the step still holding {leftover[:4]}")
        loss = float(torch.stack(state.losses).sum()) if state.losses else None
        return StepResult(
            loss=loss,
            records=state.timer.records,
            peak_activation_bytes=state.peak_bytes,
            max_inflight=state.max_inflight,
            step_time_s=step_time,
            traffic=traffic,
        )

    def _rank_of(self, stage: int) -> int:
        return rank_of(stage, self.ranks, self.stage_ranks)

    def _split(self, key: str, batch: Tensor | None, stage: int) -> list[Tensor] | None:
        """Micro-batches of `batch` if this rank holds `stage` (-1: the last), else None."""
        stage = stage % self.num_stages
        if self._rank_of(stage) != self.rank:
            return None
        if batch is None:
            raise ValueError(f"{key} is required on rank {self.rank}, which holds stage {stage}")
        if batch.shape[0] % self.microbatches:
            raise ValueError(
                f"microbatches={self.microbatches} must divide the batch size {batch.shape[0]}"
            )
        return list(batch.tensor_split(self.microbatches))

    def _compute(self, state: _StepState, action: Action) -> None:
        """One compute action of stage s on micro-batch m.

        - `F`: run stage s on its input (micro-batch m of the batch on stage 0, else the
          received or handed-on activation, made a leaf that requires grad) and keep
          (input, output); the last stage returns `loss_fn(output, targets_m) / M`, so the
          gradients summed over micro-batches are the full batch's mean loss's.
        - `B`: `torch.autograd.backward(output, grad_output)`; parameter gradients
          accumulate in `.grad`, the input's gradient is what `SEND_B` ships to stage s−1.
        - `I` / `W` (zero bubble, Qi et al. 2024): the stages' linears run each forward under
          `DeferWeightGrads` (`impls.pipeline.weight_grad`), so `I` is one backward that
          computes the input gradient and the cheap parameter gradients and keeps each
          linear's (x, grad_y) instead of its weight-gradient GEMM; `W` runs only those GEMMs
          into `.grad`. I + W costs one backward; stage 0 splits the same way.
        """
        self._await_input(state, action)
        with state.guard():
            with state.timer.compute(action):
                if action.kind == "F":
                    self._forward(state, action.stage, action.microbatch)
                else:
                    self._backward(state, action)
            if action.kind != "F":  # bookkeeping, not the action's cost: outside its timer
                self._release(state, action)

    def _forward(self, state: _StepState, s: int, m: int) -> None:
        last = s == self.num_stages - 1
        inputs = state.batch[m] if s == 0 else state.ready_inputs.pop((s, m))
        # `_backward` frees these bytes at this pair's B (or W): no finalizer per saved tensor.
        saved = SavedStorages()
        slot = WeightGradSlot()
        with (
            saved.counting(self._param_storages, state.caller_storages, until_dropped=False),
            DeferWeightGrads(slot) if self._splits else nullcontext(),
        ):
            output = self.stage_modules[s](inputs)
            if last:
                output = self.loss_fn(output, state.targets[m]) / self.microbatches
        if last:
            state.losses.append(output.detach())
        elif self._rank_of(s + 1) == self.rank:  # next stage is local: hand it on
            state.ready_inputs[(s + 1, m)] = output.detach().requires_grad_()
        else:
            state.outbox[Action(s, "SEND_F", m)] = output.detach().contiguous()
        state.held[(s, m)] = _Held(inputs, output, saved.nbytes, slot)
        state.held_bytes += saved.nbytes
        state.peak_bytes = max(state.peak_bytes, state.held_bytes)
        state.max_inflight = max(state.max_inflight, len(state.held))

    def _backward(self, state: _StepState, action: Action) -> None:
        s, m = action.stage, action.microbatch
        held = state.held[(s, m)]
        input_grad = None
        if action.kind in ("B", "I"):
            last = s == self.num_stages - 1
            grad_output = None if last else state.ready_grads.pop((s, m))
            held.slot.deferring = action.kind == "I"
            input_grad = held.slot.backward(
                held.output, grad_output, params=self._params[s], stage_input=held.inputs
            )
            input_grad = input_grad if s > 0 else None
            held.output = held.inputs = None  # the graph is freed; W needs only the slot
        if action.kind == "W":
            held.slot.run()
        if input_grad is None:
            return
        if self._rank_of(s - 1) == self.rank:
            state.ready_grads[(s - 1, m)] = input_grad
        else:
            state.outbox[Action(s, "SEND_B", m)] = input_grad.contiguous()

    def _release(self, state: _StepState, action: Action) -> None:
        """The held bytes after a backward action: B and W free the pair; after I only the
        slot's (x, grad_y) storages stay held, until W."""
        key = (action.stage, action.microbatch)
        held = state.held[key]
        if action.kind == "I":
            kept = held.slot.nbytes(self._param_storages | state.caller_storages)
            state.held_bytes += kept - held.saved_bytes
            held.saved_bytes = kept
            state.peak_bytes = max(state.peak_bytes, state.held_bytes)
        else:
            del state.held[key]
            state.held_bytes -= held.saved_bytes

    def _await_input(self, state: _StepState, action: Action) -> None:
        """Wait for the received tensor `action` reads (an F's input, a B's or I's output
        gradient), if it is still arriving; outside the action's timing."""
        reads = _READS.get(action.kind)  # None: a W reads nothing that arrives
        pending = reads and state.arriving.pop((reads, action.stage, action.microbatch), None)
        if pending:
            rnd, receive = pending
            ready = state.ready_inputs if reads == "F" else state.ready_grads
            rnd.wait_received(ready[(action.stage, action.microbatch)])
            state.timer.received(receive)

    def _receives(self, i: int) -> _Receives:
        """A round for segment i with its receives posted, each into a new buffer."""
        rnd = self.comm.round()
        buffers: list[tuple[Action, Tensor]] = []
        for action in self._segments[i]:
            if action.kind.startswith("RECV"):
                size, dtype = self._shapes[boundary(action)]
                buffer = torch.empty(size, dtype=dtype, device=self.comm.device)
                peer = message_peer(action, self.ranks, self.stage_ranks)
                rnd.recv(buffer, peer, message_tag(action, self.microbatches))
                buffers.append((action, buffer))
        return rnd, buffers

    def _round(self, state: _StepState, i: int) -> None:
        """Segment i's transfers: post its sends (its receives were posted a round
        earlier) and the next round's receives; count the round; leave every message in
        flight (`_await_input` waits for each receive, the step's end for the sends)."""
        actions = self._segments[i]
        with state.timer.round(actions):
            rnd, arriving = state.posted.pop(i, None) or self._receives(i)
            sends = [action for action in actions if action.kind.startswith("SEND")]
            for action in sends:  # the round holds each tensor until its send completes
                peer = message_peer(action, self.ranks, self.stage_ranks)
                rnd.send(state.outbox.pop(action), peer, message_tag(action, self.microbatches))
            following = self._next_round.get(i)
            if following is not None:
                state.posted[following] = self._receives(following)
            rnd.wait(sends=False, receives=False)
            if sends:
                state.sending.append(rnd)
            for action, buffer in arriving:
                key = (action.stage, action.microbatch)
                state.arriving[("F" if action.kind == "RECV_F" else "B", *key)] = (rnd, action)
                if action.kind == "RECV_F":
                    state.ready_inputs[key] = buffer.requires_grad_()
                else:
                    state.ready_grads[key] = buffer
