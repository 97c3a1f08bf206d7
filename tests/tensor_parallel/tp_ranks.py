"""What the tensor-parallel tests run *inside* pool ranks (module-level, so ranks unpickle it).

Every rank of the pool calls these with the same arguments. For each degree t the first t
ranks form the TP group (a prefix sub-group); each of them also computes the single-device
reference itself (the models are tiny) and returns a list of error strings: empty means
every output, gradient and counter matched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from impls.comm import Communicator
from impls.memory import MemoryLedger
from impls.models import GPT, CausalSelfAttention, FeedForward, GPTConfig
from impls.tensor_parallel import (
    ColumnParallelLinear,
    ParallelFeedForward,
    ParallelSelfAttention,
    RowParallelLinear,
    VocabParallelEmbedding,
    all_gather_seq,
    analytic_comm,
    analytic_gpt_comm,
    copy_to_tp,
    gather_from_tp,
    parallelize_gpt,
    reduce_from_tp,
    reduce_scatter_seq,
    scatter_to_tp,
    sharded_dims,
    tp_loss,
    vocab_parallel_cross_entropy,
)
from tests.rank_support import mismatch, prefix_communicator

DEGREES = (1, 2, 4)
B, S, H = 2, 4, 16  # batch, sequence, width of the per-layer cases
# float32; the TP layers sum the same products in another order (split reductions, ring
# all-reduce), which moves O(1) results by a few ulps: 1e-5 is ~100 ulps of headroom.
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@torch.no_grad()
def _randomize(module: nn.Module, seed: int) -> nn.Module:
    """Nonzero weights *and biases* (GPT init zeroes biases, which would hide a bias added
    t times), identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def _block(full: torch.Tensor, dim: int, comm: Communicator) -> torch.Tensor:
    return full.chunk(comm.world_size, dim)[comm.rank]


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def _check_traffic(name, measured, want_bytes: int, want_rounds: int, errors) -> None:
    got = (measured.bytes_sent, measured.bytes_recv, measured.rounds)
    if got != (want_bytes, want_bytes, want_rounds):
        errors.append(f"{name}: traffic (sent, recv, rounds) {got} != {want_bytes, want_rounds}")


def _add(errors: list[str], name: str, got, want) -> None:
    err = mismatch(name, got, want, **TOL)
    if err:
        errors.append(err)


# --- the operators -----------------------------------------------------------------------


