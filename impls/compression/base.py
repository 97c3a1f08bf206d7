"""The compressor interface: a gradient in, a payload of tensors out, and back.

Every method of the lecture's "Gradient Compression" section (sparsification with error
feedback, quantization, low rank) is a pair of maps C (compress: gradient -> payload, the
tensors that travel) and D (decompress: payload -> a dense estimate of the gradient), plus,
for the biased ones, *error feedback* (Seide et al. 2014; Stich et al. 2018, "Sparsified
SGD with memory"): what C dropped is kept in a per-tensor memory and added to the next
gradient before compressing, so no part of any gradient is lost, only delayed.

A payload's `nbytes` is what its tensors occupy: what a transport moving them would count.
The data-parallel path sends payloads through `impls.comm`, whose counters measure the
bytes actually moved; `nbytes` is the compressor's own claim, which tests compare with
those counters.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from impls.comm import Communicator

__all__ = ["Compressor", "Payload", "pack_bits", "unpack_bits"]


@dataclass
class Payload:
    """What one tensor's compressed gradient sends: named tensors, plus the dense shape."""

    tensors: dict[str, torch.Tensor]
    shape: torch.Size
    meta: dict[str, int | float] = field(default_factory=dict)  # small scalars, not sent

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class Compressor(ABC):
    """C and D for one method; `error_feedback` keeps a residual memory per tensor key."""

    name: str = "compressor"
    unbiased: bool = False
    """E[D(C(g))] = g (QSGD, TernGrad, unscaled casts up to rounding); tests check it."""

    def __init__(self, *, error_feedback: bool = False) -> None:
        self.error_feedback = error_feedback
        self.memory: dict[str, torch.Tensor] = {}

    def compress(self, grad: torch.Tensor, key: str = "") -> Payload:
        """Encode `grad` (plus this key's memory, with error feedback); update the memory
        to what the payload leaves out."""
        target = grad.detach().float()
        if self.error_feedback and key in self.memory:
            target = target + self.memory[key]
        payload = self.encode(target)
        if self.error_feedback:
            self.memory[key] = target - self.decode(payload)
        return payload

    def decompress(self, payload: Payload) -> torch.Tensor:
        """The dense float32 estimate of the gradient a payload carries."""
        return self.decode(payload)

    def aggregate(
        self, named_grads: list[tuple[str, torch.Tensor]], comm: Communicator
    ) -> list[torch.Tensor]:
        """The average over `comm`'s ranks of every rank's decoded gradients, one float32
        tensor per entry of `named_grads` ((key, gradient) pairs, the same keys and shapes
        on every rank). Default: all-gather the payloads (`exchange.all_gather_average`)."""
        from impls.compression.exchange import all_gather_average

        return all_gather_average(self, named_grads, comm)

    def ratio(self, payload: Payload) -> float:
        """Dense float32 bytes over payload bytes (the compression ratio)."""
        return 4 * payload.numel / max(payload.nbytes, 1)

    @abstractmethod
    def encode(self, x: torch.Tensor) -> Payload: ...

    @abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor: ...


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integers in [0, 2**bits) (`bits` ∈ {1, 2, 4, 8}) into a uint8 tensor, 8/bits
    values per byte, little end first; the last byte is zero-padded."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits={bits}: allowed 1, 2, 4, 8")
    flat = values.reshape(-1).to(torch.uint8)
    if bits == 8:
        return flat.clone()
    per_byte = 8 // bits
    pad = (-flat.numel()) % per_byte
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    return (flat.view(-1, per_byte) << shifts).sum(dim=1, dtype=torch.int32).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """The inverse of `pack_bits`: the first `numel` values, as uint8."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits={bits}: allowed 1, 2, 4, 8")
    if bits == 8:
        return packed[:numel].clone()
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    mask = (1 << bits) - 1
    return ((packed.view(-1, 1) >> shifts) & mask).reshape(-1)[:numel]
