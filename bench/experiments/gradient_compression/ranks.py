"""What one rank does in a `gradient_compression` cell: data-parallel training on real
data with one gradient-compression method, every byte counted.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.experiments.base import Cell
from bench.experiments.gradient_compression.config import GradientCompressionConfig
from bench.kit.tasks import Task, build_task, cosine
from bench.kit.timing import timed_step
from bench.kit.workloads import rank_shard
from impls.comm import Communicator, SimulatedNetwork
from impls.compression import DGC, QSGD, Cast, OneBit, PowerSGD, RandomK, TernGrad, TopK
from impls.data_parallel.compressed import CompressedDP

__all__ = ["make_compressor", "quantizer_check", "run"]

MOMENTUM = 0.9


def make_compressor(method: str, setting: Any, rank: int, seed: int, dgc_warmup_steps: int = 0):
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
        return DGC(setting, momentum=MOMENTUM, warmup_steps=dgc_warmup_steps)
    if method == "onebit":
        return OneBit()
    if method == "terngrad":
        return TernGrad(seed=noise_seed)
    if method == "qsgd":
        return QSGD(int(setting), seed=noise_seed)
    if method == "powersgd":
        return PowerSGD(int(setting), seed=seed)
    if method in ("fp16", "bf16"):
        return Cast(method)
    raise ValueError(f"method={method!r} is not a distbench compressor")


def _optimizer(
    cfg: GradientCompressionConfig, method: str
) -> Callable[[list], torch.optim.Optimizer]:
    momentum = 0.0 if method == "dgc" else MOMENTUM  # DGC carries its own momentum
    return lambda params: torch.optim.SGD(params, lr=cfg.lr, momentum=momentum)


@dataclass
class _Record:
    """One rank's per-step record and its held-out evaluations."""

    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    sync_times_s: list[float] = field(default_factory=list)
    simulated_s: list[float] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    evals: list[tuple[int, float, float, float]] = field(default_factory=list)
    """(step, training seconds so far, held-out loss, held-out accuracy)."""

    def add(self, seconds: float, step: dict[str, Any]) -> None:
        self.step_times_s.append(seconds)
        self.losses.append(step["loss"].item())
        for name in ("sync_times_s", "simulated_s", "bytes_sent", "rounds"):
            getattr(self, name).append(step[name])

    def result(self, task: Task) -> dict[str, Any]:
        _, _, loss, accuracy = self.evals[-1]
        return {
            **{
                name: getattr(self, name)
                for name in (
                    "losses",
                    "step_times_s",
                    "sync_times_s",
                    "simulated_s",
                    "bytes_sent",
                    "rounds",
                    "evals",
                )
            },
            "final_loss": loss,
            "final_accuracy": accuracy,
            "params": sum(p.numel() for p in task.model.parameters()),
        }


def _train(
    cfg: GradientCompressionConfig, task: Task, optimizer: torch.optim.Optimizer, step: Callable
) -> _Record:
    """`cfg.steps` timed steps of `step(x, y)` on this rank's shard of each global batch,
    the learning rate on a cosine; held-out evaluation every `eval_every` steps (clock
    stopped) and after the last."""
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(cfg.steps))
    record = _Record()
    for t in range(cfg.steps):
        x, y = (rank_shard(batch) for batch in task.batches(t))
        outcome, seconds, _ = timed_step(functools.partial(step, x, y))
        schedule.step()
        record.add(seconds, outcome)
        if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.steps:
            loss, accuracy = task.evaluate()
            record.evals.append((t + 1, sum(record.step_times_s), loss, accuracy))
    return record


