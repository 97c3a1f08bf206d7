"""Memory and traffic of data-parallel training with ZeRO, from the formulas (theory only).

Model states per device (Rajbhandari et al. 2019, ZeRO, §3.1, §5, Fig. 1) for Ψ parameters
on N data-parallel ranks, P, G, O the bytes per parameter of weights, gradients, optimizer:

    stage 0 (plain DP)      (P + G + O) Ψ
    stage 1 (ZeRO-1, O)     (P + G) Ψ + O Ψ / N
    stage 2 (ZeRO-2, G + O) P Ψ + (G + O) Ψ / N
    stage 3 (ZeRO-3, all)   (P + G + O) Ψ / N

The lecture (`seeds/003`) takes mixed-precision Adam, P = G = 2, O = K = 12: 16 bytes per
parameter, so an 80 GB device (GB = 1e9 bytes) trains 5B parameters unsharded and, at
N = 64, 19B / 36B / 320B under ZeRO-1 / 2 / 3 (`max_trainable_params`).
Nothing here touches torch.distributed: these are the numbers measured runs are held to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from impls.costmodel._checks import check_count, is_int, is_number

__all__ = [
    "MIXED_PRECISION_ADAM",
    "PRESETS",
    "STAGES",
    "BytesPerParam",
    "ModelStateBytes",
    "bytes_per_param_for",
    "comm_bytes_per_step",
    "comm_psi_multiple",
    "floor_billions",
    "max_trainable_params",
    "model_state_bytes",
]

STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, kw_only=True)
class BytesPerParam:
    """Bytes each parameter costs in weights, gradients and optimizer state (P, G, O)."""

    weights: float = 2
    gradients: float = 2
    optimizer: float = 12
    """K in the ZeRO paper: Adam's fp32 master copy, momentum and variance = 4 + 4 + 4."""

    def __post_init__(self) -> None:
        for key in ("weights", "gradients", "optimizer"):
            value = getattr(self, key)
            if not is_number(value) or not value > 0:
                raise ValueError(
                    f"bytes_per_param.{key}={value!r}: must be a number > 0 (bytes per parameter)"
                )

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


MIXED_PRECISION_ADAM = BytesPerParam(weights=2, gradients=2, optimizer=12)
PRESETS: dict[str, BytesPerParam] = {
    # fp32 Adam: no master copy, the weights are the fp32 values; momentum + variance = 8.
    "fp32": BytesPerParam(weights=4, gradients=4, optimizer=8),
    # Mixed precision (Micikevicius et al. 2018): half-precision weights and gradients,
    # fp32 master weights + momentum + variance in the optimizer (the ZeRO paper's K = 12).
    "fp16": MIXED_PRECISION_ADAM,
    "bf16": MIXED_PRECISION_ADAM,
}


def bytes_per_param_for(precision: str) -> BytesPerParam:
    """The Adam preset for a precision name (`fp32`, `fp16` or `bf16`)."""
    if precision not in PRESETS:
        raise ValueError(
            f"precision={precision!r} is unknown; allowed values: {', '.join(PRESETS)}"
        )
    return PRESETS[precision]


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-device bytes of weights, gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def _check_stage(stage: int) -> None:
    if not is_int(stage) or stage not in STAGES:
        raise ValueError(f"stage={stage!r} is unknown; allowed values: 0, 1, 2, 3")


def _units(params: float | Sequence[float], pad: bool) -> list[float]:
    """Ψ as a list of flat units (one unit when a single count is given)."""
    units = list(params) if isinstance(params, Sequence) else [params]
    bad = [u for u in units if not is_number(u) or u < 0]
    if bad or not units:
        raise ValueError(f"params={params!r}: every parameter count must be a number ≥ 0")
    if pad and any(not float(u).is_integer() for u in units):
        raise ValueError(f"params={params!r}: pad=True needs whole parameter counts")
    return units


def _shard(units: list[float], dp: int, pad: bool) -> float:
    """Parameters one rank holds of a quantity sharded over `dp` ranks."""
    if pad:
        return float(sum(math.ceil(u / dp) for u in units))
    return sum(units) / dp


