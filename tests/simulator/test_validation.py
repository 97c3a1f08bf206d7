"""The published-run comparison and its error bar: a failure means the sign convention of
the error, the interval's quantiles or the leave-one-source-out split is wrong."""

from __future__ import annotations

import math

import pytest

from impls.costmodel.published import PUBLISHED_RUNS
from impls.simulator.validation import (
    Interval,
    leave_one_source_out,
    predict_run,
    predict_runs,
    ratio_interval,
)


def test_error_is_signed_optimistic_above_zero():
    p = predict_run(PUBLISHED_RUNS[0])
    assert math.isclose(p.ratio, p.predicted / p.published)
    assert math.isclose(p.error, p.ratio - 1.0)
    assert p.plan.gpus == p.run.gpus


def test_interval_quantiles_in_log_space():
    # ln r = 0, 1, 2, 3, 4 → the 5th percentile interpolates 0.2 of the way from 0 to 1.
    ratios = [math.exp(k) for k in range(5)]
    interval = ratio_interval(ratios, 0.9)
    assert math.isclose(math.log(interval.low), 0.2)
    assert math.isclose(math.log(interval.high), 3.8)
    assert interval.rows == 5
    low, high = Interval(0.8, 1.25, 10).around(100.0)
    assert math.isclose(low, 80.0) and math.isclose(high, 125.0)


@pytest.mark.parametrize("coverage", [0.0, 1.0, -0.1])
def test_interval_refuses_bad_coverage(coverage):
    with pytest.raises(ValueError, match="coverage"):
        ratio_interval([1.0, 1.1], coverage)


def test_leave_one_source_out_never_sees_its_own_rows():
    predictions = predict_runs()
    checks = leave_one_source_out(predictions)
    assert sum(c.rows for c in checks) == len(predictions)
    for check in checks:
        others = [p.ratio for p in predictions if p.run.origin != check.source]
        assert check.interval == ratio_interval(others)
        mine = [p for p in predictions if p.run.origin == check.source]
        assert check.covered == sum(check.interval.covers(p.ratio) for p in mine)


def test_each_convention_counts_its_own_flops():
    """The same run counted three ways: 6N (every parameter, embeddings too) exceeds the
    matrix-by-matrix model count, and Megatron's count with the recomputed forward exceeds
    that by about a third (8/6 of the dense FLOPs)."""
    from dataclasses import replace

    from impls.simulator.validation import convention_flops

    run = next(r for r in PUBLISHED_RUNS if r.flops_convention == "hardware_full_recompute")
    model_count = convention_flops(replace(run, flops_convention="model"))
    six_n = convention_flops(replace(run, flops_convention="model_6n"))
    megatron = convention_flops(run)
    assert model_count < six_n < 1.1 * model_count
    assert megatron / model_count == pytest.approx(4 / 3, rel=0.02)


def test_megatron_layout_puts_the_end_layers_on_the_end_stages():
    from impls.simulator.validation import run_plan

    run = next(r for r in PUBLISHED_RUNS if r.layout == "megatron" and r.plan.pp > 2)
    layers = run_plan(run).stage_layers
    assert layers[0] == layers[-1] == layers[1] + 1
    equal = [r for r in PUBLISHED_RUNS if r.layout == "equal"]
    assert all(run_plan(r).stage_layers is None for r in equal)
