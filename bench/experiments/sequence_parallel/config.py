"""`sequence_parallel`'s typed config: every key, its default and its meaning.

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
from impls.models import GPTConfig

__all__ = ["METHODS", "SequenceParallelConfig"]

METHODS = ("megatron_sp", "ulysses", "ring_attention")


@dataclass(kw_only=True)
class SequenceParallelConfig:
    RANK_KEY: ClassVar[str] = "sp_degrees"
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("model", "seq_lens", "batch_size")

    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """Sequence-parallel methods: megatron_sp, ulysses, ring_attention."""
    sp_degrees: list[int] = ranks_key([1, 2, 4])
    """Degrees P (each a cell's world size)."""
    seq_lens: list[int] = bounded(
        [128, 255, 512, 1023, 2048], ge=1, le=2**20, why="a million tokens"
    )
    """Sequence lengths s; P need not divide them (chunks are end-padded: 255 and 1023
    divide by neither 2 nor 4)."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "d_model": 64,
            "n_heads": 4,
            "n_layers": 4,
            "bias": True,
            "vocab_size": 64,
        }
    )
    """`GPTConfig` keyword arguments of the block (no `seq_len`: that is `seq_lens`).
    Cells measure one block; `n_layers` is the depth the memory-budget figure assumes;
    Ulysses and Megatron-SP need P to divide `n_heads`."""
    batch_size: int = batch_key(2)
    """Sequences per cell's batch; every rank holds its chunk of each."""
    memory_budget_bytes: int = bounded(1 << 30, ge=1, le=2**50, why="a PiB")
    """Per-rank budget for the activations of `n_layers` blocks, for the longest-sequence
    figure (weights, gradients and optimizer state not included)."""
    warmup: int = iterations_key(2, ge=0)
    """Untimed forward + backward passes per cell before the timed ones."""
    repeats: int = iterations_key(7)
    """Timed forward + backward passes per cell; the median of the slowest rank's is kept."""
    timeout_s: float = cell_timeout(600.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""
    seed: int = seed_key(0)
    """Seeds the block's weights and the input (the same on every rank)."""

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_positive("sp_degrees", self.sp_degrees)
        check_positive("seq_lens", self.seq_lens)
        check_training(self, ("batch_size", "repeats", "memory_budget_bytes"))
        cfg = self._check_model()
        self._check_degrees(cfg)

    def rank_bytes(self) -> int:
        """An upper bound on what one rank holds: the block (P = 1) and the reference, on the
        longest sequence."""
        return gpt_rank_bytes(self._check_model(), self.batch_size)

    def _check_model(self) -> GPTConfig:
        if "seq_len" in self.model:
            raise ValueError(
                f"model.seq_len={self.model['seq_len']}: sequence lengths are the grid key "
                "seq_lens, not a model key"
            )
        if self.model.get("dropout", 0.0):
            raise ValueError(
                f"model.dropout={self.model['dropout']}: sequence-parallel attention runs "
                "without dropout (a random mask could not match the reference); allowed: 0.0"
            )
        return check_gpt_model(self.model, seq_len=max(self.seq_lens))

    def _check_degrees(self, cfg: GPTConfig) -> None:
        """P must split whole heads (Ulysses, Megatron-SP) and Megatron-SP's shards."""
        needs = {"ulysses": {"n_heads": cfg.n_heads}}
        needs["megatron_sp"] = {"n_heads": cfg.n_heads, "d_model": cfg.d_model, "d_ff": cfg.ff_dim}
        for method in self.methods:
            for key, size in needs.get(method, {}).items():
                bad = [p for p in self.sp_degrees if size % p]
                if bad:
                    allowed = [p for p in range(1, size + 1) if size % p == 0]
                    raise ValueError(
                        f"sp_degrees={bad} do not divide model.{key}={size}, which {method} "
                        f"splits over the P ranks; allowed sp_degrees: {allowed} (or drop "
                        f"{method} from methods; ring_attention takes any P)"
                    )
