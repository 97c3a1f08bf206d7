"""What the one rank of a `planner_validation` cell does: calibrate this host
(`calibration`: cached per process and per thread count), then predict one ground-truth
configuration.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import math
from typing import Any

from bench.experiments.base import Cell
from bench.experiments.planner_validation import calibration
from bench.experiments.planner_validation.config import PlannerValidationConfig
from impls.costmodel.comm import allreduce_rounds

__all__ = [
    "activation_stage_bytes",
    "carries_tp_calls",
    "optimizer_params",
    "params_per_stage",
    "predict",
    "host_slowdown",
    "rank_rates",
    "round_alpha",
    "run",
    "stage_layers",
]

_STAT = 4  # LayerNorm / log-sum-exp statistics are fp32 (activations.activation_bytes)
_INDEX = 8  # int64 positions


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
    """Bytes saved per micro-batch by each stage: `activations.activation_bytes`'s terms, the
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
            gathered = b.weights * (
                _block_params(m, tp)
                + params_per_stage(m, 1, tp)[0]
                - m["n_layers"] * _block_params(m, tp)
            )
        total = held + (states + gathered if truth["memory_includes_states"] else 0.0)
        if total > best["total"]:
            best = {"total": total, "states": states, "activations": held, "gathered": gathered}
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
    from bench.kit.prediction import prediction_row
    from impls.costmodel.compute import TransformerSpec
    from impls.simulator import ParallelPlan, simulate

    m = truth["model"]
    spec = TransformerSpec(
        n_layers=m["n_layers"],
        d_model=m["d_model"],
        n_heads=m["n_heads"],
        vocab_size=m["vocab_size"],
        seq_len=m["seq_len"],
    )
    stages = truth["pp"] * truth["virtual_stages"]
    plan = ParallelPlan(
        dp=truth["dp"],
        tp=truth["tp"],
        pp=truth["pp"],
        zero_stage=truth["zero_stage"],
        microbatch_size=truth["microbatch_size"],
        num_microbatches=truth["microbatches"],
        schedule=truth["schedule"],
        virtual_stages=truth["virtual_stages"],
        stage_layers=stage_layers(m["n_layers"], stages),
    )
    p = simulate(
        spec, plan, hw, dtype=truth["precision"], dp_collectives=truth.get("dp_collectives", 1)
    )
    optimizer = 0.0
    if truth["optimizer"]:
        optimizer = (
            p.optimizer_s
            if adamw_s_per_param is None
            else adamw_s_per_param * optimizer_params(truth)
        )
    memory = _memory(truth)
    return {
        **prediction_row(p, parts="predicted_{part}_s", optimizer_s=optimizer, summary=False),
        "predicted_peak_bytes": memory["total"],
        "predicted_state_bytes": memory["states"],
        "predicted_activation_bytes": memory["activations"],
        "predicted_gathered_bytes": memory["gathered"],
    }


def host_slowdown(source_probe: float, calibration_probe: float) -> float:
    """How much slower the host ran while the source measured than where this run
    calibrated: the host probe's step (`bench.kit.host.host_probe`) as the source's runner
    timed it between its other cells (`experiment.source_host_probe`: the probes next to
    the row's own cell left out) ÷ the same probe timed among the calibration's reference
    rounds. Every compute rate of the row's hardware is divided by it, its per-kernel
    overhead, AdamW cost, TP call work and this run's own link (α and β) multiplied (a
    ring fit read from `allreduce_scaling`'s report is kept as it is): a calibration made
    at another time, or on another machine, priced at the speed the source's run saw.
    1 where either probe is missing (a source run without probes)."""
    probes = (source_probe, calibration_probe)
    if not all(math.isfinite(p) and p > 0 for p in probes):
        return 1.0
    return source_probe / calibration_probe


def carries_tp_calls(truth: dict[str, Any]) -> bool:
    """Whether the row's replay charges each TP all-reduce its own work (a replayed row
    with tp ≥ 2); a wall-clock row's ring fit already holds that work in its α."""
    return truth["ground_truth"] == "replayed" and truth["tp"] >= 2


