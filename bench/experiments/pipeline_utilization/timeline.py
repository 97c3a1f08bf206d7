"""A distbench cell's records turned into its timeline columns, spans and trace.

Utilization is Σ busy / (P × makespan), two ways. *Wall clock*: the timed steps' records
on this host's clock. *Replayed*: the plan's dependency graph with each compute action
costing its measured thread CPU time (the fastest of its stage's actions of its kind, in
the profiling steps in which ranks compute one at a time: `bench.kit.host.HostComputeLock`)
and each transfer the measured cost of one activation between two otherwise idle ranks
(`bench.kit.host.probe_pairs`), as if every rank had its own device. `util_replayed_raw`
replays each timed step as recorded instead (median over steps).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

from bench.report import write_text_atomic
from impls.pipeline import (
    Action,
    Plan,
    Timeline,
    chrome_trace_json,
    max_inflight_microbatches,
    replay,
    replay_measured,
    utilization_bound,
    utilization_wall,
)
from impls.pipeline.actions import COMPUTE_KINDS
from impls.pipeline.schedules import stage_ranks

__all__ = ["action_costs", "columns", "replayed", "write_trace"]

Records = dict[int, list]  # rank -> that rank's action records of one step


def _steps(per_rank: list[dict], field: str) -> list[Records]:
    """Each recorded step's records by rank, from every rank's `field`."""
    count = len(per_rank[0][field])
    return [{r["rank"]: r[field][i] for r in per_rank} for i in range(count)]


def _stage_count(key: dict[str, Any]) -> int:
    return key["stages"] * key["virtual_stages"]


def _stage_ranks(key: dict[str, Any]) -> tuple[int, ...] | None:
    return stage_ranks(key["schedule"], key["stages"], key["virtual_stages"])


def _transfer(per_rank: list[dict]) -> float:
    """The median of the ranks' probed transfer seconds (0 without a probe)."""
    probes = [r["transfer_s"] for r in per_rank if r.get("transfer_s") is not None]
    return statistics.median(probes) if probes else 0.0


def replayed(
    plan: Plan, key: dict[str, Any], per_rank: list[dict], field: str = "isolated_records"
) -> Timeline:
    """The plan replayed with the action costs of the profiling steps in `field` and the
    probed transfer."""
    costs = action_costs(_steps(per_rank, field))
    return replay(plan, costs, _transfer(per_rank), _stage_count(key), _stage_ranks(key))


def _theory(key: dict[str, Any]) -> float:
    try:
        return utilization_bound(
            key["schedule"], key["stages"], key["microbatches"], key["virtual_stages"]
        )
    except ValueError:  # e.g. ZB-H1's bound assumes M ≥ P, ZB-H2's M ≥ 2P−1
        return math.nan


def columns(
    plan: Plan, key: dict[str, Any], per_rank: list[dict], fused_twin: Plan | None = None
) -> dict[str, Any]:
    """Utilization wall-clock and replayed, memory and in-flight counts; with `fused_twin`
    (a ZB-H1 cell's 1F1B twin), the twin's replayed step and stage costs from its own
    profiling steps, which alternated with the cell's."""
    steps = _steps(per_rank, "records")
    timeline = replayed(plan, key, per_rank)
    in_step = [
        replay_measured(plan, records, _stage_count(key), stage_ranks=_stage_ranks(key))
        for records in steps
    ]
    return {
        "util_wall": statistics.median(utilization_wall(records) for records in steps),
        "util_replayed": timeline.utilization,
        "util_theory": _theory(key),
        "bubble_fraction": 1.0 - timeline.utilization,
        "peak_activation_bytes": max(r["peak_activation_bytes"] for r in per_rank),
        "max_inflight_microbatches": max(r["max_inflight"] for r in per_rank),
        "max_inflight_plan": max(max_inflight_microbatches(plan).values()),
        "transfer_s": _transfer(per_rank),
        "util_replayed_raw": statistics.median(t.utilization for t in in_step),
        "replayed_makespan_s": timeline.makespan,
        "stage_costs": json.dumps(stage_costs(_steps(per_rank, "isolated_records"))),
        **_twin_columns(fused_twin, key, per_rank),
    }


