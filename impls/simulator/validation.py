"""The simulator held against published training runs, and the error bar that earns it.

`predict_run` rebuilds a published run's plan from its stated layout and prices it; the
comparison is made in the source's own metric and FLOP convention (MFU, TFLOP/s per GPU
counting the recomputed forward or not, tokens/s per GPU). Every one of those metrics is
a work count ÷ the step time, so `ratio` = predicted ÷ published is also the published
step time ÷ the predicted one: above 1 is optimistic. The error bar a
prediction carries: `ratio_interval`, tested on unseen sources by `leave_one_source_out`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from impls.costmodel.compute import step_flops
from impls.costmodel.hardware import Hardware
from impls.costmodel.models import model
from impls.costmodel.presets import hardware
from impls.costmodel.published import PUBLISHED_RUNS, PublishedRun
from impls.simulator.plan import ParallelPlan, Prediction, megatron_stage_layers
from impls.simulator.step import simulate

__all__ = [
    "COVERAGE",
    "convention_flops",
    "Interval",
    "RunPrediction",
    "SourceCheck",
    "leave_one_source_out",
    "predict_run",
    "predict_runs",
    "published_interval",
    "published_predictions",
    "ratio_interval",
    "run_hardware",
    "run_plan",
]

COVERAGE = 0.9
"""The interval's nominal coverage: the 5th to the 95th percentile of the residuals."""


@dataclass(frozen=True)
class RunPrediction:
    """One published run, its plan, the simulator's step and both sides of the metric."""

    run: PublishedRun
    plan: ParallelPlan
    prediction: Prediction
    metric: str
    unit: str
    predicted: float
    published: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.published

    @property
    def error(self) -> float:
        """Signed: > 0 is optimistic (the model promises more than the run achieved)."""
        return self.ratio - 1.0


@dataclass(frozen=True)
class Interval:
    """Quantiles of predicted ÷ published over `rows` validation rows."""

    low: float
    high: float
    rows: int
    coverage: float = COVERAGE

    def around(self, predicted: float) -> tuple[float, float]:
        """(low, high) of the quantity whose prediction is `predicted`."""
        return predicted / self.high, predicted / self.low

    def covers(self, ratio: float) -> bool:
        return self.low <= ratio <= self.high


@dataclass(frozen=True)
class SourceCheck:
    """One source family's rows judged by the interval built from every other family."""

    source: str
    """`PublishedRun.origin`: NeMo's releases are one family, not several sources."""
    rows: int
    median_abs_error: float
    optimistic: int
    interval: Interval
    covered: int


def run_plan(run: PublishedRun) -> ParallelPlan:
    """The run's published layout as a `ParallelPlan` (Megatron-LM's stage layout where the
    run used it: L/S blocks a stage, embedding and head on the end stages)."""
    plan = run.plan
    if run.layout != "megatron" or plan.pp == 1:
        return plan
    return replace(plan, stage_layers=megatron_stage_layers(model(run.model).n_layers, plan.stages))


def run_hardware(run: PublishedRun) -> Hardware:
    """The run's cluster preset, with the node size and the node's network the run states."""
    hw = hardware(run.hardware)
    if run.gpus_per_node != hw.devices_per_node:
        hw = replace(hw, devices_per_node=run.gpus_per_node)
    if run.node_network_gbps is not None:
        per_gpu = run.node_network_gbps * 1e9 / 8 / run.gpus_per_node
        hw = replace(hw, inter=replace(hw.inter, bandwidth=per_gpu))
    return hw


def convention_flops(run: PublishedRun) -> float:
    """FLOPs of one step of `run` counted by its source's convention (`PublishedRun`)."""
    if run.flops_convention == "model_6n":  # PaLM App. B: 6N + 12·l·h·s per token
        return run.model_6n_flops_per_token * run.global_batch * run.seq_len
    spec = replace(model(run.model), seq_len=run.seq_len)
    full = run.flops_convention == "hardware_full_recompute"
    flops = step_flops(spec, run.global_batch, recompute="full" if full else "none")
    return flops.hardware if full else flops.model


_LABELS = {
    "model": "",
    "model_6n": " (6N + attention per token)",
    "hardware_full_recompute": " (counting full recomputation)",
}


