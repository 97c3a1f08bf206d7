"""What one rank does in a `sequence_parallel` cell: one transformer layer, forward and
backward on this rank's sequence chunk, counted, checked and timed.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from bench.experiments.base import Cell
from bench.experiments.sequence_parallel.config import SequenceParallelConfig
from bench.kit.memory import ledger_over_pass
from bench.kit.timing import alternate
from impls.comm import Communicator
from impls.models import GPT, Block
from impls.sequence_parallel import (
    MegatronSPBlock,
    RingAttention,
    UlyssesAttention,
    all_reduce_replicated_grads,
    local_seq_len,
    shard_sequence,
)
from impls.tensor_parallel import sharded_dims
from impls.tensor_parallel.layers import shard

__all__ = [
    "TOLERANCE",
    "SequenceShardedBlock",
    "full_block",
    "measure",
    "parallel_block",
    "run",
]

# fp32. A tensor is wrong when max|got − want| > TOLERANCE · max|want|. The distributed
# layer sums the same products in another order (blockwise online softmax, weight
# gradients summed chunk by chunk over ranks), which moves a result by a few float32 ulps
# per term: at most 2.5e-6 over the full grid (s = 2048). A head, position or block in
# the wrong place moves it by O(1).
TOLERANCE = 1e-4
GRAD_FLOOR = 1e-3


class SequenceShardedBlock(nn.Module):
    """A pre-LayerNorm `Block` whose attention is sequence-parallel and whose LayerNorms
    and MLP, per position, run replicated on this rank's chunk: (b, s/P, h) -> (b, s/P, h).

    Every weight is replicated and sees only this rank's positions: sum the gradients of
    `replicated_parameters()` over the group (`all_reduce_replicated_grads`).
    """

    def __init__(self, block: Block, attention: type, comm: Communicator) -> None:
        super().__init__()
        self.ln1 = copy.deepcopy(block.ln1)
        self.attn = attention.from_attention(block.attn, comm)
        self.ln2 = copy.deepcopy(block.ln2)
        self.mlp = copy.deepcopy(block.mlp)

    def replicated_parameters(self) -> list[nn.Parameter]:
        return list(self.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def full_block(cfg: SequenceParallelConfig, cell: Cell) -> Block:
    """The single-device block every rank starts from (one seed: identical everywhere)."""
    return GPT(cell.carry.block, seed=cfg.seed).blocks[0]


def parallel_block(cfg: SequenceParallelConfig, cell: Cell, comm: Communicator) -> nn.Module:
    """This rank's part of the block under the cell's method."""
    block, method = full_block(cfg, cell), cell.key["method"]
    if method == "megatron_sp":
        return MegatronSPBlock.from_block(block, comm)
    attention = {"ulysses": UlyssesAttention, "ring_attention": RingAttention}[method]
    return SequenceShardedBlock(block, attention, comm)


def full_inputs(cfg: SequenceParallelConfig, cell: Cell) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole input x and output gradient dy, (b, s, h) each, the same on every rank."""
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    shape = (cfg.batch_size, cell.key["seq_len"], cell.carry.block.d_model)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _reference(cfg: SequenceParallelConfig, cell: Cell) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The full block on one process: output, input gradient, weight gradients."""
    block = full_block(cfg, cell)
    x, dy = full_inputs(cfg, cell)
    x.requires_grad_()
    y = block(x)
    y.backward(dy)
    return y.detach(), x.grad, {name: p.grad for name, p in block.named_parameters()}


def _error(got: torch.Tensor, want: torch.Tensor, floor: float = 0.0) -> float:
    """max|got − want| / max(max|want|, floor) (0 for empty tensors)."""
    if want.numel() == 0:
        return 0.0
    scale = max(float(want.abs().max()), floor) or 1.0
    return float((got - want).abs().max()) / scale


def _errors(
    cfg: SequenceParallelConfig,
    cell: Cell,
    block: nn.Module,
    y: torch.Tensor,
    dx: torch.Tensor,
    comm: Communicator,
) -> dict[str, float]:
    """Each checked tensor's normalised error against the single-process block: this
    rank's real (unpadded) positions of y and dx, and every weight gradient (a tensor-
    parallel shard against its block of the full gradient).

    A weight gradient is measured against its own largest value, or against
    `GRAD_FLOOR` × the block's largest reference weight gradient where that is larger:
    k_proj's bias has an identically zero gradient (softmax ignores a shift common to
    every key), so its reference holds nothing but rounding noise.
    """
    want_y, want_dx, want_grads = _reference(cfg, cell)
    seq_len = cell.key["seq_len"]
    chunk = local_seq_len(seq_len, comm.world_size)
    start = comm.rank * chunk
    real = max(0, min(chunk, seq_len - start))
    errors = {
        "output": _error(y[:, :real], want_y[:, start : start + real]),
        "input grad": _error(dx[:, :real], want_dx[:, start : start + real]),
    }
    floor = GRAD_FLOOR * max(float(g.abs().max()) for g in want_grads.values())
    dims = sharded_dims(block)
    for name, param in block.named_parameters():
        want = want_grads[name]
        if name in dims:
            want = shard(want, dims[name], comm.rank, comm.world_size)
        got = param.grad
        errors[f"grad {name}"] = 1.0 if got is None else _error(got, want, floor)
    return errors


def _measured_pass(
    cfg: SequenceParallelConfig, cell: Cell, block: nn.Module, comm: Communicator
) -> dict:
    """One forward + backward with traffic counted and memory accounted, then the check."""
    x_full, dy_full = full_inputs(cfg, cell)
    # A copy: with b = 1 the chunk is a view of the whole x, whose storage the ledger would
    # count as the input's; the previous layer would hand over a tensor of its own.
    x = shard_sequence(x_full, comm).clone().requires_grad_()
    dy = shard_sequence(dy_full, comm)  # padded positions get a zero gradient
    traffic, outputs = {}, []

    def forward() -> torch.Tensor:
        with comm.measure() as traffic["fwd"]:
            outputs.append(block(x))
        return outputs[0]

    def backward(y: torch.Tensor) -> None:
        with comm.measure() as traffic["bwd"]:
            y.backward(dy)

    ledger, activations = ledger_over_pass(block.parameters(), forward, backward)
    memory = ledger.snapshot()
    with comm.measure() as grad_sync:
        all_reduce_replicated_grads(block.replicated_parameters(), comm)
    errors = _errors(cfg, cell, block, outputs[0].detach(), x.grad, comm)
    return {
        "fwd": traffic["fwd"].as_dict(),
        "bwd": traffic["bwd"].as_dict(),
        "grad_sync": grad_sync.as_dict(),
        "activation_bytes": activations,
        "param_bytes": memory["current"]["params"],
        "grad_bytes": memory["current"]["grads"],
        "peak_bytes": memory["peak_total"],
        "errors": errors,
        "wrong": sum(error > TOLERANCE for error in errors.values()),
    }


def _step_times(
    cfg: SequenceParallelConfig, cell: Cell, block: nn.Module, comm: Communicator
) -> list[float]:
    """`repeats` barrier-opened forward + backward passes (after `warmup`): slowest rank's s."""
    x_full, dy_full = full_inputs(cfg, cell)
    x = shard_sequence(x_full, comm).requires_grad_()
    dy = shard_sequence(dy_full, comm)

    def step() -> None:
        block.zero_grad(set_to_none=True)
        x.grad = None
        block(x).backward(dy)

    timed = alternate({"step": step}, warmup=cfg.warmup, repeats=cfg.repeats, group=comm.group)
    return timed["step"].seconds