def run(cfg: GradientCompressionConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell: the method of `cell.key`, its setting `cell.carry`.

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

    Every training step is timed by the kit (`bench.kit.timing.timed_step`: barrier-opened,
    the slowest rank's time). distbench's methods train through `CompressedDP` over a
    `Communicator`: bytes per step are what its counters saw (each rank's bytes sent), the
    exchange time is the `aggregate` call's (compress + collective + decode), and with a
    `network` every round also waits for the simulated link. torch's DDP moves its bytes
    inside torch.distributed, where these counters cannot see them, and its all-reduces
    overlap backward: those rows carry NaN bytes and exchange time, never an estimate, and
    their step time is without the simulated link.

    For `qsgd` and `terngrad`, rank 0 also measures the quantizer on a real gradient (the
    first layer's, after training): `draws` independent quantizations of the same g, their
    mean against g (bias statistic S = draws·‖mean − g‖² / v̂, ≈ 1 when unbiased, ≫ 1 when
    biased), and E‖Q(g) − g‖² against the paper's bound.
    """
    method, seed = cell.key["method"], cell.key["seed"]
    task = build_task(cfg.task, cfg.batch_size, seed)
    if method.startswith("torch_"):
        return _run_torch(cfg, cell, task)
    network = SimulatedNetwork.from_units(**cfg.network) if cfg.network else None
    comm = Communicator(network=network)
    compressor = make_compressor(method, cell.carry, comm.rank, seed, cfg.dgc_warmup_steps)
    dp = CompressedDP(task.model, comm, _optimizer(cfg, method), compressor)

    def step(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        simulated = comm.simulated_s
        with comm.measure() as traffic:
            loss = task.loss(dp(x).float(), y)
            loss.backward()
            dp.synchronize_and_step()
        return {
            "loss": loss.detach(),
            "sync_times_s": dp.last_sync_s,
            "simulated_s": comm.simulated_s - simulated,
            "bytes_sent": traffic.bytes_sent,
            "rounds": traffic.rounds,
        }

    out = _train(cfg, task, dp.updater.optimizer, step).result(task)
    if method in ("qsgd", "terngrad") and comm.rank == 0:
        out["quantizer"] = quantizer_check(cfg, cell, task)
    return out


def _run_torch(cfg: GradientCompressionConfig, cell: Cell, task: Task) -> dict[str, Any]:
    """torch's DDP with its own comm hook: same model, data, optimizer and schedule."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(task.model)
    if cell.key["method"] == "torch_powersgd":
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(cell.carry),
            start_powerSGD_iter=2,  # torch's smallest with error feedback / warm start
            use_error_feedback=True,
            warm_start=True,
            random_seed=cell.key["seed"],
        )
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    else:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = _optimizer(cfg, cell.key["method"])(list(ddp.parameters()))

    def step(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        loss = task.loss(ddp(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # torch's traffic is out of our counters' sight: -1 marks "not counted".
        return {
            "loss": loss.detach(),
            "sync_times_s": math.nan,
            "simulated_s": 0.0,
            "bytes_sent": -1,
            "rounds": -1,
        }

    return _train(cfg, task, optimizer, step).result(task)


def quantizer_check(cfg: GradientCompressionConfig, cell: Cell, task: Task) -> dict[str, float]:
    """Draw `cfg.draws` quantizations of one real gradient: bias statistic and variance
    against the paper's bound (see `run`)."""
    method, draws_n = cell.key["method"], cfg.draws
    x, y = task.batches(0)
    task.model.zero_grad(set_to_none=True)
    task.loss(task.model(x).float(), y).backward()
    first = next(p for p in task.model.parameters() if p.dim() == 2)
    g = first.grad.detach().reshape(-1).float()
    compressor = make_compressor(method, cell.carry, 0, cell.key["seed"] + 777)
    draws = torch.stack([compressor.decompress(compressor.compress(g)) for _ in range(draws_n)])
    mean = draws.mean(0)
    spread = (draws - mean).pow(2).sum(1).sum().item() / (draws_n - 1)  # tr Cov estimate
    bias_stat = draws_n * (mean - g).pow(2).sum().item() / spread if spread > 0 else math.inf
    variance = (draws - g).pow(2).sum(1).mean().item()
    n, norm2 = g.numel(), g.pow(2).sum().item()
    if method == "qsgd":
        s = int(cell.carry)
        bound = min(n / s**2, math.sqrt(n) / s) * norm2  # Alistarh et al. 2017, Lemma 3.1
        expected = math.nan
    else:
        scale = g.abs().max().item()
        bound = scale * g.abs().sum().item()  # Wen et al. 2017: E‖ĝ − g‖² ≤ s·‖g‖₁
        expected = bound - norm2  # the exact E‖ĝ − g‖² = Σ (s·|g_i| − g_i²)
    return {
        "numel": n,
        "draws": draws_n,
        "bias_stat": bias_stat,
        "relative_bias": (mean - g).norm().item() / g.norm().item(),
        "variance": variance,
        "variance_bound": bound,
        "variance_expected": expected,
        "grad_norm2": norm2,
    }
