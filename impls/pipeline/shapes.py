"""The activation shape at every stage boundary, which sizes the executor's receive buffers.

A receive must post a buffer of the right size before the tensor arrives, so each rank
needs the shape and dtype of every boundary it receives across. They are either given
(`activation_shape`, the same at every boundary) or learnt once by messages: each
boundary's sender runs its stage on an example input and sends a fixed-size header — the
number of dims, the dims padded with zeros to `MAX_DIMS`, and the dtype's index in
`DTYPES` — to the receiver.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from impls.comm import Communicator
from impls.pipeline.dataflow import StageRanks, rank_of

__all__ = ["DTYPES", "MAX_DIMS", "BoundaryShapes", "exchange_shapes", "uniform_shapes"]

# Activation dtypes a shape header can name (index in this tuple is sent).
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
MAX_DIMS = 8

BoundaryShapes = dict[int, tuple[torch.Size, torch.dtype]]
"""Stage b -> the shape and dtype of stage b's output (what crosses to stage b+1)."""


def uniform_shapes(shape: tuple[int, ...], dtype: torch.dtype, num_stages: int) -> BoundaryShapes:
    """Every boundary carries `shape` in `dtype` (e.g. (mb, seq, d_model) between blocks)."""
    size = torch.Size(shape)
    return {b: (size, dtype) for b in range(num_stages - 1)}


def exchange_shapes(
    comm: Communicator,
    stage_modules: dict[int, nn.Module],
    num_stages: int,
    example: Tensor | None,
    stage_ranks: StageRanks | None = None,
) -> BoundaryShapes:
    """Learn each stage boundary's tensor shape once, walking the stages in model order.

    Stage b's rank runs stage b without autograd on an example input (`example`, micro-batch
    0, on stage 0; zeros of the received shape after) and sends the output's shape to stage
    b+1's rank. The RNG state is restored, so dropout draws are unaffected. Every rank of
    `comm` calls it together; each learns the boundaries next to the stages it holds.
    """
    shapes: BoundaryShapes = {}
    device, ranks = comm.device, comm.world_size
    rng_devices = [device] if device.type == "cuda" else []
    for b in range(num_stages - 1):
        sender, receiver = rank_of(b, ranks, stage_ranks), rank_of(b + 1, ranks, stage_ranks)
        if comm.rank == sender:
            if b == 0:
                stage_input = example
            else:
                stage_input = torch.zeros(shapes[b - 1][0], dtype=shapes[b - 1][1], device=device)
            with torch.no_grad(), torch.random.fork_rng(devices=rng_devices):
                output = stage_modules[b](stage_input)
            shapes[b] = (output.shape, output.dtype)
            if receiver != sender:
                comm.send(shape_header(*shapes[b]).to(device), receiver)
        elif comm.rank == receiver:
            header = torch.empty(MAX_DIMS + 2, dtype=torch.int64, device=device)
            comm.recv(header, sender)
            shapes[b] = read_header(header)
    return shapes


def shape_header(size: torch.Size, dtype: torch.dtype) -> Tensor:
    """The int64 header that names `size` and `dtype` (refused: more dims, other dtypes)."""
    if len(size) > MAX_DIMS or dtype not in DTYPES:
        raise ValueError(
            f"stage output {tuple(size)} {dtype}: activations must have <= {MAX_DIMS} dims "
            f"and a dtype in {DTYPES}; pass activation_shape/activation_dtype instead"
        )
    padded = list(size) + [0] * (MAX_DIMS - len(size))
    return torch.tensor([len(size), *padded, DTYPES.index(dtype)], dtype=torch.int64)


def read_header(header: Tensor) -> tuple[torch.Size, torch.dtype]:
    """The size and dtype a `shape_header` names."""
    values = header.tolist()
    return torch.Size(values[1 : 1 + values[0]]), DTYPES[values[-1]]
