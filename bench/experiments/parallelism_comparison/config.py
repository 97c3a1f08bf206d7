"""`parallelism_comparison`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas,
plotting or report code."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.config import (
    batch_key,
    bounded,
    cell_timeout,
    check_choice,
    check_gpt_model,
    check_positive,
    check_training,
    check_unique,
    gpt_rank_bytes,
    iterations_key,
    ranks_key,
    seed_key,
)
from impls.models import GPTConfig
from impls.pipeline.schedules import SCHEDULES as PIPELINE_SCHEDULES
from impls.tensor_parallel import check_tp_config

__all__ = ["ParallelismComparisonConfig", "TOLERANCES"]

AXES = ("dp", "pp", "tp")  # the parallel axes a layout may name


# One stage per rank, micro-batched, the backward whole: the schedules HybridTrainer runs.
SCHEDULES = tuple(
    sorted(
        name
        for name, spec in PIPELINE_SCHEDULES.items()
        if spec.chunks == "one" and spec.microbatched and not spec.split_backward
    )
)
# Relative errors against single-device training. float32 throughout: TP sums partial
# matmuls in another order, micro-batches and the dp average add gradients in pieces.
# After 3 AdamW steps the update ends 1e-6 (CI's GPT) to 1.1e-4 (the full grid's) from the
# reference's — Adam turns the rounding of near-zero gradient elements into full steps, as
# zero_memory found (its tolerance: 1e-3) — the last gradients 4e-7 to 5e-5, the losses
# within 1e-7. Adam cannot see a gradient's scale, hence the gradient check: a sum over
# replicas instead of a mean is off by d − 1, a lost micro-batch by tens of percent.
TOLERANCES = {"update": 1e-3, "grad": 1e-3, "loss": 1e-5}
DEFAULT_LAYOUTS = [
    {"dp": 4},
    {"tp": 4},
    {"pp": 4},
    {"dp": 2, "tp": 2},
    {"dp": 2, "pp": 2},
    {"pp": 2, "tp": 2},
    {"dp": 8},
    {"tp": 8},
    {"pp": 8},
    {"dp": 2, "pp": 2, "tp": 2},
]


@dataclass(kw_only=True)
class ParallelismComparisonConfig:
    RANK_KEY: ClassVar[str] = "world_sizes"
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("model", "batch_size")

    world_sizes: list[int] = ranks_key([4, 8])
    """Numbers of ranks; every layout must use exactly one of them."""
    layouts: list[dict[str, int]] = field(default_factory=lambda: list(DEFAULT_LAYOUTS))
    """Mesh degrees per cell, e.g. `{dp: 2, tp: 2}`; an axis left out has degree 1."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "d_model": 128,
            "n_layers": 8,
            "n_heads": 8,
            "seq_len": 64,
            "vocab_size": 256,
            "bias": False,
        }
    )
    """`GPTConfig` keyword arguments. tp must divide n_heads, d_ff and vocab_size; pp must
    not exceed n_layers. Without biases: k_proj's bias has an identically zero gradient,
    which Adam turns into noise steps no distributed run matches (see zero_memory)."""
    batch_size: int = batch_key(32)
    """Sequences per step over all ranks: dp replicas × microbatches must divide it."""
    microbatches: int = iterations_key(4)
    """Micro-batches per replica and step, the same for every layout (pp = 1 accumulates);
    pp = 4 gives the lecture's 4 × 4 pipeline (bound 4/7)."""
    schedule: str = "1f1b"
    """Pipeline schedule: 1f1b or gpipe (same bubble, M/(M+pp−1))."""
    steps: int = iterations_key(3)
    """AdamW steps checked against single-device training."""
    lr: float = bounded(1e-3, ge=0, le=100, why="past it SGD diverges")
    """AdamW learning rate."""
    warmup: int = iterations_key(1, ge=0)
    """Untimed steps per cell before the timed ones."""
    repeats: int = iterations_key(5)
    """Timed steps per cell; the median of the slowest rank's step is reported."""
    profile_steps: int = iterations_key(2)
    """Steps with the host's compute serialised, whose costs the replay uses."""
    timeout_s: float = cell_timeout(900.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""
    seed: int = seed_key(0)
    """Seeds the model's weights and the batch."""

    def __post_init__(self) -> None:
        check_positive("world_sizes", self.world_sizes)
        check_training(self, ("batch_size", "microbatches", "steps", "repeats", "profile_steps"))
        check_choice("schedule", self.schedule, SCHEDULES)
        model = _gpt_config(self.model)
        if not isinstance(self.layouts, list) or not self.layouts:
            raise ValueError(f"layouts={self.layouts!r}: give a non-empty list such as [{{dp: 4}}]")
        self.layouts = [
            self._check_layout(i, layout, model) for i, layout in enumerate(self.layouts)
        ]
        check_unique("layouts", self.layouts)  # {dp: 4} and {dp: 4, tp: 1} are one cell
        unused = sorted(set(self.world_sizes) - {math.prod(lay.values()) for lay in self.layouts})
        if unused:
            raise ValueError(f"world_sizes={self.world_sizes}: no layout has {unused} ranks")

    def rank_bytes(self) -> int:
        """An upper bound on what one rank holds: the whole model (as if no axis split it)
        and the single-device reference, on the whole batch."""
        return gpt_rank_bytes(_gpt_config(self.model), self.batch_size)

    def _check_layout(self, i: int, layout: Any, model: GPTConfig) -> dict[str, int]:
        """`layout` with every axis filled in, or a ValueError naming `layouts[i]`."""
        where = f"layouts[{i}]={layout!r}"
        if not isinstance(layout, dict) or not layout:
            raise ValueError(f"{where}: each layout maps axes to degrees, e.g. {{dp: 2, tp: 2}}")
        unknown = sorted(set(layout) - set(AXES))
        if unknown:
            raise ValueError(f"{where}: unknown axis {unknown}; allowed axes: {', '.join(AXES)}")
        degrees = {axis: layout.get(axis, 1) for axis in AXES}
        for axis, value in degrees.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {axis}={value!r} must be an integer ≥ 1")
        ranks = math.prod(degrees.values())
        if ranks not in self.world_sizes:
            raise ValueError(
                f"{where}: dp × pp × tp = {ranks}, but world_sizes={self.world_sizes}: the "
                "degrees must multiply to a world size"
            )
        try:
            check_tp_config(model, degrees["tp"])
        except ValueError as error:
            raise ValueError(f"{where}: model: {error}") from error
        if degrees["pp"] > model.n_layers:
            raise ValueError(
                f"{where}: pp={degrees['pp']} exceeds model n_layers={model.n_layers}: each "
                f"pipeline stage needs at least one block, so pp must be in 1..{model.n_layers}"
            )
        shares = degrees["dp"] * self.microbatches
        if self.batch_size % shares:
            raise ValueError(
                f"{where}: batch_size={self.batch_size} is not divisible by dp × microbatches "
                f"= {degrees['dp']} × {self.microbatches} = {shares}: every micro-batch of "
                "every replica must be equal"
            )
        if degrees["pp"] > 1 and model.tie_embeddings:
            raise ValueError(f"{where}: model tie_embeddings=True needs pp=1; allowed: False")
        return degrees


def _gpt_config(model: dict[str, Any]) -> GPTConfig:
    cfg = check_gpt_model(model)
    if cfg.dropout:
        raise ValueError(
            f"model dropout={cfg.dropout}: the 3D step draws no coordinated dropout masks "
            "across TP ranks; allowed: 0.0"
        )
    return cfg
