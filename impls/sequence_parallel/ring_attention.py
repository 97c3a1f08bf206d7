"""Ring Attention (Liu et al. 2023, arXiv 2310.01889): blockwise causal attention whose
key/value blocks travel around a ring of ranks.

Rank r holds query, key and value block r of the sequence. In step t it attends its queries
to the K/V block of rank (r − t) mod P while that block's successor is already on the wire:
the send to r + 1 and the receive from r − 1 are posted on a `Communicator.round()` before
the step's compute and waited on after it, so communication overlaps computation. Scores
are folded in with the online softmax (Milakov & Gimelshein 2018; the blockwise form of
Rabe & Staats 2021): a running row maximum m and row sum l, so the s × s score matrix never
exists, only one (s/P) × (s/P) block at a time.

Uneven sequence lengths are end-padded by `common.shard_sequence`; padded keys come after
every real query, so the causal mask already hides them.
"""

from __future__ import annotations

import math

import torch

from impls.comm import Communicator
from impls.sequence_parallel.common import SequenceShardedAttention

__all__ = ["RingAttention", "ring_attention"]

# Backward sends K/V and a dK/dV accumulator to the same neighbour in one round; distinct
# tags keep the two messages from being matched to each other's receives.
_GRAD_TAG = 1


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diagonal: bool) -> torch.Tensor:
    """(b, nh, L, hd) @ (b, nh, hd, L) -> (b, nh, L, L), causally masked on the diagonal."""
    s = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        n = q.shape[-2]
        above = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(above, float("-inf"))
    return s


def _ring_forward(q, k, v, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise causal attention over the ring: (output, log-sum-exp), both per query.

    Causal masking by block index: block j < r is fully visible, j = r gets the triangular
    mask, j > r is skipped (it is still relayed). Step 0 is always the diagonal block, so every
    row has a finite maximum before any fully masked case can arise.
    """
    p, r = comm.world_size, comm.rank
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros_like(q)  # running un-normalized output
    row_max = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
    row_sum = torch.zeros_like(row_max)
    kv = torch.stack((k, v))  # (2, b, nh, L, hd): one message per step
    for step in range(p):
        src = (r - step) % p
        rnd = comm.round()
        if step < p - 1:  # post the next block's transfer before computing this one
            incoming = torch.empty_like(kv)
            rnd.recv(incoming, (r - 1) % p)
            rnd.send(kv, (r + 1) % p)
            rnd.post()
        if src <= r:  # blocks after ours are fully masked by causality
            s = _scores(q, kv[0], scale, diagonal=src == r)
            new_max = torch.maximum(row_max, s.amax(-1, keepdim=True))
            correction = torch.exp(row_max - new_max)  # rescales what was summed so far
            probs = torch.exp(s - new_max)
            row_sum = row_sum * correction + probs.sum(-1, keepdim=True)
            out = out * correction + probs @ kv[1]  # (b, nh, L, L) @ (b, nh, L, hd)
            row_max = new_max
        rnd.wait()
        if step < p - 1:
            kv = incoming
    return out / row_sum, row_max + torch.log(row_sum)


def _ring_backward(q, k, v, out, lse, grad_out, comm: Communicator):
    """dQ, dK, dV by blockwise recomputation; K/V and dK/dV accumulators go round the ring.

    Backward is a custom autograd Function that recomputes each block from the saved
    log-sum-exp (as FlashAttention does) instead of keeping per-block probabilities. K/V go
    around the ring again, and each block's dK/dV accumulator follows one hop behind: the
    accumulator for block j, received from r − 1 while this rank computes its own contribution
    to block j, is added afterwards and sent on in the next step; a last hop returns it to its
    owner. Forward moves (P − 1) K/V blocks per rank; backward (P − 1) K/V blocks and P dK/dV
    blocks (see `analytic.layer_traffic`).
    """
    p, r = comm.world_size, comm.rank
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = (grad_out * out).sum(-1, keepdim=True)  # rowsum(dO ∘ O), the softmax-backward term
    grad_q = torch.zeros_like(q)
    kv = torch.stack((k, v))
    grad_kv_done = None  # accumulator of the block handled last step, to pass on
    for step in range(p):
        src = (r - step) % p
        rnd = comm.round()
        if step < p - 1:
            incoming_kv = torch.empty_like(kv)
            rnd.recv(incoming_kv, (r - 1) % p)
            rnd.send(kv, (r + 1) % p)
        if step > 0:  # earlier ranks' share of block src's gradient, one hop behind
            incoming_grad = torch.empty_like(kv)
            rnd.recv(incoming_grad, (r - 1) % p, tag=_GRAD_TAG)
            rnd.send(grad_kv_done, (r + 1) % p, tag=_GRAD_TAG)
        rnd.post()
        grad_kv = torch.zeros_like(kv)
        if src <= r:
            k_blk, v_blk = kv[0], kv[1]
            probs = torch.exp(_scores(q, k_blk, scale, diagonal=src == r) - lse)
            grad_kv[1] = probs.transpose(-2, -1) @ grad_out  # dV = Pᵀ dO
            grad_scores = probs * (grad_out @ v_blk.transpose(-2, -1) - delta)
            grad_q += (grad_scores @ k_blk) * scale
            grad_kv[0] = (grad_scores.transpose(-2, -1) @ q) * scale  # dK = dSᵀ Q
        rnd.wait()
        if step > 0:
            grad_kv += incoming_grad
        if step < p - 1:
            kv = incoming_kv
        grad_kv_done = grad_kv
    if p > 1:  # the last rank to touch block r+1 is r: hand the total to its owner
        home = torch.empty_like(grad_kv_done)
        with comm.round() as rnd:
            rnd.recv(home, (r - 1) % p)
            rnd.send(grad_kv_done, (r + 1) % p)
        grad_kv_done = home
    return grad_q, grad_kv_done[0], grad_kv_done[1]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm: Communicator):
        out, lse = _ring_forward(q, k, v, comm)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm = comm
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _ring_backward(q, k, v, out, lse, grad_out.contiguous(), ctx.comm)
        return (*grads, None)


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator
) -> torch.Tensor:
    """Causal attention of this rank's query block over every rank's K/V blocks.

    q, k, v: (b, nh, L, hd), block `comm.rank` of a sequence cut into P blocks of L.
    Returns (b, nh, L, hd), equal to rows rL..(r+1)L of full causal attention.
    """
    if not (q.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(
            f"q, k, v must share one (b, n_heads, L, head_dim) shape; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), comm)


class RingAttention(SequenceShardedAttention):
    """Ring Attention over a sequence chunk: any head count, any P."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # (b, L, nh, hd) -> (b, nh, L, hd) -> ring -> (b, nh, L, hd) -> (b, L, nh, hd)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return ring_attention(q, k, v, self.comm).transpose(1, 2)
