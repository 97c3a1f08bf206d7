"""Moving compressed gradients between ranks: the average every replica steps with.

A compressor's payloads cannot in general be summed on the wire (two Top-K payloads keep
different indices; two QSGD payloads have different norms), so the default exchange is an
*all-gather* of every rank's payloads, each rank then decoding all N and averaging — the
exchange the lecture gives sparse gradients. The payloads of all tensors of a step travel
as one byte buffer (one collective per step), so the bytes the `Communicator` counts are
exactly the payloads' bytes times the all-gather's traffic, nothing the compressor claims.

Compressors whose payloads *are* linear (fp16/bf16 casts, PowerSGD's factors) override
`Compressor.aggregate` with all-reduces instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from impls.collectives import all_gather, all_reduce
from impls.comm import Communicator

__all__ = ["all_gather_average", "all_reduce_average", "pack_payloads", "unpack_payloads"]


def pack_payloads(
    payloads: Sequence,
) -> tuple[torch.Tensor, list[tuple[str, torch.dtype, torch.Size]]]:
    """One uint8 buffer holding every payload tensor's bytes, and the layout to cut it."""
    layout, parts = [], []
    for payload in payloads:
        for name, t in payload.tensors.items():
            layout.append((name, t.dtype, t.shape))
            parts.append(t.contiguous().reshape(-1).view(torch.uint8))
    return torch.cat(parts), layout


def unpack_payloads(buffer: torch.Tensor, like: Sequence, layout) -> list:
    """Payloads shaped like `like` whose tensors are read from `buffer` (the layout of
    `pack_payloads(like)`)."""
    from impls.compression.base import Payload

    out, offset, i = [], 0, 0
    for payload in like:
        tensors = {}
        for _ in payload.tensors:
            name, dtype, shape = layout[i]
            nbytes = shape.numel() * torch.empty((), dtype=dtype).element_size()
            # clone: a view to a wider dtype needs an aligned storage offset
            tensors[name] = buffer[offset : offset + nbytes].clone().view(dtype).view(shape)
            offset, i = offset + nbytes, i + 1
        out.append(Payload(tensors, payload.shape, dict(payload.meta)))
    return out


def all_gather_average(
    compressor, named_grads: Sequence[tuple[str, torch.Tensor]], comm: Communicator
) -> list[torch.Tensor]:
    """Compress each gradient, all-gather every rank's payloads, decode and average them."""
    payloads = [compressor.compress(g, key) for key, g in named_grads]
    if comm.world_size == 1:
        return [compressor.decompress(p) for p in payloads]
    mine, layout = pack_payloads(payloads)
    gathered = torch.empty(comm.world_size * mine.numel(), dtype=torch.uint8, device=mine.device)
    all_gather(gathered, mine, comm)
    sums = [torch.zeros(g.shape, dtype=torch.float32) for _, g in named_grads]
    for peer, chunk in enumerate(gathered.view(comm.world_size, -1)):
        theirs = payloads if peer == comm.rank else unpack_payloads(chunk, payloads, layout)
        for total, payload in zip(sums, theirs, strict=True):
            total += compressor.decompress(payload)
    return [s.div_(comm.world_size) for s in sums]


def all_reduce_average(
    grads: Sequence[torch.Tensor], comm: Communicator, dtype: torch.dtype, algorithm: str = "ring"
) -> list[torch.Tensor]:
    """The float32 average of `grads` over ranks, all-reduced as one buffer in `dtype`.

    Divided by N before the sum, as torch's DDP and `fp16_compress_hook` do, so a sum in
    fp16 overflows only where the average would.
    """
    flat = torch.cat([g.detach().reshape(-1).float() for g in grads]).div_(comm.world_size)
    flat = flat.to(dtype)
    if comm.world_size > 1:
        all_reduce(flat, comm, op="sum", algorithm=algorithm)
    out, offset = [], 0
    for g in grads:
        out.append(flat[offset : offset + g.numel()].float().view(g.shape))
        offset += g.numel()
    return out
