"""Published training runs, each with its full layout, to hold the simulator against; and the
lecture's own scale figures with the assumptions they rest on.

Every number was read in the cited source (paper table, README or documentation page).
Where a layout detail is not published, the row still needs a value for the simulator;
such fields are named in the row's `assumed` tuple and explained in `notes`. The rows live
by family: `megatron` (Megatron-LM, BLOOM, NeMo) and `fsdp` (llm-foundry, torchtitan,
fms-fsdp, TinyLlama); `schema` holds the row type, its allowed values and FLOP conventions.
"""

from __future__ import annotations

from impls.costmodel.published.fsdp import FSDP_RUNS
from impls.costmodel.published.lecture import LECTURE_FIGURES, LectureFigure
from impls.costmodel.published.megatron import MEGATRON_RUNS
from impls.costmodel.published.schema import (
    ATTENTION_KINDS,
    FLOPS_CONVENTIONS,
    HARDWARE_NAMES,
    LAYOUTS,
    PublishedRun,
    published_plan,
)

__all__ = [
    "ATTENTION_KINDS",
    "FLOPS_CONVENTIONS",
    "HARDWARE_NAMES",
    "LAYOUTS",
    "LECTURE_FIGURES",
    "PUBLISHED_RUNS",
    "LectureFigure",
    "PublishedRun",
    "published_plan",
    "published_run",
]

PUBLISHED_RUNS: tuple[PublishedRun, ...] = MEGATRON_RUNS + FSDP_RUNS


def published_run(name: str) -> PublishedRun:
    """The row of `PUBLISHED_RUNS` called `name`."""
    for run in PUBLISHED_RUNS:
        if run.name == name:
            return run
    choices = ", ".join(run.name for run in PUBLISHED_RUNS)
    raise ValueError(f"run={name!r}: unknown; choose one of {choices}")