def _ops_errors(comm: Communicator) -> list[str]:
    t, r, errors = comm.world_size, comm.rank, []
    xs = [_randn(B, 4 * t, 8, seed=10 + i) for i in range(t)]  # rank i's local tensor
    gs = [_randn(B, 4 * t, 8, seed=20 + i) for i in range(t)]  # rank i's upstream gradient
    full_x, full_g = torch.cat(xs, 1), torch.cat(gs, 1)  # (B, 4t·t, 8) for gather/scatter

    x = _leaf(xs[r])
    copy_to_tp(x, comm).backward(gs[r])
    _add(errors, "f forward is the identity", copy_to_tp(xs[r], comm), xs[r])
    _add(errors, "f backward sums gradients", x.grad, sum(gs))

    x = _leaf(xs[r])
    y = reduce_from_tp(x, comm)
    y.backward(gs[r])
    want = xs[r].clone()
    dist.all_reduce(want, group=comm.group)  # torch's own all-reduce as the reference
    _add(errors, "g forward equals torch all_reduce", y, want)
    _add(errors, "g backward is the identity", x.grad, gs[r])

    for dim in (0, 1, -1):
        x = _leaf(xs[r])
        y = gather_from_tp(x, comm, dim=dim)
        y.backward(torch.cat(gs, dim))
        _add(errors, f"gather dim={dim}", y, torch.cat(xs, dim))
        _add(errors, f"gather backward dim={dim}", x.grad, gs[r])

        x = _leaf(torch.cat(xs, dim))
        y = scatter_to_tp(x, comm, dim=dim)
        y.backward(gs[r])
        _add(errors, f"scatter dim={dim}", y, xs[r])
        _add(errors, f"scatter backward dim={dim}", x.grad, torch.cat(gs, dim))

    x = _leaf(xs[r])
    with comm.measure() as fwd:
        y = all_gather_seq(x, comm, dim=1)
    want = torch.empty(t * B, 4 * t, 8)
    dist.all_gather_into_tensor(want, xs[r], group=comm.group)  # torch's, along dim 0
    _add(errors, "all_gather_seq equals torch", y, torch.cat(want.chunk(t, 0), 1))
    with comm.measure() as bwd:
        y.backward(_randn(*full_x.shape, seed=30 + r))
    summed = sum(_randn(*full_x.shape, seed=30 + i) for i in range(t))
    _add(errors, "all_gather_seq backward reduce-scatters", x.grad, _block(summed, 1, comm))
    numel = full_x.numel()  # the gathered tensor: (t−1)/t of it crosses each link
    _check_traffic("all_gather_seq fwd", fwd, (t - 1) * numel // t * 4, t - 1, errors)
    _check_traffic("all_gather_seq bwd", bwd, (t - 1) * numel // t * 4, t - 1, errors)

    x = _leaf(_randn(*full_x.shape, seed=40 + r))
    y = reduce_scatter_seq(x, comm, dim=1)
    y.backward(gs[r])
    want = torch.empty(B, 4 * t, 8)
    blocks = x.detach().chunk(t, 1)
    dist.reduce_scatter_tensor(want, torch.cat(blocks, 0), group=comm.group)
    _add(errors, "reduce_scatter_seq equals torch", y, want)
    _add(errors, "reduce_scatter_seq backward all-gathers", x.grad, full_g)
    return errors


# --- layers ------------------------------------------------------------------------------


def _compare_module(
    name: str,
    full: nn.Module,
    parallel: nn.Module,
    x_full: torch.Tensor,
    comm: Communicator,
    *,
    x_dim: int | None,
    out_dim: int | None,
    errors: list[str],
    comm_count: int | None,
) -> None:
    """Run both on `x_full` (or this rank's block of it along `x_dim`), backward the same
    replicated objective, compare outputs (or this rank's block along `out_dim`), the input
    gradient and every parameter gradient; `comm_count` all-reduces of b·s·h each way."""
    xf = _leaf(x_full)
    yf = full(xf)
    upstream = _randn(*yf.shape, seed=99)
    (yf * upstream).sum().backward()

    xp = _leaf(x_full if x_dim is None else _block(x_full, x_dim, comm))
    with comm.measure() as fwd:
        yp = parallel(xp)
    # Each rank's objective covers its output block; their sum is the full objective.
    up = upstream if out_dim is None else _block(upstream, out_dim, comm)
    with comm.measure() as bwd:
        (yp * up).sum().backward()

    _add(errors, f"{name} output", yp, yf if out_dim is None else _block(yf, out_dim, comm))
    want_x = xf.grad if x_dim is None else _block(xf.grad, x_dim, comm)
    _add(errors, f"{name} input grad", xp.grad, want_x)
    _compare_grads(name, full, parallel, comm, errors)
    if comm_count is not None:
        cost = analytic_comm(B, S, H, comm.world_size, layer=name)
        _check_traffic(f"{name} fwd", fwd, cost.bytes_sent_fwd, cost.rounds_fwd, errors)
        _check_traffic(f"{name} bwd", bwd, cost.bytes_sent_bwd, cost.rounds_bwd, errors)


def _compare_grads(name, full: nn.Module, parallel: nn.Module, comm, errors) -> None:
    dims = sharded_dims(parallel)
    want = dict(full.named_parameters())
    got = dict(parallel.named_parameters())
    if set(got) != set(want):
        errors.append(f"{name}: parameter names {sorted(got)} != {sorted(want)}")
        return
    for pname, param in got.items():
        ref = want[pname].grad
        ref = ref if pname not in dims else _block(ref, dims[pname], comm)
        _add(errors, f"{name}.{pname} grad", param.grad, ref)


def _layer_errors(comm: Communicator) -> list[str]:
    errors: list[str] = []
    x = _randn(B, S, H, seed=1)
    kw = {"errors": errors, "comm_count": None}

    lin = _randomize(nn.Linear(H, 4 * H), seed=2)
    for gather in (False, True):
        col = ColumnParallelLinear.from_linear(lin, comm, gather_output=gather)
        lin.zero_grad()
        out_dim = None if gather else -1
        _compare_module(
            f"column gather={gather}", lin, col, x, comm, x_dim=None, out_dim=out_dim, **kw
        )

    lin = _randomize(nn.Linear(4 * H, H), seed=3)
    x_wide = _randn(B, S, 4 * H, seed=4)
    for parallel_in in (True, False):
        row = RowParallelLinear.from_linear(lin, comm, input_is_parallel=parallel_in)
        lin.zero_grad()
        x_dim = -1 if parallel_in else None
        _compare_module(
            f"row input_is_parallel={parallel_in}",
            lin,
            row,
            x_wide,
            comm,
            x_dim=x_dim,
            out_dim=None,
            **kw,
        )

    cfg = GPTConfig(d_model=H, n_heads=4, d_ff=4 * H, vocab_size=32, seq_len=S)
    ff = _randomize(FeedForward(cfg), seed=5)
    _compare_module(
        "mlp",
        ff,
        ParallelFeedForward.from_module(ff, comm),
        x,
        comm,
        x_dim=None,
        out_dim=None,
        errors=errors,
        comm_count=1,
    )
    attn = _randomize(CausalSelfAttention(cfg), seed=6)
    _compare_module(
        "attention",
        attn,
        ParallelSelfAttention.from_module(attn, comm),
        x,
        comm,
        x_dim=None,
        out_dim=None,
        errors=errors,
        comm_count=1,
    )
    return errors


def _embedding_errors(comm: Communicator) -> list[str]:
    errors: list[str] = []
    emb = _randomize(nn.Embedding(32, H), seed=7)
    par = VocabParallelEmbedding.from_module(emb, comm)
    idx = torch.randint(0, 32, (B, S), generator=torch.Generator().manual_seed(8))
    upstream = _randn(B, S, H, seed=9)
    (emb(idx) * upstream).sum().backward()
    with comm.measure() as fwd:
        y = par(idx)
    (y * upstream).sum().backward()
    _add(errors, "embedding output", y, emb(idx))
    _add(errors, "embedding grad", par.weight.grad, _block(emb.weight.grad, 0, comm))
    cost = analytic_comm(B, S, H, comm.world_size, layer="mlp")  # one all-reduce of b·s·h
    _check_traffic("embedding fwd", fwd, cost.bytes_sent_fwd, cost.rounds_fwd, errors)

    # Cross-entropy, including logits large enough that exp() overflows without the max.
    for scale in (1.0, 200.0):
        logits = _leaf(_randn(B, S, 32, seed=11, scale=scale))
        targets = torch.randint(0, 32, (B, S), generator=torch.Generator().manual_seed(12))
        want = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        want.backward()
        shard = _leaf(_block(logits.detach(), -1, comm))
        got = vocab_parallel_cross_entropy(shard, targets, comm)
        got.backward()
        _add(errors, f"cross-entropy x{scale}", got, want)
        _add(errors, f"cross-entropy grad x{scale}", shard.grad, _block(logits.grad, -1, comm))
    return errors


def _gpt_errors(comm: Communicator, tie: bool) -> list[str]:
    errors: list[str] = []
    cfg = GPTConfig(vocab_size=32, seq_len=8, d_model=H, n_heads=4, n_layers=2, tie_embeddings=tie)
    full = _randomize(GPT(cfg, seed=0), seed=13)
    tp_model = parallelize_gpt(_randomize(GPT(cfg, seed=0), seed=13), comm)
    tokens = torch.randint(0, 32, (4, 9), generator=torch.Generator().manual_seed(14))
    idx, targets = tokens[:, :-1], tokens[:, 1:]

    logits = full(idx)
    want = GPT.loss(logits, targets)
    want.backward()
    with comm.measure() as fwd:
        got = tp_loss(tp_model, idx, targets, comm)
    with comm.measure() as bwd:
        got.backward()
    name = f"gpt tie={tie}"
    _add(errors, f"{name} logits", tp_model(idx), _block(logits, -1, comm))
    _add(errors, f"{name} loss", got, want)
    _compare_grads(name, full, tp_model, comm, errors)
    cost = analytic_gpt_comm(cfg, 4, 8, comm.world_size)
    _check_traffic(f"{name} fwd", fwd, cost.bytes_sent_fwd, cost.rounds_fwd, errors)
    _check_traffic(f"{name} bwd", bwd, cost.bytes_sent_bwd, cost.rounds_bwd, errors)
    return errors


CHECKS: dict[str, Callable[[Communicator], list[str]]] = {
    "ops": _ops_errors,
    "layers": _layer_errors,
    "embedding": _embedding_errors,
    "gpt": lambda comm: _gpt_errors(comm, tie=False),
    "gpt_tied": lambda comm: _gpt_errors(comm, tie=True),
}


def run_checks(names: list[str], degrees: tuple[int, ...] = DEGREES) -> dict | None:
    """{(check, t): errors} on the ranks of each TP group; None on ranks in no group."""
    results = {}
    for t in degrees:
        comm = prefix_communicator(t)
        if comm is None:
            continue
        for name in names:
            results[(name, t)] = CHECKS[name](comm)
    return results or None


def dtensor_mlp(degrees: tuple[int, ...] = (2, 4)) -> dict | None:
    """{t: errors} comparing `ParallelFeedForward` with torch DTensor's `parallelize_module`
    (fc1 ColwiseParallel, fc2 RowwiseParallel) on the same weights: outputs, input gradient
    and the local shards of every parameter gradient.

    `init_device_mesh` wants the default group to be exactly the mesh; `DeviceMesh.from_group`
    wraps the prefix sub-group instead, so the comparison runs inside the shared pool.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    results = {}
    for t in degrees:
        comm = prefix_communicator(t)
        if comm is None:
            continue
        errors: list[str] = []
        cfg = GPTConfig(d_model=H, n_heads=4, d_ff=4 * H, vocab_size=32, seq_len=S)
        ours = ParallelFeedForward.from_module(_randomize(FeedForward(cfg), seed=5), comm)
        mesh = DeviceMesh.from_group(comm.group, "cpu")
        theirs = parallelize_module(
            _randomize(FeedForward(cfg), seed=5),
            mesh,
            {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()},
        )
        x, upstream = _randn(B, S, H, seed=1), _randn(B, S, H, seed=99)
        xo, xt = _leaf(x), _leaf(x)
        # The ledger counts a DTensor's local shard, so both hold the same saved bytes.
        saved = {}
        for name, module, inp in (("ours", ours, xo), ("theirs", theirs, xt)):
            ledger = MemoryLedger()
            with ledger.saved_activations(exclude=list(module.parameters())):
                saved[name] = (module(inp), ledger.current["activations"])
        (yo, ours_saved), (yt, theirs_saved) = saved["ours"], saved["theirs"]
        if not 0 < ours_saved == theirs_saved:
            errors.append(f"dtensor t={t} saved activations {ours_saved} vs {theirs_saved} B")
        (yo * upstream).sum().backward()
        (yt * upstream).sum().backward()
        _add(errors, f"dtensor t={t} output", yo, yt)
        _add(errors, f"dtensor t={t} input grad", xo.grad, xt.grad)
        for (name, po), pt in zip(ours.named_parameters(), theirs.parameters(), strict=True):
            grad = pt.grad.to_local() if isinstance(pt.grad, DTensor) else pt.grad
            _add(errors, f"dtensor t={t} {name} grad", po.grad, grad)
        results[t] = errors
    return results or None
