"""What `PipelineExecutor.step` reports: one `ActionRecord` per executed action, timed from
one origin, and the step's `StepResult`.

The origin is the step's start after the opening barrier, so the records of every rank
share one clock (`impls.pipeline.trace` draws them on one timeline and replays them).
A compute action's `cpu_s` is the thread's CPU time, which a descheduled rank does not
accrue; a transfer's is its wall time: a send's, its round's (posting it, and any wait the
round made); a receive's, from its round's start until its data was waited for, just
before the compute that reads it (`ActionTimer.received`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from impls.comm import TrafficCounters
from impls.pipeline.actions import Action

__all__ = ["ActionRecord", "ActionTimer", "StepResult"]


@dataclass
class ActionRecord:
    """One executed action on this rank; times in seconds from the step's start."""

    action: str  # str(Action), e.g. "1F0" or "0SEND_F2"
    kind: str  # F B I W SEND_F RECV_F SEND_B RECV_B
    start_s: float  # time.perf_counter() since the post-barrier start of the step
    end_s: float
    cpu_s: float  # compute: thread CPU time; transfer: its wall time (end − start)


@dataclass
class StepResult:
    """What one `PipelineExecutor.step` did on this rank."""

    loss: float | None  # mean loss over micro-batches (last stage's rank only)
    records: list[ActionRecord]
    peak_activation_bytes: int  # saved-for-backward bytes, max over the step
    max_inflight: int  # most (stage, micro-batch) pairs forwarded, not yet fully backwarded
    step_time_s: float  # wall time from the post-barrier start to the last action's end
    traffic: TrafficCounters = field(default_factory=TrafficCounters)  # step's messages only


class ActionTimer:
    """Records a step's actions against the moment it was made (the step's origin)."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.records: list[ActionRecord] = []
        self._index: dict[str, int] = {}  # action -> its record

    def elapsed(self) -> float:
        """Wall seconds since the origin."""
        return time.perf_counter() - self.origin

    @contextmanager
    def compute(self, action: Action) -> Iterator[None]:
        """Time the block as compute `action`: its wall span and this thread's CPU time."""
        start, cpu = time.perf_counter(), time.thread_time()
        yield
        end, cpu = time.perf_counter(), time.thread_time() - cpu
        self._add(action, start, end, cpu)

    @contextmanager
    def round(self, actions: tuple[Action, ...]) -> Iterator[None]:
        """Time the block as one round of transfers: each action spans the whole round."""
        start = time.perf_counter()
        yield
        end = time.perf_counter()
        for action in actions:
            self._add(action, start, end, end - start)

    def received(self, action: Action) -> None:
        """End the record of receive `action` (timed with its round) now, when its data
        has been waited for."""
        record = self.records[self._index[str(action)]]
        record.end_s = max(record.end_s, time.perf_counter() - self.origin)
        record.cpu_s = record.end_s - record.start_s

    def _add(self, action: Action, start: float, end: float, cpu: float) -> None:
        self._index[str(action)] = len(self.records)
        self.records.append(
            ActionRecord(str(action), action.kind, start - self.origin, end - self.origin, cpu)
        )
