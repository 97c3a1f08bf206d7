"""`gradient_compression`'s typed config: every key, its default and its meaning, and the
methods with the setting each takes.

Light on purpose: every rank unpickles this config, so it imports no pandas or plotting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from bench.config import (
    batch_key,
    bounded,
    cell_timeout,
    check_batch_split,
    check_choice,
    check_choices,
    check_positive,
    check_training,
    iterations_key,
    ranks_key,
    seed_key,
)
from bench.kit.tasks import DEFAULT_BATCH, DEFAULT_LR, TASKS
from impls.comm import SimulatedNetwork
from impls.compression import check_density, check_levels, check_rank

__all__ = ["METHODS", "SETTING_KEY", "SETTING_NAME", "GradientCompressionConfig"]

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
NETWORK_KEYS = ("latency_ms", "bandwidth_mbps")


@dataclass(kw_only=True)
class GradientCompressionConfig:
    RANK_KEY: ClassVar[str] = "world_size"

    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """Any of: dp, topk, topk_noef, randomk, dgc, onebit, terngrad, qsgd, powersgd, fp16,
    bf16, torch_powersgd, torch_fp16."""
    ratios: list[float] = bounded([0.01, 0.1], ge=0.0, le=1.0)
    """Densities kept by topk, topk_noef, randomk and dgc, each in (0, 1]."""
    ranks: list[int] = bounded([1, 4], ge=1, le=1024, why="a low-rank approximation's rank")
    """PowerSGD ranks (distbench's and torch's hook), each ≥ 1."""
    levels: list[int] = bounded([4], ge=1, le=127)
    """QSGD quantization levels s, each in [1, 127]."""
    network: dict[str, float] | None = field(
        default_factory=lambda: {"latency_ms": 1.0, "bandwidth_mbps": 100.0}
    )
    """Simulated link for distbench's exchanges: {latency_ms, bandwidth_mbps}; null: off."""
    task: str = "digits"
    """digits (sklearn's 8×8 digits, MLP) or chargpt (character GPT on Python's docs)."""
    steps: int = iterations_key(300)
    """Training steps per cell, timed; the learning rate decays over them."""
    batch_size: int | None = batch_key(None)
    """Global batch per step (split over the ranks); null: the task's default."""
    lr: float | None = bounded(None, ge=0, le=100, why="past it SGD diverges")
    """Peak SGD learning rate (cosine decay to 0); null: the task's default."""
    world_size: int = ranks_key(4)
    """Ranks (data-parallel replicas) of every cell."""
    seeds: list[int] = seed_key([0, 1])
    """Each seed is a full replicate (model init and data order)."""
    eval_every: int = iterations_key(25)
    """Steps between held-out evaluations (the clock is stopped while they run)."""
    dgc_warmup_steps: int = iterations_key(50, ge=0)
    """DGC's sparsity warm-up: density decays from 25% to the target over these steps."""
    draws: int = iterations_key(200, ge=2)
    """Quantizations drawn for QSGD's and TernGrad's unbiasedness and variance check."""
    timeout_s: float = cell_timeout(900.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_choice("task", self.task, TASKS)
        for ratio in self.ratios:
            check_density(ratio)
        for key, check in (("ranks", check_rank), ("levels", check_levels)):
            for value in getattr(self, key):
                try:
                    check(value)
                except ValueError as err:
                    raise ValueError(f"{key}={getattr(self, key)}: {err}") from err
        for key in ("ratios", "ranks", "levels"):
            used = [m for m in self.methods if SETTING_KEY[m] == key]
            if used and not getattr(self, key):
                raise ValueError(f"{key}=[] but methods {used} need at least one value")
        if self.network is not None:
            unknown = set(self.network) - set(NETWORK_KEYS)
            if unknown:
                raise ValueError(
                    f"network has unknown key(s) {sorted(unknown)}; allowed: "
                    f"{', '.join(NETWORK_KEYS)}"
                )
            SimulatedNetwork.from_units(**self.network)
        check_positive("draws", [self.draws], minimum=2)
        check_positive("dgc_warmup_steps", [self.dgc_warmup_steps], minimum=0)
        check_positive("seeds", self.seeds, minimum=0)
        if self.batch_size is None:
            self.batch_size = DEFAULT_BATCH[self.task]
        if self.lr is None:
            self.lr = DEFAULT_LR[self.task]
        check_training(self, ("steps", "world_size", "eval_every", "batch_size"))
        check_batch_split(self.batch_size, self.world_size)
