"""The training runs the data-parallel tests check, all run in one pool call (conftest)."""

from __future__ import annotations

from impls.collectives import ALGORITHMS
from tests.data_parallel.dp_ranks import Case

ONE_BUCKET = 1 << 30
BELOW_ONE_PARAM = 16  # bytes: only the 4-element last bias fits; every bucket holds one parameter


def _fp32_cases() -> list[Case]:
    cases = []
    for variant in ("ps", "allreduce", "ddp"):
        for n in (1, 2, 3, 4, 8):
            cases += [Case(variant, n, "sgd"), Case(variant, n, "adam")]
    cases += [Case("allreduce", 3, "adam", algorithm) for algorithm in ALGORITHMS]
    cases += [Case("ddp", 4, "sgd", algorithm) for algorithm in ALGORITHMS]
    for cap in (BELOW_ONE_PARAM, ONE_BUCKET):
        cases += [Case("ddp", n, "adam", bucket_cap_bytes=cap) for n in (2, 3, 4)]
    cases += [Case("ddp", n, "adam", overlap=False) for n in (2, 3)]
    cases += [
        Case("ps", 3, "adam", model="gpt"),
        Case("allreduce", 4, "adam", "tree", model="gpt"),
        Case("ddp", 2, "adam", model="gpt"),
    ]
    return cases


FP32_CASES = _fp32_cases()
TORCH_DDP_CASES = [Case("torch_ddp", n, "adam") for n in (2, 3, 4)] + [
    Case("torch_ddp", 2, "adam", model="gpt")
]

# Gradients of these small models are O(1): times the default dynamic scale 2^16 they
# would overflow fp16's 65504 and the scaler would (rightly) skip the first steps. A loss
# weight of 2^-10 (SGD's lr × 2^10, an exact compensation) brings them to the O(1e-3) of
# real training, so no step overflows unless a case forces one.
_FP16 = {"precision": "fp16", "loss_scale": "dynamic", "loss_weight": 2.0**-10}
# The last rank's input holds an inf at step 1 of 4: every rank must skip that step.
_FORCED = {**_FP16, "overflow_step": 1, "steps": 4}
LOW_PRECISION_CASES = [
    Case("ddp", 4, "adam", **_FP16),
    Case("ddp", 3, "sgd", overlap=False, **_FP16),
    Case("allreduce", 2, "adam", precision="fp16", loss_scale=1024.0, loss_weight=2.0**-10),
    Case("ddp", 2, "adam", precision="bf16"),
    Case("allreduce", 3, "sgd", precision="bf16"),
    Case("ps", 2, "adam", precision="bf16"),
]
OVERFLOW_CASES = [
    Case("ddp", 4, "sgd", **_FORCED),
    Case("ddp", 8, "sgd", "recursive_halving", **_FORCED),
    Case("allreduce", 3, "sgd", "tree", **_FORCED),
    Case("ps", 3, "sgd", **_FORCED),
]

ALL_CASES = FP32_CASES + TORCH_DDP_CASES + LOW_PRECISION_CASES + OVERFLOW_CASES
