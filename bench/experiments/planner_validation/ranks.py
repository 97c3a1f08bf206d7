"""What the one rank of a `planner_validation` cell does: calibrate this host (once per
process, on one thread; the optimizer and thread scaling once per thread count a rank runs
at), then predict one ground-truth configuration.

Calibration, measured here with torch on this CPU (`calibrate`):

- GEMM: the fastest of `repeats` tall (8n × n)·(n × n) fp32 matmuls per n of `gemm_sizes`;
  the fastest rate is the peak, each size's rate ÷ peak a point of the GEMM-efficiency
  table (the simulator interpolates it log-linearly over a GEMM's FLOPs,
  `Hardware.efficiency`). bf16 is timed at the largest n and shares fp32's table.
- memory bandwidth: a `copy_mib` MiB tensor copied (read + write = 2 × its bytes moved).
- per-op overhead: a chain of one-element autograd multiplications, forward and backward.
- the reference fit (`fit_reference`): one forward + loss + backward + zero_grad (the
  gradients kept allocated, `set_to_none=False`, as the ground-truth runs do) of a
  reference GPT (none of the ground-truth shapes) on one process at micro-batch 1 and 16,
  per dtype; a factor dividing every microbenchmark rate and a per-kernel overhead are
  solved so that the simulator's single-process compute equals both (eager PyTorch on a
  CPU reaches neither the GEMM peak nor the copy bandwidth in a model's small kernels).

At the rank's own thread count (`rank_calibration`, cached per thread count):

- the optimizer: the fastest `torch.optim.AdamW` step (what the ground-truth runs use) over
  the reference GPT's fp32 parameters, ÷ its parameter elements = seconds per parameter
  element; a rank's optimizer is that × the parameter elements it updates (its stages',
  ÷ dp under ZeRO; low precision updates fp32 master weights, so the same fp32 cost, the
  master casts unpriced), ÷ the core share under modelled core sharing. It replaces the
  simulator's memory-bandwidth price of Adam, which is several times below what torch's
  AdamW costs on a CPU for these parameter counts.
- thread scaling: with more than one thread per rank, the reference step at micro-batch 16
  timed at those threads and on one thread, in alternating rounds; the rank's compute
  rate is the measured speedup (bounded to [1, threads]), not the thread count: eager
  PyTorch on a CPU does not scale linearly over cores.

The link's α and β are not measured here: they come with the cell (`carry`), read from
`parallelism_comparison`'s own probe of this host (`bench.kit.host.probe_pairs`: the
fastest exchange of 4 bytes and of 1 MiB between two ranks), the median over its rows.

Prediction (`predict`): the simulator (`impls.simulator.simulate`) on the calibrated
`Hardware`, the plan laid out as this repo's implementations lay it out (blocks split
evenly, the first stage holding the embedding and the last the LM head,
`impls.models.stages.stage_layer_ranges`), its optimizer time replaced by the measured
AdamW cost. A rank's rates are scaled by `rank_rates` (threads per rank, modelled core
sharing when ranks outnumber cores on the wall clock), a rank with several threads at the
measured thread speedup.

Memory is composed here, not by the simulator (whose model is GPU training with 2-byte
activations, Korthikanti et al. 2022): the exact bytes autograd saves in this repo's GPT
(`impls.costmodel.memory.activation_bytes`'s terms, split per stage and sharded by tp),
held for the in-flight micro-batches the schedule keeps
(`impls.simulator.memory.held_activation_peak`), plus the model states of the rank's
parameters under its ZeRO stage (`impls.costmodel.memory.model_state_bytes`) and, under
ZeRO-3, the parameters gathered at once (one block and the non-block parameters, what
`zero_memory` measures as gathered_peak_bytes).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

__all__ = ["activation_stage_bytes", "calibrate", "host_hardware", "optimizer_params",
           "params_per_stage", "predict", "rank_calibration", "run", "stage_layers",
           "thread_speedup"]  # fmt: skip

_STAT = 4  # LayerNorm / log-sum-exp statistics are fp32 (memory.activation_bytes)
_INDEX = 8  # int64 positions
_CALIBRATIONS: dict[tuple, dict[str, Any]] = {}
_RANK_CALIBRATIONS: dict[tuple, dict[str, Any]] = {}
ROWS = 8  # calibration GEMMs are (8n × n)·(n × n): tall, as tokens × width are
REFERENCE = {"d_model": 128, "n_layers": 4, "n_heads": 4, "seq_len": 64, "vocab_size": 256,
             "bias": False}  # fmt: skip
"""The reference GPT timed on one process (none of the ground-truth shapes)."""
REFERENCE_MICRO = (1, 16)
CHAIN = 50  # tiny ops in the per-kernel overhead probe (each runs forward and backward)


def _flops(n: int) -> int:
    return 2 * ROWS * n**3


def _tiny_autograd_chain() -> None:
    """`CHAIN` one-element multiplications through autograd, forward then backward."""
    x = torch.ones(1, requires_grad=True)
    y = x
    for _ in range(CHAIN):
        y = y * 1.0
    y.backward()


def _fastest(fn, repeats: int, inner: int = 1) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def calibrate(cfg: Any, threads: int) -> dict[str, Any]:
    """This host's GEMM table, peaks, bandwidth and per-kernel overhead at `threads`."""
    key = (tuple(cfg.gemm_sizes), cfg.copy_mib, cfg.repeats, threads)
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
        reference = {(dtype, micro): _reference_seconds(micro, dtype, cfg.repeats)
                     for dtype in ("fp32", "bf16") for micro in REFERENCE_MICRO}  # fmt: skip
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
    }
    for dtype in ("fp32", "bf16"):
        measured = {micro: reference[(dtype, micro)] for micro in REFERENCE_MICRO}
        result[f"reference_{dtype}_s"] = measured
        result[f"fit_{dtype}"] = fit_reference(result, dtype, measured)
    _CALIBRATIONS[key] = result
    return result


