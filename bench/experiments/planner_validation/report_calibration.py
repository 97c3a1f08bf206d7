"""The `planner_validation` report's Calibration section: what this run measured on the
host before it predicted (`calibration.py`), the runtimes and links each row was priced
on, and the TP call work replayed rows carry (all measured by this run, or read from a
report that is not a ground-truth source)."""

from __future__ import annotations

import math

import pandas as pd

from bench.experiments.planner_validation.config import PROBE_LINK
from bench.report import Context, format_seconds, markdown_table

__all__ = ["CAL_COLUMNS", "THREAD_COLUMNS", "calibration"]

CAL_COLUMNS = (
    ("cal_peak_fp32_flops", "peak fp32 GEMM (FLOP/s)", lambda v: f"{v / 1e9:.1f} G"),
    ("cal_peak_bf16_flops", "peak bf16 GEMM (FLOP/s)", lambda v: f"{v / 1e9:.1f} G"),
    ("cal_memory_bandwidth", "copy bandwidth (B/s)", lambda v: f"{v / 1e9:.1f} G"),
    ("cal_kernel_overhead_s", "tiny autograd op", format_seconds),
    ("fit_median_scale", "reference fit to the median: compute factor", lambda v: f"{v:.2f}×"),
    ("fit_median_overhead_s", "reference fit to the median: per-kernel overhead", format_seconds),
    ("fit_fastest_scale", "reference fit to the fastest: compute factor", lambda v: f"{v:.2f}×"),
    ("fit_fastest_overhead_s", "reference fit to the fastest: per-kernel overhead", format_seconds),
    ("reference_fp32_micro1_s", "reference step fp32, b = 1, median", format_seconds),
    ("reference_fp32_micro1_fastest_s", "reference step fp32, b = 1, fastest", format_seconds),
    ("reference_fp32_micro16_s", "reference step fp32, b = 16, median", format_seconds),
    ("reference_fp32_micro16_fastest_s", "reference step fp32, b = 16, fastest", format_seconds),
    ("reference_bf16_micro1_s", "reference step bf16, b = 1, median", format_seconds),
    ("reference_bf16_micro1_fastest_s", "reference step bf16, b = 1, fastest", format_seconds),
    ("reference_bf16_micro16_s", "reference step bf16, b = 16, median", format_seconds),
    ("reference_bf16_micro16_fastest_s", "reference step bf16, b = 16, fastest", format_seconds),
    ("cal_gemm_table", "GEMM table (FLOPs:fraction of peak)", str),
)
THREAD_COLUMNS = (
    ("cal_adamw_s_per_param", "AdamW step per parameter element", lambda v: f"{v * 1e9:.2f} ns"),
    (
        "cal_reference_fp32_micro16_one_thread_s",
        "reference step fp32, b = 16, 1 thread",
        format_seconds,
    ),
    (
        "cal_reference_fp32_micro16_at_threads_s",
        "reference step fp32, b = 16, these threads",
        format_seconds,
    ),
    (
        "cal_reference_bf16_micro16_one_thread_s",
        "reference step bf16, b = 16, 1 thread",
        format_seconds,
    ),
    (
        "cal_reference_bf16_micro16_at_threads_s",
        "reference step bf16, b = 16, these threads",
        format_seconds,
    ),
)


