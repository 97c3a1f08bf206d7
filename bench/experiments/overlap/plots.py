"""The `overlap` report's plots: step time against bucket cap (both settings and the
derived ideal), and the hidden fraction and exposed sync against bucket cap."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bench.experiments.overlap.pairs import flag
from bench.report import log2_axis, new_figure

__all__ = ["hidden_figure", "step_time_figure"]


def _networks(df: pd.DataFrame) -> list[str]:
    return [str(n) for n in pd.unique(df["network"])]


def _caps(ok: pd.DataFrame) -> list[int]:
    return sorted(int(c) for c in ok["bucket_cap_bytes"].unique())


def step_time_figure(ok: pd.DataFrame, table: pd.DataFrame) -> Any:
    """One panel per network: each setting's step time against the bucket cap (a pair's
    as its table shows it, pooled with the twin), and the ideal derived from it."""
    networks = _networks(ok)
    fig, axes = new_figure(6 * len(networks), 4.5, 1, len(networks))
    flags = flag(ok["overlap"])
    pooled = {}
    for r in table.itertuples() if len(table) else ():
        pooled[(r.network, r.bucket_cap_bytes, False)] = r.serial_step_s
        pooled[(r.network, r.bucket_cap_bytes, True)] = r.overlap_step_s
    for ax, network in zip(axes, networks, strict=True):
        for overlap, colour, name in (
            (False, "#DD8452", "overlap off"),
            (True, "#4C72B0", "overlap on"),
        ):
            rows = ok[(ok["network"] == network) & (flags == overlap)]
            rows = rows.sort_values("bucket_cap_bytes")
            steps = [
                pooled.get((network, int(cap), overlap), own)
                for cap, own in zip(rows["bucket_cap_bytes"], rows["step_time_s"], strict=True)
            ]
            ax.plot(
                rows["bucket_cap_bytes"],
                1e3 * np.asarray(steps, dtype=float),
                "o-",
                color=colour,
                label=name,
            )
        ideal = table[table["network"] == network] if len(table) else table
        if len(ideal):
            ideal = ideal.sort_values("bucket_cap_bytes")
            ax.plot(
                ideal["bucket_cap_bytes"],
                1e3 * ideal["ideal_step_s"],
                "k--",
                alpha=0.6,
                label="ideal: serial − S (derived from measurements)",
            )
        log2_axis(ax, _caps(ok), as_bytes=True)
        ax.set(
            xlabel="bucket cap",
            ylabel="step time (ms, slowest rank, median; with twin)",
            title=network,
        )
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    return fig


def hidden_figure(ok: pd.DataFrame) -> Any:
    """The share of all-reduce time hidden behind backward (overlap on), and the exposed
    sync per step of both settings, against the bucket cap."""
    flags = flag(ok["overlap"])
    fig, (hidden_ax, exposed_ax) = new_figure(12, 4.5, 1, 2)
    for i, network in enumerate(_networks(ok)):
        colour = f"C{i % 10}"
        rows = ok[ok["network"] == network].assign(_on=flags).sort_values("bucket_cap_bytes")
        on, off = rows[rows["_on"]], rows[~rows["_on"]]
        hidden_ax.plot(
            on["bucket_cap_bytes"], 100 * on["hidden_fraction"], "o-", color=colour, label=network
        )
        exposed_ax.plot(
            off["bucket_cap_bytes"],
            1e3 * off["exposed_sync_s"],
            "s--",
            color=colour,
            label=f"{network}, overlap off",
        )
        exposed_ax.plot(
            on["bucket_cap_bytes"],
            1e3 * on["exposed_sync_s"],
            "o-",
            color=colour,
            label=f"{network}, overlap on",
        )
    for ax in (hidden_ax, exposed_ax):
        log2_axis(ax, _caps(ok), as_bytes=True)
        ax.set_xlabel("bucket cap")
        ax.legend(fontsize="small")
    hidden_ax.set(
        ylabel="all-reduce time before backward ended (%)",
        ylim=(0, 100),
        title="Hidden behind backward (overlap on)",
    )
    exposed_ax.set(ylabel="exposed sync per step (ms)", title="Sync the step still waited for")
    exposed_ax.set_ylim(bottom=0)
    return fig
