"""What an `at_scale` cell computes, in the runner's process: one figure priced by the
simulator.

Published rows rebuild the run's plan from its published layout and compare the
simulator's throughput with the paper's, in the paper's own FLOPs convention. Lecture rows
follow the lecture's arithmetic (C = 6ND, D ≈ 20N, time = work ÷ throughput) with the
throughput taken from the simulator. Nothing is measured here."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from bench.experiments.at_scale.config import AtScaleConfig
from bench.experiments.base import Cell

__all__ = ["run"]

HOUR, YEAR = 3600.0, 365.25 * 24 * 3600.0
GPT3 = {
    "params": 175e9,
    "tokens": 300e9,
    "source": "Brown et al. 2020 (GPT-3), Table 2.1 / §2.2: 175B parameters, 300B tokens",
}
LAMBDA = {
    "hours": 3.1e6,
    "years": 355,
    "flops": 28e12,
    "source": "lecture 003 (numbers from lambdalabs.com/blog/demystifying-gpt-3: "
    "C = 3.14e23 FLOPs on a V100 at 28 TFLOP/s)",
}
SUMMIT = {
    "6": 49 * 60 + 50,
    "768": 28,
    "1536": 14,
    "videos": 240_000,
    "epochs": 100,
    "batch_per_gpu": 8,
    "dtype": "fp32",  # assumption: TSM's 2019 code trains in fp32
    "source": "lecture 003: TSM on SUMMIT, Kinetics 240k videos × 100 epochs; 8 clips "
    "per GPU: Lin et al. 2019, 'Training Kinetics in 15 Minutes' (arXiv "
    "1910.00932), a mini-batch of 12,288 clips on 1,536 GPUs",
}


def run(cfg: AtScaleConfig, cell: Cell) -> dict[str, Any]:
    kind, name = cell.key["kind"], cell.key["name"]
    if kind == "published":
        return _published(name)
    return {
        "gpt3_gpu_hours": _gpt3_hours,
        "gpt3_gpu_hours_lambda": _gpt3_hours,
        "gpt3_one_gpu_years": _gpt3_one_gpu,
        "chinchilla": _chinchilla,
    }.get(name, _summit)(cfg, name)


def _row(
    metric: str, unit: str, predicted: float, published: float, source: str, **extra: Any
) -> dict[str, Any]:
    ratio = predicted / published if published else math.nan
    return {
        "metric": metric,
        "unit": unit,
        "predicted": predicted,
        "published": published,
        "ratio": ratio,
        "abs_error": abs(ratio - 1.0),
        "source": source,
        **extra,
    }


def _plan_columns(plan: Any, p: Any) -> dict[str, Any]:
    from bench.kit.prediction import prediction_row

    return {
        "dp": plan.dp,
        "cp": plan.cp,
        "tp": plan.tp,
        "pp": plan.pp,
        "sp": plan.sp,
        "zero_stage": plan.zero_stage,
        "microbatch_size": plan.microbatch_size,
        "num_microbatches": plan.num_microbatches,
        "schedule": plan.schedule,
        "virtual_stages": plan.virtual_stages,
        "recompute": plan.recompute,
        **prediction_row(p),
    }


def _cluster(name: str, per_node: int | None = None) -> Any:
    from impls.costmodel.presets import hardware

    hw = hardware(name)
    return replace(hw, devices_per_node=per_node) if per_node else hw


def _published(name: str) -> dict[str, Any]:
    """The run priced in its source's metric, with the interval the other sources' residuals
    give it (leave-one-source-out: its own source's rows never widen or centre it)."""
    from impls.simulator.validation import leave_one_source_out, published_predictions

    predictions = published_predictions()
    mine = next(p for p in predictions if p.run.name == name)
    run = mine.run
    check = next(c for c in leave_one_source_out(predictions) if c.source == run.origin)
    low, high = check.interval.around(mine.predicted)
    columns = {
        "model": run.model,
        "hardware": run.hardware,
        "gpus": run.gpus,
        "global_batch": run.global_batch,
        "seq_len": run.seq_len,
        "assumed": ", ".join(run.assumed) or "—",
        "origin": run.origin,
        "error": mine.error,
        "interval_low": low,
        "interval_high": high,
        "interval_covers": bool(low <= mine.published <= high),
        "source_median_abs_error": check.median_abs_error,
        **_plan_columns(mine.plan, mine.prediction),
    }
    return _row(mine.metric, mine.unit, mine.predicted, mine.published, run.source, **columns)


def _best(spec: Any, hw: Any, gpus: int, batch: int, dtype: str = "bf16") -> tuple[Any, Any]:
    from impls.planner import search

    result = search(spec, hw, gpus=gpus, global_batch=batch, top_k=1, dtype=dtype)
    if not result.best:
        raise RuntimeError(
            f"no plan fits {gpus} × {hw.name}: smallest peak "
            f"{result.smallest_memory_bytes / 1e9:.1f} GB"
        )
    best = result.best[0]
    return best.plan, best.prediction


def lambda_v100() -> Any:
    """A V100 as Lambda's estimate states it: 28 TFLOP/s, every GEMM at 100% of it (links,
    memory and element-wise bandwidth stay the V100 32GB preset's)."""
    hw = _cluster("v100_32gb")
    return replace(
        hw,
        name="V100 32GB at Lambda's 28 TFLOP/s, 100% GEMM efficiency "
        "(the lecture's stated assumptions)",
        peak_flops={"fp16": LAMBDA["flops"]},
        gemm_efficiency=((1.0, 1.0),),
    )


def _gpt3_hours(cfg: AtScaleConfig, name: str) -> dict[str, Any]:
    """The GPT-3 run planned and priced by the simulator on `gpt3_gpus` devices: the
    configured cluster (the lecture labels its table "measured on A100"), or, for
    `gpt3_gpu_hours_lambda`, the V100 at the 28 TFLOP/s that the 3.1M arithmetic assumes,
    so that what the simulator adds (communication, bubble, element-wise work, optimizer)
    is what separates it from the lecture's figure."""
    from impls.costmodel.models import model

    spec = model("gpt3_175b")
    hw = lambda_v100() if name.endswith("_lambda") else _cluster(cfg.gpt3_hardware)
    dtype = "bf16" if "bf16" in hw.peak_flops else "fp16"
    plan, p = _best(spec, hw, cfg.gpt3_gpus, 1536, dtype)
    hours = GPT3["tokens"] / p.tokens_per_s * cfg.gpt3_gpus / HOUR
    arithmetic = 6 * GPT3["params"] * GPT3["tokens"] / LAMBDA["flops"] / HOUR
    return _row(
        f"GPU-hours, {cfg.gpt3_gpus} × {hw.name}, best plan",
        "GPU-hours",
        hours,
        LAMBDA["hours"],
        LAMBDA["source"],
        lecture_arithmetic=arithmetic,
        model="gpt3_175b",
        hardware=hw.name,
        gpus=cfg.gpt3_gpus,
        global_batch=1536,
        **_plan_columns(plan, p),
    )


def _gpt3_one_gpu(cfg: AtScaleConfig, name: str) -> dict[str, Any]:
    """C = 6ND on one V100, every GEMM at the preset's largest-GEMM efficiency (memory
    ignored, as the lecture's figure does)."""
    hw = _cluster("v100_32gb")
    rate = hw.peak("fp16") * hw.gemm_efficiency[-1][1]
    years = 6 * GPT3["params"] * GPT3["tokens"] / rate / YEAR
    arithmetic = 6 * GPT3["params"] * GPT3["tokens"] / LAMBDA["flops"] / YEAR
    return _row(
        "years on one V100 (tensor cores)",
        "years",
        years,
        LAMBDA["years"],
        LAMBDA["source"],
        lecture_arithmetic=arithmetic,
        hardware=hw.name,
        gpus=1,
    )


def _summit(cfg: AtScaleConfig, name: str) -> dict[str, Any]:
    from impls.costmodel.models import DP_MODELS
    from impls.simulator import simulate_data_parallel

    gpus = int(name.split("_")[1])
    hw = _cluster("v100_summit")
    net = DP_MODELS["tsm_resnet50"]
    samples = SUMMIT["videos"] * SUMMIT["epochs"]

    def minutes(n: int) -> float:
        p = simulate_data_parallel(net, n, SUMMIT["batch_per_gpu"], hw, SUMMIT["dtype"])
        return samples / p.tokens_per_s / 60.0

    predicted = minutes(gpus)
    efficiency = minutes(6) * 6 / (predicted * gpus)
    measured_eff = SUMMIT["6"] * 6 / (SUMMIT[str(gpus)] * gpus)
    return _row(
        f"training time on {gpus} V100 (SUMMIT)",
        "minutes",
        predicted,
        SUMMIT[str(gpus)],
        SUMMIT["source"],
        hardware=hw.name,
        gpus=gpus,
        dtype=SUMMIT["dtype"],
        predicted_scaling_efficiency=efficiency,
        published_scaling_efficiency=measured_eff,
        efficiency_gap_points=100 * abs(efficiency - measured_eff),
    )


def _chinchilla(cfg: AtScaleConfig, name: str) -> dict[str, Any]:
    from impls.costmodel.models import model, param_count

    spec = model(cfg.chinchilla_model)
    hw = _cluster(cfg.chinchilla_hardware)
    n_opt = math.sqrt(cfg.chinchilla_flops / 120.0)
    tokens = 20.0 * n_opt
    batch = 1024  # sequences: Chinchilla's 1.5M→3M-token batches at 2048 tokens (assumption)
    plan, p = _best(spec, hw, cfg.chinchilla_gpus, batch)
    days = tokens / p.tokens_per_s / 86400.0
    return {
        "metric": f"days for D = 20N tokens on {cfg.chinchilla_gpus} × {hw.name}",
        "unit": "days",
        "predicted": days,
        "published": math.nan,
        "ratio": math.nan,
        "abs_error": math.nan,
        "optimal_params": n_opt,
        "optimal_tokens": tokens,
        "model_params": param_count(spec),
        "model": cfg.chinchilla_model,
        "hardware": hw.name,
        "gpus": cfg.chinchilla_gpus,
        "global_batch": batch,
        "source": "lecture 001 (C = 6ND, D ≈ 20N; Hoffmann et al. 2022)",
        **_plan_columns(plan, p),
    }
