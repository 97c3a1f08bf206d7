"""What one rank does in a `gradient_compression` cell: data-parallel training on real
data with one gradient-compression method, every byte counted.

Methods (`METHODS`; the setting each takes in brackets):

- `dp`: uncompressed — one fp32 ring all-reduce of all gradients (the baseline);
- `topk` / `topk_noef` [density]: Top-K with / without error feedback;
- `randomk` [density]: Random-K with error feedback;
- `dgc` [density]: Deep Gradient Compression (momentum correction and factor masking,
  local clipping, sparsity warm-up); the optimizer is then momentum-free SGD;
- `onebit`: 1-bit SGD with error feedback; `terngrad`; `qsgd` [levels];
- `powersgd` [rank]: PowerSGD with error feedback and warm start;
- `fp16` / `bf16`: the gradients all-reduced in half precision;
- `torch_powersgd` [rank] / `torch_fp16`: torch's own DDP with its comm hooks
  (`powerSGD_hook`, `fp16_compress_hook`) on the same model, data and schedule.

distbench's methods train through `CompressedDP` over a `Communicator`: bytes per step are
what its counters saw (the busiest rank's bytes sent), the exchange time is the
`aggregate` call's (compress + collective + decode), and with a `network` every round
also waits for the simulated link. torch's DDP moves its bytes inside torch.distributed,
where these counters cannot see them, and its all-reduces overlap backward: those rows
carry NaN bytes and exchange time, never an estimate, and their step time is without the
simulated link.

For `qsgd` and `terngrad`, rank 0 also measures the quantizer on a real gradient (the
first layer's, after training): `draws` independent quantizations of the same g, their
mean against g (bias statistic S = draws·‖mean − g‖² / v̂, ≈ 1 when unbiased, ≫ 1 when
biased), and E‖Q(g) − g‖² against the paper's bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.kit.tasks import build_task, cosine
from impls.comm import Communicator, SimulatedNetwork
from impls.compression import QSGD, Cast, OneBit, RandomK, TernGrad, TopK
from impls.data_parallel import shard_batch
from impls.data_parallel.compressed import CompressedDP

__all__ = ["METHODS", "SETTING_KEY", "CompressionCell", "make_compressor", "run_compression_cell"]

# method -> the config key its setting comes from (None: takes no setting)
SETTING_KEY: dict[str, str | None] = {
    "dp": None,
    "topk": "ratios",
    "topk_noef": "ratios",
    "randomk": "ratios",
    "dgc": "ratios",
    "onebit": None,
    "terngrad": None,
    "qsgd": "levels",
    "powersgd": "ranks",
    "fp16": None,
    "bf16": None,
    "torch_powersgd": "ranks",
    "torch_fp16": None,
}
METHODS = tuple(SETTING_KEY)
SETTING_NAME = {"ratios": "density", "levels": "levels", "ranks": "rank"}
MOMENTUM = 0.9


@dataclass(kw_only=True)
class CompressionCell:
    method: str
    setting: float | int | None
    task: str = "digits"
    steps: int = 600
    batch_size: int = 64
    lr: float = 0.05
    seed: int = 0
    eval_every: int = 50
    network: dict[str, float] | None = None
    """`SimulatedNetwork.from_units` keywords (latency_ms, bandwidth_mbps); None: off."""
    dgc_warmup_steps: int = 0
    draws: int = 200
    """Quantizations drawn for the unbiasedness/variance check (qsgd, terngrad)."""


def make_compressor(
    method: str, setting, rank: int, seed: int, cell: CompressionCell | None = None
):
    """The distbench compressor of `method` (None for `dp`). Stochastic compressors draw
    from a generator seeded per rank (independent noise, reproducible runs); Random-K uses
    one seed on every rank, as the all-gather does not need it but reproducibility does."""
    noise_seed = seed * 1009 + rank
    if method == "dp":
        return None
    if method in ("topk", "topk_noef"):
        return TopK(setting, error_feedback=method == "topk")
    if method == "randomk":
        return RandomK(setting, seed=seed)
    if method == "dgc":
        from impls.compression import DGC

        warmup = cell.dgc_warmup_steps if cell is not None else 0
        return DGC(setting, momentum=MOMENTUM, warmup_steps=warmup)
    if method == "onebit":
        return OneBit()
    if method == "terngrad":
        return TernGrad(seed=noise_seed)
    if method == "qsgd":
        return QSGD(int(setting), seed=noise_seed)
    if method == "powersgd":
        from impls.compression import PowerSGD

        return PowerSGD(int(setting), seed=seed)
    if method in ("fp16", "bf16"):
        return Cast(method)
    raise ValueError(f"method={method!r} is not a distbench compressor")


def _network(cell: CompressionCell) -> SimulatedNetwork | None:
    return SimulatedNetwork.from_units(**cell.network) if cell.network else None


def _optimizer(cell: CompressionCell):
    momentum = 0.0 if cell.method == "dgc" else MOMENTUM
    return lambda params: torch.optim.SGD(params, lr=cell.lr, momentum=momentum)


def run_compression_cell(cell: CompressionCell) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    task = build_task(cell.task, cell.batch_size, cell.seed)
    if cell.method.startswith("torch_"):
        return _run_torch(cell, task, rank, world)
    comm = Communicator(network=_network(cell))
    dp = CompressedDP(task.model, comm, _optimizer(cell),
                      make_compressor(cell.method, cell.setting, rank, cell.seed, cell))  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(dp.updater.optimizer, cosine(cell.steps))
    record = _Record()
    for step in range(cell.steps):
        x, y = task.batches(step)
        x, y = shard_batch(x, rank, world), shard_batch(y, rank, world)
        simulated = comm.simulated_s
        with comm.measure() as traffic:
            start = time.perf_counter()
            loss = task.loss(dp(x).float(), y)
            loss.backward()
            dp.synchronize_and_step()
            elapsed = time.perf_counter() - start
        schedule.step()
        record.step(loss.item(), elapsed, dp.last_sync_s, comm.simulated_s - simulated,
                    traffic.bytes_sent, traffic.rounds)  # fmt: skip
        if (step + 1) % cell.eval_every == 0 or step + 1 == cell.steps:
            record.evaluate(step + 1, task)
    out = record.result(task)
    if cell.method in ("qsgd", "terngrad") and rank == 0:
        out["quantizer"] = quantizer_check(cell, task)
    return out


class _Record:
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.step_s: list[float] = []
        self.sync_s: list[float] = []
        self.simulated_s: list[float] = []
        self.bytes_sent: list[int] = []
        self.rounds: list[int] = []
        self.evals: list[tuple[int, float, float, float]] = []  # step, elapsed, loss, acc

    def step(self, loss, step_s, sync_s, simulated_s, bytes_sent, rounds) -> None:
        self.losses.append(loss)
        self.step_s.append(step_s)
        self.sync_s.append(sync_s)
        self.simulated_s.append(simulated_s)
        self.bytes_sent.append(bytes_sent)
        self.rounds.append(rounds)

    def evaluate(self, step: int, task) -> None:
        loss, acc = task.evaluate()
        self.evals.append((step, sum(self.step_s), loss, acc))

    def result(self, task) -> dict[str, Any]:
        _, _, loss, acc = self.evals[-1]
        return {
            "losses": self.losses,
            "step_times_s": self.step_s,
            "sync_times_s": self.sync_s,
            "simulated_s": self.simulated_s,
            "bytes_sent": self.bytes_sent,
            "rounds": self.rounds,
            "evals": self.evals,
            "final_loss": loss,
            "final_accuracy": acc,
            "params": sum(p.numel() for p in task.model.parameters()),
        }


def _run_torch(cell: CompressionCell, task, rank: int, world: int) -> dict[str, Any]:
    """torch's DDP with its own comm hook: same model, data, optimizer and schedule."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(task.model)
    if cell.method == "torch_powersgd":
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(cell.setting),
            start_powerSGD_iter=2,  # torch's smallest with error feedback / warm start
            use_error_feedback=True,
            warm_start=True,
            random_seed=cell.seed,
        )
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    else:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = _optimizer(cell)(list(ddp.parameters()))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(cell.steps))
    record = _Record()
    for step in range(cell.steps):
        x, y = task.batches(step)
        x, y = shard_batch(x, rank, world), shard_batch(y, rank, world)
        start = time.perf_counter()
        loss = task.loss(ddp(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        schedule.step()
        record.step(loss.item(), elapsed, math.nan, 0.0, -1, -1)
        if (step + 1) % cell.eval_every == 0 or step + 1 == cell.steps:
            record.evaluate(step + 1, task)
    return record.result(task)


def quantizer_check(cell: CompressionCell, task) -> dict[str, float]:
    """Draw `cell.draws` quantizations of one real gradient: bias statistic and variance
    against the paper's bound (see the module docstring)."""
    x, y = task.batches(0)
    task.model.zero_grad(set_to_none=True)
    task.loss(task.model(x).float(), y).backward()
    first = next(p for p in task.model.parameters() if p.dim() == 2)
    g = first.grad.detach().reshape(-1).float()
    compressor = make_compressor(cell.method, cell.setting, 0, cell.seed + 777)
    draws = torch.stack([compressor.decompress(compressor.compress(g)) for _ in range(cell.draws)])
    mean = draws.mean(0)
    spread = (draws - mean).pow(2).sum(1).sum().item() / (cell.draws - 1)  # tr Cov estimate
    bias_stat = cell.draws * (mean - g).pow(2).sum().item() / spread if spread > 0 else math.inf
    variance = (draws - g).pow(2).sum(1).mean().item()
    n, norm2 = g.numel(), g.pow(2).sum().item()
    if cell.method == "qsgd":
        s = int(cell.setting)
        bound = min(n / s**2, math.sqrt(n) / s) * norm2  # Alistarh et al. 2017, Lemma 3.1
        expected = math.nan
    else:
        scale = g.abs().max().item()
        bound = scale * g.abs().sum().item()  # Wen et al. 2017: E‖ĝ − g‖² ≤ s·‖g‖₁
        expected = bound - norm2  # the exact E‖ĝ − g‖² = Σ (s·|g_i| − g_i²)
    return {
        "numel": n,
        "draws": cell.draws,
        "bias_stat": bias_stat,
        "relative_bias": (mean - g).norm().item() / g.norm().item(),
        "variance": variance,
        "variance_bound": bound,
        "variance_expected": expected,
        "grad_norm2": norm2,
    }
