"""A data-parallel-only model (ResNet-50 on SUMMIT): compute, one gradient all-reduce, SGD.

The model is given by its parameter count and its *training* FLOPs per sample (forward +
backward ≈ 3 × forward, Kaplan et al. 2020 §2.1), as
`impls.costmodel.models.DataParallelModel` states them; any object with `.params` and
`.flops_per_sample` will do.

The terms (compute, the overlapped all-reduce, the optimizer, memory):
`simulate_data_parallel`. The returned `Prediction` carries samples per second in
`tokens_per_s`'s place.
"""

from __future__ import annotations

from typing import Any

from impls.costmodel.comm import collective_seconds
from impls.costmodel.compute import mfu
from impls.costmodel.hardware import Hardware
from impls.simulator.memory import WORKSPACE_BYTES
from impls.simulator.plan import Prediction
from impls.simulator.zero_comm import BUCKET_BYTES

__all__ = ["simulate_data_parallel"]

_STATE_BYTES = {"sgd": 4, "adam": 8}  # fp32 momentum / Adam's two moments, per parameter
_HALF = ("fp16", "bf16", "fp8")


def _count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r}: must be an integer ≥ 1")
    return value


def simulate_data_parallel(
    model: Any,
    gpus: int,
    batch_per_gpu: int,
    hw: Hardware,
    dtype: str = "fp16",
    *,
    optimizer: str = "sgd",
    grad_bytes: float | None = None,
    weight_layers: int = 50,
    workspace_bytes: float = WORKSPACE_BYTES,
) -> Prediction:
    """One synchronous data-parallel step of `model` on `gpus` devices (the terms below).

    - Compute: `flops_per_sample` × `batch_per_gpu` at peak × `hw.efficiency` of a
      representative GEMM: the average weight layer of the batch's forward, forward FLOPs ÷
      `weight_layers` (assumption: 50, ResNet-50's convolutions and classifier; a convolution
      runs as an implicit GEMM of the same FLOPs).
    - Communication: one all-reduce of params × `grad_bytes` over all GPUs
      (`impls.costmodel.comm.collective_seconds`, hierarchical when the group spans nodes),
      bucketed and overlapped with the backward (2/3 of compute) as PyTorch DDP and Horovod do
      (Li et al. 2020 §3.2): exposed = min(t, max(0, t − backward) + one 25 MB bucket).
    - Optimizer: SGD with momentum, fused (assumption): reads weight, gradient and momentum,
      writes weight and momentum, in fp32, plus writing the half-precision copy (20 + 2 bytes per
      parameter; Adam: 28 + 2).
    - Memory: fp32 weights, gradients of `grad_bytes`, the momentum (Adam: two moments) and the
      half copy, plus `activation_bytes_per_sample` × batch when the model gives it, plus the
      workspace constant of `impls.simulator.memory`.
    """
    _count("gpus", gpus)
    _count("batch_per_gpu", batch_per_gpu)
    _count("weight_layers", weight_layers)
    params, per_sample = float(model.params), float(model.flops_per_sample)
    if not params > 0 or not per_sample > 0:
        raise ValueError(
            f"model={getattr(model, 'name', model)!r}: params and flops_per_sample must be > 0"
        )
    if optimizer not in _STATE_BYTES:
        raise ValueError(f"optimizer={optimizer!r}: allowed values {', '.join(_STATE_BYTES)}")
    peak = hw.peak(dtype)
    if grad_bytes is None:
        grad_bytes = 2.0 if dtype in _HALF else 4.0
    step_flops = per_sample * batch_per_gpu
    compute = step_flops / (peak * hw.efficiency(step_flops / 3 / weight_layers, dtype))
    backward = compute * 2 / 3
    exposed_dp = 0.0
    if gpus > 1:
        nbytes = params * grad_bytes
        total = collective_seconds("all_reduce", nbytes, gpus, hw)
        bucket = collective_seconds("all_reduce", min(BUCKET_BYTES, nbytes), gpus, hw)
        exposed_dp = min(total, max(0.0, total - backward) + bucket)
    half_copy = 2 if dtype in _HALF else 0
    state = _STATE_BYTES[optimizer]
    touched = 4 + grad_bytes + 2 * state + 4 + half_copy  # read w, g, states; write states, w
    optimizer_s = hw.elementwise_seconds(params * touched, 1)
    step = compute + exposed_dp + optimizer_s
    memory = {
        "weights": params * (4 + half_copy),
        "gradients": params * grad_bytes,
        "optimizer": params * state,
        "activations": float(getattr(model, "activation_bytes_per_sample", 0.0)) * batch_per_gpu,
        "transient": 0.0,
        "workspace": workspace_bytes,
    }
    memory["total"] = sum(memory.values())
    return Prediction(
        step_time_s=step,
        compute_s=compute,
        bubble_s=0.0,
        exposed_tp_s=0.0,
        exposed_pp_s=0.0,
        exposed_dp_s=exposed_dp,
        optimizer_s=optimizer_s,
        peak_memory_bytes=memory["total"],
        fits=memory["total"] <= hw.memory_bytes,
        tokens_per_s=gpus * batch_per_gpu / step,
        tflops_per_gpu=step_flops / step / 1e12,
        mfu=mfu(step_flops * gpus, step, gpus, peak),
        hfu=mfu(step_flops * gpus, step, gpus, peak),
        memory_breakdown={**memory, "rank": 0},
        stage_times=(compute,),
    )
