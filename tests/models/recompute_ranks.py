"""What the recomputation tests run *inside* pool ranks (module-level, so ranks can
unpickle it): Megatron TP, Megatron-SP and ZeRO with each recompute mode against the
single-process reference, and the saved bytes of one layer under TP and TP + SP.
Every rank calls these with the same arguments; the first k ranks form the group."""

from __future__ import annotations

import torch

from impls.memory.saved import SavedStorages, storage_key
from impls.models import GPT, Block, GPTConfig
from impls.sequence_parallel import (
    MegatronSPBlock,
    UlyssesAttention,
    all_reduce_replicated_grads,
    shard_sequence,
)
from impls.tensor_parallel import parallelize_gpt, sharded_dims, tp_loss
from impls.tensor_parallel.layers import shard
from impls.zero import ZeroDataParallel
from tests.rank_support import mismatch, prefix_communicator

MODES = ("none", "selective", "full")
ATTENTION = ("fused", "materialized")
TOL = {"rtol": 1e-5, "atol": 1e-6}
# Korthikanti's conditions at a size where the LayerNorm statistics the paper leaves out
# (4·b·s elements) stay under 1% of 34·s·b·h: b, s, h, a.
PAPER_SHAPE = (2, 32, 64, 4)


def tiny(recompute: str, attention: str, dropout: float = 0.0, **kw) -> GPTConfig:
    return GPTConfig(
        vocab_size=16,
        seq_len=8,
        d_model=16,
        n_heads=4,
        n_layers=2,
        dropout=dropout,
        recompute=recompute,
        attention=attention,
        **kw,
    )


