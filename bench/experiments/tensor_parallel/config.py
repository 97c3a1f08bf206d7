"""`tensor_parallel`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas or plotting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.config import (
    batch_key,
    bounded,
    cell_timeout,
    check_choices,
    check_gpt_model,
    check_positive,
    check_training,
    gpt_rank_bytes,
    iterations_key,
    ranks_key,
    seed_key,
)
from impls.tensor_parallel import check_tp_config

__all__ = ["METHODS", "TensorParallelConfig"]

METHODS = ("distbench", "torch_dtensor")


@dataclass(kw_only=True)
class TensorParallelConfig:
    RANK_KEY: ClassVar[str] = "tp_degrees"
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("model", "batch_size")

    tp_degrees: list[int] = ranks_key([1, 2, 4])
    """Tensor-parallel degrees t; each must divide the model's n_heads, d_ff and vocab."""
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """distbench (Megatron layers) and/or torch_dtensor (`parallelize_module`)."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "bias": False,
            "d_model": 256,
            "n_layers": 4,
            "n_heads": 8,
            "seq_len": 128,
            "vocab_size": 256,
        }
    )
    """`GPTConfig` keyword arguments of the model every cell splits (in the order of the
    results' columns)."""
    batch_size: int = batch_key(8)
    """Sequences per step; every TP rank sees the whole batch."""
    steps: int = iterations_key(3)
    """SGD steps checked against the single-process reference."""
    lr: float = bounded(0.1, ge=0, le=100, why="past it SGD diverges")
    """SGD learning rate of the checked steps."""
    warmup: int = iterations_key(3, ge=0)
    """Untimed steps per cell before the timed ones."""
    repeats: int = iterations_key(21)
    """Timed steps of the block stack per cell; the median of the slowest rank is reported."""
    paired: bool = True
    """Time each cell's other method on twin weights in alternating steps (the speed ratio)."""
    timeout_s: float = cell_timeout(900.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""
    seed: int = seed_key(0)
    """Seeds the model's weights and the batch (the same on every rank)."""

    def __post_init__(self) -> None:
        check_positive("tp_degrees", self.tp_degrees)
        check_choices("methods", self.methods, METHODS)
        check_training(self, ("batch_size", "steps", "repeats"))
        cfg = check_gpt_model(self.model)
        for t in self.tp_degrees:
            try:
                check_tp_config(cfg, t)
            except ValueError as error:
                raise ValueError(f"tp_degrees={self.tp_degrees}: {error}") from error

    def rank_bytes(self) -> int:
        """An upper bound on what one rank holds: the whole model (t = 1) and its twin, on
        the whole batch."""
        return gpt_rank_bytes(check_gpt_model(self.model), self.batch_size)
