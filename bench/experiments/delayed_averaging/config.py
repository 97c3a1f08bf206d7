"""`delayed_averaging`'s typed config: every key, its default and its meaning.

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
from bench.kit.tasks import TASKS
from impls.comm import SimulatedNetwork

__all__ = ["METHODS", "DelayedAveragingConfig"]

METHODS = ("sync", "dga")


@dataclass(kw_only=True)
class DelayedAveragingConfig:
    RANK_KEY: ClassVar[str] = "world_size"

    latencies_ms: list[float] = bounded([0.0, 10.0, 50.0, 100.0], ge=0, le=60_000, why="a minute")
    """One-way link latency per round of the simulated network, each ≥ 0."""
    delays: list[int] = iterations_key([4, 16])
    """DGA's delay D (steps an average may take), each ≥ 1; sync DP is D = 0."""
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """sync (every step waits for its all-reduce) and/or dga (Delayed Gradient Averaging:
    step on the local gradient now, correct it with the average D steps later)."""
    bandwidth_mbps: float | None = bounded(None, ge=0, le=1e7, why="10 Tb/s")
    """Link bandwidth; null: unlimited (latency only)."""
    target_accuracy: float = bounded(0.95, ge=0.0, le=1.0)
    """Held-out accuracy whose first crossing is the time-to-accuracy."""
    task: str = "digits"
    """digits (sklearn's 8×8 digits, MLP) or chargpt (character GPT on Python's docs)."""
    steps: int = iterations_key(300)
    """Training steps per cell, timed; the learning rate decays over them."""
    batch_size: int = batch_key(64)
    """Global batch per step, split evenly over the ranks."""
    lr: float = bounded(0.5, ge=0, le=100, why="past it SGD diverges")
    """Peak plain-SGD learning rate (cosine decay to 0)."""
    world_size: int = ranks_key(4)
    """Ranks (data-parallel replicas) of every cell."""
    eval_every: int = iterations_key(10)
    """Steps between held-out evaluations (the clock is stopped while they run)."""
    seed: int = seed_key(0)
    """Seeds the model's initialization and the data order."""
    timeout_s: float = cell_timeout(900.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_choice("task", self.task, TASKS)
        if not self.latencies_ms:
            raise ValueError("latencies_ms=[]: give at least one latency")
        for latency in self.latencies_ms:
            try:
                SimulatedNetwork.from_units(latency_ms=latency)
            except ValueError as err:
                raise ValueError(f"latencies_ms={self.latencies_ms}: {err}") from err
        if self.bandwidth_mbps is not None:
            SimulatedNetwork.from_units(bandwidth_mbps=self.bandwidth_mbps)
        if "dga" in self.methods:
            check_positive("delays", self.delays)
        if not (isinstance(self.target_accuracy, int | float) and 0 < self.target_accuracy <= 1):
            raise ValueError(f"target_accuracy={self.target_accuracy}: must be in (0, 1]")
        check_training(self, ("steps", "batch_size", "world_size", "eval_every"))
        check_batch_split(self.batch_size, self.world_size)
