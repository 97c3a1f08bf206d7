"""What the sequence-parallel tests run *inside* pool ranks (module-level, so ranks can
unpickle it). Every rank calls these with the same arguments; the first P ranks of the
pool form the sequence-parallel group and the others sit the case out."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from impls.comm import Communicator
from impls.models import GPT, GPTConfig
from impls.sequence_parallel import (
    MegatronSPBlock,
    RingAttention,
    UlyssesAttention,
    all_reduce_replicated_grads,
    gather_sequence,
    heads_to_seq,
    ring_attention,
    seq_to_heads,
    shard_sequence,
)
from impls.sequence_parallel.analytic import layer_traffic
from impls.tensor_parallel import sharded_dims
from impls.tensor_parallel.layers import shard
from tests.rank_support import mismatch, prefix_communicator

BATCH, D_MODEL, N_HEADS = 2, 16, 4
# float32; the distributed result sums the same products in another order (blockwise
# softmax, sequence-chunked weight gradients summed over ranks): a few ulps of O(1) values.
TOL = {"rtol": 1e-5, "atol": 1e-6}


@dataclass(frozen=True)
class Case:
    """One method on P ranks with a sequence of `seq_len` positions."""

    method: str
    sp: int
    seq_len: int
    regather: bool = False
    """Megatron-SP only: keep the column layers' input shards, gather them in backward."""

    def config(self) -> GPTConfig:
        return GPTConfig(vocab_size=8, seq_len=self.seq_len, d_model=D_MODEL, n_heads=N_HEADS)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The full input and the weights of a linear loss, identical on every rank."""
        g = torch.Generator().manual_seed(7)
        shape = (BATCH, self.seq_len, D_MODEL)
        return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def _reference_module(case: Case) -> nn.Module:
    block = GPT(case.config(), seed=0).blocks[0]
    return block if case.method == "megatron_sp" else block.attn


def _parallel_module(case: Case, comm: Communicator) -> nn.Module:
    ref = _reference_module(case)
    if case.method == "megatron_sp":
        return MegatronSPBlock.from_block(ref, comm, regather=case.regather)
    layer = {"ulysses": UlyssesAttention, "ring_attention": RingAttention}[case.method]
    return layer.from_attention(ref, comm)


def _reference(case: Case) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Full single-process layer: output, input gradient, parameter gradients."""
    module = _reference_module(case)
    x, w = case.tensors()
    x.requires_grad_()
    y = module(x)
    (y * w).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in module.named_parameters()}


def run_case(case: Case, comm: Communicator) -> list[str]:
    """Errors of one case against the reference, including its measured traffic."""
    module = _parallel_module(case, comm)
    x, w = case.tensors()
    x_local = shard_sequence(x, comm).requires_grad_()
    with comm.measure() as fwd:
        y_local = module(x_local)
    loss = (y_local * shard_sequence(w, comm)).sum()  # padded rows weigh 0
    with comm.measure() as bwd:
        loss.backward()
    all_reduce_replicated_grads(module.replicated_parameters(), comm)

    want_y, want_dx, want_grads = _reference(case)
    errors = [
        mismatch("output", gather_sequence(y_local, comm, case.seq_len), want_y, **TOL),
        mismatch("input grad", gather_sequence(x_local.grad, comm, case.seq_len), want_dx, **TOL),
    ]
    got_grads = {n: p.grad for n, p in module.named_parameters()}
    if set(got_grads) != set(want_grads):
        errors.append(f"parameters {sorted(got_grads)} != {sorted(want_grads)}")
    else:
        # A tensor-parallel shard is compared with its block of the full gradient.
        dims = sharded_dims(module)
        for name, want in want_grads.items():
            if name in dims:
                want = shard(want, dims[name], comm.rank, comm.world_size)
            errors.append(mismatch(f"grad {name}", got_grads[name], want, **TOL))
    want = layer_traffic(
        case.method,
        sp=case.sp,
        batch=BATCH,
        seq_len=case.seq_len,
        d_model=D_MODEL,
        regather=case.regather,
    )
    got = (fwd.bytes_sent, fwd.bytes_recv, fwd.rounds, bwd.bytes_sent, bwd.bytes_recv, bwd.rounds)
    expected = (
        want.bytes_fwd,
        want.bytes_fwd,
        want.rounds_fwd,
        want.bytes_bwd,
        want.bytes_bwd,
        want.rounds_bwd,
    )
    if got != expected:
        errors.append(f"traffic (sent, recv, rounds) fwd/bwd {got} != analytic {expected}")
    return [f"{case} rank {comm.rank}: {e}" for e in errors if e]


