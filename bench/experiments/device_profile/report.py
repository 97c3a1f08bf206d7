"""The `device_profile` report: the preset file it writes, then the measurements behind each
of its numbers — GEMM rate and efficiency by shape (with the plot), the copy and launch
probes, and the ring all-reduce's α–β fit per N beside the times it was fitted to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench.experiments.device_profile.preset import ring_fits, write_preset
from bench.report import (
    Context,
    Report,
    format_bytes,
    format_percent,
    format_seconds,
    markdown_table,
    new_figure,
    prose,
)

__all__ = ["PRESET_FILE", "REPORT"]

PRESET_FILE = "hardware.yaml"
# The columns read as numbers (a CSV round trip may leave them as text).
GEMM = ("m", "n", "k", "flops", "flop_rate")
NUMERIC = (*GEMM, "time_s", "bandwidth", "world_size", "message_bytes", "wrong")


def _of(ctx: Context, measurement: str) -> pd.DataFrame:
    rows = ctx.ok[ctx.ok["measurement"] == measurement].copy()
    for column in NUMERIC:
        if column in rows:
            rows[column] = pd.to_numeric(rows[column], errors="coerce")
    return rows


def _shown_path(path: Path) -> str:
    """`path` relative to the working directory where it lies below it (the committed
    report names `reports/device_profile/hardware.yaml`), else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def preset(ctx: Context) -> str | None:
    """The preset file

    Every number of a `Hardware` preset, made from this run's rows and written beside this
    report as `hardware.yaml`; any key that takes a preset name takes its path
    (`python -m bench experiment=auto_parallel hardware=reports/device_profile/hardware.yaml`).
    Its `sources` say where each number was measured; what the profile does not measure
    (fp8, FlashAttention, the link between nodes) is marked there too."""
    path = ctx.report_dir / PRESET_FILE
    hw, why = write_preset(ctx.ok, path)
    ctx.headline["preset_file"] = _shown_path(path) if hw is not None else None
    if hw is None:
        ctx.finding("the rows make a hardware preset", False, why)
        return prose(__package__, "no_preset", why=why)
    table = [
        ("peak " + dtype, f"{flops / 1e9:.4g} GFLOP/s") for dtype, flops in hw.peak_flops.items()
    ]
    table += [
        ("memory bandwidth", f"{hw.memory_bandwidth / 1e9:.4g} GB/s"),
        ("kernel overhead", format_seconds(hw.kernel_overhead_s)),
        ("link α (per round)", format_seconds(hw.intra.alpha_s)),
        ("link bandwidth (1/β)", f"{hw.intra.bandwidth / 1e9:.4g} GB/s"),
        ("devices per node", str(hw.devices_per_node)),
        ("memory per device", format_bytes(hw.memory_bytes)),
    ]
    for figure, value in table:
        ctx.figure(f"device_profile: {figure}", measured=value)
    shown = markdown_table(pd.DataFrame(table, columns=["number", "value"]), numparse=False)
    text = prose(__package__, "written", path=_shown_path(path), name=hw.name, table=shown)
    return f"{text}\n\n```yaml\n{path.read_text(encoding='utf-8').rstrip()}\n```"


def gemm(ctx: Context) -> str | None:
    """GEMM rate by shape

    Each (m × k)·(k × n) product timed alone (2mnk FLOPs; the median window); its share of
    its dtype's best rate is its efficiency. The first dtype's shares, by FLOPs, are the
    preset's `gemm_efficiency` table; the best rate per dtype is its peak."""
    rows = _of(ctx, "gemm")
    if rows.empty:
        return None
    rows["efficiency"] = rows["flop_rate"] / rows.groupby("dtype")["flop_rate"].transform("max")
    shown = pd.DataFrame(
        {
            "dtype": rows["dtype"],
            "m × n × k": [f"{r.m:.0f}×{r.n:.0f}×{r.k:.0f}" for r in rows.itertuples()],
            "GFLOP": (rows["flops"] / 1e9).map(lambda v: f"{v:.3g}"),
            "time": rows["time_s"].map(format_seconds),
            "GFLOP/s": (rows["flop_rate"] / 1e9).map(lambda v: f"{v:.4g}"),
            "of peak": rows["efficiency"].map(format_percent),
        }
    )
    fig, (ax,) = new_figure(7, 4)
    for dtype, group in rows.groupby("dtype", sort=False):
        group = group.sort_values("flops")
        ax.plot(group["flops"], group["efficiency"], "o-", label=str(dtype))
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.set(xlabel="FLOPs of one GEMM", ylabel="fraction of the dtype's best rate")
    ax.legend(title="dtype")
    plot = ctx.plot(fig, "gemm_efficiency", "GEMM efficiency by FLOPs, per dtype")
    return markdown_table(shown, numparse=False) + "\n\n" + plot


def memory_and_launch(ctx: Context) -> str | None:
    """Memory bandwidth and launch overhead

    Bandwidth: a copy of one buffer into another, read and write (2 × its bytes) ÷ its
    time. Launch overhead: a one-element in-place add, issued back to back (on a GPU, a
    hundred kernels before each synchronisation): what every kernel costs beyond its work."""
    copy, launch = _of(ctx, "copy"), _of(ctx, "launch")
    rows = [
        (
            "copy " + format_bytes(r.message_bytes),
            format_seconds(r.time_s),
            f"{r.bandwidth / 1e9:.4g} GB/s",
        )
        for r in copy.itertuples()
    ]
    rows += [
        ("one-element add", format_seconds(r.time_s), "per kernel") for r in launch.itertuples()
    ]
    if not rows:
        return None
    return markdown_table(pd.DataFrame(rows, columns=["probe", "time", "rate"]), numparse=False)


def ring(ctx: Context) -> str | None:
    """Ring all-reduce: α–β per N

    This repo's ring all-reduce (`impls.collectives`), timed as `allreduce_scaling` times it,
    at each size; a ring of M bytes on N ranks is 2(N − 1) rounds of α and 2(N − 1)/N · M
    bytes of β per rank, and (α, β) minimise the sum of relative errors over the sizes (a
    median regression, `bench.kit.profile.fit_ring`). The preset's link is the largest N's."""
    rows = _of(ctx, "all_reduce")
    try:
        fits = ring_fits(ctx.ok)
    except ValueError as error:
        return prose(__package__, "no_fit", error=error) if not rows.empty else None
    out, errors = [], []
    for row in rows.sort_values(["world_size", "message_bytes"]).itertuples():
        n = int(row.world_size)
        if n not in fits:
            continue
        alpha, beta = fits[n]
        model = 2 * (n - 1) * alpha + 2 * (n - 1) / n * row.message_bytes * beta
        errors.append(abs(model / row.time_s - 1))
        out.append(
            {
                "N": n,
                "size": format_bytes(row.message_bytes),
                "measured": format_seconds(row.time_s),
                "α–β": format_seconds(model),
                "error": f"{model / row.time_s - 1:+.1%}",
                "wrong": int(row.wrong),
            }
        )
    shown = [(n, format_seconds(a), f"{1 / b / 1e9:.4g}") for n, (a, b) in fits.items()]
    ctx.headline["ring_median_abs_error"] = float(np.median(errors)) if errors else None
    table = markdown_table(pd.DataFrame(out), numparse=False)
    return prose(__package__, "ring_fits", fits=shown, table=table)


REPORT = Report(
    title="Device profile: this device measured for the simulator",
    intro=prose(__package__, "intro"),
    sections=(preset, gemm, memory_and_launch, ring),
    correctness=prose(__package__, "correctness"),
)
