"""Targets judged on every cell they apply to, never on a median.

A `Target` is a claim such as "ZeRO-3 step time ≤ 1.25× FSDP2": a results column, a
bound, and the cells it applies to (`where`). `Target.judge` reads every such cell that
ran and returns a `Verdict`: the median beside the worst cell, with that cell's key, and
whether every cell meets the bound. A target is met only if its worst cell meets it.

Cells that cannot be fair on the host that measured them (a wall-clock target, more
ranks than cores: ranks wait for a core as well as for each other) are still judged and
shown, labelled; when only such cells miss the bound the verdict says so rather than
dropping them.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bench.report.format import format_ratio, host_cores, to_jsonable

__all__ = ["Target", "Verdict", "canonical", "key_text", "select"]

_OPS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    "<=": (operator.le, "≤"),
    "<": (operator.lt, "<"),
    ">=": (operator.ge, "≥"),
    ">": (operator.gt, ">"),
}


def canonical(value: Any) -> str:
    """One text per value whatever its type after a CSV round trip: `2`, `2.0` and `"2"`
    read alike, as do `True` and `"True"`."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and number.is_integer():
            return str(int(number))
        return repr(number)
    text = str(value)
    try:
        return canonical(float(text)) if text not in ("True", "False") else text
    except ValueError:
        return text


def select(df: pd.DataFrame, where: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of `df` matching `where`: column -> a value, or a list/tuple of values."""
    mask = pd.Series(True, index=df.index)
    for column, wanted in where.items():
        if column not in df.columns:
            return df.iloc[0:0]
        allowed = wanted if isinstance(wanted, list | tuple | set) else [wanted]
        texts = {canonical(v) for v in allowed}
        mask &= df[column].map(canonical).isin(texts)
    return df[mask]


def key_text(row: Mapping[str, Any], key_columns: Sequence[str]) -> str:
    """`method=zero3, world_size=8` for the key columns the row has."""
    return ", ".join(f"{k}={canonical(row[k])}" for k in key_columns if k in row)


@dataclass(frozen=True, kw_only=True)
class Target:
    """A bound every cell in `where` must meet, e.g. step time ratio ≤ 1.25."""

    figure: str
    """What is compared, as the index names it ("ZeRO-3 step time ÷ torch FSDP2")."""
    column: str
    """The results column holding each cell's value (a report may derive it first)."""
    op: str
    """One of <=, <, >=, >."""
    bound: float
    source: str
    """Where the target comes from: an issue, a paper."""
    where: Mapping[str, Any] = field(default_factory=dict)
    """The cells it applies to: column -> value (or list of values)."""
    fmt: Callable[[float], str] = format_ratio
    wall_clock: bool = False
    """Whether the value is a wall-clock time (or a ratio of two): then a cell with more
    ranks than the host's cores is labelled so, as ranks wait for a core as well as for
    each other. Bytes, memory, accuracy and replayed timelines do not depend on it."""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"op={self.op!r}; allowed values: {', '.join(_OPS)}")

    @property
    def bound_text(self) -> str:
        return f"{_OPS[self.op][1]} {self.fmt(self.bound)}"

    def meets(self, value: float) -> bool:
        return math.isfinite(value) and _OPS[self.op][0](value, self.bound)

    def judge(self, ok: pd.DataFrame, key_columns: Sequence[str]) -> Verdict:
        """Every ran cell in `where`, its median and its worst (farthest past the bound)."""
        rows = select(ok, self.where)
        values = (
            pd.to_numeric(rows[self.column], errors="coerce")
            if self.column in rows.columns
            else pd.Series(math.nan, index=rows.index)
        )
        finite = values[values.map(math.isfinite)]
        if finite.empty:
            return Verdict(target=self, cells=len(rows), measured=0)
        higher_is_worse = self.op in ("<=", "<")
        worst_index = finite.idxmax() if higher_is_worse else finite.idxmin()
        cores = host_cores(ok)
        crowded = _crowded(rows, cores if self.wall_clock else math.nan)
        missing = [i for i in finite.index if not self.meets(float(finite[i]))]
        return Verdict(
            target=self,
            cells=len(rows),
            measured=len(finite),
            median=float(finite.median()),
            worst=float(finite[worst_index]),
            worst_key=key_text(rows.loc[worst_index], key_columns),
            worst_crowded=bool(crowded.loc[worst_index]),
            cores=cores,
            missing=[key_text(rows.loc[i], key_columns) for i in missing],
            missing_crowded=int(sum(bool(crowded.loc[i]) for i in missing)),
        )


def _crowded(rows: pd.DataFrame, cores: float) -> pd.Series:
    """Whether each row ran more ranks than the host has cores."""
    if "world_size" not in rows.columns or not math.isfinite(cores):
        return pd.Series(False, index=rows.index)
    return pd.to_numeric(rows["world_size"], errors="coerce") > cores


@dataclass(kw_only=True)
class Verdict:
    """A target judged on the cells of one run."""

    target: Target
    cells: int
    """Cells that ran and that the target applies to."""
    measured: int
    """Of those, cells with a finite value."""
    median: float = math.nan
    worst: float = math.nan
    worst_key: str = ""
    worst_crowded: bool = False
    cores: float = math.nan
    missing: list[str] = field(default_factory=list)
    """Keys of the cells that miss the bound."""
    missing_crowded: int = 0
    """How many of those ran more ranks than cores."""

    @property
    def met(self) -> bool:
        """Every cell the target applies to was measured and meets the bound."""
        return self.measured > 0 and self.measured == self.cells and not self.missing

    @property
    def status(self) -> str:
        if self.cells == 0:
            return "not measured: this run has no cell it applies to"
        if self.measured == 0:
            return "not measured: no cell it applies to has a value"
        if self.met:
            return f"met in all {self.measured} cells"
        if self.measured < self.cells:
            return f"not met: {self.cells - self.measured} of {self.cells} cells have no value"
        misses = len(self.missing)
        text = f"not met in {misses} of {self.measured} cells"
        if self.missing_crowded == misses:
            text += f" (all with more ranks than the host's {int(self.cores)} cores)"
        elif self.missing_crowded:
            text += f" ({self.missing_crowded} with more ranks than cores)"
        return text

    @property
    def worst_text(self) -> str:
        if self.measured == 0:
            return "—"
        label = f"; {int(self.cores)} cores shared by more ranks" if self.worst_crowded else ""
        return f"{self.target.fmt(self.worst)} ({self.worst_key}{label})"

    @property
    def median_text(self) -> str:
        if self.measured == 0:
            return "—"
        return f"{self.target.fmt(self.median)} over {self.measured} cells"

    def as_dict(self) -> dict[str, Any]:
        t = self.target
        return to_jsonable(
            {
                "figure": t.figure,
                "column": t.column,
                "where": dict(t.where),
                "bound": t.bound,
                "op": t.op,
                "bound_text": t.bound_text,
                "source": t.source,
                "cells": self.cells,
                "measured": self.measured,
                "median": self.median,
                "median_text": self.median_text,
                "worst": self.worst,
                "worst_key": self.worst_key,
                "worst_text": self.worst_text,
                "worst_crowded": self.worst_crowded,
                "missing": self.missing,
                "missing_crowded": self.missing_crowded,
                "met": self.met,
                "status": self.status,
            }
        )
