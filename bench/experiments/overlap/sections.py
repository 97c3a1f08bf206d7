"""The `overlap` report's cell table, its replica-agreement section and the sentences
under its pairs table (best cap per network, pairs above the derived ideal, why loopback
and the simulated link differ)."""

from __future__ import annotations

import math
from functools import partial

import pandas as pd

from bench.experiments.overlap.pairs import flag, pairs, whole
from bench.report import (
    Context,
    format_bytes,
    format_percent,
    format_ratio,
    format_seconds,
    markdown_table,
    prose,
)

__all__ = ["every_cell", "replicas_agree", "speedup_lines"]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros


def _best_line(network: str, b: dict) -> str:
    return _prose(
        "best_line",
        network=network,
        cap=format_bytes(b["bucket_cap_bytes"]),
        buckets=b["buckets"],
        overlap=format_seconds(b["overlap_step_s"]),
        serial=format_seconds(b["serial_step_s"]),
        speedup=format_ratio(b["speedup"]),
        basis=b["speedup_basis"],
        ideal=format_ratio(b["ideal_speedup"]),
        hidden=format_percent(b["hidden_fraction"], 0),
        best_cap=format_bytes(b["best_serial_bucket_cap_bytes"]),
        best_vs_best=format_ratio(b["best_vs_best_speedup"]),
    )


def _above_ideal(table: pd.DataFrame) -> str:
    above = table[table["speedup"] > table["ideal_speedup"]]
    listed = [
        f"{r.network} at {format_bytes(r.bucket_cap_bytes)}: {format_ratio(r.speedup)} "
        f"against {format_ratio(r.ideal_speedup)}, all-reduce "
        f"{format_seconds(r.overlap_allreduce_s)} on / {format_seconds(r.serial_allreduce_s)} off"
        for r in above.itertuples()
    ]
    return _prose("above_ideal", listed=listed) if listed else ""


def _contention_note(ctx: Context, best: dict[str, dict]) -> str:
    """Why loopback and the simulated link differ, with this run's numbers only."""
    ok = ctx.ok
    world = whole(float(pd.to_numeric(ok["world_size"], errors="coerce").max()))
    cores = int(ctx.cores) if math.isfinite(ctx.cores) else None
    parts = [_prose("contention", cores=cores, world=world)]
    flags = flag(ok["overlap"])
    for network, b in best.items():
        at_cap = (ok["network"] == network) & (ok["bucket_cap_bytes"] == b["bucket_cap_bytes"])
        on, off = ok[at_cap & flags], ok[at_cap & ~flags]
        if len(on) and len(off):
            parts.append(
                _prose(
                    "contention_at",
                    network=network,
                    cap=format_bytes(b["bucket_cap_bytes"]),
                    speedup=format_ratio(b["speedup"]),
                    on=format_seconds(on["backward_s"].iloc[0]),
                    off=format_seconds(off["backward_s"].iloc[0]),
                )
            )
    return " ".join(parts)


def speedup_lines(ctx: Context, table: pd.DataFrame, best: dict[str, dict]) -> str:
    lines = "\n".join(_best_line(network, b) for network, b in best.items())
    return "\n\n".join(p for p in (lines, _above_ideal(table), _contention_note(ctx, best)) if p)


def every_cell(ctx: Context) -> str | None:
    """Every cell"""
    ok = ctx.ok
    if ok.empty:
        return None
    table = pd.DataFrame(
        {
            "network": ok["network"],
            "bucket cap": ok["bucket_cap_bytes"].map(format_bytes),
            "buckets": ok["buckets"].map(lambda v: whole(float(v))),
            "overlap": flag(ok["overlap"]).map({True: "on", False: "off"}),
            "step time": ok["step_time_s"].map(format_seconds),
            "forward": ok["forward_s"].map(format_seconds),
            "backward": ok["backward_s"].map(format_seconds),
            "all-reduce": ok["allreduce_s"].map(format_seconds),
            "last bucket": ok["last_bucket_s"].map(format_seconds),
            "exposed sync": ok["exposed_sync_s"].map(format_seconds),
            "hidden": ok["hidden_fraction"].map(lambda v: format_percent(v, 0)),
            "simulated": ok["simulated_s"].map(format_seconds),
            "bytes / step": ok["bytes_per_step"].map(format_bytes),
            "wrong": ok["wrong"].map(lambda v: whole(float(v))),
        }
    )
    return markdown_table(table)


def replicas_agree(ctx: Context) -> str | None:
    """Overlap changes when buckets are summed, not what

    The serial and overlapped cells of one network and cap train the same replicas on the
    same batch: they must end with bitwise the same parameters; so must each paired
    cell's twin replica."""
    ok = ctx.ok
    table = pairs(ok) if not ok.empty else pd.DataFrame()
    same = int(table["same_parameters"].sum()) if len(table) else 0
    ctx.headline.update(pairs_bitwise_equal=same, pairs=len(table))
    if ok.empty:
        return None
    twins = ok.get("twin_same_parameters", pd.Series(dtype=object))
    twins = twins[twins.map(lambda v: str(v) in ("True", "False"))]
    equal = int((twins.astype(str) == "True").sum())
    ctx.finding(
        _prose("bitwise_finding"),
        same == len(table) and equal == len(twins),
        f"{same} of {len(table)} pairs, {equal} of {len(twins)} twins",
    )
    counts = {"same": same, "pairs": len(table), "equal_twins": equal, "twins": len(twins)}
    return _prose("replicas", **counts)