def calibration(ctx: Context) -> str | None:
    """Calibration measured on this host in this run

    All on one thread (a rank with t threads is priced at these rates × its measured
    thread speedup, below; with more ranks than cores at cores/N of them and every
    kernel's overhead × N/cores): the microbenchmarks (the fastest of the repeats of tall
    (8n × n)·(n × n) fp32 GEMMs → peak and efficiency table, a bf16 GEMM at the largest n,
    a tensor copy → bandwidth, a chain of one-element autograd ops → per-op overhead) and
    the two-point fit on a reference GPT (d_model 128, 4 layers, 4 heads, s = 64, V = 256;
    one forward + backward on one process at micro-batch 1 and 16, none of the
    ground-truth shapes): a factor dividing every microbenchmark rate and a per-kernel
    overhead, solved so the simulator's single-process compute equals the reference's
    step at both sizes (each step: forward + loss + backward + zero_grad keeping the
    gradients, as the runs do), once per statistic a ground-truth row is of its samples
    (column `statistic` below): the **median** for a wall-clock step (the median of its
    timed steps) and for `parallelism_comparison`'s replay (each action the median over
    its ranks, micro-batches and profiled steps), the **fastest** for
    `pipeline_utilization`'s replay (each action the fastest of its stage's). Per
    thread count a rank runs at (second table): the median `torch.optim.AdamW` step over
    the reference's parameters ÷ its parameter elements (a rank's optimizer time is that ×
    the parameter elements it updates, ÷ its core share under modelled core sharing; it
    replaces the simulator's memory-bandwidth price of Adam), and with several threads the
    reference step at b = 16 on one thread and on those threads in alternating rounds: the
    ratio of their medians, bounded to [1, threads], is the rank's compute rate in place
    of the thread count.

    The runtimes (table "Runtimes"): each source steps its model under a runtime of this
    repo that the plain reference does not run: `parallelism_comparison` and
    `pipeline_utilization` under `impls.pipeline.PipelineExecutor` (its schedule walk,
    the saved-activation accounting it keeps), `zero_memory` under
    `impls.zero.ZeroDataParallel`'s ledger (each forward inside
    `MemoryLedger.saved_activations`). The reference at b = 1 is timed under each, among
    the same rounds (the executor's as the one stage of a one-rank executor, per
    micro-batch), each sample paired with a plain reference step right after it (the
    cost is a few percent of a step, less than the host's drift between rounds); the
    median excess, halved, is that runtime's cost per compute action
    (`Hardware.action_overhead_s`), paid by each F and each backward action of a row that
    runs under it, stretched and scaled like a kernel's overhead. A median excess at or
    below zero is a cost under this run's noise: it is floored at 0 and the table says so.

    Links (table "Links"): a wall-clock row of N ≥ 2 ranks is priced on the α (per round)
    and β fitted to `allreduce_scaling`'s ring all-reduce at the same N, read from that
    report of this host (not a ground-truth source; 2(N − 1) rounds carrying
    2(N − 1)/N · M bytes, the least absolute relative error over its message sizes: a
    median regression, which one size timed in another phase of the host does not drag,
    as it dragged least squares, shown beside for context): with
    more ranks than cores a round waits for descheduled ranks, which a two-rank probe
    does not see. Replayed rows, and any N that report lacks, use this run's own probe
    on a fresh pool of two ranks (the fastest 4-byte and 1 MiB exchanges between them,
    `bench.kit.host.probe_pairs`, as `parallelism_comparison` defines its probe); a
    replayed row with TP adds to that α its TP all-reduce's own work between rounds,
    measured by this run on a fresh pool of the row's tp ranks at the row's activation
    size (`tp_call_cpu_s`: the work such a replay charges each call) and spread over the
    ring's 2(t − 1) rounds (table "TP call work"). Neither is read from the ground-truth
    cell it prices; both, measured in this run, are scaled like its compute to the host
    speed of the row's source run (`host_slowdown`, Accuracy), while a ring fit read from
    `allreduce_scaling` is kept as it is. On this host a collective blocks the rank's
    computing thread, so none of it hides under the backward (`Hardware.comm_overlap`
    False), and ZeRO rows are priced as `impls.zero` issues them: one gather or
    reduce-scatter per unit (the GPT's blocks and its root unit, `dp_collectives`). A
    pipeline send, likewise, holds the sending rank on the wall clock (the executor waits
    out each round, `Hardware.p2p_blocking`); a replayed row keeps its replay's
    convention, a send as a latency between the two ranks' actions.

    Meetings (table "Meetings"): those links are fitted to calls made back to back, in
    which neither rank waits for a computing one. A collective after compute is a meeting:
    the first rank to arrive waits for the last, and on this host a rank that waited long
    enough for its core to go idle is slow to run again. This run times it on a fresh pool
    of two ranks (`bench.kit.meeting`): a one-element ring all-reduce after a segment of
    matmuls, against the segment alone and the call alone, in alternating rounds. What
    the call after compute costs beyond the row's link's price of the same call is paid at
    each meeting of a wall-clock row's collectives on two ranks
    (`Hardware.collective_meeting_s`: ZeRO-3 at each unit's forward and backward gather,
    ZeRO-2 at each unit's reduce-scatter, and once per back-to-back run of calls at the
    end of a step). Rows with more ranks than cores, replayed rows and pipeline transfers
    pay none (their ranks share cores and never idle, or their receive is posted a round
    early)."""
    ok = ctx.ok
    if ok.empty or "fit_scale" not in ok.columns:
        return None
    rows, headline = [], {}
    for precision, sub in ok.groupby("precision"):
        first = sub.iloc[0]
        entry = {label: fmt(first[col]) for col, label, fmt in CAL_COLUMNS if col in sub}
        rows.append({"dtype": f"{precision} (1 thread)", **entry})
        headline[str(precision)] = {col: first[col] for col, _, _ in CAL_COLUMNS if col in sub}
    probed = ok[ok["link_source"] == PROBE_LINK] if "link_source" in ok else ok
    link = None
    if not probed.empty:
        first = probed.iloc[0]
        link = {
            "alpha_s": float(first["link_alpha_s"]),
            "beta_s_per_byte": float(first["link_beta_s_per_byte"]),
            "source": "this run's probe_pairs on a fresh pool of 2 ranks",
        }
    ctx.headline["calibration"] = {"host": headline, "link": link}
    table = pd.DataFrame(rows).set_index("dtype").T.rename_axis("measured").reset_index()
    return (
        markdown_table(table, numparse=False)
        + _per_thread(ctx, ok)
        + _runtimes(ctx, ok)
        + _links(ctx, ok)
        + _meetings(ctx, ok)
    )


