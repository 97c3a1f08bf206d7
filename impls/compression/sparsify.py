"""Sparsification: send k of a gradient's n elements, as (index, value) pairs.

- Top-K (Aji & Heafield 2017; Lin et al. 2018, "Deep Gradient Compression"): the k elements
  of largest magnitude. Biased: without error feedback the small coordinates are never
  applied; with it (the lecture's "residuals for future updates") they accumulate until
  they are large enough to be sent.
- Random-K (Stich et al. 2018, "Sparsified SGD with memory"): k elements drawn uniformly,
  from a generator seeded per call so that a run is reproducible.

k = max(1, round(density · n)). Indices travel as int32 (any tensor here has < 2³¹
elements), values as float32: 8 bytes per kept element, so density d compresses by 1/(2d).
"""

from __future__ import annotations

import torch

from impls.compression.base import Compressor, Payload

__all__ = ["RandomK", "TopK", "check_density", "kept"]


def check_density(density: float) -> float:
    if not (isinstance(density, int | float) and 0 < density <= 1):
        raise ValueError(f"ratio={density!r}: the density kept must be in (0, 1]")
    return float(density)


def kept(numel: int, density: float) -> int:
    """How many of `numel` elements a density keeps (at least one)."""
    return max(1, min(numel, round(density * numel)))


class _Sparse(Compressor):
    def __init__(self, density: float, *, error_feedback: bool = True) -> None:
        super().__init__(error_feedback=error_feedback)
        self.density = check_density(density)

    def _payload(self, x: torch.Tensor, index: torch.Tensor) -> Payload:
        flat = x.reshape(-1)
        return Payload({"index": index.to(torch.int32), "value": flat[index].clone()}, x.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        out = torch.zeros(payload.numel, dtype=torch.float32)
        out[payload.tensors["index"].long()] = payload.tensors["value"]
        return out.view(payload.shape)


class TopK(_Sparse):
    """The k = density·n largest-magnitude elements."""

    name = "topk"

    def encode(self, x: torch.Tensor) -> Payload:
        k = kept(x.numel(), self.density)
        return self._payload(x, x.reshape(-1).abs().topk(k, sorted=False).indices)


class RandomK(_Sparse):
    """k = density·n elements chosen uniformly at random (a fresh draw per call)."""

    name = "randomk"

    def __init__(self, density: float, *, error_feedback: bool = True, seed: int = 0) -> None:
        super().__init__(density, error_feedback=error_feedback)
        self.generator = torch.Generator().manual_seed(seed)

    def encode(self, x: torch.Tensor) -> Payload:
        k = kept(x.numel(), self.density)
        index = torch.randperm(x.numel(), generator=self.generator)[:k]
        return self._payload(x, index)
