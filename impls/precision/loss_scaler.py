"""Loss scaling: multiply the loss before backward so small fp16 gradients stay representable.

Backward is linear in the loss, so scaling the loss by S scales every gradient by S; the
optimizer sees the true gradient after `unscale_` divides by S again. Unscale the fp32
master gradients (see `MasterWeights`), never the fp16 ones: dividing in fp16 would flush
the small values the scale was there to save.

Distributed training: `unscale_` reports non-finite values in *this rank's* gradients
only. Every rank must take the same decision, so the caller agrees on the flag first (an
all-reduce with op="max" of `float(found_inf)`) and passes the agreed flag to `update`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["DynamicLossScaler", "StaticLossScaler"]


class _LossScaler:
    """What both scalers share: scaling the loss and unscaling the gradients by `scale`."""

    scale: float

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss × scale`, in float32 so the scaled loss itself cannot overflow fp16."""
        return loss.float() * self.scale

    def unscale_(self, grads: Iterable[torch.Tensor]) -> bool:
        """Divide `grads` in place by the scale; True if any holds an inf or a NaN."""
        return _unscale(grads, self.scale)


class StaticLossScaler(_LossScaler):
    """A constant loss scale; a step whose gradients overflow is skipped, the scale kept."""

    def __init__(self, scale: float) -> None:
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale={scale!r} must be positive and finite")
        self.scale = float(scale)
        self.skipped_steps = 0

    def update(self, found_inf: bool) -> bool:
        """Whether to apply this step: False (and counted as skipped) on overflow."""
        if found_inf:
            self.skipped_steps += 1
        return not found_inf

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])
        self.skipped_steps = int(state["skipped_steps"])


class DynamicLossScaler(_LossScaler):
    """The largest loss scale that does not overflow, found by trial (torch.amp.GradScaler's rule).

    On a step whose gradients hold an inf or a NaN the step is skipped and the scale
    multiplied by `backoff_factor` (never below `min_scale`); after `growth_interval`
    consecutive clean steps the scale is multiplied by `growth_factor`. Unlike GradScaler,
    the scale has a floor: a model that overflows at `min_scale` keeps skipping steps, which
    `skipped_steps` makes visible, instead of driving the scale to zero.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
    ) -> None:
        _require(math.isfinite(init_scale) and init_scale > 0, "init_scale", init_scale, "> 0")
        _require(
            math.isfinite(growth_factor) and growth_factor > 1,
            "growth_factor",
            growth_factor,
            "> 1",
        )
        _require(0 < backoff_factor < 1, "backoff_factor", backoff_factor, "in (0, 1)")
        _require(
            isinstance(growth_interval, int) and growth_interval >= 1,
            "growth_interval",
            growth_interval,
            "an integer >= 1",
        )
        _require(0 < min_scale <= init_scale, "min_scale", min_scale, "in (0, init_scale]")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.min_scale = float(min_scale)
        self.clean_steps = 0  # consecutive steps without overflow since the last change
        self.skipped_steps = 0

    def update(self, found_inf: bool) -> bool:
        """Adjust the scale after a step; returns whether the step should be applied."""
        if found_inf:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.clean_steps = 0
            self.skipped_steps += 1
            return False
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            grown = self.scale * self.growth_factor
            if math.isfinite(grown):
                self.scale = grown
            self.clean_steps = 0
        return True

    def state_dict(self) -> dict[str, float | int]:
        return {
            "scale": self.scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "min_scale": self.min_scale,
            "clean_steps": self.clean_steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.min_scale = float(state["min_scale"])
        self.clean_steps = int(state["clean_steps"])
        self.skipped_steps = int(state["skipped_steps"])


def _unscale(grads: Iterable[torch.Tensor], scale: float) -> bool:
    # Multiply by the reciprocal, as GradScaler does: exact when the scale is a power of two.
    inverse = 1.0 / scale
    found_inf = False
    for grad in grads:
        grad.mul_(inverse)
        found_inf = found_inf or not bool(torch.isfinite(grad).all())
    return found_inf


def _require(ok: bool, key: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r} is invalid; it must be {rule}")
