"""Schedule names and torch's rules, plain data: the grid, the ranks and the report share
them (the report reads results only, so nothing here imports `impls` or torch).

A `torch_*` schedule is a torch.distributed.pipelining baseline, the twin of the
distbench schedule of the same name; torch's cells also follow distbench's rules (the
interleaved schedules need M divisible by P).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SLICINGS", "TORCH_SCHEDULES", "declared", "slicing_of", "torch_refuses", "torch_twin"]

# distbench name of each torch.distributed.pipelining baseline -> torch's schedule class
TORCH_SCHEDULES = {
    "torch_gpipe": "ScheduleGPipe",
    "torch_1f1b": "Schedule1F1B",
    "torch_interleaved_1f1b": "ScheduleInterleaved1F1B",
}
# How a cell cuts the model into stages: equal block counts, or Alpa's cut (`slicing.py`)
SLICINGS = ("equal", "alpa")


def slicing_of(value: object) -> str:
    """A row's slicing; rows written before the `slicing` column existed were equal."""
    return value if isinstance(value, str) and value else "equal"


def torch_twin(schedule: str) -> str | None:
    """torch's baseline of a distbench schedule (`gpipe` -> `torch_gpipe`), or None."""
    twin = f"torch_{schedule}"
    return twin if twin in TORCH_SCHEDULES else None


def torch_refuses(schedule: str, stages: int, microbatches: int) -> str | None:
    """Why torch's `schedule` cannot take P = `stages`, M = `microbatches` beyond distbench's
    own rules; None if it can (or if `schedule` is not torch's)."""
    if schedule == "torch_1f1b" and microbatches < stages:
        return f"torch's Schedule1F1B needs microbatches ≥ stages={stages}"
    return None


def declared(rows: Any, column: str) -> dict[str, Any]:
    """Schedule -> what its spec declares in `column` of the results (`schedule_label`,
    `bound_source`, `marker`, `schedule_rank`, `split_backward`: the experiment writes
    them, `config.declared_columns`), for the schedules whose rows hold one."""
    if column not in rows.columns or rows.empty:
        return {}
    held = rows[rows[column].notna() & (rows[column].astype(str) != "")]
    return {str(s): v for s, v in held.groupby("schedule")[column].first().items()}
