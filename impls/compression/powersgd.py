"""PowerSGD: low-rank gradient compression by one step of power iteration per step.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019), Algorithm 1. Each gradient is viewed as an
n × m matrix M (n = shape[0], m = the product of the other dimensions) and replaced by a
rank-r product P̂ Qᵀ found by one power-iteration step that *every rank performs jointly*:

    M ← M + e                      (error feedback: what the last step left out)
    P ← M Q;        P ← mean over ranks of P          (all-reduce 1)
    P̂ ← orthonormal basis of P's columns
    Q ← Mᵀ P̂;       Q ← mean over ranks of Q          (all-reduce 2)
    ĝ ← P̂ Qᵀ;       e ← M − ĝ                         (ĝ is the same on every rank)

P and Q are linear in M, so they are *summed on the wire*: two all-reduces of (n + m)·r.
"""

from __future__ import annotations

import math

import torch

from impls.comm import Communicator
from impls.compression.base import Compressor, Payload
from impls.compression.exchange import all_reduce_average

__all__ = ["PowerSGD", "check_rank"]


def check_rank(rank: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r}: PowerSGD needs an integer approximation rank >= 1")
    return rank


def _check_rate(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < math.inf:
        raise ValueError(
            f"min_compression_rate={rate!r}: must be a finite number >= 0 "
            "(0 compresses every matrix)"
        )
    return float(rate)


def _orthonormal(p: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis (n × r) whose span contains the columns of p (n × r, r ≤ n)."""
    return torch.linalg.qr(p, mode="reduced").Q


class PowerSGD(Compressor):
    """Rank-`rank` PowerSGD with error feedback and warm start (Vogels et al. 2019).

    `aggregate` runs Algorithm 1 over a communicator (two batched factor all-reduces and
    one of the uncompressed tensors). `compress` is the same algorithm on one process (a
    world of one rank): its payload holds P̂ and Q (or the dense tensor when it is not
    compressed) and `decompress` returns P̂ Qᵀ. ĝ = P̂ P̂ᵀ mean(M) is the mean gradient
    projected onto span(P̂). Choices of this implementation:

    - The rank is clamped to min(n, m) per tensor (a larger one adds nothing).
    - A tensor is sent uncompressed when it is 1-D (biases, norms: the paper's "vectors"),
      or when n·m / ((n + m)·r) < `min_compression_rate` (the factors would not be much
      smaller than the tensor, as torch's `powerSGD_hook` decides it). All such tensors of a
      step travel in one fp32 all-reduce, divided by N before the sum.
    - All keys' P travel as one flat buffer, likewise all keys' Q: exactly two factor
      all-reduces per step (ring, `impls.collectives`), plus one for the uncompressed tensors.
    - Orthogonalization is `torch.linalg.qr` (Householder, reduced): stable, and its basis
      spans P's columns even when P is rank-deficient (Gram–Schmidt would divide by zero).
      Every rank holds bitwise the same P after the all-reduce, hence the same P̂.
    - Q is initialised from a `torch.Generator` seeded with `seed`: each key, the first time
      it is compressed (keys in call order), draws `torch.randn(m, r, generator=...)`; without
      warm start every step draws a fresh Q the same way. Ranks call in the same order, so
      they draw the same Q. With `warm_start` (the paper's "reuse of the previous Q", §3)
      each step starts from the previous step's Q: a power iteration continued across steps.
    """

    name = "powersgd"

    def __init__(
        self,
        rank: int,
        *,
        error_feedback: bool = True,
        warm_start: bool = True,
        min_compression_rate: float = 2.0,
        seed: int = 0,
    ) -> None:
        super().__init__(error_feedback=error_feedback)
        self.rank = check_rank(rank)
        self.warm_start = bool(warm_start)
        self.min_compression_rate = _check_rate(min_compression_rate)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.q: dict[str, torch.Tensor] = {}  # the last Q per key (warm start)

    # -- which tensors are compressed, and how ------------------------------------------

    def matrix_shape(self, shape: torch.Size | tuple[int, ...]) -> tuple[int, int, int] | None:
        """(n, m, r) if a tensor of this shape is sent as rank-r factors, else None."""
        shape = torch.Size(shape)
        if len(shape) < 2:
            return None
        n, m = shape[0], shape[1:].numel()
        r = min(self.rank, n, m)
        if r < 1 or n * m < self.min_compression_rate * (n + m) * r:
            return None
        return n, m, r

    def _start_q(self, key: str | None, m: int, r: int) -> torch.Tensor:
        if self.warm_start and key is not None and key in self.q:
            return self.q[key]
        return torch.randn(m, r, generator=self.generator)

    def _target(self, grad: torch.Tensor, key: str) -> torch.Tensor:
        target = grad.detach().float()
        if self.error_feedback and key in self.memory:
            target = target + self.memory[key]
        return target

    def _remember(self, key: str, target: torch.Tensor, approx: torch.Tensor | None) -> None:
        """Keep what the estimate left out (`approx` None: sent whole, nothing left)."""
        if approx is None:
            self.memory.pop(key, None)
        elif self.error_feedback:
            self.memory[key] = target - approx.view(target.shape)

    # -- one process ---------------------------------------------------------------------

    def _encode(self, x: torch.Tensor, key: str | None) -> Payload:
        dims = self.matrix_shape(x.shape)
        if dims is None:
            return Payload({"dense": x.float().clone()}, x.shape)
        n, m, r = dims
        matrix = x.float().reshape(n, m)
        p = _orthonormal(matrix @ self._start_q(key, m, r))
        q = matrix.T @ p
        if self.warm_start and key is not None:
            self.q[key] = q
        return Payload({"p": p, "q": q}, x.shape)

    def compress(self, grad: torch.Tensor, key: str = "") -> Payload:
        """Algorithm 1 on one process: M (+ memory) -> (P̂, Q), warm-started per key."""
        target = self._target(grad, key)
        payload = self._encode(target, key)
        dense = "dense" in payload.tensors
        self._remember(key, target, None if dense else self.decode(payload))
        return payload

    def encode(self, x: torch.Tensor) -> Payload:
        """Factor x from a fresh Q (no key, so no warm start and no memory)."""
        return self._encode(x, None)

    def decode(self, payload: Payload) -> torch.Tensor:
        if "dense" in payload.tensors:
            return payload.tensors["dense"].float().view(payload.shape)
        p, q = payload.tensors["p"], payload.tensors["q"]
        return (p @ q.T).view(payload.shape)

    # -- over a communicator -------------------------------------------------------------

    def aggregate(
        self, named_grads: list[tuple[str, torch.Tensor]], comm: Communicator
    ) -> list[torch.Tensor]:
        """Algorithm 1 over `comm`: the same rank-r estimate of the mean gradient on every
        rank, in two batched factor all-reduces plus one of the uncompressed tensors."""
        targets = [self._target(g, key) for key, g in named_grads]
        out: list[torch.Tensor | None] = [None] * len(targets)

        dense = [i for i, t in enumerate(targets) if self.matrix_shape(t.shape) is None]
        if dense:
            averaged = all_reduce_average([targets[i] for i in dense], comm, torch.float32)
            for i, avg in zip(dense, averaged, strict=True):
                out[i] = avg.clone()
                self._remember(named_grads[i][0], targets[i], None)

        low_rank = [i for i, t in enumerate(targets) if self.matrix_shape(t.shape) is not None]
        if low_rank:
            matrices, ps = [], []
            for i in low_rank:
                n, m, r = self.matrix_shape(targets[i].shape)
                matrix = targets[i].reshape(n, m)
                matrices.append(matrix)
                ps.append(matrix @ self._start_q(named_grads[i][0], m, r))
            ps = all_reduce_average(ps, comm, torch.float32)  # all-reduce 1: every P
            ps = [_orthonormal(p) for p in ps]
            qs = [matrix.T @ p for matrix, p in zip(matrices, ps, strict=True)]
            qs = all_reduce_average(qs, comm, torch.float32)  # all-reduce 2: every Q
            for i, p, q in zip(low_rank, ps, qs, strict=True):
                key = named_grads[i][0]
                approx = p @ q.T
                if self.warm_start:
                    self.q[key] = q.clone()
                out[i] = approx.view(targets[i].shape)
                self._remember(key, targets[i], out[i])
        return out  # type: ignore[return-value]
