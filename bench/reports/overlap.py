"""Report for `overlap`: DDP's step time with its bucket all-reduces overlapped with
backward and without, per bucket size, on loopback and on a simulated link.

Every measured number is read from results.csv. The one theory figure is Li et al.'s
(VLDB 2020, "PyTorch Distributed"): overlapped, a step ideally takes forward +
max(backward, all-reduce) + optimizer instead of their sum. Buckets refine it: the last
bucket holds the gradients backward produces last and cannot start before backward
ends, so overlap saves at most min(backward, all-reduce − last bucket's all-reduce). The
"ideal" shown beside each pair is that bound evaluated on the serial cell's own measured
times — derived from measurements, and labelled so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.reports import (
    failed_cells_markdown,
    failures_list,
    figure_row,
    format_bytes,
    format_ratio,
    format_seconds,
    log2_axis,
    markdown_table,
    new_figure,
    ok_rows,
    run_context,
    save_figure,
    to_jsonable,
    write_headline,
    write_text_atomic,
)

__all__ = ["IDEAL_SOURCE", "pairs", "write_report"]

KEYS = ["network", "bucket_cap_bytes", "overlap"]
IDEAL_SOURCE = (
    "Li et al., VLDB 2020 (PyTorch Distributed): ideal overlapped step = forward + "
    "max(backward, all-reduce) + optimizer, less the last bucket, which cannot start before "
    "backward ends; evaluated on the serial cell's measured times"
)


def _flag(values: pd.Series) -> pd.Series:
    """The overlap column as bools, whether read back as bools or as text."""
    return values.map(lambda v: v if isinstance(v, bool | np.bool_) else str(v) == "True")


def _plain(value: Any) -> str:
    """`64.0 -> "64"` (integers read back from CSV may arrive as floats)."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _networks(df: pd.DataFrame) -> list[str]:
    return [str(n) for n in pd.unique(df["network"])]


def _is_simulated(label: str) -> bool:
    return label != "loopback"


def _number(row: pd.Series, column: str) -> float:
    value = pd.to_numeric(row.get(column, math.nan), errors="coerce")
    return float(value) if pd.notna(value) else math.nan


def _pooled(own: float, twin: float) -> float:
    """A setting's step time: the mean of its cell's median and its twin's median in the
    other cell, where there is one."""
    return (own + twin) / 2 if math.isfinite(twin) else own


