"""A GEMM priced by its shape: wave quantisation of its output tiles and the roofline.

A failure means a GEMM that leaves SMs idle in its last wave, or that is too thin to be
compute-bound, is priced at the large-GEMM plateau anyway (an optimistic model)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from impls.costmodel.hardware import ELEMENT_BYTES, wave_fraction
from tests.simulator import flat_hardware

SMS = 100
HW = replace(
    flat_hardware(alpha_s=0.0, bandwidth=1e10, per_node=8),
    sms=SMS,
    gemm_efficiency=((1.0, 0.8),),
    memory_bandwidth=1e12,
    elementwise_efficiency=1.0,
    kernel_overhead_s=0.0,
)
PEAK = HW.peak("bf16")


def test_wave_fraction_counts_padding_and_the_idle_sms_of_the_last_wave():
    assert wave_fraction(256 * 10, 128 * 10, SMS) == 1.0  # 100 tiles, one full wave
    # 2560 × 1408: 110 tiles of 256 × 128 (2 waves, 55%) or 220 of 128 × 128 (3 waves)
    assert wave_fraction(256 * 10, 128 * 11, SMS) == pytest.approx(220 / 300)
    assert wave_fraction(128, 128, SMS) == pytest.approx(1 / SMS)  # one tile, one SM
    assert wave_fraction(64, 128, SMS) == pytest.approx(0.5 / SMS)  # half of it padding
    assert wave_fraction(256, 2560, SMS) == pytest.approx(0.4)  # 40 small tiles, one wave


def test_a_perfectly_tiled_gemm_runs_at_the_plateau():
    m, n, k = 256 * 20, 128 * 50, 8192  # 1000 tiles: 10 full waves
    flops = 2.0 * m * n * k
    assert HW.gemm_seconds(m, n, k) == pytest.approx(flops / (PEAK * 0.8))


def test_a_ragged_last_wave_costs_its_idle_sms():
    m, k = 256 * 10, 8192
    full = HW.gemm_seconds(m, 128 * 10, k)  # 100 tiles
    ragged = HW.gemm_seconds(m, 128 * 11, k)  # 10% more work in 3 waves instead of 2
    assert ragged / full == pytest.approx(1.1 / (220 / 300))


def test_a_thin_gemm_is_memory_bound():
    m, n, k = 256 * 100, 128 * 100, 8  # k = 8: 2 FLOPs per byte or so
    operands = ELEMENT_BYTES["bf16"] * (m * k + k * n + m * n)
    assert HW.gemm_seconds(m, n, k) == pytest.approx(operands / 1e12)
    assert HW.gemm_seconds(m, n, k) > 2.0 * m * n * k / (PEAK * 0.8)


def test_without_sms_the_flops_table_prices_it():
    table = replace(HW, sms=0)
    m, n, k = 300, 700, 900
    assert table.gemm_seconds(m, n, k) == pytest.approx(2.0 * m * n * k / (PEAK * 0.8))
    assert not math.isclose(HW.gemm_seconds(m, n, k), table.gemm_seconds(m, n, k))


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_bad_sm_count_is_refused(bad):
    with pytest.raises(ValueError, match="sms"):
        replace(HW, sms=bad)