def model_state_bytes(
    params: float | Sequence[float],
    stage: int,
    dp: int,
    bytes_per_param: BytesPerParam = MIXED_PRECISION_ADAM,
    *,
    pad: bool = False,
) -> ModelStateBytes:
    """Per-device model-state bytes of Ψ = `params` parameters at ZeRO `stage` on `dp` ranks.

    `params` is one count, or the sizes of the flat units the implementation shards
    separately (FSDP-style units); with `pad=True` each unit is padded to a multiple of `dp`
    before sharding, so a rank holds ceil(Ψ_u / N) of every sharded quantity.

    A real implementation cuts Ψ into N equal shards, padding each flat unit to a multiple of
    N; `pad=True` predicts that: a sharded quantity of a unit of Ψ_u parameters holds
    ceil(Ψ_u / N) per rank. Activations are not model states: `impls.costmodel.activations`
    prices what autograd saves for the backward.
    """
    _check_stage(stage)
    check_count("dp", dp)
    units = _units(params, pad)
    full, shard = float(sum(units)), _shard(units, dp, pad)
    b = bytes_per_param
    return ModelStateBytes(
        weights=b.weights * (shard if stage >= 3 else full),
        gradients=b.gradients * (shard if stage >= 2 else full),
        optimizer=b.optimizer * (shard if stage >= 1 else full),
    )


def _bytes_per_param_on_device(stage: int, dp: int, b: BytesPerParam) -> Fraction:
    """Model-state bytes per parameter on one device, exactly (fractions, not floats)."""
    p, g, o = (Fraction(v) for v in (b.weights, b.gradients, b.optimizer))
    n = Fraction(dp)
    return {0: p + g + o, 1: p + g + o / n, 2: p + (g + o) / n, 3: (p + g + o) / n}[stage]


def max_trainable_params(
    gpu_memory_bytes: float,
    stage: int,
    dp: int,
    mp: int = 1,
    bytes_per_param: BytesPerParam = MIXED_PRECISION_ADAM,
) -> int:
    """The largest Ψ whose model states fit in `gpu_memory_bytes` per device.

    floor(mp · M / c) with c the stage's bytes per parameter on one device (module
    docstring). A model-parallel degree `mp` (tensor or pipeline) splits every model state
    evenly over `mp` devices, so it multiplies the model that fits. Activations, buffers and
    fragmentation are left out, as the lecture leaves them out. Computed in
    exact fractions: 80e9 / 16 is 5_000_000_000, not 4_999_999_999.
    """
    _check_stage(stage)
    check_count("dp", dp)
    check_count("mp", mp)
    if not is_number(gpu_memory_bytes) or gpu_memory_bytes < 0:
        raise ValueError(f"gpu_memory_bytes={gpu_memory_bytes!r}: must be a number ≥ 0")
    fits = Fraction(gpu_memory_bytes) * mp / _bytes_per_param_on_device(stage, dp, bytes_per_param)
    return math.floor(fits)


def floor_billions(params: float) -> int:
    """Ψ in whole billions, rounded down: the largest whole-billion model that fits.

    The lecture's figures are this rounding: ZeRO-1 at N = 64 fits 80e9 / 4.1875 = 19.10e9
    (the slide writes 80 GB / 4.2 B = 19B), ZeRO-2 36.06e9 → 36B; rounding to nearest would
    agree here but could claim a model that does not fit.
    """
    return math.floor(params / 1e9)


def comm_bytes_per_step(
    params: float | Sequence[float],
    stage: int,
    dp: int,
    bytes_per_elem: float,
    *,
    pad: bool = False,
) -> float:
    """Bytes one rank sends per training step with ring collectives (ZeRO paper §7).

    Stages 0–2 move 2Ψ: an all-reduce (DP) or a reduce-scatter of the gradients plus an
    all-gather of the updated weights (ZeRO-1/2). ZeRO-3 moves 3Ψ: each unit's weights are
    all-gathered for its forward and again for its backward, and its gradients
    reduce-scattered. A ring reduce-scatter or all-gather sends (N−1)/N of its buffer per
    rank, hence 2Ψ(N−1)/N and 3Ψ(N−1)/N elements; with `pad=True`, (N−1)·ceil(Ψ_u/N) per
    unit and collective.
    """
    _check_stage(stage)
    check_count("dp", dp)
    units = _units(params, pad)
    collectives = 3 if stage == 3 else 2
    per_collective = (dp - 1) * _shard(units, dp, pad)
    return collectives * per_collective * bytes_per_elem


def comm_psi_multiple(stage: int, dp: int) -> float:
    """`comm_bytes_per_step` in units of Ψ elements: 2(N−1)/N, or 3(N−1)/N for ZeRO-3."""
    _check_stage(stage)
    check_count("dp", dp)
    return (3 if stage == 3 else 2) * (dp - 1) / dp