def pairs(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (network, bucket cap) with both a serial and an overlapped cell: their
    step times, the speed-up (serial ÷ overlapped; paired where the cells timed twins,
    else across the two cells) and the ideal derived from the serial cell."""
    ok = ok.assign(overlap=_flag(ok["overlap"]))
    serial = ok[~ok["overlap"]].set_index(["network", "bucket_cap_bytes"])
    overlapped = ok[ok["overlap"]].set_index(["network", "bucket_cap_bytes"])
    common = [i for i in serial.index if i in overlapped.index]
    rows = []
    for network, cap in common:
        s, o = serial.loc[(network, cap)], overlapped.loc[(network, cap)]
        hideable = float(s["allreduce_s"]) - float(s.get("last_bucket_s", 0.0))
        saving = max(0.0, min(float(s["backward_s"]), hideable))
        ideal = float(s["step_time_s"]) - saving
        serial_step = _pooled(float(s["step_time_s"]), _number(o, "twin_step_time_s"))
        separate = float(s["step_time_s"]) / float(o["step_time_s"])
        paired = [v for v in (_number(s, "paired_speedup"), _number(o, "paired_speedup"))
                  if math.isfinite(v) and v > 0]  # fmt: skip
        rows.append({
            "network": network,
            "bucket_cap_bytes": int(cap),
            "buckets": int(o["buckets"]),
            "serial_step_s": serial_step,
            "overlap_step_s": _pooled(float(o["step_time_s"]), _number(s, "twin_step_time_s")),
            # Geometric mean of the two cells' side-by-side ratios.
            "speedup": math.prod(paired) ** (1 / len(paired)) if paired else separate,
            "speedup_basis": "paired" if paired else "separate cells",
            "separate_speedup": separate,
            "ideal_step_s": serial_step - saving,  # beside the pooled serial step
            "ideal_speedup": float(s["step_time_s"]) / ideal if ideal > 0 else math.nan,
            "serial_backward_s": float(s["backward_s"]),
            "serial_allreduce_s": float(s["allreduce_s"]),
            "overlap_allreduce_s": float(o["allreduce_s"]),
            "hidden_fraction": float(o["hidden_fraction"]),
            "hideable_fraction": saving / float(s["allreduce_s"])
            if float(s["allreduce_s"]) > 0 else math.nan,
            "serial_exposed_s": float(s["exposed_sync_s"]),
            "overlap_exposed_s": float(o["exposed_sync_s"]),
            "same_parameters": str(s.get("param_digest", "")) == str(o.get("param_digest", "-")),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _best(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per network: the bucket cap where the overlapped step is fastest, and that pair."""
    out = {}
    for network, rows in table.groupby("network", sort=False):
        best = rows.loc[rows["overlap_step_s"].idxmin()]
        fastest_serial = rows.loc[rows["serial_step_s"].idxmin()]
        out[str(network)] = {
            "bucket_cap_bytes": int(best["bucket_cap_bytes"]),
            "buckets": int(best["buckets"]),
            "serial_step_s": float(best["serial_step_s"]),
            "overlap_step_s": float(best["overlap_step_s"]),
            "speedup": float(best["speedup"]),
            "speedup_basis": str(best["speedup_basis"]),
            "ideal_speedup": float(best["ideal_speedup"]),
            "hidden_fraction": float(best["hidden_fraction"]),
            "hideable_fraction": float(best["hideable_fraction"]),
            "best_serial_bucket_cap_bytes": int(fastest_serial["bucket_cap_bytes"]),
            "best_vs_best_speedup": float(fastest_serial["serial_step_s"])
            / float(best["overlap_step_s"]),
        }  # fmt: skip
    return out


def _setup_section(df: pd.DataFrame, ok: pd.DataFrame) -> str:
    first = ok.iloc[0]
    shape = ", ".join(
        f"{c.removeprefix('model_')}={_plain(first[c])}"
        for c in ok.columns if c.startswith("model_") and pd.notna(first[c])
    )  # fmt: skip
    links = []
    for network in _networks(ok):
        if not _is_simulated(network):
            links.append("`loopback`: no simulated link, the ranks' real gloo transfers only")
        else:
            row = ok[ok["network"] == network].iloc[0]
            bandwidth = float(row["bandwidth_mbps"])
            bw = "unlimited bandwidth" if not math.isfinite(bandwidth) else f"{bandwidth:g} Mbit/s"
            links.append(f"`{network}`: every round of the bucket all-reduces also waits "
                         f"{float(row['latency_ms']):g} ms + its bytes at {bw} "
                         "(`impls.comm.SimulatedNetwork`)")  # fmt: skip
    return (
        "## What was measured, on what\n\n"
        f"distbench's `DDP` (gradient buckets, ring all-reduce) training the GPT ({shape}; "
        f"{int(first['params']):,} parameters, {format_bytes(first['grad_bytes'])} of "
        f"fp32 gradients) with SGD on {int(first['world_size'])} ranks, "
        f"{int(first['batch_size'])} seeded sequences per rank; each cell times "
        f"{int(first['steps'])} steps after its warm-up. Networks: "
        + "; ".join(links)
        + f". {run_context(df)}\n\n"
        "**overlap on**: the buckets are all-reduced on DDP's communication thread (its own "
        "process group) as backward produces them; **off**: the same buckets, all-reduced "
        "one after the other once backward has returned. **Step time**: barrier, then "
        "forward, backward, gradient sync and the optimizer step; the slowest rank's, "
        "median over steps. **All-reduce**: Σ over buckets of each all-reduce's start to "
        "finish (slowest rank, median step). **Exposed sync**: from the end of backward to "
        "the last bucket's finish — what the step still waited for. **Hidden fraction**: "
        "the share of the all-reduce time that fell before backward ended (mean of the "
        "ranks, median step). **Simulated**: the seconds the modelled link added per step. "
        "**Bytes / step**: what the busiest rank sent, counted by distbench's "
        "communicators.\n"
    )


def _cells_section(ok: pd.DataFrame) -> str:
    table = pd.DataFrame({
        "network": ok["network"],
        "bucket cap": ok["bucket_cap_bytes"].map(format_bytes),
        "buckets": ok["buckets"].astype(int),
        "overlap": _flag(ok["overlap"]).map({True: "on", False: "off"}),
        "step time": ok["step_time_s"].map(format_seconds),
        "forward": ok["forward_s"].map(format_seconds),
        "backward": ok["backward_s"].map(format_seconds),
        "all-reduce": ok["allreduce_s"].map(format_seconds),
        "last bucket": ok["last_bucket_s"].map(format_seconds),
        "exposed sync": ok["exposed_sync_s"].map(format_seconds),
        "hidden": ok["hidden_fraction"].map(lambda v: f"{100 * v:.0f}%"),
        "simulated": ok["simulated_s"].map(format_seconds),
        "bytes / step": ok["bytes_per_step"].map(format_bytes),
        "wrong": ok["wrong"].astype(int),
    })  # fmt: skip
    return f"## Every cell\n\n{markdown_table(table)}\n"


def _plot_step_time(ok: pd.DataFrame, table: pd.DataFrame, path: Path) -> None:
    networks = _networks(ok)
    fig, axes = new_figure(6 * len(networks), 4.5, 1, len(networks))
    caps = sorted(int(c) for c in ok["bucket_cap_bytes"].unique())
    flags = _flag(ok["overlap"])
    # A pair's step times as its table shows them (pooled with the twins); a cell without
    # its pair, its own median.
    pooled = {(r.network, r.bucket_cap_bytes, False): r.serial_step_s for r in table.itertuples()}
    pooled |= {(r.network, r.bucket_cap_bytes, True): r.overlap_step_s for r in table.itertuples()}
    for ax, network in zip(axes, networks, strict=True):
        for overlap, colour, name in ((False, "#DD8452", "overlap off"),
                                      (True, "#4C72B0", "overlap on")):  # fmt: skip
            rows = ok[(ok["network"] == network) & (flags == overlap)]
            rows = rows.sort_values("bucket_cap_bytes")
            steps = [pooled.get((network, int(cap), overlap), own)
                     for cap, own in zip(rows["bucket_cap_bytes"], rows["step_time_s"],
                                         strict=True)]  # fmt: skip
            ax.plot(rows["bucket_cap_bytes"], 1e3 * np.asarray(steps), "o-", color=colour,
                    label=name)  # fmt: skip
        ideal = table[table["network"] == network] if len(table) else table
        if len(ideal):
            ideal = ideal.sort_values("bucket_cap_bytes")
            ax.plot(ideal["bucket_cap_bytes"], 1e3 * ideal["ideal_step_s"], "k--", alpha=0.6,
                    label="ideal: serial − S (derived from measurements)")  # fmt: skip
        log2_axis(ax, caps, as_bytes=True)
        ax.set(xlabel="bucket cap", ylabel="step time (ms, slowest rank, median; with twin)",
               title=network)  # fmt: skip
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    save_figure(fig, path)


def _plot_hidden(ok: pd.DataFrame, path: Path) -> None:
    networks = _networks(ok)
    caps = sorted(int(c) for c in ok["bucket_cap_bytes"].unique())
    flags = _flag(ok["overlap"])
    fig, (hidden_ax, exposed_ax) = new_figure(12, 4.5, 1, 2)
    for i, network in enumerate(networks):
        colour = f"C{i % 10}"
        rows = ok[ok["network"] == network].assign(_on=flags).sort_values("bucket_cap_bytes")
        on, off = rows[rows["_on"]], rows[~rows["_on"]]
        hidden_ax.plot(on["bucket_cap_bytes"], 100 * on["hidden_fraction"], "o-",
                       color=colour, label=network)  # fmt: skip
        exposed_ax.plot(off["bucket_cap_bytes"], 1e3 * off["exposed_sync_s"], "s--",
                        color=colour, label=f"{network}, overlap off")  # fmt: skip
        exposed_ax.plot(on["bucket_cap_bytes"], 1e3 * on["exposed_sync_s"], "o-",
                        color=colour, label=f"{network}, overlap on")  # fmt: skip
    for ax in (hidden_ax, exposed_ax):
        log2_axis(ax, caps, as_bytes=True)
        ax.set_xlabel("bucket cap")
        ax.legend(fontsize="small")
    hidden_ax.set(ylabel="all-reduce time before backward ended (%)", ylim=(0, 100),
                  title="Hidden behind backward (overlap on)")  # fmt: skip
    exposed_ax.set(ylabel="exposed sync per step (ms)", title="Sync the step still waited for")
    exposed_ax.set_ylim(bottom=0)
    save_figure(fig, path)


def _speedup_section(table: pd.DataFrame, best: dict[str, dict], ok: pd.DataFrame) -> str:
    rows = pd.DataFrame({
        "network": table["network"],
        "bucket cap": table["bucket_cap_bytes"].map(format_bytes),
        "buckets": table["buckets"],
        "step, off": table["serial_step_s"].map(format_seconds),
        "step, on": table["overlap_step_s"].map(format_seconds),
        "speed-up (off ÷ on)": table["speedup"].map(format_ratio),
        "basis": table["speedup_basis"],
        "across cells": table["separate_speedup"].map(format_ratio),
        "ideal (derived)": table["ideal_speedup"].map(format_ratio),
        "hidden": table["hidden_fraction"].map(lambda v: f"{100 * v:.0f}%"),
        "hideable (derived)": table["hideable_fraction"].map(lambda v: f"{100 * v:.0f}%"),
    })  # fmt: skip
    lines = []
    for network, b in best.items():
        buckets = f"{b['buckets']} bucket" + ("s" if b["buckets"] != 1 else "")
        lines.append(
            f"- **{network}**: fastest with overlap at a {format_bytes(b['bucket_cap_bytes'])} "
            f"cap ({buckets}): {format_seconds(b['overlap_step_s'])} against "
            f"{format_seconds(b['serial_step_s'])} serial at the same cap: speed-up "
            f"**{format_ratio(b['speedup'])}** ({b['speedup_basis']}; ideal "
            f"{format_ratio(b['ideal_speedup'])}); {100 * b['hidden_fraction']:.0f}% of its "
            "all-reduce time hidden behind backward. Against the serial step at its own best "
            f"cap ({format_bytes(b['best_serial_bucket_cap_bytes'])}, across cells): "
            f"{format_ratio(b['best_vs_best_speedup'])}."
        )
    above = table[table["speedup"] > table["ideal_speedup"]]
    if len(above):
        listed = "; ".join(
            f"{r.network} at {format_bytes(r.bucket_cap_bytes)}: {format_ratio(r.speedup)} "
            f"against {format_ratio(r.ideal_speedup)}, all-reduce "
            f"{format_seconds(r.overlap_allreduce_s)} on / "
            f"{format_seconds(r.serial_allreduce_s)} off"
            for r in above.itertuples()
        )  # fmt: skip
        lines.append(
            "\nAbove the derived ideal — " + listed + ". The bound holds the serial cell's "
            "all-reduce time fixed; where the overlapped cell's all-reduces ran faster, or "
            "the gap is within this host's step-to-step spread, the measurement can pass it."
        )
    return (
        "## What overlap buys, per bucket size\n\n"
        "![step time against bucket size](step_time_vs_bucket.png)\n\n"
        "![hidden fraction and exposed sync](hidden_fraction.png)\n\n"
        "Serial and overlapped cells of the same network and cap. **Step, off / on**: "
        "the setting's median step time, averaged with its twin's median in the other cell "
        "where the cells ran paired. **Speed-up**: serial ÷ overlapped; *paired*: the "
        "geometric mean of the two cells' side-by-side ratios (each cell alternated its "
        "steps with a twin replica running the other setting, so drift on a shared host "
        "hits both alike); *across cells*: the ratio of the two cells' own medians, which "
        "such drift can bias. **Ideal "
        "(derived)**: serial step ÷ (serial step − S) with S = min(backward, all-reduce − "
        "last bucket's all-reduce), all three the serial cell's measured times — the most "
        "overlap could save if an all-reduce running beside backward slowed neither "
        f"({IDEAL_SOURCE.split(':')[0]}; the last bucket holds the gradients backward "
        "produces last, so it cannot start before backward ends). **Hideable**: S ÷ "
        "all-reduce, the same bound as a share of the all-reduce time. With one bucket "
        "both are 1× / 0%: nothing is ready to send while backward runs.\n\n"
        f"{markdown_table(rows)}\n\n"
        + "\n".join(lines)
        + "\n\n"
        + _contention_note(ok, best)
        + "\n"
    )


def _contention_note(ok: pd.DataFrame, best: dict[str, dict]) -> str:
    cores = pd.to_numeric(ok.get("host_cores"), errors="coerce").max() if "host_cores" in ok \
        else math.nan  # fmt: skip
    world = int(ok["world_size"].max())
    host = (f"this host has {int(cores)} cores for {world} ranks"
            if math.isfinite(cores) else f"{world} ranks share this host's cores")  # fmt: skip
    text = (
        f"**Why loopback and the simulated link differ.** On loopback the all-reduce is CPU "
        f"work — gloo's copies and the ring's additions — and {host}: the communication "
        "thread competes with backward for the same cores, so what overlap hides it partly "
        "pays back as slower compute. zero_memory's paired measurement (issue 4) put the "
        "overlapped DDP at 0.98× the serial step time on such a host. The simulated link's "
        "extra time is waiting (a sleep on the communication thread), which uses no CPU, so "
        "overlap can hide it."
    )
    flags = _flag(ok["overlap"])
    for network, b in best.items():
        rows = ok[(ok["network"] == network) & (ok["bucket_cap_bytes"] == b["bucket_cap_bytes"])]
        on, off = rows[flags[rows.index]], rows[~flags[rows.index]]
        if len(on) and len(off):
            backward_on = format_seconds(on["backward_s"].iloc[0])
            backward_off = format_seconds(off["backward_s"].iloc[0])
            text += (
                f" `{network}` at {format_bytes(b['bucket_cap_bytes'])}: speed-up "
                f"{format_ratio(b['speedup'])}, backward {backward_on} with overlap on "
                f"against {backward_off} off."
            )
    return text + "\n"


def _correctness_section(ok: pd.DataFrame, table: pd.DataFrame) -> tuple[str, int, int, int]:
    wrong = int(ok["wrong"].sum())
    same = int(table["same_parameters"].sum()) if len(table) else 0
    twins = ok.get("twin_same_parameters", pd.Series(dtype=object))
    twins = twins[twins.map(lambda v: str(v) in ("True", "False"))]
    twin_text = (
        f" Within the paired cells, the twin replica (the other setting) ended bitwise equal "
        f"to the cell's own in {int((twins.astype(str) == 'True').sum())} of {len(twins)}."
        if len(twins) else ""
    )  # fmt: skip
    text = (
        "## Correctness\n\n"
        f"After its timed steps each cell fingerprints every rank's parameters (SHA-256 of "
        f"the fp32 bytes): {wrong} rank(s) in all held parameters different from rank 0's "
        f"or not finite (`wrong`, expected 0). Overlap changes when the buckets are "
        f"all-reduced, not what is summed: the serial and overlapped cells of the same "
        f"network and cap ended with bitwise the same parameters in {same} of {len(table)} "
        f"pairs.{twin_text}\n"
    )
    return text, wrong, same, len(table)


def _figures(best: dict[str, dict], wrong: int, same: int, npairs: int, failed: int) -> list:
    figures = []
    for network, b in best.items():
        cap = format_bytes(b["bucket_cap_bytes"])
        ideal, hideable = b["ideal_speedup"], b["hideable_fraction"]
        figures.append(figure_row(
            f"DDP serial ÷ overlapped step time, {network}, best cap ({cap})",
            f"≤ {format_ratio(ideal)} (ideal, derived from the serial cell)", IDEAL_SOURCE,
            format_ratio(b["speedup"]),
            f"{b['speedup'] - ideal:+.2f}×" if math.isfinite(ideal) else "—"))  # fmt: skip
        figures.append(figure_row(
            f"DDP all-reduce time hidden behind backward, {network}, {cap}",
            f"≤ {100 * hideable:.0f}% (derived from the serial cell)", IDEAL_SOURCE,
            f"{100 * b['hidden_fraction']:.0f}%",
            f"{100 * (b['hidden_fraction'] - hideable):+.0f} points"
            if math.isfinite(hideable) else "—"))  # fmt: skip
    figures.append(figure_row("ranks whose parameters differ from rank 0's", "0",
                              "data parallelism keeps replicas identical", str(wrong),
                              f"{wrong:+d}"))  # fmt: skip
    figures.append(figure_row("overlap on/off pairs ending bitwise equal", str(npairs),
                              "same buckets, same sums", str(same),
                              f"{same - npairs:+d}"))  # fmt: skip
    figures.append(figure_row("failed cells", "0", "grid", str(failed), f"{failed:+d}"))
    return figures


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, step_time_vs_bucket.png, hidden_fraction.png and headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    failures = failures_list(df, KEYS)
    parts = ["# Overlapping DDP's gradient all-reduces with backward\n"]
    best: dict[str, dict] = {}
    wrong = same = npairs = 0
    if ok.empty:
        parts.append("No cell finished; nothing was measured.\n")
    else:
        table = pairs(ok)
        best = _best(table) if len(table) else {}
        parts.append(_setup_section(df, ok))
        _plot_step_time(ok, table, report_dir / "step_time_vs_bucket.png")
        _plot_hidden(ok, report_dir / "hidden_fraction.png")
        correctness, wrong, same, npairs = _correctness_section(ok, table)
        if len(table):
            parts.append(_speedup_section(table, best, ok))
        parts += [_cells_section(ok), correctness]
    parts.append(failed_cells_markdown(failures))
    write_text_atomic(report_dir / "report.md", "\n".join(parts))
    headline = {
        "experiment": "overlap",
        "best_per_network": best,
        "wrong_total": wrong,
        "pairs_bitwise_equal": same,
        "pairs": npairs,
        "failed_cells": len(failures),
        "failures": failures,
        "figures": _figures(best, wrong, same, npairs, len(failures)),
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
