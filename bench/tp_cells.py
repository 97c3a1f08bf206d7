"""What one rank does in a `tensor_parallel` cell: train, count one layer's traffic, time.

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
   a single-process reference trained the same way: `update_error` =
   ‖θ − θ_ref‖ / ‖θ_ref − θ_0‖ over the whole model, and the largest loss difference.
2. **One layer's communication.** One transformer block's forward and backward on a
   replicated (b, s, h) activation: distbench's bytes, messages, rounds and collective
   calls from the TP communicator's counters; for torch, the collectives DTensor issued,
   counted by `torch.distributed.tensor.debug.CommDebugMode` (their bytes are opaque to
   our counters: NaN, never a made-up figure).
3. **Memory.** Over one forward + backward of the block stack, a `MemoryLedger` counts
   this rank's parameters, the gradients as they are accumulated and the tensors autograd
   saves (a DTensor counts its local shard); `peak_bytes` is the largest running total.
4. **Speed.** The step the issue names — forward and backward of the transformer blocks
   (attention + MLP) on a replicated activation — timed `repeats` times (barrier, slowest
   rank, median). With `paired`, the other method's blocks are built on twin weights and
   timed in alternating steps, so the ratio is measured side by side.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.kit.timing import slowest
from bench.kit.workloads import lm_loss, seeded_batch
from impls.comm import Communicator
from impls.memory import MemoryLedger
from impls.models import GPT, GPTConfig
from impls.tensor_parallel import parallelize_gpt, sharded_dims, tp_loss

__all__ = ["METHODS", "TPCell", "paired_block_times", "run_tp_cell"]

METHODS = ("distbench", "torch_dtensor")
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


@dataclass(kw_only=True)
class TPCell:
    """One measured configuration, as shipped to every rank."""

    method: str
    model: dict[str, Any]
    """`GPTConfig` keyword arguments."""
    batch_size: int = 8
    steps: int = 3
    """SGD steps compared with the single-process reference."""
    lr: float = 0.1
    warmup: int = 2
    repeats: int = 10
    paired: bool = False
    seed: int = 0


def _dtensor_plan() -> dict[str, nn.Module]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return {name: styles[style]() for name, style in BLOCK_PLAN.items()}


def _build(method: str, cfg: GPTConfig, seed: int, comm: Communicator) -> GPT:
    """The full GPT from `seed`, split over this cell's ranks by `method`."""
    model = GPT(cfg, seed=seed)
    if method == "distbench":
        return parallelize_gpt(model, comm)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = DeviceMesh.from_group(comm.group, "cpu")
    for block in model.blocks:
        parallelize_module(block, mesh, _dtensor_plan())
    return model


def _loss(method: str, model: GPT, idx: torch.Tensor, targets: torch.Tensor, comm) -> torch.Tensor:
    if method == "distbench":
        return tp_loss(model, idx, targets, comm)
    return lm_loss(model(idx), targets)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _full_parameters(method: str, model: GPT, comm: Communicator) -> dict[str, torch.Tensor]:
    """Every parameter whole, on every rank (shards gathered with torch's all_gather: the
    harness's bookkeeping, outside anything measured)."""
    if method == "torch_dtensor":
        return {
            n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()
        }
    dims, out = sharded_dims(model), {}
    for name, p in model.named_parameters():
        if name not in dims or comm.world_size == 1:
            out[name] = p.detach().clone()
            continue
        parts = [torch.empty_like(p) for _ in range(comm.world_size)]
        dist.all_gather(parts, p.detach().contiguous(), group=comm.group)
        out[name] = torch.cat(parts, dim=dims[name])
    return out