def run_cases(cases: list[Case]) -> list[str]:
    """Every case, grouped by degree so that each rank builds groups in the same order."""
    errors: list[str] = []
    for sp in sorted({c.sp for c in cases}):
        comm = prefix_communicator(sp)
        if comm is None:
            continue
        for case in (c for c in cases if c.sp == sp):
            errors += run_case(case, comm)
    return errors


def layout_errors() -> list[str] | None:
    """Ulysses' re-partition on 4 ranks against slicing the full tensor, and against the
    same exchange done by torch.distributed's own `all_to_all_single`."""
    comm = prefix_communicator(4)
    if comm is None:
        return None
    p, r, chunk, n_heads = 4, comm.rank, 3, 8
    full = torch.randn(2, p * chunk, n_heads, 5, generator=torch.Generator().manual_seed(3))
    mine = full[:, r * chunk : (r + 1) * chunk].contiguous().requires_grad_()
    heads = seq_to_heads(mine, comm)
    group = n_heads // p
    errors = [mismatch("seq_to_heads", heads, full[:, :, r * group : (r + 1) * group])]
    heads.backward(heads.detach() * 2)  # the backward must route each gradient home
    errors.append(mismatch("seq_to_heads backward", mine.grad, mine.detach() * 2))
    errors.append(mismatch("heads_to_seq", heads_to_seq(heads.detach(), comm), mine.detach()))
    # torch's all-to-all on the block layout seq_to_heads sends (block j = head group j).
    send = mine.detach().view(2, chunk, p, group, 5).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=comm.group)
    theirs = recv.permute(1, 0, 2, 3, 4).reshape(heads.shape)
    errors.append(mismatch("vs torch all_to_all_single", heads, theirs, rtol=0, atol=0))
    return [f"rank {r}: {e}" for e in errors if e]


def bad_input_errors() -> list[str] | None:
    """Each misuse on 4 ranks and the message it raised (all refused before any message)."""
    comm = prefix_communicator(4)
    if comm is None:
        return None
    two_heads = GPT(GPTConfig(vocab_size=8, seq_len=8, d_model=16, n_heads=2), seed=0)
    dropout = GPT(GPTConfig(vocab_size=8, seq_len=8, d_model=16, dropout=0.1), seed=0)
    x = torch.zeros(1, 2, 16)
    attempts = {
        "ulysses heads": lambda: UlyssesAttention.from_attention(two_heads.blocks[0].attn, comm),
        "megatron_sp heads": lambda: MegatronSPBlock.from_block(two_heads.blocks[0], comm),
        "ulysses dropout": lambda: UlyssesAttention.from_attention(dropout.blocks[0].attn, comm),
        "ring dropout": lambda: RingAttention.from_attention(dropout.blocks[0].attn, comm),
        "gather seq_len": lambda: gather_sequence(x, comm, seq_len=12),
        "zero seq_len": lambda: shard_sequence(torch.zeros(1, 0, 16), comm),
        "ring shapes": lambda: ring_attention(x[None], x[None], x[None, :, :1], comm),
    }
    messages = []
    for name, attempt in attempts.items():
        try:
            attempt()
            messages.append(f"{name}: accepted")
        except ValueError as err:
            messages.append(f"{name}: {err}")
    return messages