def run(cfg: SequenceParallelConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell on the default group: see `measure`.

    A cell is (method, P, s). Every rank builds the same block of the same seeded GPT and the
    same full input x and output gradient dy of shape (b, s, h), and keeps its chunk of each
    (`impls.sequence_parallel.shard_sequence`: ceil(s/P) positions, the last chunks
    end-padded). The layer is a whole pre-LayerNorm transformer block for all three methods:

    - `megatron_sp`: `MegatronSPBlock` (Korthikanti et al. 2022, arXiv 2205.05198, §4.2.2) —
      LayerNorms sequence-sharded, attention heads and MLP units tensor-parallel;
    - `ulysses` / `ring_attention`: `SequenceShardedBlock` below — replicated LayerNorms and
      MLP on the rank's positions around `UlyssesAttention` (Jacobs et al. 2023, arXiv
      2309.14509) or `RingAttention` (Liu et al. 2023, arXiv 2310.01889).

    One measured pass, on which everything but time is read:

    - traffic: the communicator's counters over the forward and over the backward (the
      gradient all-reduce of replicated weights, a per-step cost like data parallelism's, is
      counted apart);
    - memory: `bench.kit.memory.ledger_over_pass` holding the rank's weights, counting what
      autograd saves for backward in the forward (`saved_tensors_hooks`; weights excluded)
      and each gradient as it is accumulated, with the peak of their sum over the pass;
    - correctness: the output, the input gradient and every weight gradient (after the
      replicated ones are summed over ranks) against the full single-process block on the same
      x and dy (`wrong`: tensors off by more than `TOLERANCE`, see there).

    Then `repeats` timed passes (after `warmup`, `bench.kit.timing.alternate`), each opened by
    a barrier and taken as the slowest rank's time, with no hooks installed.
    """
    return measure(cfg, cell, Communicator())


def measure(cfg: SequenceParallelConfig, cell: Cell, comm: Communicator) -> dict[str, Any]:
    """One rank of a cell on `comm`'s group of P ranks: traffic, memory, errors against the
    reference, step times."""
    if comm.world_size != cell.key["sp"]:
        raise ValueError(f"sp={cell.key['sp']} but the cell runs on {comm.world_size} ranks")
    block = parallel_block(cfg, cell, comm)
    measured = _measured_pass(cfg, cell, block, comm)
    return {"rank": comm.rank, **measured, "step_times_s": _step_times(cfg, cell, block, comm)}