def _meetings(ctx: Context, ok: pd.DataFrame) -> str:
    """The meeting probe's loops, and what each link's rows pay per meeting."""
    if "cal_meeting_after_compute_s" not in ok.columns:
        return ""
    first = ok.iloc[0]
    after = float(first["cal_meeting_after_compute_s"])
    if pd.isna(after):
        return "\n\nMeetings: not probed in this run (the host has fewer than two cores)."
    probe = {
        "after_compute_s": after,
        "call_s": float(first["cal_meeting_call_s"]),
        "segment_s": float(first["cal_meeting_segment_s"]),
        "ranks": int(first["cal_meeting_world_size"]),
    }
    text = (
        f"\n\nMeetings (probe on {probe['ranks']} ranks, one thread each): a segment of "
        f"matmuls took {format_seconds(probe['segment_s'])}; the one-element ring "
        f"all-reduce after it added {format_seconds(after)}, the same call back to back "
        f"took {format_seconds(probe['call_s'])}."
    )
    meets = pd.to_numeric(ok["collective_meeting_s"], errors="coerce") > 0
    paying = ok[meets & (pd.to_numeric(ok["predicted_dp_s"], errors="coerce") > 0)]
    rows, per_link = [], {}
    for source, sub in paying.groupby("link_source", sort=False):
        per_link[str(source)] = meet = float(sub["collective_meeting_s"].iloc[0])
        rows.append(
            {
                "link": source,
                "per meeting, beyond the link's price of the call": format_seconds(meet),
                "rows paying it": len(sub),
            }
        )
    ctx.headline["meetings"] = {**probe, "rows": len(paying), "per_link": per_link}
    if not rows:
        return text + (
            " No row pays a meeting (none is a wall-clock row of collectives "
            "on as many ranks as the probe's)."
        )
    return text + "\n\n" + markdown_table(pd.DataFrame(rows), numparse=False)


def _links(ctx: Context, ok: pd.DataFrame) -> str:
    """The table of the links rows were priced on, one line per source of α–β."""
    if "link_source" not in ok.columns:
        return ""
    rows, headline = [], {}
    for source, sub in ok.groupby("link_source", sort=False):
        first = sub.iloc[0]
        alpha, beta = float(first["link_alpha_s"]), float(first["link_beta_s_per_byte"])
        lsq_alpha = float(first.get("link_lsq_alpha_s", math.nan))
        lsq_beta = float(first.get("link_lsq_beta_s_per_byte", math.nan))
        rows.append(
            {
                "link": source,
                "α (per round)": format_seconds(alpha),
                "1/β": _bandwidth(beta),
                "least squares (not used): α, 1/β": "—"
                if math.isnan(lsq_alpha)
                else f"{format_seconds(lsq_alpha)}, {_bandwidth(lsq_beta)}",
                "rows priced on it": len(sub),
            }
        )
        headline[str(source)] = {"alpha_s": alpha, "beta_s_per_byte": beta, "rows": len(sub)}
        if not math.isnan(lsq_alpha):
            headline[str(source)]["least_squares_alpha_s"] = lsq_alpha
    ctx.headline["links"] = headline
    return "\n\nLinks:\n\n" + markdown_table(pd.DataFrame(rows), numparse=False) + _tp_calls(ok)


