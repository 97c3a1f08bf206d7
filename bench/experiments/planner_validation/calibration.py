"""This host measured for the simulator: what `planner_validation`'s rank calibrates before it
predicts (once per process, on one thread; the optimizer and thread scaling once per thread
count a rank runs at).

What `calibrate` measures on one thread, `fit_for`'s two statistics, `tp_call_work` and
`rank_calibration` (the optimizer and thread scaling) are described where they are.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.experiments.planner_validation import pool_probes, rounds
from bench.experiments.planner_validation.rounds import PROBE, REFERENCE, REFERENCE_MICRO, RUNTIMES
from bench.kit.meeting import measure as measure_meeting
from bench.kit.workloads import reference_step
from impls.costmodel.comm import allreduce_rounds
from impls.costmodel.presets import host_hardware

__all__ = [
    "MEETING_RANKS",
    "REFERENCE",
    "REFERENCE_MICRO",
    "RUNTIMES",
    "STATISTICS",
    "action_overhead",
    "calibrate",
    "collective_meeting",
    "fit_for",
    "fit_reference",
    "host_hardware",
    "rank_calibration",
    "reference_plan",
    "straggler",
    "thread_speedup",
    "tp_call_work",
]

_CALIBRATIONS: dict[tuple, dict[str, Any]] = {}
_RANK_CALIBRATIONS: dict[tuple, dict[str, Any]] = {}
_TP_CALLS: dict[tuple[int, int], float] = {}
ROWS = 8  # calibration GEMMs are (8n × n)·(n × n): tall, as tokens × width are
CHAIN = 50  # tiny ops in the per-kernel overhead probe (each runs forward and backward)
SPEEDUP_ROUNDS = 3  # alternating one-thread / rank-thread rounds of the speedup probe
MEETING_RANKS = 2  # the meeting probe's pool: the wall-clock rows of N ≥ 2 ranks ≤ cores
STATISTICS: dict[str, Callable[[list[float]], float]] = {
    "median": statistics.median,
    "fastest": min,
}
"""The statistics of a ground-truth row's time, each with a reference fit of its own."""
_SUFFIX = {"median": "", "fastest": "_fastest"}  # keys: reference_fp32_s, ..._fastest_s


def action_overhead(cal: dict[str, Any], runtime: str | None) -> float:
    """Seconds `runtime` (`RUNTIMES`; None: a plain step) adds per compute action: the
    median excess of the reference's step under it (per micro-batch) over the plain one
    timed right after it, ÷ 2 (its F and its B), at least 0; 0 for a calibration made
    before it was measured. One figure for both statistics: a fixed cost per action, not
    a rate that the host's phases move."""
    if runtime is None:
        return 0.0
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime={runtime!r}: expected one of {RUNTIMES} or None")
    return cal.get(f"action_overhead_{runtime}_s", 0.0)


def collective_meeting(cal: dict[str, Any], ranks: int, link: tuple[float, float]) -> float:
    """Seconds each meeting of `ranks` ranks at a collective after compute costs beyond
    what `link` (α per round, β per byte) charges (`Hardware.collective_meeting_s`): the
    meeting probe's call after compute less that link's price of the same call (a ring
    all-reduce of 4 bytes: 2(N − 1) rounds), at least 0. 0 where the probe did not run or
    ran on another rank count."""
    probe = cal.get("meeting")
    if not probe or probe["world_size"] != ranks:
        return 0.0
    alpha, beta = link
    rounds_ = allreduce_rounds(ranks)
    return max(0.0, probe["after_compute_s"] - (rounds_ * alpha + rounds_ / ranks * 4 * beta))


def straggler(cal: dict[str, Any], ranks: int) -> float:
    """The median of the slowest of `ranks` steps ÷ the median step (≥ 1): a wall-clock step
    of N ranks that meet at every collective ends with the slowest, and if each rank's step
    time varies independently as one process's does, the median of the slowest of N is
    that distribution's quantile at 0.5^(1/N) (order statistics). The distribution is the
    reference's step ÷ its window's median (`step_jitter`); 1 for one rank or a
    calibration without it."""
    jitter = cal.get("step_jitter") or ()
    if ranks < 2 or not jitter:
        return 1.0
    return max(1.0, float(np.quantile(jitter, 0.5 ** (1 / ranks))))


def fit_for(cal: dict[str, Any], dtype: str, statistic: str) -> dict[str, Any]:
    """The reference fit of `dtype` to the reference's `statistic` step (`STATISTICS`).

    The microbenchmarks give the table its shape and keep their fastest repeat (the least
    disturbed); the reference fit sets its level, and it is fitted twice, once per statistic
    a ground-truth row reports (`STATISTICS`): the **median** of the reference's timed steps
    for a wall-clock row (the median of its timed steps) and for `parallelism_comparison`'s
    replay (each action the median over its ranks, micro-batches and profiled steps); the
    **fastest** for `pipeline_utilization`'s replay (each action the fastest of its stage's).
    On this host a step's median sits well above its fastest repeat (the report's calibration
    table shows both), and a fit to the other statistic misprices a row by that gap.
    """
    return cal[f"fit_{dtype}{_SUFFIX[statistic]}"]


