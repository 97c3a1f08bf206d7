"""Pipeline parallelism: schedules as data, their validation, and their replayed timelines.

A schedule is a pure function returning a `Plan` (rank -> ordered `Action`s, `1F0` =
stage 1's forward of micro-batch 0); `insert_communication` adds the transfers, `dry_run`
checks a plan without starting a process, and `replay` computes its ideal timeline.
`PipelineExecutor` runs a plan on P ranks and records every action; `impls.pipeline.trace`
turns the records into a Chrome trace, wall-clock utilization and a measured replay.
"""

from importlib import import_module

from impls.pipeline.actions import Action, Plan, plan_from_csv, plan_to_csv
from impls.pipeline.replay import ActionSpan, Timeline, max_inflight_microbatches, replay
from impls.pipeline.schedules import SCHEDULES, build_plan, utilization_bound
from impls.pipeline.validate import (
    DryRunResult,
    PlanError,
    dry_run,
    insert_communication,
    validate,
)

# The executor and the trace need torch; they load on first use, so that reading the
# schedule registry (the reports do) stays light.
_LAZY = {
    "ActionRecord": "executor",
    "PipelineExecutor": "executor",
    "StepResult": "executor",
    "chrome_trace": "trace",
    "chrome_trace_json": "trace",
    "replay_measured": "trace",
    "transfer_costs": "trace",
    "utilization_wall": "trace",
}

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


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"impls.pipeline.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'impls.pipeline' has no attribute {name!r}")
