"""Legacy report writers, moving into `bench/experiments/<name>/report.py`; the helpers
they import now live in `bench.report`."""

from bench.report.format import *  # noqa: F403
from bench.report.format import __all__ as _format_all
from bench.report.plots import PLOT_DPI, log2_axis, new_figure, save_figure

__all__ = [*_format_all, "PLOT_DPI", "log2_axis", "new_figure", "save_figure"]
