"""What one rank does in a `tensor_parallel` cell: train, count one layer's traffic, time.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.experiments.base import Cell
from bench.experiments.tensor_parallel.config import TensorParallelConfig
from bench.kit.memory import ledger_over_pass
from bench.kit.reference import compare, train_reference
from bench.kit.timing import Timed, alternate
from bench.kit.workloads import gpt, lm_loss, seeded_batch
from impls.comm import Communicator
from impls.models import GPT, GPTConfig
from impls.tensor_parallel import (
    TPComm,
    parallelize_gpt,
    sharded_dims,
    vocab_parallel_cross_entropy,
)

__all__ = ["TWIN", "Sides", "measure", "paired_block_times", "run"]

TWIN = {"distbench": "torch_dtensor", "torch_dtensor": "distbench"}
# torch's tensor-parallel plan for one block: Megatron's layout in DTensor's vocabulary.
BLOCK_PLAN = {
    "attn.q_proj": "colwise",
    "attn.k_proj": "colwise",
    "attn.v_proj": "colwise",
    "attn.o_proj": "rowwise",
    "mlp.fc1": "colwise",
    "mlp.fc2": "rowwise",
}


@dataclass(frozen=True)
class Sides:
    """What a cell derives once (its `carry`): the method, the twin timed beside it (None:
    unpaired) and Megatron's count for its t (None at t = 1, where nothing moves)."""

    method: str
    twin: str | None
    predicted: TPComm | None


def _dtensor_plan() -> dict[str, nn.Module]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return {name: styles[style]() for name, style in BLOCK_PLAN.items()}


def _build(method: str, cfg: TensorParallelConfig, comm: Communicator) -> GPT:
    """The full seeded GPT, split over this cell's ranks by `method`."""
    model = gpt(cfg.model, cfg.seed)
    if method == "distbench":
        return parallelize_gpt(model, comm)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = DeviceMesh.from_group(comm.group, "cpu")
    for block in model.blocks:
        parallelize_module(block, mesh, _dtensor_plan())
    return model


def _whole(params: dict[str, torch.Tensor], dims: dict[str, int], comm: Communicator) -> dict:
    """Every parameter whole: each shard along `dims` gathered (with torch's all_gather:
    the harness's bookkeeping, outside anything measured)."""
    out = {}
    for name, p in params.items():
        if name in dims and comm.world_size > 1:
            parts = [torch.empty_like(p) for _ in range(comm.world_size)]
            dist.all_gather(parts, p.contiguous(), group=comm.group)
            p = torch.cat(parts, dim=dims[name])
        out[name] = p
    return out


def _train_and_compare(
    cfg: TensorParallelConfig, method: str, comm: Communicator
) -> dict[str, Any]:
    """`steps` SGD steps of the split model, then (rank 0) the check against one process."""
    model = _build(method, cfg, comm)
    idx, targets = seeded_batch(model.cfg, cfg.batch_size, cfg.seed)
    loss = lm_loss
    if method == "distbench":  # the LM head is vocab-parallel: Megatron's parallel loss
        loss = partial(vocab_parallel_cross_entropy, comm=comm)
    # The kit's training loop on the split model: tensor parallelism trains on the whole
    # batch, as the single-process reference does.
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    trained = train_reference(model, idx, targets, optimizer, cfg.steps, loss=loss)
    # A DTensor's parameters come back whole from the kit; distbench's are shards.
    dims = sharded_dims(model) if method == "distbench" else {}
    params = _whole(trained.end, dims, comm)
    out = {"losses": trained.losses, "loss_diff": math.nan, "update_error": math.nan}
    out["params"] = sum(p.numel() for p in params.values())
    if comm.rank == 0:
        single = gpt(cfg.model, cfg.seed)
        reference = train_reference(
            single, idx, targets, torch.optim.SGD(single.parameters(), lr=cfg.lr), cfg.steps
        )
        pairs = zip(trained.losses, reference.losses, strict=True)
        out["loss_diff"] = max(abs(a - b) for a, b in pairs)
        out["update_error"] = compare(params, reference)["update_error"]
    return out