def predict_run(run: PublishedRun) -> RunPrediction:
    """Price `run` and express the prediction in the source's own metric and convention,
    with the attention kernel the run used."""
    spec = replace(model(run.model), seq_len=run.seq_len, attention=run.attention)
    plan = run_plan(run)
    hw = run_hardware(run)
    p = simulate(spec, plan, hw, dtype=run.dtype)
    label = _LABELS[run.flops_convention]
    if run.tflops_per_gpu is not None:
        predicted = convention_flops(run) / p.step_time_s / run.gpus / 1e12
        return RunPrediction(
            run, plan, p, "TFLOP/s per GPU" + label, "TFLOP/s", predicted, run.tflops_per_gpu
        )
    if run.mfu is not None:
        predicted = convention_flops(run) / p.step_time_s / run.gpus / hw.peak(run.dtype)
        return RunPrediction(run, plan, p, "MFU" + label, "fraction", predicted, run.mfu)
    if run.tokens_per_s_per_gpu is not None:
        per_gpu = p.tokens_per_s / run.gpus
        return RunPrediction(
            run, plan, p, "tokens/s per GPU", "tokens/s", per_gpu, run.tokens_per_s_per_gpu
        )
    return RunPrediction(run, plan, p, "HFU", "fraction", p.hfu, run.hfu)


def predict_runs(runs: Iterable[PublishedRun] = PUBLISHED_RUNS) -> tuple[RunPrediction, ...]:
    return tuple(predict_run(run) for run in runs)


def ratio_interval(ratios: Sequence[float], coverage: float = COVERAGE) -> Interval:
    """The central `coverage` quantiles of `ratios`, interpolated in log space.

    No term of the simulator is fitted to a published throughput, so a
    prediction's error on a run is the same whether or not that run is among the validation
    rows; what the rows estimate is the *spread* of that error. `ratio_interval` takes the
    empirical quantiles of ln(ratio) over validation rows; a prediction p then carries the
    interval [p ÷ r_hi, p ÷ r_lo] for the quantity it predicts (a run that went as the model
    says it would lie inside it at the stated coverage). `leave_one_source_out` builds, for
    each source, the interval from the other sources' rows only, and says how many of that
    source's rows it covers: the honest test of an interval on data it did not see.
    """
    if not 0 < coverage < 1:
        raise ValueError(f"coverage={coverage!r}: must lie in (0, 1)")
    logs = sorted(math.log(r) for r in ratios)
    if not logs:
        raise ValueError("ratio_interval: needs at least one validation row")
    tail = (1 - coverage) / 2
    return Interval(
        math.exp(_quantile(logs, tail)), math.exp(_quantile(logs, 1 - tail)), len(logs), coverage
    )


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default 'linear')."""
    position = q * (len(values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (position - low) * (values[high] - values[low])


def leave_one_source_out(
    predictions: Sequence[RunPrediction], coverage: float = COVERAGE
) -> tuple[SourceCheck, ...]:
    """Per source: its rows' errors, and the interval from the other sources' rows."""
    sources = list(dict.fromkeys(p.run.origin for p in predictions))
    checks = []
    for source in sources:
        mine = [p for p in predictions if p.run.origin == source]
        others = [p.ratio for p in predictions if p.run.origin != source]
        interval = ratio_interval(others, coverage) if others else Interval(0.0, math.inf, 0)
        errors = sorted(abs(p.error) for p in mine)
        checks.append(
            SourceCheck(
                source=source,
                rows=len(mine),
                median_abs_error=_quantile(errors, 0.5),
                optimistic=sum(p.error > 0 for p in mine),
                interval=interval,
                covered=sum(interval.covers(p.ratio) for p in mine),
            )
        )
    return tuple(checks)


@lru_cache(maxsize=1)
def published_predictions() -> tuple[RunPrediction, ...]:
    """Every run of `PUBLISHED_RUNS` priced once per process (runs and model are fixed)."""
    return predict_runs()


def published_interval(coverage: float = COVERAGE) -> Interval:
    """The interval every new prediction carries: all published rows' residuals."""
    return ratio_interval([p.ratio for p in published_predictions()], coverage)
