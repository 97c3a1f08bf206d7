"""Which precision a run trains in, and which loss-scaling configurations can work with it.

- fp32: parameters, activations and gradients in float32; nothing else is needed.
- fp16: IEEE half. Its smallest subnormal is 2^-24 ≈ 6e-8 and its largest value 65504, so
  small gradients flush to zero unless the loss is scaled up before backward (Micikevicius
  et al., 2018, "Mixed Precision Training"). fp16 therefore needs a loss scale.
- bf16: bfloat16 keeps float32's 8-bit exponent (same range, 8-bit mantissa): gradients do
  not underflow, so it trains without a loss scale.

A loss scale is `"dynamic"` (`DynamicLossScaler`), a positive finite number (a
`StaticLossScaler`), or None / `"none"` (no scaling).
"""

from __future__ import annotations

import math

import torch

from impls.precision.loss_scaler import DynamicLossScaler, StaticLossScaler

__all__ = [
    "FP16_MAX",
    "PRECISIONS",
    "check_precision",
    "compute_dtype",
    "make_loss_scaler",
]

PRECISIONS = ("fp32", "fp16", "bf16")
FP16_MAX = 65504.0  # torch.finfo(torch.float16).max

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_LOSS_SCALE_RULE = "None, 'none', 'dynamic', or a positive finite number"


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a model's parameters, activations and gradients use under `precision`."""
    _check_name(precision)
    return _DTYPES[precision]


def check_precision(precision: str, loss_scale: str | float | None) -> None:
    """Refuse a precision / loss-scale pair that cannot train, naming the offending key.

    fp16 needs a loss scale (its gradients underflow without one), and a static fp16 scale
    must itself be representable in fp16. fp32 and bf16 accept no scale or any valid one.
    """
    _check_name(precision)
    if loss_scale is None or loss_scale == "none":
        if precision == "fp16":
            raise ValueError(
                f"loss_scale={loss_scale!r} cannot work with precision='fp16': fp16 gradients "
                "below 2^-24 flush to zero without loss scaling; allowed values: 'dynamic' "
                f"or a positive finite number <= {FP16_MAX:g}"
            )
        return
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ValueError(
                f"loss_scale={loss_scale!r} is unknown; allowed values: {_LOSS_SCALE_RULE}"
            )
        return
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, int | float):
        raise ValueError(
            f"loss_scale={loss_scale!r} is unknown; allowed values: {_LOSS_SCALE_RULE}"
        )
    if not math.isfinite(loss_scale) or loss_scale <= 0:
        raise ValueError(f"loss_scale={loss_scale!r} must be positive and finite")
    if precision == "fp16" and loss_scale > FP16_MAX:
        raise ValueError(
            f"loss_scale={loss_scale!r} exceeds fp16's largest value {FP16_MAX:g}: every "
            "scaled gradient at least as large as the loss would overflow"
        )


def make_loss_scaler(
    precision: str, loss_scale: str | float | None
) -> DynamicLossScaler | StaticLossScaler | None:
    """The scaler `loss_scale` describes (after `check_precision`), or None for no scaling."""
    check_precision(precision, loss_scale)
    if loss_scale is None or loss_scale == "none":
        return None
    if loss_scale == "dynamic":
        return DynamicLossScaler()
    return StaticLossScaler(float(loss_scale))


def _check_name(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision={precision!r} is unknown; allowed values: {', '.join(PRECISIONS)}"
        )
