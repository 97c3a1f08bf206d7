"""Deep Gradient Compression: Top-k with the momentum moved in front of the sparsifier.

Lin, Han, Mao, Wang & Dally, "Deep Gradient Compression: Reducing the Communication
Bandwidth for Distributed Training" (ICLR 2018). Plain Top-k with error feedback
(`impls.compression.sparsify.TopK`) accumulates *gradients* and leaves momentum to the
optimizer, so a coordinate that waited many steps is sent without the momentum it would
have had; DGC accumulates the momentum-corrected velocity instead (`DGC` gives the step).

**Pair DGC with momentum-free SGD.** The momentum is applied here, before the
sparsifier; an optimizer with its own momentum would apply it a second time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from impls.comm import Communicator
from impls.compression.base import Compressor, Payload
from impls.compression.exchange import all_gather_average
from impls.compression.sparsify import (
    VALUE_DTYPES,
    check_density,
    decode_index,
    decode_sparse,
    encode_sparse,
    kept,
)

__all__ = ["DGC"]


def _number(name: str, value: object, low: float, high: float, *, closed_high: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and low <= value and (value <= high if closed_high else value < high)
    if not ok:
        bracket = "]" if closed_high else ")"
        raise ValueError(f"{name}={value!r}: must be a number in [{low}, {high}{bracket}")
    return float(value)


class DGC(Compressor):
    """Deep Gradient Compression (Lin et al. 2018) at `density`, with momentum `momentum`.

    State per key: `velocity[key]` (u) and `memory[key]` (v, the accumulation). `step`
    counts `aggregate` calls and sets the warm-up density (`density_at`). On every step:

    1. local gradient clipping (§3.3): the rank's gradient, all tensors together, is clipped
       to the norm clip_norm · N^{-1/2}. The paper's reasoning: N independent gradients with
       variance σ² sum to variance Nσ², so a threshold meant for the combined gradient is
       scaled by N^{-1/2} on each rank. Clipping happens before the gradient enters u, so the
       accumulated mass is clipped too. `compress` (one tensor alone) does not clip;
       `aggregate`, which sees the whole gradient and N, does.
    2. momentum correction (§3.1): u ← m·u + g;  v ← v + u. Accumulating the *velocity*
       makes a coordinate that is finally sent carry the momentum-SGD update it missed.
    3. send the k entries of largest |v| (k from the current density, `kept`), in TopK's
       payload format (`encode_sparse`: fp16 values by default, the smaller index encoding).
    4. v ← v − sent (the sent entries leave the accumulation; only an fp16 rounding residual
       stays at them, as in TopK's error feedback — zero when the value is exact in fp16);
       momentum factor masking (§3.2): u ← 0 at the sent entries, so stale momentum does not
       keep pushing a coordinate that was just applied.

    Sparsity warm-up (§3.4): over the first `warmup_steps` steps the density falls
    exponentially from `warmup_start` to `density` (the paper: 25%, 6.25%, 1.5625%, 0.4%,
    0.1% over four epochs), then stays at `density`. A step is one `aggregate` call (one
    optimizer step of the whole model), not one tensor.

    The exchange is the default all-gather of payloads (`exchange.all_gather_average`): all
    ranks are at the same step, so their k and payload layouts match. The result is the mean
    over ranks of the v entries each rank sent.

    Departures from the paper: Top-k is exact (`torch.topk`), not the paper's threshold
    estimated on a sample; with `momentum_masking=True` (the paper's algorithm) a coordinate
    sent every step gets no momentum at all (at density 1 DGC is plain SGD); with
    `momentum_masking=False` and density 1, DGC sends exactly momentum SGD's velocity.
    """

    name = "dgc"

    def __init__(
        self,
        density: float,
        *,
        momentum: float = 0.9,
        clip_norm: float | None = None,
        warmup_steps: int = 0,
        warmup_start: float = 0.25,
        momentum_masking: bool = True,
        value_dtype: str = "fp16",
    ) -> None:
        super().__init__(error_feedback=True)
        self.density = check_density(density)
        self.momentum = _number("momentum", momentum, 0.0, 1.0, closed_high=False)
        if clip_norm is not None:
            clip_norm = _number("clip_norm", clip_norm, 0.0, math.inf, closed_high=False)
            if clip_norm == 0:
                raise ValueError("clip_norm=0: must be > 0 (None: no clipping)")
        self.clip_norm = clip_norm
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps!r}: must be an integer >= 0")
        self.warmup_steps = warmup_steps
        self.warmup_start = _number("warmup_start", warmup_start, 0.0, 1.0, closed_high=True)
        if warmup_steps and not self.density <= self.warmup_start:
            raise ValueError(
                f"warmup_start={warmup_start!r}: the warm-up starts denser than "
                f"density={density!r} and decreases to it"
            )
        if value_dtype not in VALUE_DTYPES:
            raise ValueError(f"value_dtype={value_dtype!r}: allowed {', '.join(VALUE_DTYPES)}")
        self.value_dtype = VALUE_DTYPES[value_dtype]
        self.momentum_masking = bool(momentum_masking)
        self.step = 0
        self.velocity: dict[str, torch.Tensor] = {}

    def density_at(self, step: int) -> float:
        """The density of step `step` (0-based): exponential decay from `warmup_start` to
        `density` over `warmup_steps` steps, then `density`."""
        if step >= self.warmup_steps:
            return self.density
        return self.warmup_start * (self.density / self.warmup_start) ** (step / self.warmup_steps)

    @property
    def current_density(self) -> float:
        return self.density_at(self.step)

    def clip_gradients(self, grads: Sequence[torch.Tensor], world_size: int) -> list[torch.Tensor]:
        """float32 copies of one rank's gradients, their joint norm clipped to
        clip_norm / √world_size (unchanged when `clip_norm` is None or not exceeded)."""
        out = [g.detach().float().clone() for g in grads]
        if self.clip_norm is None or not out:
            return out
        norm = math.sqrt(sum(float(g.square().sum()) for g in out))
        threshold = self.clip_norm / math.sqrt(world_size)
        if norm > threshold:
            for g in out:
                g.mul_(threshold / norm)
        return out

    def compress(self, grad: torch.Tensor, key: str = "") -> Payload:
        """One tensor's DGC step at the current density: momentum correction, Top-k of the
        accumulation, momentum factor masking. No clipping (see `aggregate`)."""
        g = grad.detach().float()
        u = self.velocity.get(key)
        u = g.clone() if u is None else u.mul_(self.momentum).add_(g)
        v = self.memory.get(key)
        v = u.clone() if v is None else v.add_(u)
        payload = self.encode(v)
        v.sub_(self.decode(payload))
        if self.momentum_masking:
            u.view(-1)[decode_index(payload)] = 0.0
        self.velocity[key], self.memory[key] = u, v
        return payload

    def encode(self, x: torch.Tensor) -> Payload:
        """The k = current-density·n largest-magnitude entries of x (TopK's payload)."""
        k = kept(x.numel(), self.current_density)
        index = x.reshape(-1).abs().topk(k, sorted=False).indices
        return encode_sparse(x, index, self.value_dtype)

    def decode(self, payload: Payload) -> torch.Tensor:
        return decode_sparse(payload)

    def aggregate(
        self, named_grads: list[tuple[str, torch.Tensor]], comm: Communicator
    ) -> list[torch.Tensor]:
        """Clip this rank's gradient, run `compress` on every tensor, all-gather the
        payloads and average them; then advance the warm-up step."""
        grads = self.clip_gradients([g for _, g in named_grads], comm.world_size)
        keys = [key for key, _ in named_grads]
        out = all_gather_average(self, list(zip(keys, grads, strict=True)), comm)
        self.step += 1
        return out