def _bandwidth(beta: float) -> str:
    return f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "—"


def _runtimes(ctx: Context, ok: pd.DataFrame) -> str:
    """The table of each runtime's measured cost per compute action, and its rows."""
    if "runtime" not in ok.columns or "cal_action_overhead_executor_s" not in ok.columns:
        return ""
    rows, headline = [], {}
    for runtime, sub in ok.groupby("runtime"):
        first = sub.iloc[0]
        cost = float(first[f"cal_action_overhead_{runtime}_s"])
        shown = format_seconds(cost) if cost > 0 else "0 (median excess ≤ 0: under the noise)"
        rows.append(
            {
                "runtime": runtime,
                "per compute action": shown,
                "sources": ", ".join(sorted(sub["source"].unique())),
                "rows priced on it": len(sub),
            }
        )
        headline[str(runtime)] = {"per_action_s": cost, "rows": len(sub)}
    ctx.headline["runtimes"] = headline
    return (
        "\n\nRuntimes (each source steps its model under one; the median excess of the "
        "reference under it over the plain reference right after it, at b = 1, per F "
        "and per B):\n\n" + markdown_table(pd.DataFrame(rows), numparse=False)
    )


def _tp_calls(ok: pd.DataFrame) -> str:
    """The table of the replayed TP rows' per-call work, and the α it makes per round."""
    if "tp_call_cpu_s" not in ok.columns:
        return ""
    calls = ok[pd.to_numeric(ok["tp_call_cpu_s"], errors="coerce") > 0]
    if calls.empty:
        return ""
    table = pd.DataFrame(
        {
            "configuration": calls["config"],
            "tp": calls["tp"].astype(int),
            "activation (float32 elements)": calls["tp_call_numel"].astype(int)
            if "tp_call_numel" in calls
            else "—",
            "call work (this run, tp ranks)": calls["tp_call_cpu_s"].map(format_seconds),
            "α of the link": calls["link_alpha_s"].map(format_seconds),
            "α per round priced (× host slowdown)": calls["round_alpha_s"].map(format_seconds),
        }
    )
    return "\n\nTP call work (replayed rows):\n\n" + markdown_table(table, numparse=False)


def _per_thread(ctx: Context, ok: pd.DataFrame) -> str:
    """The table of what is measured per thread count (AdamW, thread speedup)."""
    if "cal_adamw_s_per_param" not in ok.columns:
        return ""
    rows, headline = [], {}
    for threads, sub in ok.groupby("threads_per_rank"):
        first = sub.iloc[0]
        entry = {
            label: fmt(first[col]) if pd.notna(first[col]) else "—"
            for col, label, fmt in THREAD_COLUMNS
            if col in sub
        }
        for dtype in ("fp32", "bf16"):
            speed = sub.loc[sub["precision"] == dtype, "cal_thread_speedup"]
            entry[f"compute rate {dtype} (thread speedup)"] = (
                f"{float(speed.iloc[0]):.2f}×" if len(speed) and pd.notna(speed.iloc[0]) else "—"
            )
        rows.append({"threads": f"{threads} thread(s) per rank", **entry})
        headline[str(threads)] = {
            col: None if pd.isna(first[col]) else float(first[col])
            for col, _, _ in THREAD_COLUMNS
            if col in sub
        }
    ctx.headline["calibration_per_thread"] = headline
    if not rows:  # no row says how many threads it ran on
        return ""
    table = pd.DataFrame(rows).set_index("threads").T.rename_axis("measured").reset_index()
    return "\n\n" + markdown_table(table, numparse=False)
