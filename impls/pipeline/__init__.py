"""Pipeline parallelism: schedules as data, their validation, and their replayed timelines.

A schedule is a pure function returning a `Plan` (rank -> ordered `Action`s, `1F0` =
stage 1's forward of micro-batch 0); `insert_communication` adds the transfers, `dry_run`
checks a plan without starting a process, and `replay` computes its ideal timeline.
`PipelineExecutor` runs a plan on P ranks and records every action; `impls.pipeline.trace`
turns the records into a Chrome trace, wall-clock utilization and a measured replay.
"""

from impls.pipeline.actions import Action, Plan, plan_from_csv, plan_to_csv
from impls.pipeline.executor import ActionRecord, PipelineExecutor, StepResult
from impls.pipeline.replay import ActionSpan, Timeline, max_inflight_microbatches, replay
from impls.pipeline.schedules import SCHEDULES, build_plan
from impls.pipeline.theory import utilization_bound
from impls.pipeline.trace import (
    chrome_trace,
    chrome_trace_json,
    replay_measured,
    transfer_costs,
    utilization_wall,
)
from impls.pipeline.validate import (
    DryRunResult,
    PlanError,
    dry_run,
    insert_communication,
    validate,
)

__all__ = [
    "SCHEDULES",
    "Action",
    "ActionRecord",
    "ActionSpan",
    "DryRunResult",
    "PipelineExecutor",
    "Plan",
    "PlanError",
    "StepResult",
    "Timeline",
    "build_plan",
    "chrome_trace",
    "chrome_trace_json",
    "dry_run",
    "insert_communication",
    "max_inflight_microbatches",
    "plan_from_csv",
    "plan_to_csv",
    "replay",
    "replay_measured",
    "transfer_costs",
    "utilization_bound",
    "utilization_wall",
    "validate",
]