def _reference(cfg: GPTConfig, cell: TPCell, idx, targets) -> tuple[list[float], dict, dict]:
    """Single-process SGD on the whole batch: losses, parameters before and after."""
    model = GPT(cfg, seed=cell.seed)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=cell.lr)
    losses = []
    for _ in range(cell.steps):
        loss = lm_loss(model(idx), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, start, {n: p.detach().clone() for n, p in model.named_parameters()}


def _train_and_compare(cell: TPCell, cfg: GPTConfig, comm: Communicator) -> dict[str, Any]:
    idx, targets = seeded_batch(cfg, cell.batch_size, cell.seed)
    model = _build(cell.method, cfg, cell.seed, comm)
    optimizer = torch.optim.SGD(model.parameters(), lr=cell.lr)
    losses = []
    for _ in range(cell.steps):
        loss = _loss(cell.method, model, idx, targets, comm)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    params = _full_parameters(cell.method, model, comm)
    out = {"losses": losses, "loss_diff": math.nan, "update_error": math.nan}
    out["params"] = sum(p.numel() for p in params.values())
    if comm.rank == 0:
        ref_losses, start, reference = _reference(cfg, cell, idx, targets)
        out["loss_diff"] = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
        off = sum(float((params[n] - w).square().sum()) for n, w in reference.items())
        moved = sum(float((w - start[n]).square().sum()) for n, w in reference.items())
        out["update_error"] = (off / moved) ** 0.5 if moved else math.inf
    return out


def _activation(cfg: GPTConfig, cell: TPCell) -> tuple[torch.Tensor, torch.Tensor]:
    """A replicated (b, s, h) block input and an upstream gradient, seeded."""
    generator = torch.Generator().manual_seed(cell.seed + 7)
    shape = (cell.batch_size, cfg.seq_len, cfg.d_model)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _layer_traffic(cell: TPCell, block: nn.Module, comm: Communicator, x, upstream) -> dict:
    """One block's forward and backward: what each direction sent and how many collectives."""
    x = x.clone().requires_grad_(True)
    if cell.method == "distbench":
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
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as fwd_mode:
        y = block(x)
    with CommDebugMode() as bwd_mode:
        y.backward(upstream)
    out = {
        f"{k}_{d}": math.nan for k in ("bytes_sent", "rounds", "messages") for d in ("fwd", "bwd")
    }
    for name, mode in (("fwd", fwd_mode), ("bwd", bwd_mode)):
        # "c10d_functional.all_reduce" -> "all_reduce": one vocabulary for both methods.
        counts = Counter()
        for op, count in mode.get_comm_counts().items():
            counts[str(op).rsplit(".", 1)[-1].removesuffix("_")] += count
        out[f"collectives_{name}"] = dict(counts)
    return out


def _blocks_step(blocks: nn.ModuleList, x: torch.Tensor, upstream: torch.Tensor) -> None:
    """The timed step: forward and backward of every block on a replicated activation."""
    for p in blocks.parameters():
        p.grad = None
    x.grad = None
    h = x
    for block in blocks:
        h = block(h)
    h.backward(upstream)


def _memory(blocks: nn.ModuleList, x: torch.Tensor, upstream: torch.Tensor) -> dict:
    """This rank's parameters, gradients and saved activations over one blocks step."""
    for p in blocks.parameters():
        p.grad = None
    ledger, params = MemoryLedger(), list(blocks.parameters())
    for p in params:
        ledger.track("params", _local(p))

    def count_grad(param: torch.Tensor) -> None:
        ledger.track("grads", _local(param.grad))

    hooks = [p.register_post_accumulate_grad_hook(count_grad) for p in params]
    ledger.reset_peak()
    with ledger.saved_activations(exclude=[_local(p) for p in params]):
        h = x
        for block in blocks:
            h = block(h)
    h.backward(upstream)
    for hook in hooks:
        hook.remove()
    return ledger.snapshot()


def _alternate(sides: dict[str, nn.ModuleList], x, upstream, warmup: int, repeats: int) -> dict:
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(warmup + repeats):
        for name, blocks in sides.items():
            dist.barrier()
            start = time.perf_counter()
            _blocks_step(blocks, x, upstream)
            seconds = slowest(time.perf_counter() - start)
            if i >= warmup:
                times[name].append(seconds)
    return times


def paired_block_times(cell: TPCell) -> dict[str, float]:
    """`cell.method`'s blocks and its twin's, timed in alternating steps: medians and their
    ratio (for the benchmarks)."""
    cfg, comm = GPTConfig(**cell.model), Communicator()
    x, upstream = _activation(cfg, cell)
    x.requires_grad_(True)
    twin = TWIN[cell.method]
    sides = {m: _build(m, cfg, cell.seed, comm).blocks for m in (cell.method, twin)}
    times = _alternate(sides, x, upstream, cell.warmup, cell.repeats)
    a, b = (statistics.median(times[m]) for m in (cell.method, twin))
    return {f"{cell.method}_s": a, f"{twin}_s": b, "ratio": a / b}


def run_tp_cell(cell: TPCell) -> dict[str, Any]:
    """One rank of a cell: the check against one process, one layer's traffic, memory and
    step times."""
    cfg, comm = GPTConfig(**cell.model), Communicator()
    result = _train_and_compare(cell, cfg, comm)
    model = _build(cell.method, cfg, cell.seed, comm)
    x, upstream = _activation(cfg, cell)
    result.update(_layer_traffic(cell, model.blocks[0], comm, x, upstream))
    x.requires_grad_(True)
    result["memory"] = _memory(model.blocks, x, upstream)
    sides = {"method": model.blocks}
    if cell.paired:
        sides["twin"] = _build(TWIN[cell.method], cfg, cell.seed, comm).blocks
    times = _alternate(sides, x, upstream, cell.warmup, cell.repeats)
    result.update(
        rank=dist.get_rank(),
        step_times_s=times["method"],
        twin_step_times_s=times.get("twin"),
    )
    return result
