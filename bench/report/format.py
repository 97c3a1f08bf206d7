"""Report writers: turn a results DataFrame into `report.md`, PNGs and `headline.json`.

Each experiment has one module here with `write_report(df, report_dir) -> dict`; `index`
gathers every `headline.json` into `reports/README.md`. Writers read results only (they
never import `impls`), and every number they print is either taken from the DataFrame or is
theory labelled with its source. This module holds the formatting and file helpers they
share.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

__all__ = [
    "METADATA_COLUMNS",
    "PLOT_DPI",
    "failed_cells_markdown",
    "failed_rows",
    "failures_list",
    "figure_row",
    "format_bytes",
    "format_ratio",
    "format_seconds",
    "log2_axis",
    "markdown_table",
    "metadata_summary",
    "new_figure",
    "ok_rows",
    "run_context",
    "save_figure",
    "to_jsonable",
    "write_headline",
    "write_text_atomic",
]

METADATA_COLUMNS = ("git_sha", "torch_version", "backend", "device", "host", "host_cores")
PLOT_DPI = 120
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def format_bytes(n_bytes: float | None) -> str:
    """`4096 -> "4 KiB"`, `1.5 * 2**20 -> "1.5 MiB"`; missing values print as "—"."""
    if _is_missing(n_bytes):
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
    if _is_missing(seconds):
        return "—"
    value = float(seconds)
    # Pick the unit after rounding to 3 digits, so 0.9996 s reads "1 s", not "1e+03 ms".
    if abs(float(f"{value:.3g}")) < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if abs(float(f"{value:.3g}")) < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def format_ratio(ratio: float | None) -> str:
    return "—" if _is_missing(ratio) else f"{float(ratio):.2f}×"


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose cell ran (`status == "ok"`); a frame without `status` counts as all ok."""
    if "status" not in df.columns:
        return df
    return df[df["status"] == "ok"]


def failed_rows(df: pd.DataFrame) -> pd.DataFrame:
    if "status" not in df.columns:
        return df.iloc[0:0]
    return df[df["status"] != "ok"]


def failures_list(df: pd.DataFrame, keys: Iterable[str]) -> list[dict[str, Any]]:
    """One JSON-ready dict per failed cell: its grid keys and its error text."""
    failed = failed_rows(df)
    columns = [key for key in keys if key in failed.columns]
    records = []
    for _, row in failed.iterrows():
        record = {key: to_jsonable(row[key]) for key in columns}
        error = row.get("error", "")
        record["error"] = "" if _is_missing(error) else str(error)
        records.append(record)
    return records


def _plain(value: Any) -> str:
    """`2.0 -> "2"`: integer metadata (host_cores) read back from CSV arrives as float."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def failed_cells_markdown(failures: list[dict[str, Any]]) -> str:
    """A "Failed cells (k)" subsection listing each failed cell's keys and error."""
    table = pd.DataFrame(failures)
    if "message_bytes" in table:
        table["message_bytes"] = table["message_bytes"].map(format_bytes)
    listing = markdown_table(table) if failures else "No failed cells."
    return f"### Failed cells ({len(failures)})\n\n{listing}\n"


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


def run_context(df: pd.DataFrame) -> str:
    """Where and when the run happened, plus the core-sharing caveat when it applies."""
    meta = metadata_summary(df)
    text = (
        f"Host `{meta['host']}` ({meta['host_cores']} cores, device {meta['device']}), torch "
        f"{meta['torch_version']}, backend {meta['backend']}, git `{meta['git_sha']}`, run "
        f"{meta['timestamp']}."
    )
    cores = pd.to_numeric(pd.Series([meta["host_cores"]]), errors="coerce").iloc[0]
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
    return df.to_markdown(index=False, disable_numparse=not numparse)


def figure_row(figure: str, theory: str, source: str, measured: str, gap: str) -> dict[str, str]:
    """One row of the headline table that `reports/README.md` collects."""
    return {"figure": figure, "theory": theory, "source": source, "measured": measured, "gap": gap}


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
    """Write through a temporary file, so an interrupted run never leaves half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_headline(report_dir: Path, headline: Mapping[str, Any]) -> Path:
    path = Path(report_dir) / "headline.json"
    write_text_atomic(path, json.dumps(to_jsonable(headline), indent=2, ensure_ascii=False) + "\n")
    return path


def save_figure(fig: Any, path: Path) -> Path:
    """Save a `matplotlib.figure.Figure` (built without pyplot, so no global state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=PLOT_DPI, bbox_inches="tight")
    return path


def new_figure(
    width: float, height: float = 4.5, rows: int = 1, cols: int = 1, **subplots: Any
) -> tuple[Figure, np.ndarray]:
    """A pyplot-free Figure with a flat array of whitegrid axes."""
    with sns.axes_style("whitegrid"):
        fig = Figure(figsize=(width, height))
        axes = fig.subplots(rows, cols, squeeze=False, **subplots)
    return fig, np.asarray(axes).ravel()


def log2_axis(ax: Any, ticks: Iterable[float], as_bytes: bool = False) -> None:
    """Log-2 x axis with ticks only at `ticks`, labelled as plain numbers or KiB/MiB."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks))
    label = format_bytes if as_bytes else (lambda v: f"{v:g}")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: label(v)))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