def round_alpha(truth: dict[str, Any], alpha: float, call: float) -> tuple[float, float]:
    """(α per round the row is priced at, the TP call CPU it carries), from the link's
    `alpha` and `call`, the own work of one TP all-reduce this run measured.

    A replayed TP row's timeline (`parallelism_comparison`'s replay) prices each TP
    all-reduce as its own work between rounds (the slicing, reductions and bookkeeping of
    this repo's ring) plus α per round and β per byte. The simulator's link has one α, so
    that work, spread over the ring's 2(t − 1) rounds, joins it: the row's TP all-reduces
    then cost what such a replay charges (its few DP rounds and pipeline sends carry the
    share too)."""
    if not carries_tp_calls(truth) or not call > 0:
        return alpha, 0.0
    return alpha + call / allreduce_rounds(truth["tp"]), call


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


def run(cfg: PlannerValidationConfig, cell: Cell) -> dict[str, Any]:
    """Calibrate (cached) and predict `cell.carry`, the ground-truth row.

    The link's α and β come with the cell (`carry`), fitted to `allreduce_scaling`'s ring at
    the row's rank count, or (`link` None) are this run's own two-rank probe
    (`calibration.calibrate`'s `link`; `experiment.py` says which row takes which); a
    replayed TP row adds to α its collectives' own work per round, measured by this run on a
    pool of its tp ranks at its activation's size (`calibration.tp_call_work`, `round_alpha`).
    No number the source measured in the row's own cell enters the prediction. What this run
    measured on the host — compute, overheads, AdamW, the TP call work and its own link — is
    priced at the calibration's host speed, or with `cfg.host_scaling` at the source run's
    (`host_slowdown`); the other of the two is kept beside it.

    Prediction (`predict`): the simulator (`impls.simulator.simulate`) on the calibrated
    `Hardware`, the plan laid out as this repo's implementations lay it out (blocks split
    evenly, the first stage holding the embedding and the last the LM head,
    `impls.models.stages.stage_layer_ranges`), its optimizer time replaced by the measured
    AdamW cost. A rank's rates are scaled by `rank_rates` (threads per rank, modelled core
    sharing when ranks outnumber cores on the wall clock), a rank with several threads at the
    measured thread speedup.

    Memory is composed here, not by the simulator (whose model is GPU training with 2-byte
    activations, Korthikanti et al. 2022): the exact bytes autograd saves in this repo's GPT
    (`impls.costmodel.activations.activation_bytes`'s terms, split per stage and sharded by tp),
    held for the in-flight micro-batches the schedule keeps
    (`impls.simulator.memory.held_activation_peak`), plus the model states of the rank's
    parameters under its ZeRO stage (`impls.costmodel.memory.model_state_bytes`) and, under
    ZeRO-3, the parameters gathered at once (one block and the non-block parameters, what
    `zero_memory` measures as gathered_peak_bytes).
    """
    truth = cell.carry
    cal = calibration.calibrate(cfg, 1)
    wall_clock = truth["ground_truth"] != "replayed"
    threads, rate, stretch = rank_rates(truth["ranks"], truth["host_cores"], wall_clock)
    local = calibration.rank_calibration(cfg, threads)
    speedup = calibration.thread_speedup(local, truth["precision"])
    if threads > 1:
        rate = speedup  # measured on the reference, not the thread count
    fit = calibration.fit_for(cal, truth["precision"], truth.get("statistic", "median"))
    own = truth.get("link") is None  # this run's probe, not a ring fit read from a report
    wire = cal["link"] if own else truth["link"]
    call = (
        calibration.tp_call_work(cfg, truth["tp"], truth["tp_call_numel"])
        if carries_tp_calls(truth)
        else 0.0
    )
    probe, cal_probe = truth.get("host_probe_s", math.nan), cal.get("host_probe_s", math.nan)
    slowdown = host_slowdown(probe, cal_probe)
    action = calibration.action_overhead(cal, truth.get("runtime"))
    # the ranks' meetings after compute: on the wall clock, each rank on a core of its own
    meets = wall_clock and 2 <= truth["ranks"] <= truth["host_cores"]

    def predicted(host: float, straggle: float) -> dict[str, Any]:
        """The row priced on a host `host` times slower than the calibration's, its rank
        `straggle` times slower again (compute only). What this run measured on the host
        — compute, overheads, AdamW, the TP call work and its own link — is scaled by
        `host`; a link read from another report is kept."""
        scale = host if own else 1.0
        alpha, _ = round_alpha(truth, wire[0] * scale, call * host)
        link = (alpha, wire[1] * scale)
        slower = host * straggle
        meeting = calibration.collective_meeting(cal, truth["ranks"], link) if meets else 0.0
        hw = calibration.host_hardware(
            cal,
            link,
            rate / fit["scale"] / slower,
            overhead_s=fit["overhead_s"] * stretch * slower,
            p2p_blocking=wall_clock,
            action_overhead_s=action * stretch * slower,
            meeting_s=meeting,
        )
        adamw = local["adamw_s_per_param"] / min(rate, 1.0)  # a core share stretches it
        return {
            **predict(truth, hw, adamw * slower),
            "round_alpha_s": alpha,
            "link_scale": scale,
            "collective_meeting_s": meeting,
        }

    # a wall-clock step ends with the slowest of its ranks; a replay prices each action alone
    straggle = calibration.straggler(cal, truth["ranks"]) if wall_clock else 1.0
    host = slowdown if cfg.host_scaling else 1.0
    row = predicted(host, straggle)
    plain = row if host == 1.0 else predicted(1.0, straggle)
    scaled = row if host == slowdown else predicted(slowdown, straggle)
    alone = row if straggle == 1.0 else predicted(host, 1.0)
    row.update(
        {
            "predicted_unscaled_step_time_s": plain["predicted_step_time_s"],
            "predicted_host_scaled_step_time_s": scaled["predicted_step_time_s"],
            "host_scaling": bool(cfg.host_scaling),
            "predicted_without_straggler_step_time_s": alone["predicted_step_time_s"],
            "straggler": straggle,
            "host_probe_s": probe,
            "cal_host_probe_s": cal_probe,
            "host_slowdown": slowdown,
            "threads_per_rank": threads,
            "compute_rate": rate,
            "overhead_stretch": stretch,
            "p2p_blocking": wall_clock,
            "cal_thread_speedup": speedup,
            "optimizer_params": optimizer_params(truth),
            "link_alpha_s": wire[0],
            "link_beta_s_per_byte": wire[1],
            "tp_call_numel": truth.get("tp_call_numel", 0),
            "tp_call_cpu_s": call,
            "runtime": truth.get("runtime"),
            "action_overhead_s": action,
            **_calibration_columns(cal, local, fit, truth["precision"]),
        }
    )
    return row


