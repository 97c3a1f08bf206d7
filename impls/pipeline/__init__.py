"""Pipeline parallelism: schedules as data, their validation, and their replayed timelines.

A schedule is a pure function returning a `Plan` (rank -> ordered `Action`s, `1F0` =
stage 1's forward of micro-batch 0); `insert_communication` adds the transfers, `dry_run`
checks a plan without starting a process, and `replay` computes its ideal timeline.
"""

from impls.pipeline.actions import Action, Plan, plan_from_csv, plan_to_csv
from impls.pipeline.replay import ActionSpan, Timeline, max_inflight_microbatches, replay
from impls.pipeline.schedules import SCHEDULES, build_plan
from impls.pipeline.theory import utilization_bound
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
    "ActionSpan",
    "DryRunResult",
    "Plan",
    "PlanError",
    "Timeline",
    "build_plan",
    "dry_run",
    "insert_communication",
    "max_inflight_microbatches",
    "plan_from_csv",
    "plan_to_csv",
    "replay",
    "utilization_bound",
    "validate",
]
