"""Reports: the skeleton every report shares, targets judged on every cell, the index,
and the formatting and plotting helpers the experiments' report sections use.

Report code reads results only: it never imports `impls`.
"""

from bench.report.format import (
    format_bytes,
    format_count,
    format_percent,
    format_ratio,
    format_seconds,
    host_cores,
    is_missing,
    markdown_table,
    ok_rows,
    to_jsonable,
    write_text_atomic,
)
from bench.report.plots import log2_axis, new_figure, save_figure
from bench.report.prose import prose
from bench.report.skeleton import Context, Report, write_report
from bench.report.targets import Target, Verdict, key_text, select

__all__ = [
    "Context",
    "Report",
    "Target",
    "Verdict",
    "format_bytes",
    "format_count",
    "format_percent",
    "format_ratio",
    "format_seconds",
    "host_cores",
    "is_missing",
    "key_text",
    "log2_axis",
    "markdown_table",
    "new_figure",
    "ok_rows",
    "prose",
    "save_figure",
    "select",
    "to_jsonable",
    "write_report",
    "write_text_atomic",
]