def _flops(n: int) -> int:
    return 2 * ROWS * n**3


def _tiny_autograd_chain() -> None:
    """`CHAIN` one-element multiplications through autograd, forward then backward."""
    x = torch.ones(1, requires_grad=True)
    y = x
    for _ in range(CHAIN):
        y = y * 1.0
    y.backward()


def _timings(fn: Callable[[], Any], repeats: int, inner: int = 1) -> list[float]:
    """Seconds per call of `repeats` timed batches of `inner` calls, after one warm-up."""
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - start) / inner)
    return out


def _fastest(fn: Callable[[], Any], repeats: int, inner: int = 1) -> float:
    return min(_timings(fn, repeats, inner))


def calibrate(cfg: Any, threads: int) -> dict[str, Any]:
    """This host's GEMM table, peaks, bandwidth and per-kernel overhead at `threads`, and
    the reference fit per dtype, on one thread:

    - GEMM: the fastest of `repeats` tall (8n × n)·(n × n) fp32 matmuls per n of `gemm_sizes`;
      the fastest rate is the peak, each size's rate ÷ peak a point of the GEMM-efficiency
      table (the simulator interpolates it log-linearly over a GEMM's FLOPs,
      `Hardware.efficiency`). bf16 is timed at the largest n and shares fp32's table.
    - memory bandwidth: a `copy_mib` MiB tensor copied (read + write = 2 × its bytes moved).
    - per-op overhead: a chain of one-element autograd multiplications, forward and backward.
    - the reference fit (`fit_reference`): one forward + loss + backward + zero_grad (the
      gradients kept allocated, `set_to_none=False`, as the ground-truth runs do) of a
      reference GPT (none of the ground-truth shapes) on one process at micro-batch 1 and 16,
      per dtype, timed in `repeats` rounds of `reference_window_s` per configuration
      (`rounds.reference_rounds`); a factor dividing every microbenchmark rate and a
      per-kernel overhead are solved so that the simulator's single-process compute equals
      both (eager PyTorch on a CPU reaches neither the GEMM peak nor the copy bandwidth in a
      model's small kernels).

    - the host probe's step (`bench.kit.host.host_probe`: the reference in fp32 at micro-batch
      `PROBE_MICRO`), a fifth configuration of the same rounds; its median over every round is
      where this run's host stood while it calibrated (one probe window alone is too noisy
      to say). The sources' runner timed the same probe around each
      ground-truth row; their ratio (`ranks.host_slowdown`) scales a row's rates where
      `host_scaling` is on (off by default: `config.PlannerValidationConfig` says why): a
      shared host drifts between fast and slow phases, and the calibration and the ground
      truth are measured minutes to hours apart.
    - each runtime a source steps under (`RUNTIMES`: the pipeline executor, the ZeRO wrapper's
      ledger), the reference at micro-batch 1 under it, each sample paired with a plain step
      right after it, among the same rounds: its median excess ÷ 2 is the runtime's cost per
      compute action (`action_overhead`, the simulator's `Hardware.action_overhead_s`).
    - the step-to-step spread: each fp32 b = 1 reference step of those rounds ÷ the median of
      its window (`step_jitter`); the slowest of N ranks that vary as it does is priced at its
      quantile 0.5^(1/N) (`straggler`, for wall-clock rows of N ≥ 2 ranks).
    - the link: on a fresh pool of two ranks (`pool_probes.probe_link`), the fastest exchange
      of 4 bytes and of 1 MiB between them → α per round and β per byte, the link of every row
      that `allreduce_scaling`'s ring fits do not price (replayed rows, rank counts that
      experiment did not run).
    - the ranks' meeting at a collective after compute (`bench.kit.meeting`, on a fresh pool
      of two ranks, where the host has two cores or more): a one-element ring all-reduce
      after `meeting_segment_s` of matmuls, against the matmuls alone. What that call costs
      beyond a link's price of it (`collective_meeting`) is paid at each meeting of a
      wall-clock row's collectives on two ranks (`Hardware.collective_meeting_s`): the links
      are fitted to calls made back to back, where no rank waits for a computing one.
    """
    window = cfg.reference_window_s
    key = (
        tuple(cfg.gemm_sizes),
        cfg.copy_mib,
        cfg.repeats,
        window,
        threads,
        cfg.meeting_segment_s,
        cfg.meeting_rounds,
    )
    if key in _CALIBRATIONS:
        return _CALIBRATIONS[key]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rates = []
        for n in cfg.gemm_sizes:
            a, b = torch.randn(ROWS * n, n), torch.randn(n, n)
            inner = max(1, int(2e7 // _flops(n)))
            rates.append(_flops(n) / _fastest(lambda a=a, b=b: a @ b, cfg.repeats, inner))
        n = cfg.gemm_sizes[-1]
        a16 = torch.randn(ROWS * n, n, dtype=torch.bfloat16)
        b16 = torch.randn(n, n, dtype=torch.bfloat16)
        bf16 = _flops(n) / _fastest(lambda: a16 @ b16, cfg.repeats)
        source = torch.empty(cfg.copy_mib * 2**18)
        target = torch.empty_like(source)
        copy_s = _fastest(lambda: target.copy_(source), cfg.repeats)
        overhead = _fastest(_tiny_autograd_chain, cfg.repeats) / (2 * CHAIN)
        reference, jitter = rounds.reference_rounds(cfg.repeats, window)
    finally:
        torch.set_num_threads(before)
    peak = max(rates)
    result = {
        "threads": threads,
        "peak_fp32_flops": peak,
        "peak_bf16_flops": bf16 * peak / rates[-1],  # bf16 on fp32's table, scaled at n max
        "gemm_table": tuple(
            (float(_flops(n)), r / peak) for n, r in zip(cfg.gemm_sizes, rates, strict=True)
        ),
        "memory_bandwidth": 2 * source.numel() * 4 / copy_s,
        "kernel_overhead_s": overhead,
        "host_probe_s": statistics.median(reference[PROBE]),
        "step_jitter": tuple(sorted(jitter)),
    }
    result["link"] = pool_probes.measure(2, [], link=True, timeout_s=cfg.timeout_s)["link"]
    if (os.cpu_count() or 1) >= MEETING_RANKS:  # two ranks, each on a core of its own
        result["meeting"] = measure_meeting(
            MEETING_RANKS, cfg.meeting_segment_s, cfg.meeting_rounds, timeout_s=cfg.timeout_s
        )
    for runtime in RUNTIMES:  # per action: the F and the B of a micro-batch
        excess = statistics.median(reference[(runtime, REFERENCE_MICRO[0])])
        result[f"action_overhead_{runtime}_s"] = max(0.0, excess / 2)
    for dtype in ("fp32", "bf16"):
        times = {micro: reference[(dtype, micro)] for micro in REFERENCE_MICRO}
        for statistic, pick in STATISTICS.items():
            measured = {micro: pick(t) for micro, t in times.items()}
            result[f"reference_{dtype}{_SUFFIX[statistic]}_s"] = measured
            result[f"fit_{dtype}{_SUFFIX[statistic]}"] = fit_reference(result, dtype, measured)
    _CALIBRATIONS[key] = result
    return result


def tp_call_work(cfg: Any, tp: int, numel: int) -> float:
    """Thread CPU seconds one TP all-reduce of `numel` float32 spends outside its rounds on
    `tp` ranks, measured on a fresh pool of them (cached per process).

    `tp_call_work`, once per (tp, activation size) a replayed TP row needs: on a fresh pool of
    tp ranks, the thread CPU one TP all-reduce of that activation spends outside its rounds
    (`pool_probes.probe_tp_call`), the work such a replay charges each call.
    """
    key = (tp, numel)
    if key not in _TP_CALLS:
        probed = pool_probes.measure(tp, [numel], timeout_s=cfg.timeout_s)
        _TP_CALLS[key] = probed["tp_call_cpu_s"][numel]
    return _TP_CALLS[key]


def _reference_timings(micro: int, dtype: str, repeats: int) -> list[float]:
    """`repeats` timed reference steps (`bench.kit.workloads.reference_step`), after one warm-up."""
    return _timings(reference_step(micro, dtype), repeats)


def _adamw_seconds_per_param(repeats: int) -> float:
    """Median `torch.optim.AdamW` step over the reference GPT's fp32 parameters (their
    gradients filled by one backward), ÷ its parameter elements."""
    from bench.kit.workloads import seeded_gpt_and_batch

    net, inputs, targets = seeded_gpt_and_batch(REFERENCE, REFERENCE_MICRO[0], seed=0)
    net.loss(net(inputs).float(), targets).backward()
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    optimizer.step()  # the state allocated before timing
    seconds = statistics.median(_timings(optimizer.step, repeats))
    return seconds / sum(p.numel() for p in params)


def rank_calibration(cfg: Any, threads: int) -> dict[str, Any]:
    """At `threads` threads: AdamW's seconds per parameter element on the reference, and
    (threads > 1) the median reference step at micro-batch 16 per dtype, timed in
    `SPEEDUP_ROUNDS` rounds alternating with the same step on one thread, so both see the
    same states of the host.

    `rank_calibration`, at the rank's own thread count (medians, for the same reason):

    - the optimizer: the median `torch.optim.AdamW` step (what the ground-truth runs use) over
      the reference GPT's fp32 parameters, ÷ its parameter elements = seconds per parameter
      element; a rank's optimizer is that × the parameter elements it updates (its stages'
      parameters, ÷ dp under ZeRO ≥ 1, where each rank steps its shard; in bf16 the update
      runs on the fp32 master copy of the same elements), ÷ its core share when ranks
      outnumber cores on the wall clock.
    - thread scaling: with more than one thread per rank, the reference step at micro-batch 16
      timed at those threads and on one thread, in alternating rounds; the rank's compute
      rate is the ratio of their medians (bounded to [1, threads], `thread_speedup`), not the
      thread count: eager PyTorch on a CPU does not scale linearly over cores.
    """
    key = (cfg.repeats, threads)
    if key in _RANK_CALIBRATIONS:
        return _RANK_CALIBRATIONS[key]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        result: dict[str, Any] = {
            "threads": threads,
            "adamw_s_per_param": _adamw_seconds_per_param(cfg.repeats),
        }
        micro, per_round = REFERENCE_MICRO[-1], max(1, cfg.repeats // SPEEDUP_ROUNDS)
        for dtype in ("fp32", "bf16"):
            one = at = None
            if threads > 1:
                ones, ats = [], []
                for _ in range(SPEEDUP_ROUNDS):
                    torch.set_num_threads(1)
                    ones += _reference_timings(micro, dtype, per_round)
                    torch.set_num_threads(threads)
                    ats += _reference_timings(micro, dtype, per_round)
                one, at = statistics.median(ones), statistics.median(ats)
            result[f"reference_{dtype}_one_thread_s"] = one
            result[f"reference_{dtype}_at_threads_s"] = at
    finally:
        torch.set_num_threads(before)
    _RANK_CALIBRATIONS[key] = result
    return result


def thread_speedup(local: dict[str, Any], dtype: str) -> float:
    """The reference step's speedup at the rank's threads over one thread (1 at one
    thread), bounded to [1, threads]: outside it the probe was disturbed (another process
    on the cores), and the bound is the best that is still physical."""
    at_threads = local[f"reference_{dtype}_at_threads_s"]
    if at_threads is None:
        return 1.0
    speedup = local[f"reference_{dtype}_one_thread_s"] / at_threads
    return min(max(speedup, 1.0), float(local["threads"]))


def reference_plan(micro: int) -> tuple[Any, Any]:
    """The reference GPT and its one-process plan at micro-batch `micro`, as the simulator
    takes them."""
    from impls.costmodel.compute import TransformerSpec
    from impls.simulator import ParallelPlan

    spec = TransformerSpec(
        n_layers=REFERENCE["n_layers"],
        d_model=REFERENCE["d_model"],
        n_heads=REFERENCE["n_heads"],
        vocab_size=REFERENCE["vocab_size"],
        seq_len=REFERENCE["seq_len"],
    )
    plan = ParallelPlan(
        dp=1, tp=1, pp=1, microbatch_size=micro, stage_layers=(REFERENCE["n_layers"] + 2,)
    )
    return spec, plan


def fit_reference(cal: dict[str, Any], dtype: str, measured: dict[int, float]) -> dict:
    """(scale, overhead) making the simulator's single-process compute equal the
    reference steps measured at two micro-batch sizes: compute = scale·A(b) + overhead·K(b),
    A the microbenchmarks' time without overhead, K the kernels the simulator counts.
    Falls back to the microbenchmark's overhead when the two-point solution is not
    positive."""
    from impls.simulator import simulate

    link = (1e-6, 1e-9)
    terms = []
    for micro in sorted(measured):
        spec, plan = reference_plan(micro)
        a = simulate(spec, plan, host_hardware(cal, link, overhead_s=0.0), dtype=dtype)
        k = simulate(spec, plan, host_hardware(cal, link, overhead_s=1e-3), dtype=dtype)
        terms.append((a.compute_s, (k.compute_s - a.compute_s) / 1e-3, measured[micro]))
    (a1, k1, t1), (a2, k2, t2) = terms[0], terms[-1]
    det = a1 * k2 - a2 * k1
    scale = (t1 * k2 - t2 * k1) / det if det else 0.0
    overhead = (a1 * t2 - a2 * t1) / det if det else 0.0
    fitted = scale > 0 and overhead > 0
    if not fitted:
        overhead = cal["kernel_overhead_s"]
        scale = max((t2 - overhead * k2) / a2, 1e-3)
    return {"scale": scale, "overhead_s": overhead, "kernels": k2, "two_point": fitted}
