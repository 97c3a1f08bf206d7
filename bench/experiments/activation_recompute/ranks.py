"""What one rank does in an `activation_recompute` cell.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bench.experiments.activation_recompute.config import ActivationRecomputeConfig
from bench.experiments.base import Cell
from bench.kit.memory import ledger_over_pass
from bench.kit.timing import alternate
from impls.collectives import all_reduce
from impls.comm import Communicator
from impls.memory.saved import SavedStorages, storage_key
from impls.models import GPT
from impls.sequence_parallel import MegatronSPBlock, all_reduce_replicated_grads
from impls.tensor_parallel import parallelize_gpt

__all__ = ["DTYPE", "build_layer", "run"]

DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_layer(
    cfg: ActivationRecomputeConfig, comm: Communicator, recompute: str, sp: bool, seq_len: int
):
    """This rank's layer (see `run`), in the cell's dtype."""
    model = GPT(cfg.gpt_config(seq_len, recompute), seed=cfg.seed)
    if sp:
        layer = MegatronSPBlock.from_block(model.blocks[0], comm, regather=True)
    elif comm.world_size > 1:
        layer = parallelize_gpt(model, comm).blocks[0]
    else:
        layer = model.blocks[0]
    return layer.to(DTYPE[cfg.dtype])


def _inputs(cfg: ActivationRecomputeConfig, comm: Communicator, sp: bool, seq_len: int):
    """This rank's input (a sequence shard under SP) and output gradient, seeded."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    h = cfg.model["d_model"]
    x = torch.randn(cfg.micro_batch, seq_len, h, generator=g)
    dy = torch.randn(cfg.micro_batch, seq_len, h, generator=g)
    if sp:
        chunk = seq_len // comm.world_size
        x, dy = (t[:, comm.rank * chunk : (comm.rank + 1) * chunk] for t in (x, dy))
    dtype = DTYPE[cfg.dtype]
    return x.to(dtype).clone().requires_grad_(), dy.to(dtype).contiguous()


def _pass(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor, sp: bool, comm, seed: int):
    """One forward + backward with the saved bytes counted; (saved, y, dx, grads)."""
    layer.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(seed + comm.rank)  # the dropout draws, identical for every mode
    ys = []

    def forward() -> torch.Tensor:
        ys.append(layer(x))
        return ys[0]

    _, saved = ledger_over_pass(layer.parameters(), forward, lambda y: y.backward(dy))
    if sp:
        all_reduce_replicated_grads(layer.replicated_parameters(), comm)
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    return saved, ys[0].detach(), x.grad.clone(), grads


def _saved_forward(layer: nn.Module, x: torch.Tensor) -> int:
    """Bytes one forward saves for backward (the graph dropped afterwards)."""
    count = SavedStorages()
    with count.counting({storage_key(p) for p in layer.parameters()}):
        y = layer(x)
        saved = count.nbytes
    del y
    return saved


def longest_in_budget(
    cfg: ActivationRecomputeConfig, comm: Communicator, recompute: str, sp: bool
) -> int:
    """The longest s (a multiple of t, at most `budget_max_seq_len`) whose one-layer
    forward saves ≤ `budget_bytes` on the busiest rank, found by running: double, then
    bisect. 0 if even s = t does not fit."""
    t = comm.world_size

    def fits(s: int) -> bool:
        layer = build_layer(cfg, comm, recompute, sp, s)
        x, _ = _inputs(cfg, comm, sp, s)
        saved = torch.tensor([float(_saved_forward(layer, x))])
        if t > 1:
            all_reduce(saved, comm, op="max")
        return saved.item() <= cfg.budget_bytes

    cap = cfg.budget_max_seq_len // t  # in units of t, like lo and hi
    if not fits(t):
        return 0
    lo, hi = 1, 2  # lo fits, hi does not (once the doubling stops)
    while hi <= cap and fits(hi * t):
        lo, hi = hi, 2 * hi
    if hi > cap:
        if lo == cap or fits(cap * t):
            return cap * t  # the cap: the report shows it as a lower bound
        hi = cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * t) else (lo, mid)
    return lo * t


def run(cfg: ActivationRecomputeConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell on the default group: saved bytes, errors, times, budget.

    A cell is (recompute, t, sp, s). Each rank builds one transformer layer from the same
    seeded `Block`: under t = 1 the block itself, under TP the block of a one-layer
    `parallelize_gpt` GPT (Megatron's heads / hidden split), under TP + SP a
    `MegatronSPBlock(regather=True)` (the column layers keep their input shard, as Megatron-LM
    does), each cast to the cell's dtype. Then:

    - saved bytes: one forward under `bench.kit.memory.ledger_over_pass`, which counts what
      autograd saves for backward (each storage once, parameters excluded) — the layer's
      input stays outside the count only where the layer does not save it itself;
    - correctness: output, input gradient and every parameter gradient against the same
      layer without recomputation, dropout on and the same RNG state (recomputation must
      redraw the same masks): `wrong` counts the tensors that differ at all;
    - time: `repeats` barrier-opened forward + backward passes of this mode and of "none"
      taking turns (`bench.kit.timing.alternate`), the slowest rank's fastest pass each (the
      least disturbed by other work on shared cores);
    - the longest sequence within `budget_bytes`: forward passes at growing s (multiples of
      t, at most `budget_max_seq_len`, which bounds the s² scores a probe allocates) with the
      count on, doubling then bisecting, on the cell's largest s only.
    """
    comm = Communicator()
    mode, sp, seq_len = cell.key["recompute"], cell.key["sp"], cell.key["seq_len"]
    layer = build_layer(cfg, comm, mode, sp, seq_len)
    twin = build_layer(cfg, comm, "none", sp, seq_len)
    x, dy = _inputs(cfg, comm, sp, seq_len)
    saved, y, dx, grads = _pass(layer, x, dy, sp, comm, cfg.seed)
    _, y_ref, dx_ref, grads_ref = _pass(twin, x, dy, sp, comm, cfg.seed)
    pairs = [(y, y_ref), (dx, dx_ref), *((grads[n], grads_ref[n]) for n in grads)]
    wrong = sum(not torch.equal(got, want) for got, want in pairs)

    def step(model: nn.Module) -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x).backward(dy)

    timed = alternate(
        {"mode": lambda: step(layer), "none": lambda: step(twin)},
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        group=comm.group,
    )
    longest = None
    if seq_len == max(cfg.seq_lens):
        longest = longest_in_budget(cfg, comm, mode, sp)
    return {
        "rank": comm.rank,
        "saved_bytes": saved,
        "wrong": wrong,
        "step_time_s": min(timed["mode"].seconds),
        "none_step_time_s": min(timed["none"].seconds),
        "max_seq_len_in_budget": longest,
    }