def _calibration_columns(cal: dict, local: dict, fit: dict, dtype: str) -> dict[str, Any]:
    """What the row was priced on, as this run measured it: the one-thread calibration,
    the rank's thread-count calibration and the reference fits."""
    micro = calibration.REFERENCE_MICRO
    return {
        "cal_adamw_s_per_param": local["adamw_s_per_param"],
        **{
            f"cal_reference_{d}_micro{micro[-1]}_{k}_s": local[f"reference_{d}_{k}_s"]
            for d in ("fp32", "bf16")
            for k in ("one_thread", "at_threads")
        },
        "cal_peak_fp32_flops": cal["peak_fp32_flops"],
        "cal_peak_bf16_flops": cal["peak_bf16_flops"],
        "cal_memory_bandwidth": cal["memory_bandwidth"],
        "cal_kernel_overhead_s": cal["kernel_overhead_s"],
        "cal_gemm_table": ";".join(f"{f:.3g}:{e:.3f}" for f, e in cal["gemm_table"]),
        "fit_scale": fit["scale"],
        "fit_overhead_s": fit["overhead_s"],
        "fit_two_point": fit["two_point"],
        **{
            f"fit_{stat}_{k}": calibration.fit_for(cal, dtype, stat)[k]
            for stat in calibration.STATISTICS
            for k in ("scale", "overhead_s")
        },
        **{
            f"reference_{d}_micro{b}{k}_s": cal[f"reference_{d}{k}_s"][b]
            for d in ("fp32", "bf16")
            for b in micro
            for k in ("", "_fastest")
        },
        **{
            f"cal_meeting_{k}": (cal.get("meeting") or {}).get(k, math.nan)
            for k in ("after_compute_s", "call_s", "segment_s", "world_size")
        },
        **{
            f"cal_action_overhead_{name}_s": calibration.action_overhead(cal, name)
            for name in calibration.RUNTIMES
        },
    }