def host_hardware(cal: dict[str, Any], link: tuple[float, float], rate: float = 1.0, *,
                  overhead_s: float | None = None) -> Any:  # fmt: skip
    """The calibrated host as the simulator's `Hardware`: the microbenchmarks' FLOP/s and
    bandwidth × `rate`, `overhead_s` per kernel (None: the microbenchmark's)."""
    from impls.costmodel.hardware import Hardware, Link

    alpha, beta = link
    wire = Link(name="loopback (gloo)", alpha_s=alpha, bandwidth=1.0 / beta)
    # this repo's collectives are blocking calls on the rank's one computing thread
    overhead = cal["kernel_overhead_s"] if overhead_s is None else overhead_s
    return Hardware(
        name=f"this host, rate {rate:.3g} of one thread",
        devices_per_node=1 << 20,  # every rank on this one host: the intra link throughout
        peak_flops={
            "fp32": cal["peak_fp32_flops"] * rate,
            "bf16": cal["peak_bf16_flops"] * rate,
        },  # fmt: skip
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        memory_bandwidth=cal["memory_bandwidth"] * rate,
        intra=wire,
        inter=wire,
        gemm_efficiency=tuple(sorted(cal["gemm_table"])),
        elementwise_efficiency=1.0,  # the copy's achieved bandwidth is already the rate
        kernel_overhead_s=overhead,
        comm_overlap=False,
        sources={"all": "measured on this host in this run (planner_validation.ranks)"},
    )


def _reference_seconds(micro: int, dtype: str, repeats: int) -> float:
    """Fastest forward + loss + backward + zero_grad of the reference GPT on one process
    (the gradients kept allocated, as the ground-truth runs zero them)."""
    from bench.kit.workloads import seeded_gpt_and_batch

    net, inputs, targets = seeded_gpt_and_batch(REFERENCE, micro, seed=0)
    if dtype == "bf16":
        net = net.to(torch.bfloat16)

    def step() -> None:
        net.loss(net(inputs).float(), targets).backward()
        net.zero_grad(set_to_none=False)

    return _fastest(step, repeats)


