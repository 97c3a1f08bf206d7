"""`activation_recompute`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas or plotting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.config import (
    batch_key,
    bounded,
    cell_timeout,
    check_choice,
    check_choices,
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
from impls.models._checks import divisors
from impls.models.gpt import ATTENTION_MODES, RECOMPUTE_MODES

__all__ = ["DTYPES", "ActivationRecomputeConfig"]

DTYPES = ("bf16", "fp16", "fp32")


@dataclass(kw_only=True)
class ActivationRecomputeConfig:
    RANK_KEY: ClassVar[str] = "tp"
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("model", "seq_lens", "micro_batch")

    recompute: list[str] = field(default_factory=lambda: list(RECOMPUTE_MODES))
    """Recomputation modes: none, selective (the attention core's s² part), full."""
    tp: list[int] = ranks_key([1, 2])
    """Tensor-parallel degrees t (each a cell's world size)."""
    sp: list[bool] = field(default_factory=lambda: [False, True])
    """Megatron sequence parallelism off / on (on only where t > 1)."""
    seq_lens: list[int] = bounded([128, 256, 512], ge=1, le=2**20, why="a million tokens")
    """Sequence lengths s."""
    dtype: str = "bf16"
    """Activation dtype: bf16, fp16 (the paper's 2-byte activations) or fp32."""
    attention: str = "materialized"
    """materialized (explicit scores, softmax, dropout: the paper's s² tensors) or fused."""
    micro_batch: int = batch_key(2)
    """Sequences b per micro-batch."""
    model: dict[str, Any] = field(
        default_factory=lambda: {"d_model": 128, "n_heads": 8, "dropout": 0.1}
    )
    """`GPTConfig` keyword arguments of the layer (no seq_len, recompute or attention:
    those are grid keys)."""
    budget_bytes: int = bounded(1 << 22, ge=1, le=2**50, why="a PiB")
    """Saved-activation bytes per layer per rank for the longest-sequence search."""
    budget_max_seq_len: int = bounded(2048, ge=1, le=2**20, why="a million tokens")
    """Where that search stops (a probe's attention scores grow as s²: full recomputation
    keeps 2·s·b·h bytes, but its forward still computes them); reached means "at least"."""
    warmup: int = iterations_key(2, ge=0)
    """Untimed forward + backward passes per cell and side before the timed ones."""
    repeats: int = iterations_key(5)
    """Timed forward + backward passes per cell and side (mode, and none beside it)."""
    timeout_s: float = cell_timeout(600.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""
    seed: int = seed_key(0)
    """Seeds the layer's weights and the batch (the same on every rank)."""

    def __post_init__(self) -> None:
        check_choices("recompute", self.recompute, RECOMPUTE_MODES)
        check_unique("recompute", self.recompute)
        check_positive("tp", self.tp)
        check_unique("tp", self.tp)
        if not self.sp or any(not isinstance(v, bool) for v in self.sp):
            raise ValueError(f"sp={list(self.sp)}: a non-empty list of true / false")
        check_unique("sp", self.sp)
        check_positive("seq_lens", self.seq_lens)
        check_unique("seq_lens", self.seq_lens)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("attention", self.attention, ATTENTION_MODES)
        check_training(self, ("micro_batch", "repeats", "budget_bytes", "budget_max_seq_len"))
        cfg = self.gpt_config(max(self.seq_lens))
        for t in self.tp:
            for key, size in (("n_heads", cfg.n_heads), ("d_ff", cfg.ff_dim)):
                if size % t:
                    allowed = divisors(size)
                    raise ValueError(
                        f"tp={t} does not divide model.{key}={size}; allowed tp: {allowed}"
                    )
            bad = [s for s in self.seq_lens if True in self.sp and s % t]
            if bad:
                raise ValueError(
                    f"seq_lens={bad} are not divisible by tp={t}, which sequence "
                    "parallelism splits them by"
                )

    def gpt_config(self, seq_len: int, recompute: str = "none") -> GPTConfig:
        """The layer's `GPTConfig` at `seq_len` (one block), refusing grid keys in `model`."""
        for key in ("seq_len", "recompute", "attention", "n_layers"):
            if key in self.model:
                raise ValueError(
                    f"model.{key}={self.model[key]}: not a model key here "
                    "(seq_lens, recompute and attention are grid keys; one layer)"
                )
        return check_gpt_model(
            self.model, seq_len=seq_len, n_layers=1, recompute=recompute, attention=self.attention
        )

    def rank_bytes(self) -> int:
        """An upper bound on one rank: the layer and its twin at the longest sequence."""
        return gpt_rank_bytes(self.gpt_config(max(self.seq_lens)), 2 * self.micro_batch)
