"""Quantization: send every element in a few bits.

- 1-bit SGD (Seide et al. 2014): one sign bit per element; decoding gives each sign the
  mean of the elements that had it (two float32 scalars per tensor). Biased; error
  feedback carries the quantization error to the next step, as in the paper.
- TernGrad (Wen et al. 2017, §3): g_i -> s·sign(g_i)·b_i with s = max|g| and
  b_i ~ Bernoulli(|g_i|/s): values in {−s, 0, s}, 2 bits each. Unbiased, with
  E‖ĝ − g‖² = Σ(s·|g_i| − g_i²) ≤ s·‖g‖₁.
- QSGD (Alistarh et al. 2017, §3.1): g_i -> ‖g‖₂·sign(g_i)·ξ_i/s, with ξ_i the stochastic
  rounding of s·|g_i|/‖g‖₂ to one of the levels 0…s. Unbiased (Lemma 3.1 (i)), with
  E‖Q(g) − g‖² ≤ min(n/s², √n/s)·‖g‖² (Lemma 3.1 (ii)). Levels and signs travel as one
  signed byte per element (s ≤ 127), not the paper's Elias code: 4× fewer bytes than fp32.
- fp16 / bf16: a cast, 2× fewer bytes (the lecture's mixed-precision communication).

Stochastic rounding draws from a generator seeded at construction, so runs reproduce."""

from __future__ import annotations

import torch

from impls.comm import Communicator
from impls.compression.base import Compressor, Payload, pack_bits, unpack_bits
from impls.compression.exchange import all_reduce_average

__all__ = ["QSGD", "Cast", "OneBit", "TernGrad", "check_levels"]


def check_levels(levels: int) -> int:
    if isinstance(levels, bool) or not isinstance(levels, int) or not 1 <= levels <= 127:
        raise ValueError(f"levels={levels!r}: QSGD needs an integer number of levels in [1, 127]")
    return levels


class OneBit(Compressor):
    """Signs packed 8 per byte, each side decoded to its mean (error feedback on)."""

    name = "onebit"

    def __init__(self, *, error_feedback: bool = True) -> None:
        super().__init__(error_feedback=error_feedback)

    def encode(self, x: torch.Tensor) -> Payload:
        flat = x.reshape(-1)
        positive = flat >= 0
        n_pos = int(positive.sum())
        pos_mean = flat[positive].mean() if n_pos else flat.new_zeros(())
        neg_mean = flat[~positive].mean() if n_pos < flat.numel() else flat.new_zeros(())
        means = torch.stack([neg_mean, pos_mean]).float()
        return Payload({"signs": pack_bits(positive, 1), "means": means}, x.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        bits = unpack_bits(payload.tensors["signs"], 1, payload.numel).long()
        return payload.tensors["means"][bits].view(payload.shape)


class TernGrad(Compressor):
    """Values in {−s, 0, +s}, s = max|g|, packed 4 per byte; unbiased."""

    name = "terngrad"
    unbiased = True

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(error_feedback=False)
        self.generator = torch.Generator().manual_seed(seed)

    def encode(self, x: torch.Tensor) -> Payload:
        flat = x.reshape(-1)
        scale = flat.abs().max()
        if scale == 0:
            codes = torch.zeros(flat.numel(), dtype=torch.uint8)
        else:
            keep = torch.rand(flat.numel(), generator=self.generator) < flat.abs() / scale
            # 0: zero, 1: +s, 2: −s
            codes = torch.where(flat >= 0, 1, 2).to(torch.uint8) * keep
        return Payload({"codes": pack_bits(codes, 2), "scale": scale.reshape(1)}, x.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        codes = unpack_bits(payload.tensors["codes"], 2, payload.numel).long()
        values = torch.stack([torch.zeros(()), torch.ones(()), -torch.ones(())])
        return (values[codes] * payload.tensors["scale"]).view(payload.shape)


class QSGD(Compressor):
    """‖g‖₂ and one signed byte per element: stochastic rounding to `levels` levels."""

    name = "qsgd"
    unbiased = True

    def __init__(self, levels: int, *, seed: int = 0) -> None:
        super().__init__(error_feedback=False)
        self.levels = check_levels(levels)
        self.generator = torch.Generator().manual_seed(seed)

    def encode(self, x: torch.Tensor) -> Payload:
        flat = x.reshape(-1)
        norm = flat.norm()
        if norm == 0:
            q = torch.zeros(flat.numel(), dtype=torch.int8)
        else:
            scaled = flat.abs() / norm * self.levels  # in [0, s]
            low = scaled.floor()
            up = torch.rand(flat.numel(), generator=self.generator) < scaled - low
            q = ((low + up) * flat.sign()).to(torch.int8)
        return Payload({"levels": q, "norm": norm.reshape(1)}, x.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        q = payload.tensors["levels"].float()
        return (q * payload.tensors["norm"] / self.levels).view(payload.shape)


class Cast(Compressor):
    """fp16 or bf16 on the wire."""

    DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

    def __init__(self, precision: str) -> None:
        super().__init__(error_feedback=False)
        if precision not in self.DTYPES:
            raise ValueError(f"precision={precision!r}: allowed {', '.join(self.DTYPES)}")
        self.name, self.dtype = precision, self.DTYPES[precision]

    def aggregate(
        self, named_grads: list[tuple[str, torch.Tensor]], comm: Communicator
    ) -> list[torch.Tensor]:
        """A cast is linear: one ring all-reduce in fp16/bf16 (torch's `fp16_compress_hook`)."""
        return all_reduce_average([g for _, g in named_grads], comm, self.dtype)

    def encode(self, x: torch.Tensor) -> Payload:
        return Payload({"values": x.to(self.dtype)}, x.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        return payload.tensors["values"].float().view(payload.shape)
