"""Formatting and file helpers every report uses: numbers as people read them (bytes in
KiB/MiB, seconds in µs/ms/s, ratios as 1.23×), pipe tables, JSON-safe values, the run's
metadata as a sentence, and files written atomically."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.results import MEASURED

__all__ = [
    "METADATA_COLUMNS",
    "failed_rows",
    "failures_list",
    "format_bytes",
    "format_count",
    "format_percent",
    "format_ratio",
    "format_seconds",
    "host_cores",
    "is_missing",
    "markdown_table",
    "metadata_summary",
    "ok_rows",
    "run_context",
    "to_jsonable",
    "write_bytes_atomic",
    "write_text_atomic",
]

METADATA_COLUMNS = ("git_sha", "torch_version", "backend", "device", "host", "host_cores")
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def format_bytes(n_bytes: float | None) -> str:
    """`4096 -> "4 KiB"`, `1.5 * 2**20 -> "1.5 MiB"`; missing values print as "—"."""
    if is_missing(n_bytes):
        return "—"
    value = float(n_bytes)
    unit = _BYTE_UNITS[0]
    for unit in _BYTE_UNITS:
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            break
        value /= 1024
    return f"{value:.0f} {unit}" if value == round(value) else f"{value:.3g} {unit}"


def format_seconds(seconds: float | None) -> str:
    """Three significant digits in µs, ms or s."""
    if is_missing(seconds):
        return "—"
    value = float(seconds)
    # Pick the unit after rounding to 3 digits, so 0.9996 s reads "1 s", not "1e+03 ms".
    if abs(float(f"{value:.3g}")) < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if abs(float(f"{value:.3g}")) < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def format_count(value: float | None) -> str:
    """`1536.0 -> "1,536"`; missing values print as "—"."""
    return "—" if is_missing(value) else f"{int(round(float(value))):,}"


def format_ratio(ratio: float | None) -> str:
    return "—" if is_missing(ratio) else f"{float(ratio):.2f}×"


def format_percent(fraction: float | None, digits: int = 1) -> str:
    """`0.571 -> "57.1%"`; missing values print as "—"."""
    return "—" if is_missing(fraction) else f"{100 * float(fraction):.{digits}f}%"


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose cell ran and measured (status "ok", or "wrong": measured but off its
    reference, which the correctness section shows); a frame without `status` counts as
    all ok."""
    if "status" not in df.columns:
        return df
    return df[df["status"].isin(MEASURED)]


def failed_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose cell measured nothing: it raised, crashed or timed out."""
    if "status" not in df.columns:
        return df.iloc[0:0]
    return df[~df["status"].isin(MEASURED)]


def failures_list(df: pd.DataFrame, keys: Iterable[str]) -> list[dict[str, Any]]:
    """One JSON-ready dict per failed cell: its grid keys and its error text."""
    failed = failed_rows(df)
    columns = [key for key in keys if key in failed.columns]
    records = []
    for _, row in failed.iterrows():
        record = {key: to_jsonable(row[key]) for key in columns}
        error = row.get("error", "")
        record["error"] = "" if is_missing(error) else str(error)
        records.append(record)
    return records


def _plain(value: Any) -> str:
    """`2.0 -> "2"`: integer metadata (host_cores) read back from CSV arrives as float."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def metadata_summary(df: pd.DataFrame) -> dict[str, str]:
    """Each metadata column's distinct values, joined; "unknown" where the column is absent."""
    summary = {}
    for column in METADATA_COLUMNS:
        if column not in df.columns:
            summary[column] = "unknown"
            continue
        values = [_plain(v) for v in pd.unique(df[column].dropna())]
        summary[column] = ", ".join(values) if values else "unknown"
    if "timestamp" in df.columns and df["timestamp"].notna().any():
        stamps = sorted(str(v) for v in df["timestamp"].dropna())
        summary["timestamp"] = (
            stamps[0] if stamps[0] == stamps[-1] else f"{stamps[0]} … {stamps[-1]}"
        )
    else:
        summary["timestamp"] = "unknown"
    return summary


def host_cores(df: pd.DataFrame) -> float:
    """The host's core count the rows recorded (NaN when none did)."""
    if "host_cores" not in df.columns or not len(df):
        return math.nan
    return float(pd.to_numeric(df["host_cores"], errors="coerce").max())


def run_context(df: pd.DataFrame) -> str:
    """Where and when the run happened, plus the core-sharing caveat when it applies."""
    meta = metadata_summary(df)
    text = (
        f"Host `{meta['host']}` ({meta['host_cores']} cores, device {meta['device']}), torch "
        f"{meta['torch_version']}, backend {meta['backend']}, git `{meta['git_sha']}`, run "
        f"{meta['timestamp']}."
    )
    cores = host_cores(df)
    largest = pd.to_numeric(df.get("world_size"), errors="coerce").max() if len(df) else 0
    if np.isfinite(cores) and largest > cores:
        text += (
            f" World sizes above {int(cores)} put more ranks than cores on this host: ranks "
            "share cores, so wall-clock numbers here are CPU-bound, not network-bound."
        )
    return text


def markdown_table(df: pd.DataFrame, *, numparse: bool = True) -> str:
    """A pipe table. `numparse=False` keeps formatted strings as written (tabulate would
    otherwise read "+0.50" back as the number 0.5 and drop the sign)."""
    if df.empty:
        return "_(no rows)_"
    # A "|" inside a cell (|x − y|) would end the cell: escape it, as GitHub's tables expect.
    escaped = df.map(lambda v: v.replace("|", "\\|") if isinstance(v, str) else v)
    return escaped.to_markdown(index=False, disable_numparse=not numparse)


def to_jsonable(value: Any) -> Any:
    """numpy scalars to Python, NaN/inf to None, containers recursively."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file of a unique name in the same directory, then rename
    it over `path`: an interrupted run never leaves half a report, and a link planted at
    `path` (or at a guessable temporary name) is replaced, never written through."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """`write_text_atomic` for bytes (plots)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the report from its readers
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