def _adamw_seconds_per_param(repeats: int) -> float:
    """Fastest `torch.optim.AdamW` step over the reference GPT's fp32 parameters (their
    gradients filled by one backward), ÷ its parameter elements."""
    from bench.kit.workloads import seeded_gpt_and_batch

    net, inputs, targets = seeded_gpt_and_batch(REFERENCE, REFERENCE_MICRO[0], seed=0)
    net.loss(net(inputs).float(), targets).backward()
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    optimizer.step()  # the state allocated before timing
    return _fastest(optimizer.step, repeats) / sum(p.numel() for p in params)


SPEEDUP_ROUNDS = 3  # alternating one-thread / rank-thread rounds of the speedup probe


def rank_calibration(cfg: Any, threads: int) -> dict[str, Any]:
    """At `threads` threads: AdamW's seconds per parameter element on the reference, and
    (threads > 1) the reference step at micro-batch 16 per dtype, timed in
    `SPEEDUP_ROUNDS` rounds alternating with the same step on one thread (the fastest of
    each), so both see the same state of the host."""
    key = (cfg.repeats, threads)
    if key in _RANK_CALIBRATIONS:
        return _RANK_CALIBRATIONS[key]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        result: dict[str, Any] = {"threads": threads,
                                  "adamw_s_per_param": _adamw_seconds_per_param(cfg.repeats)}  # fmt: skip
        micro, per_round = REFERENCE_MICRO[-1], max(1, cfg.repeats // SPEEDUP_ROUNDS)
        for dtype in ("fp32", "bf16"):
            one = at = None
            if threads > 1:
                one = at = float("inf")
                for _ in range(SPEEDUP_ROUNDS):
                    torch.set_num_threads(1)
                    one = min(one, _reference_seconds(micro, dtype, per_round))
                    torch.set_num_threads(threads)
                    at = min(at, _reference_seconds(micro, dtype, per_round))
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


def _reference_plan(micro: int) -> tuple[Any, Any]:
    from impls.costmodel.compute import TransformerSpec
    from impls.simulator import ParallelPlan

    spec = TransformerSpec(n_layers=REFERENCE["n_layers"], d_model=REFERENCE["d_model"],
                           n_heads=REFERENCE["n_heads"], vocab_size=REFERENCE["vocab_size"],
                           seq_len=REFERENCE["seq_len"])  # fmt: skip
    plan = ParallelPlan(dp=1, tp=1, pp=1, microbatch_size=micro,
                        stage_layers=(REFERENCE["n_layers"] + 2,))  # fmt: skip
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
        spec, plan = _reference_plan(micro)
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


def stage_layers(n_layers: int, stages: int) -> tuple[int, ...]:
    """This repo's split as the simulator counts it (embedding and head as layers)."""
    from impls.models.stages import stage_layer_ranges

    counts = [len(r) for r in stage_layer_ranges(n_layers, stages)]
    counts[0] += 1
    counts[-1] += 1
    return tuple(counts)


def _block_params(m: dict, tp: int) -> float:
    h, f, bias = m["d_model"], 4 * m["d_model"], bool(m.get("bias", False))
    matrices = (4 * h * h + 2 * h * f) / tp  # q/k/v, output, MLP in and out, all sharded
    biases = ((3 * h + f) / tp + 2 * h) if bias else 0  # column-parallel sharded, rows not
    norms = 2 * h * (2 if bias else 1)
    return matrices + biases + norms


def params_per_stage(m: dict, stages: int, tp: int) -> list[float]:
    """Parameters one rank of each stage holds: blocks, the vocab-sharded embedding and
    positions on the first, the final LayerNorm and vocab-sharded head on the last."""
    from impls.models.stages import stage_layer_ranges

    h, bias = m["d_model"], bool(m.get("bias", False))
    out = [len(r) * _block_params(m, tp) for r in stage_layer_ranges(m["n_layers"], stages)]
    out[0] += m["vocab_size"] * h / tp + m["seq_len"] * h
    out[-1] += h * (2 if bias else 1) + m["vocab_size"] * h / tp
    return out


def activation_stage_bytes(m: dict, micro: int, stages: int, tp: int, elem: int) -> list[float]:
    """Bytes saved per micro-batch by each stage: `memory.activation_bytes`'s terms, the
    LayerNorm inputs/outputs kept whole and the q/k/v, attention output, MLP and
    log-softmax sharded by tp (Megatron's column/row split)."""
    from impls.models.stages import stage_layer_ranges

    t, h, s = micro * m["seq_len"], m["d_model"], m["seq_len"]
    f, a, v = 4 * h, m["n_heads"], m["vocab_size"]
    block = (4 * t * h + (4 * t * h + 2 * t * f) / tp) * elem + (4 * t + t * a / tp) * _STAT
    head = (2 * t * h + t * v / tp) * elem + 2 * t * _STAT
    out = [len(r) * block for r in stage_layer_ranges(m["n_layers"], stages)]
    out[0] += s * _INDEX
    out[-1] += head
    return out


def _memory(truth: dict[str, Any]) -> dict[str, float]:
    from impls.costmodel.memory import bytes_per_param_for, model_state_bytes
    from impls.pipeline.schedules import build_plan
    from impls.simulator.memory import held_activation_peak

    m, pp, v, tp = truth["model"], truth["pp"], truth["virtual_stages"], truth["tp"]
    elem = 2 if truth["precision"] == "bf16" else 4
    acts = activation_stage_bytes(m, truth["microbatch_size"], pp * v, tp, elem)
    params = params_per_stage(m, pp * v, tp)
    schedule = truth["schedule"] if pp > 1 else "1f1b"  # pp = 1: accumulation, one held
    plan = build_plan(schedule, pp, truth["microbatches"], v)
    b = bytes_per_param_for(truth["precision"])
    best = {"total": -1.0}
    for rank in range(pp):
        mine = sum(params[s] for s in range(rank, pp * v, pp))
        states = model_state_bytes(mine, truth["zero_stage"], truth["dp"], b).total
        held = held_activation_peak(plan[rank], acts)
        gathered = 0.0
        if truth["zero_stage"] == 3:  # one block and the non-block parameters, gathered
            gathered = b.weights * (_block_params(m, tp) + params_per_stage(m, 1, tp)[0]
                                    - m["n_layers"] * _block_params(m, tp))  # fmt: skip
        total = held + (states + gathered if truth["memory_includes_states"] else 0.0)
        if total > best["total"]:
            best = {"total": total, "states": states, "activations": held,
                    "gathered": gathered}  # fmt: skip
    return best


def optimizer_params(truth: dict[str, Any]) -> float:
    """Parameter elements the busiest rank's optimizer updates: its stages' parameters
    (virtual stages r, r + P, ...), ÷ dp under ZeRO (each rank steps its shard)."""
    m, pp, v, tp = truth["model"], truth["pp"], truth["virtual_stages"], truth["tp"]
    params = params_per_stage(m, pp * v, tp)
    busiest = max(sum(params[s] for s in range(rank, pp * v, pp)) for rank in range(pp))
    return busiest / truth["dp"] if truth["zero_stage"] >= 1 else busiest


def predict(truth: dict[str, Any], hw: Any, adamw_s_per_param: float | None = None) -> dict:
    """The simulator's step for `truth`'s plan on `hw`, and the composed memory; with
    `adamw_s_per_param`, the optimizer priced at that × `optimizer_params` instead of the
    simulator's memory-bandwidth model."""
    from impls.costmodel.compute import TransformerSpec
    from impls.simulator import ParallelPlan, simulate

    m = truth["model"]
    spec = TransformerSpec(n_layers=m["n_layers"], d_model=m["d_model"], n_heads=m["n_heads"],
                           vocab_size=m["vocab_size"], seq_len=m["seq_len"])  # fmt: skip
    stages = truth["pp"] * truth["virtual_stages"]
    plan = ParallelPlan(
        dp=truth["dp"], tp=truth["tp"], pp=truth["pp"], zero_stage=truth["zero_stage"],
        microbatch_size=truth["microbatch_size"], num_microbatches=truth["microbatches"],
        schedule=truth["schedule"], virtual_stages=truth["virtual_stages"],
        stage_layers=stage_layers(m["n_layers"], stages),
    )  # fmt: skip
    p = simulate(spec, plan, hw, dtype=truth["precision"],
                 dp_collectives=truth.get("dp_collectives", 1))  # fmt: skip
    optimizer = 0.0
    if truth["optimizer"]:
        optimizer = (p.optimizer_s if adamw_s_per_param is None
                     else adamw_s_per_param * optimizer_params(truth))  # fmt: skip
    memory = _memory(truth)
    return {
        "predicted_step_time_s": p.step_time_s - p.optimizer_s + optimizer,
        "predicted_compute_s": p.compute_s,
        "predicted_bubble_s": p.bubble_s,
        "predicted_tp_s": p.exposed_tp_s,
        "predicted_pp_s": p.exposed_pp_s,
        "predicted_dp_s": p.exposed_dp_s,
        "predicted_optimizer_s": optimizer,
        "predicted_peak_bytes": memory["total"],
        "predicted_state_bytes": memory["states"],
        "predicted_activation_bytes": memory["activations"],
        "predicted_gathered_bytes": memory["gathered"],
    }


def rank_rates(ranks_: int, cores: int, wall_clock: bool) -> tuple[int, float, float]:
    """(threads, compute rate, overhead factor) of one rank against the 1-thread
    calibration: max(1, cores // N) threads (`bench.launch`'s rule) at that many times the
    single-thread rates (assumption: linear over the cores); with more ranks than cores on
    the wall clock, cores/N of one thread and every kernel's overhead stretched by N/cores
    (modelled core sharing). Replayed timelines price each rank alone: no sharing."""
    threads = max(1, cores // ranks_)
    if ranks_ > cores and wall_clock:
        return threads, cores / ranks_, ranks_ / cores
    return threads, float(threads), 1.0


def run(cfg: Any, cell: Any) -> dict[str, Any]:
    """Calibrate (cached) and predict `cell.carry`, the ground-truth row."""
    truth = cell.carry
    cal = calibrate(cfg, 1)
    threads, rate, stretch = rank_rates(truth["ranks"], truth["host_cores"],
                                        truth["ground_truth"] != "replayed")  # fmt: skip
    local = rank_calibration(cfg, threads)
    speedup = thread_speedup(local, truth["precision"])
    if threads > 1:
        rate = speedup  # measured on the reference, not the thread count
    fit = cal[f"fit_{truth['precision']}"]
    hw = host_hardware(cal, truth["link"], rate / fit["scale"],
                       overhead_s=fit["overhead_s"] * stretch)  # fmt: skip
    adamw = local["adamw_s_per_param"] / min(rate, 1.0)  # a core share stretches it
    row = predict(truth, hw, adamw)
    row.update({
        "threads_per_rank": threads, "compute_rate": rate, "overhead_stretch": stretch,
        "cal_thread_speedup": speedup, "cal_adamw_s_per_param": local["adamw_s_per_param"],
        "optimizer_params": optimizer_params(truth),
        **{f"cal_reference_{d}_micro{REFERENCE_MICRO[-1]}_{k}_s": local[f"reference_{d}_{k}_s"]
           for d in ("fp32", "bf16") for k in ("one_thread", "at_threads")},
        "cal_peak_fp32_flops": cal["peak_fp32_flops"], "cal_peak_bf16_flops":
        cal["peak_bf16_flops"], "cal_memory_bandwidth": cal["memory_bandwidth"],
        "cal_kernel_overhead_s": cal["kernel_overhead_s"],
        "cal_gemm_table": ";".join(f"{f:.3g}:{e:.3f}" for f, e in cal["gemm_table"]),
        "fit_scale": fit["scale"], "fit_overhead_s": fit["overhead_s"],
        "fit_two_point": fit["two_point"],
        **{f"reference_{d}_micro{b}_s": cal[f"reference_{d}_s"][b] for d in ("fp32", "bf16")
           for b in REFERENCE_MICRO},
        "link_alpha_s": truth["link"][0], "link_beta_s_per_byte": truth["link"][1],
    })  # fmt: skip
    return row
