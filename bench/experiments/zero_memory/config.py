"""`zero_memory`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas,
plotting or report code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.config import (
    batch_key,
    bounded,
    bytes_key,
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
from bench.experiments.zero_memory.methods import EXTRA_METHODS, METHOD_OF_STAGE
from impls.precision import PRECISIONS, check_precision

__all__ = ["ZeroMemoryConfig"]


def _default_model() -> dict[str, Any]:
    # `bias` first: the results' columns keep the order the YAML gave them.
    return {
        "bias": False,
        "d_model": 128,
        "n_layers": 6,
        "n_heads": 4,
        "seq_len": 64,
        "vocab_size": 256,
    }


@dataclass(kw_only=True)
class ZeroMemoryConfig:
    RANK_KEY: ClassVar[str] = "world_sizes"
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("model", "batch_size")

    stages: list[int] = bounded([0, 1, 2, 3], ge=0, le=3)
    """distbench ZeRO stages to run (0: plain data parallelism, the memory baseline)."""
    world_sizes: list[int] = ranks_key([1, 2, 4, 8])
    """Data-parallel degrees N; each must divide batch_size."""
    precision: Any = field(default_factory=lambda: ["fp32", "bf16"])
    """fp32 (4 + 4 + 8 bytes per parameter) and/or mixed precision fp16 / bf16 (2 + 2 + 12);
    one name or a list."""
    loss_scale: Any = "dynamic"
    """fp16's loss scaling: "dynamic" or a fixed scale (ignored by fp32 and bf16)."""
    methods: list[str] = field(default_factory=lambda: list(EXTRA_METHODS))
    """Also run these: distbench's DDP with/without overlap, and torch's baselines."""
    model: dict[str, Any] = field(default_factory=_default_model)
    """`GPTConfig` keyword arguments of the model every cell trains. Without biases:
    k_proj's bias gets an identically zero gradient (softmax ignores a shift that is the
    same for every key), which Adam turns into ±lr steps of pure rounding noise that no two
    summation orders agree on, so no distributed run — torch's DDP included — can match the
    one-process reference on it. Without it every parameter is comparable at 1e-5."""
    batch_size: int = batch_key(32)
    """Sequences per step over all ranks (rank r trains on its 1/N)."""
    steps: int = iterations_key(3)
    """AdamW steps checked against the single-process reference."""
    lr: float = bounded(1e-3, ge=0, le=100, why="past it SGD diverges")
    """AdamW learning rate."""
    bucket_cap_bytes: int = bytes_key(2 << 20)
    """distbench DDP's gradient bucket size. On 2 ranks of this 2-core host, 2 MiB measured
    best for the default GPT (5 MB of gradients): 1 MiB buckets pay more per-round latency,
    4–8 MiB leave too little to overlap (overlapped ÷ serial 0.96× vs 0.99–1.03×)."""
    warmup: int = iterations_key(2, ge=0)
    """Untimed steps per cell before the timed ones."""
    repeats: int = iterations_key(15)
    """Timed steps per cell; the median of the slowest rank's step is reported."""
    paired: bool = True
    """Time each fp32 distbench cell's torch twin in alternating steps (the speed ratio)."""
    timeout_s: float = cell_timeout(900.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""
    seed: int = seed_key(0)
    """Seeds the model's weights and the batch (the same on every rank)."""

    def __post_init__(self) -> None:
        if not isinstance(self.precision, list):
            self.precision = [self.precision]
        bad = [s for s in self.stages if isinstance(s, bool) or s not in METHOD_OF_STAGE]
        if bad or not self.stages:
            raise ValueError(f"stages={self.stages}: {bad} not a ZeRO stage; allowed: 0, 1, 2, 3")
        check_positive("world_sizes", self.world_sizes)
        check_choices("precision", self.precision, PRECISIONS)
        for precision in self.precision:
            check_precision(precision, self.loss_scale if precision == "fp16" else None)
        if self.methods:
            check_choices("methods", self.methods, EXTRA_METHODS)
        check_training(self, ("batch_size", "steps", "repeats", "bucket_cap_bytes"))
        uneven = [n for n in self.world_sizes if self.batch_size % n]
        if uneven:
            raise ValueError(
                f"world_sizes={uneven} do not divide batch_size={self.batch_size}: every rank "
                "trains on an equal share of the batch"
            )
        check_gpt_model(self.model)

    def rank_bytes(self) -> int:
        """An upper bound on what one rank holds: the unsharded model (N = 1) and its twin,
        on the whole batch."""
        return gpt_rank_bytes(check_gpt_model(self.model), self.batch_size)
