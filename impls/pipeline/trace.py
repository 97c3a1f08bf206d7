"""Measured pipeline timelines: a Chrome trace, wall-clock utilization, and the replay.

The design reports utilization twice, and the two must never be confused:

- `utilization_wall`: Σ compute busy / (P × makespan) from the wall-clock records. Faithful
  only when every rank had a core of its own; with ranks sharing cores, a rank's action
  also takes longer while its neighbours compute.
- `replay_measured`: the executed plan replayed (`impls.pipeline.replay`) with each compute
  action's measured thread CPU time and a measured transfer cost — the timeline "as if
  every rank had its own device". Thread CPU time equals the action's cost only when the
  rank computes on one thread (`torch.get_num_threads() == 1`), as distbench's CPU ranks
  do on a shared host.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from impls.pipeline.actions import COMPUTE_KINDS, Action, Plan
from impls.pipeline.dataflow import StageRanks, partner
from impls.pipeline.executor import ActionRecord
from impls.pipeline.replay import Timeline, replay

__all__ = [
    "chrome_trace",
    "chrome_trace_json",
    "replay_measured",
    "transfer_costs",
    "utilization_wall",
]

Records = Mapping[int, Sequence[ActionRecord]]
TRANSFER_MODES = ("median", "each")


def chrome_trace(records_by_rank: Records, path: str | Path) -> None:
    """Write the records as Chrome trace-event JSON (see `chrome_trace_json`)."""
    Path(path).write_text(chrome_trace_json(records_by_rank))


def chrome_trace_json(records_by_rank: Records) -> str:
    """The records as Chrome trace-event JSON (Perfetto, chrome://tracing).

    One complete event (`ph: "X"`) per record: `pid` 0, `tid` the rank, `ts`/`dur` in µs,
    `name` the action (`1F0`), `cat` its kind; thread-name metadata labels each row.
    """
    events: list[dict] = []
    for rank in sorted(records_by_rank):
        events.append(
            {
                "ph": "M",
                "pid": 0,
                "tid": rank,
                "name": "thread_name",
                "args": {"name": f"rank {rank}"},
            }
        )
        for record in records_by_rank[rank]:
            events.append(
                {
                    "ph": "X",
                    "pid": 0,
                    "tid": rank,
                    "name": record.action,
                    "cat": record.kind,
                    "ts": record.start_s * 1e6,
                    "dur": (record.end_s - record.start_s) * 1e6,
                    "args": {"cpu_ms": record.cpu_s * 1e3},
                }
            )
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})


def utilization_wall(records_by_rank: Records) -> float:
    """Σ compute (F/B/I/W) wall time / (P × makespan), makespan = max end − min start."""
    records = [r for rank_records in records_by_rank.values() for r in rank_records]
    if not records:
        return 0.0
    makespan = max(r.end_s for r in records) - min(r.start_s for r in records)
    busy = sum(r.end_s - r.start_s for r in records if r.kind in COMPUTE_KINDS)
    return busy / (len(records_by_rank) * makespan) if makespan > 0 else 0.0


def transfer_costs(records_by_rank: Records) -> dict[Action, float]:
    """Each transfer's measured seconds, keyed by its send action (`0SEND_F3`).

    The receive's end − max(starts), floored at 0 (the barrier's clock skew can push a
    short one below zero).

    A transfer's cost is read off both ends of the message: from the moment the later of the
    two ends was posted until the receiver had the data (a send's round ends when it has
    handed the message over, which says nothing of its delivery); the rest of the receive's
    span is waiting for the peer, which is bubble, not transfer. Times share an origin across
    ranks only up to the skew of the barrier that opened the step.
    """
    spans: dict[Action, tuple[float, float]] = {}
    for rank_records in records_by_rank.values():
        for record in rank_records:
            if record.kind not in COMPUTE_KINDS:
                spans[Action.parse(record.action)] = (record.start_s, record.end_s)
    costs: dict[Action, float] = {}
    for action, (start, _end) in spans.items():
        if not action.kind.startswith("SEND"):
            continue
        other = spans.get(partner(action))
        if other is None:
            raise ValueError(f"{action} was recorded but its partner {partner(action)} was not")
        costs[action] = max(0.0, other[1] - max(start, other[0]))
    return costs


def replay_measured(
    plan: Plan,
    records_by_rank: Records,
    num_stages: int,
    transfer: str | float = "median",
    stage_ranks: StageRanks | None = None,
) -> Timeline:
    """Replay `plan` with measured costs: each compute action's `cpu_s`, and transfers'.

    `transfer="median"` prices every transfer at the median of this step's measured
    transfer costs (robust to a rank being descheduled mid-message on a shared host);
    `"each"` uses each transfer's own measurement; a number prices every transfer at that
    many seconds (0.0: the textbook's free transfers). `plan` may hold transfers or not
    (the replay skips them). Raises KeyError if a compute action of `plan` has no record.
    """
    durations: dict[Action, float] = {}
    for rank_records in records_by_rank.values():
        for record in rank_records:
            if record.kind in COMPUTE_KINDS:
                durations[Action.parse(record.action)] = record.cpu_s
    if not isinstance(transfer, str):
        return replay(plan, durations, float(transfer), num_stages, stage_ranks)
    if transfer not in TRANSFER_MODES:
        raise ValueError(
            f"transfer={transfer!r}: choose one of {', '.join(TRANSFER_MODES)} or a number"
        )
    costs = transfer_costs(records_by_rank)
    if transfer == "each":
        return replay(plan, durations, costs, num_stages, stage_ranks)
    median = statistics.median(costs.values()) if costs else 0.0
    return replay(plan, durations, median, num_stages, stage_ranks)
