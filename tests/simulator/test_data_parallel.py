"""The data-parallel-only model (ResNet-50 on SUMMIT) against a hand computation.

A failure means the SUMMIT scaling figure would rest on a step composed differently from
the documented one (3× forward compute, one overlapped all-reduce, SGD).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from impls.costmodel.comm import collective_seconds
from impls.simulator import simulate_data_parallel
from tests.simulator import flat_hardware


@dataclass(frozen=True)
class Model:
    name: str = "resnet50_like"
    params: float = 25.6e6
    flops_per_sample: float = 3 * 2 * 4.1e9  # a training step: 3 × forward


def test_step_by_hand():
    hw = flat_hardware(alpha_s=1e-5, bandwidth=10e9)
    pred = simulate_data_parallel(Model(), 48, 64, hw, dtype="bf16")
    compute = 3 * 8.2e9 * 64 / (1e14 * 0.5)  # one GEMM efficiency in flat_hardware
    nbytes = 25.6e6 * 2
    total = collective_seconds("all_reduce", nbytes, 48, hw)
    bucket = collective_seconds("all_reduce", 25 * 2**20, 48, hw)
    exposed = min(total, max(0.0, total - compute * 2 / 3) + bucket)
    sgd = 25.6e6 * (4 + 2 + 8 + 4 + 2) / 1e12
    assert pred.compute_s == pytest.approx(compute)
    assert pred.exposed_dp_s == pytest.approx(exposed)
    assert pred.step_time_s == pytest.approx(compute + exposed + sgd)
    assert pred.tokens_per_s == pytest.approx(48 * 64 / pred.step_time_s)  # samples/s
    assert pred.mfu == pytest.approx(compute / pred.step_time_s * 0.5)


def test_one_gpu_has_no_communication_and_more_gpus_scale_samples():
    hw = flat_hardware(alpha_s=1e-5, bandwidth=10e9)
    one = simulate_data_parallel(Model(), 1, 64, hw, dtype="bf16")
    many = simulate_data_parallel(Model(), 768, 64, hw, dtype="bf16")
    assert one.exposed_dp_s == 0
    assert one.tokens_per_s < many.tokens_per_s < 768 * one.tokens_per_s


@pytest.mark.parametrize(
    ("key", "kwargs"),
    [
        ("gpus=0", {"gpus": 0}),
        ("batch_per_gpu=-2", {"batch_per_gpu": -2}),
        ("optimizer='lamb'", {"optimizer": "lamb"}),
    ],
)
def test_refusals(key, kwargs):
    args = {"gpus": 2, "batch_per_gpu": 4, **kwargs}
    with pytest.raises(ValueError, match=key):
        simulate_data_parallel(Model(), hw=flat_hardware(), dtype="bf16", **args)