def _activation(cfg: TensorParallelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A replicated (b, s, h) block input and an upstream gradient, seeded."""
    model = GPTConfig(**cfg.model)
    generator = torch.Generator().manual_seed(cfg.seed + 7)
    shape = (cfg.batch_size, model.seq_len, model.d_model)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _distbench_traffic(block: nn.Module, comm: Communicator, x, upstream) -> dict[str, Any]:
    out: dict[str, Any] = {}
    calls = comm.calls.copy()
    with comm.measure() as fwd:
        y = block(x)
    fwd_calls, calls = comm.calls - calls, comm.calls.copy()
    with comm.measure() as bwd:
        y.backward(upstream)
    bwd_calls = comm.calls - calls
    for name, traffic, done in (("fwd", fwd, fwd_calls), ("bwd", bwd, bwd_calls)):
        out[f"bytes_sent_{name}"] = traffic.bytes_sent
        out[f"rounds_{name}"] = traffic.rounds
        out[f"messages_{name}"] = traffic.messages_sent
        out[f"collectives_{name}"] = dict(done)
    return out


def _dtensor_traffic(block: nn.Module, x, upstream) -> dict[str, Any]:
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as fwd_mode:
        y = block(x)
    with CommDebugMode() as bwd_mode:
        y.backward(upstream)
    out: dict[str, Any] = {
        f"{k}_{d}": math.nan for k in ("bytes_sent", "rounds", "messages") for d in ("fwd", "bwd")
    }
    for name, mode in (("fwd", fwd_mode), ("bwd", bwd_mode)):
        # "c10d_functional.all_reduce" -> "all_reduce": one vocabulary for both methods.
        counts: Counter[str] = Counter()
        for op, count in mode.get_comm_counts().items():
            counts[str(op).rsplit(".", 1)[-1].removesuffix("_")] += count
        out[f"collectives_{name}"] = dict(counts)
    return out


def _layer_traffic(method: str, block: nn.Module, comm: Communicator, x, upstream) -> dict:
    """One block's forward and backward: what each direction sent and how many collectives."""
    x = x.clone().requires_grad_(True)
    if method == "distbench":
        return _distbench_traffic(block, comm, x, upstream)
    return _dtensor_traffic(block, x, upstream)


def _forward(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    h = x
    for block in blocks:
        h = block(h)
    return h


def _blocks_step(blocks: nn.ModuleList, x: torch.Tensor, upstream: torch.Tensor) -> None:
    """The timed step: forward and backward of every block on a replicated activation."""
    for p in blocks.parameters():
        p.grad = None
    x.grad = None
    _forward(blocks, x).backward(upstream)


def _timed(
    cfg: TensorParallelConfig, blocks: dict[str, nn.ModuleList], x, upstream, comm
) -> dict[str, Timed]:
    """Each side's blocks step in alternating rounds (`bench.kit.timing.alternate`)."""
    steps = {name: partial(_blocks_step, b, x, upstream) for name, b in blocks.items()}
    return alternate(steps, warmup=cfg.warmup, repeats=cfg.repeats, group=comm.group)


def paired_block_times(cfg: TensorParallelConfig, cell: Cell) -> dict[str, float]:
    """The cell's method's blocks and its twin's, timed in alternating steps: medians and
    their ratio (for the benchmarks)."""
    method, comm = cell.carry.method, Communicator()
    twin = TWIN[method]
    x, upstream = _activation(cfg)
    x.requires_grad_(True)
    sides = {m: _build(m, cfg, comm).blocks for m in (method, twin)}
    timed = _timed(cfg, sides, x, upstream, comm)
    a, b = timed[method].median, timed[twin].median
    return {f"{method}_s": a, f"{twin}_s": b, "ratio": a / b}


def run(cfg: TensorParallelConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell on the default group: see `measure`.

    Both methods split the same GPT (one seed on every rank) over the t ranks of the cell:

    - `distbench`: `impls.tensor_parallel.parallelize_gpt` — Megatron's split of every block
      (q/k/v column-parallel by heads behind one shared `f`, o_proj row-parallel ending in
      `g`; fc1 column, fc2 row), the vocab-parallel embedding and LM head, and
      `vocab_parallel_cross_entropy`, all over distbench's counted collectives;
    - `torch_dtensor`: torch's `parallelize_module` on every block with the plan Megatron's
      layout calls for (`ColwiseParallel` on q/k/v and fc1, `RowwiseParallel` on o_proj and
      fc2); the embedding and the LM head stay replicated, since DTensor's vocab-parallel
      pieces (`loss_parallel`) are a different recipe from the layers compared here.

    A cell does four things on each rank:

    1. **Correctness.** `steps` SGD steps on the whole batch (tensor parallelism splits the
       model, not the batch), then rank 0 compares the full parameters (shards gathered) with
       a single-process reference trained the same way (`bench.kit.reference`): `update_error`
       = ‖θ − θ_ref‖ / ‖θ_ref − θ_0‖ over the whole model, and the largest loss difference.
    2. **One layer's communication.** One transformer block's forward and backward on a
       replicated (b, s, h) activation: distbench's bytes, messages, rounds and collective
       calls from the TP communicator's counters; for torch, the collectives DTensor issued,
       counted by `torch.distributed.tensor.debug.CommDebugMode` (their bytes are opaque to
       our counters: NaN, never a made-up figure).
    3. **Memory.** Over one forward + backward of the block stack, `bench.kit.memory.
       ledger_over_pass` counts this rank's parameters, the gradients as they are accumulated
       and the tensors autograd saves (a DTensor counts its local shard); `peak_bytes` is the
       largest running total.
    4. **Speed.** The step the issue names — forward and backward of the transformer blocks
       (attention + MLP) on a replicated activation — timed `repeats` times (barrier, slowest
       rank, median: `bench.kit.timing.alternate`). With a twin (`paired`), the other method's
       blocks are built on twin weights and timed in alternating steps, so the ratio is
       measured side by side.
    """
    return measure(cfg, cell, Communicator())


def measure(cfg: TensorParallelConfig, cell: Cell, comm: Communicator) -> dict[str, Any]:
    """One rank of a cell on `comm`'s group of t ranks: the check against one process, one
    layer's traffic, memory and step times."""
    sides: Sides = cell.carry
    if comm.world_size != cell.world_size:
        raise ValueError(f"tp={cell.world_size} but the cell runs on {comm.world_size} ranks")
    result = _train_and_compare(cfg, sides.method, comm)
    model = _build(sides.method, cfg, comm)
    x, upstream = _activation(cfg)
    result.update(_layer_traffic(sides.method, model.blocks[0], comm, x, upstream))
    x.requires_grad_(True)
    forward = partial(_forward, model.blocks, x)
    ledger, _ = ledger_over_pass(model.blocks.parameters(), forward, lambda h: h.backward(upstream))
    result["memory"] = ledger.snapshot()
    blocks = {"method": model.blocks}
    if sides.twin is not None:
        blocks["twin"] = _build(sides.twin, cfg, comm).blocks
    timed = _timed(cfg, blocks, x, upstream, comm)
    result.update(
        rank=comm.rank,
        step_times_s=timed["method"].seconds,
        twin_step_times_s=timed["twin"].seconds if "twin" in timed else None,
    )
    return result