def tokens(rows: int = 2, seq_len: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.randint(0, 16, (rows, seq_len + 1), generator=torch.Generator().manual_seed(3))
    return t[:, :-1], t[:, 1:]


def reference_grads(attention: str) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the GPT without recomputation, on one process."""
    model = GPT(tiny("none", attention), seed=0)
    idx, tgt = tokens()
    loss = GPT.loss(model(idx), tgt)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def _tp_errors(comm, mode: str, attention: str) -> list[str]:
    """TP GPT with `mode` against the full reference: loss and every gradient shard."""
    want_loss, want = reference_grads(attention)
    model = parallelize_gpt(GPT(tiny(mode, attention), seed=0), comm)
    idx, tgt = tokens()
    loss = tp_loss(model, idx, tgt, comm)
    loss.backward()
    dims, errors = sharded_dims(model), []
    for name, p in model.named_parameters():
        full = want[name]
        ref = shard(full, dims[name], comm.rank, comm.world_size) if name in dims else full
        errors.append(mismatch(f"tp {mode} {attention} {name}", p.grad, ref, **TOL))
    errors.append(
        mismatch(f"tp {mode} loss", torch.tensor(loss.item()), torch.tensor(want_loss), **TOL)
    )
    return [e for e in errors if e]


def _sp_run(comm, mode: str, attention: str, dropout: float, regather: bool):
    """A Megatron-SP block's output shard, input gradient and parameter gradients."""
    block = Block(tiny(mode, attention, dropout))
    torch.manual_seed(0)
    for p in block.parameters():  # GPT init is per model; a random block suffices here
        p.data.normal_(0, 0.2)
    sp = MegatronSPBlock.from_block(block, comm, regather=regather)
    g = torch.Generator().manual_seed(5)
    x_full = torch.randn(2, 8, 16, generator=g)
    dy_full = torch.randn(2, 8, 16, generator=g)
    x = shard_sequence(x_full, comm).requires_grad_()
    torch.manual_seed(11 + comm.rank)  # dropout draws, the same for every mode
    y = sp(x)
    (y * shard_sequence(dy_full, comm)).sum().backward()
    all_reduce_replicated_grads(sp.replicated_parameters(), comm)
    grads = {n: p.grad for n, p in sp.named_parameters()}
    return block, sp, x_full, dy_full, y.detach(), x.grad, grads


def _sp_errors(comm, mode: str, attention: str, regather: bool) -> list[str]:
    """Megatron-SP with `mode`: against the full block (no dropout), and against its own
    run without recomputation with dropout on (recomputation must redraw the same masks)."""
    errors = []
    block, sp, x_full, dy_full, y, dx, grads = _sp_run(comm, mode, attention, 0.0, regather)
    block.recompute = block.attn.recompute = "none"
    x_ref = x_full.clone().requires_grad_()
    y_ref = block(x_ref)
    (y_ref * dy_full).sum().backward()
    tag = f"sp {mode} {attention} regather={regather}"
    errors.append(mismatch(f"{tag} y", y, shard_sequence(y_ref.detach(), comm), **TOL))
    errors.append(mismatch(f"{tag} dx", dx, shard_sequence(x_ref.grad, comm), **TOL))
    dims = sharded_dims(sp)
    for name, p in block.named_parameters():
        ref = shard(p.grad, dims[name], comm.rank, comm.world_size) if name in dims else p.grad
        errors.append(mismatch(f"{tag} {name}", grads[name], ref, **TOL))
    base = _sp_run(comm, "none", attention, 0.1, regather)
    got = _sp_run(comm, mode, attention, 0.1, regather)
    errors.append(mismatch(f"{tag} dropout y", got[4], base[4], rtol=0, atol=0))
    for name in base[6]:
        errors.append(mismatch(f"{tag} dropout {name}", got[6][name], base[6][name], **TOL))
    return [e for e in errors if e]


def _ulysses_errors(comm, mode: str, attention: str) -> list[str]:
    """Ulysses attention with `mode` against the full attention without recomputation."""
    attn = GPT(tiny(mode, attention), seed=0).blocks[0].attn
    ref = GPT(tiny("none", "fused"), seed=0).blocks[0].attn
    layer = UlyssesAttention.from_attention(attn, comm)
    g = torch.Generator().manual_seed(9)
    x_full, dy_full = torch.randn(2, 8, 16, generator=g), torch.randn(2, 8, 16, generator=g)
    x = shard_sequence(x_full, comm).requires_grad_()
    (layer(x) * shard_sequence(dy_full, comm)).sum().backward()
    all_reduce_replicated_grads(layer.replicated_parameters(), comm)
    x_ref = x_full.clone().requires_grad_()
    (ref(x_ref) * dy_full).sum().backward()
    tag = f"ulysses {mode} {attention}"
    errors = [mismatch(f"{tag} dx", x.grad, shard_sequence(x_ref.grad, comm), **TOL)]
    want = dict(ref.named_parameters())
    for name, p in layer.named_parameters():
        errors.append(mismatch(f"{tag} {name}", p.grad, want[name].grad, **TOL))
    return [e for e in errors if e]


def _zero_errors(comm, mode: str, stage: int) -> list[str]:
    """ZeRO-`stage` data parallelism over a GPT with `mode`: two Adam steps equal one
    process training on the whole batch without recomputation."""
    idx, tgt = tokens(rows=2 * comm.world_size)
    # No biases: a key bias's exact gradient is zero, and Adam turns its rounding noise
    # into ±lr updates (see tests/zero/zero_ranks.py)
    ref = GPT(tiny("none", "materialized", bias=False), seed=0)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    model = GPT(tiny(mode, "materialized", bias=False), seed=0)
    zdp = ZeroDataParallel(model, comm, stage=stage, lr=1e-2)
    lo, hi = 2 * comm.rank, 2 * comm.rank + 2
    for _ in range(2):
        opt.zero_grad()
        GPT.loss(ref(idx), tgt).backward()
        opt.step()
        zdp.backward(GPT.loss(zdp(idx[lo:hi]), tgt[lo:hi]))
        zdp.step()
        zdp.zero_grad()
    full = zdp.full_parameters()
    return [
        e
        for name, p in ref.named_parameters()
        if (e := mismatch(f"zero{stage} {mode} {name}", full[name], p.detach(), **TOL))
    ]


def equality_errors(world: int) -> list[str] | None:
    """Every mode under TP, Megatron-SP (both saving policies), Ulysses and ZeRO-1 / 3."""
    comm = prefix_communicator(world)
    if comm is None:
        return None
    errors = []
    for mode in MODES:
        for attention in ATTENTION:
            errors += _tp_errors(comm, mode, attention)
            errors += _sp_errors(comm, mode, attention, regather=attention == "materialized")
            errors += _ulysses_errors(comm, mode, attention)
        for stage in (1, 3):
            errors += _zero_errors(comm, mode, stage)
    return errors


def saved_bytes(world: int, sp: bool, recompute: str) -> int | None:
    """Bytes one bf16 layer saves on this rank (dropout 0.1, materialized attention):
    a TP block (`parallelize_gpt`'s attention and MLP), or a Megatron-SP one."""
    comm = prefix_communicator(world)
    if comm is None:
        return None
    b, s, h, a = PAPER_SHAPE
    cfg = GPTConfig(
        seq_len=s,
        d_model=h,
        n_heads=a,
        n_layers=1,
        dropout=0.1,
        recompute=recompute,
        attention="materialized",
    )
    model = GPT(cfg, seed=0)
    if sp:
        layer = MegatronSPBlock.from_block(model.blocks[0], comm, regather=True)
        positions = s // world
    else:
        layer = parallelize_gpt(model, comm).blocks[0]
        positions = s
    layer = layer.to(torch.bfloat16)
    x = torch.randn(b, positions, h, dtype=torch.bfloat16, requires_grad=True) * 1.0
    count = SavedStorages()
    with count.counting({storage_key(p) for p in layer.parameters()}):
        y = layer(x)
    saved = count.nbytes
    y.float().sum().backward()
    return saved