def _twin_columns(plan: Plan | None, key: dict[str, Any], per_rank: list[dict]) -> dict:
    """`twin_1f1b_replayed_s` and `twin_1f1b_stage_costs`: the 1F1B twin replayed as the cell
    is (its own fastest action costs, the same probed transfer); NaN / "" without a twin."""
    if plan is None or not per_rank[0].get("twin_isolated_records"):
        return {"twin_1f1b_replayed_s": math.nan, "twin_1f1b_stage_costs": ""}
    twin_key = {**key, "schedule": "1f1b", "virtual_stages": 1}
    twin = replayed(plan, twin_key, per_rank, field="twin_isolated_records")
    steps = _steps(per_rank, "twin_isolated_records")
    return {
        "twin_1f1b_replayed_s": twin.makespan,
        "twin_1f1b_stage_costs": json.dumps(stage_costs(steps)),
    }


def stage_costs(steps: list[Records]) -> dict[str, dict[str, float]]:
    """Per stage, the cost of each compute kind it ran (F, B or I and W), as `action_costs`
    prices them: {"0": {"F": seconds, "I": …, "W": …}, …}, stored as JSON in the row."""
    costs: dict[str, dict[str, float]] = {}
    for action, seconds in action_costs(steps).items():
        costs.setdefault(str(action.stage), {})[action.kind] = seconds
    return {stage: costs[stage] for stage in sorted(costs, key=int)}


def action_costs(steps: list[Records]) -> dict[Action, float]:
    """Each compute action's cost: the fastest CPU time of its stage's actions of its kind.

    Every micro-batch of a stage does the same work on same-shaped tensors, so each sample
    is that work's cost plus whatever the host added while it ran (another process on the
    core, a cold cache): the disturbance only ever adds, so the fastest of the cell's
    micro-batches and profiling steps is the closest to the cost, as the fastest ping-pong
    prices a transfer. A median drifted with the host's load, and unevenly across stages
    (CI measured GPipe 4 × 4 at 53% with stage costs 1.5× a quiet run's and ±15% apart).
    """
    seen: dict[tuple[int, str], list[float]] = {}
    actions: set[Action] = set()
    for records_by_rank in steps:
        for records in records_by_rank.values():
            for record in records:
                if record.kind in COMPUTE_KINDS:
                    action = Action.parse(record.action)
                    actions.add(action)
                    seen.setdefault((action.stage, action.kind), []).append(record.cpu_s)
    cost = {key: min(times) for key, times in seen.items()}
    return {action: cost[(action.stage, action.kind)] for action in actions}


def write_trace(
    folder: Path, stem: str, plan: Plan, key: dict[str, Any], per_rank: list[dict]
) -> dict[str, str]:
    """`folder/traces/<stem>.json` (Chrome trace) and `<stem>_spans.csv` (the Gantt data) of
    the timed step whose wall-clock utilization is the median; their paths from `folder`."""
    steps = _steps(per_rank, "records")
    walls = [utilization_wall(records) for records in steps]
    chosen = steps[sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]]
    (folder / "traces").mkdir(parents=True, exist_ok=True)
    files = {"trace_file": f"traces/{stem}.json", "spans_file": f"traces/{stem}_spans.csv"}
    write_text_atomic(folder / files["trace_file"], chrome_trace_json(chosen))
    _write_spans(folder / files["spans_file"], chosen, replayed(plan, key, per_rank))
    return files


def _write_spans(path: Path, records_by_rank: Records, timeline: Timeline) -> None:
    """The Gantt data the report draws: one row per action, replayed and wall clock."""
    rows = []
    for span in timeline.spans:
        action = span.action
        rows.append(
            [
                "replayed",
                span.rank,
                str(action),
                action.stage,
                action.kind,
                action.microbatch,
                span.start,
                span.end,
            ]
        )
    origin = min((rec.start_s for recs in records_by_rank.values() for rec in recs), default=0.0)
    for rank, records in sorted(records_by_rank.items()):
        for rec in records:
            action = Action.parse(rec.action)
            rows.append(
                [
                    "wall",
                    rank,
                    rec.action,
                    action.stage,
                    action.kind,
                    action.microbatch,
                    rec.start_s - origin,
                    rec.end_s - origin,
                ]
            )
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(
        ["timeline", "rank", "action", "stage", "kind", "microbatch", "start_s", "end_s"]
    )
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue())
