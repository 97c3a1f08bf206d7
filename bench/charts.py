"""A headline figure as data: which results columns it plots, and how. wandb draws each
as a native chart from the experiment's results table (`bench.wandb_log`), and the saved
dashboard (`bench.dashboard`) places one panel per chart; both read only these fields,
so a chart names columns that the experiment's `results.csv` really has (a test checks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Chart"]


@dataclass(frozen=True, kw_only=True)
class Chart:
    """One figure: `y` against `x`, one series per value of `group` (if any)."""

    title: str
    x: str
    y: str
    kind: Literal["line", "scatter", "bar"] = "line"
    group: str | None = None
    """The column whose values become separate series (an algorithm, a schedule)."""
    log_x: bool = False
    log_y: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("line", "scatter", "bar"):
            raise ValueError(f"Chart.kind={self.kind!r}; allowed values: line, scatter, bar")

    @property
    def columns(self) -> tuple[str, ...]:
        """Every results column the chart reads."""
        return (self.x, self.y) if self.group is None else (self.x, self.y, self.group)
