"""Training tasks on real data (issue 6): what a data-parallel cell trains and scores.

- `digits`: scikit-learn's 8×8 digits, a 64-256-256-10 MLP classifier (85k parameters);
  accuracy on the 359 held-out images.
- `chargpt`: a character-level GPT (2 blocks, width 64, context 64) on Python's reference
  documentation (`pydoc_data.topics`); next-character accuracy on 32 fixed held-out
  windows.

Both train with SGD (momentum 0.9 unless the method carries its own momentum, as DGC
does) and a cosine learning-rate decay to zero over the run, so the final weights settle
and "final accuracy" is not one noisy checkpoint. The global batch of step t is the same
on every rank (`impls.datasets.Batches`); each rank trains on its contiguous shard.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from impls.datasets import Batches, char_corpus, digits
from impls.models import GPT, Classifier, GPTConfig

__all__ = ["TASKS", "Task", "build_task", "cosine"]

TASKS = ("digits", "chargpt")
DEFAULT_LR = {"digits": 0.05, "chargpt": 0.05}
DEFAULT_BATCH = {"digits": 64, "chargpt": 32}
CHAR_CFG = {"seq_len": 64, "d_model": 64, "n_heads": 4, "n_layers": 2}
EVAL_WINDOWS = 32


@dataclass
class Task:
    """One rank's model, loss, batches and held-out evaluation."""

    name: str
    model: nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batches: Batches
    eval_inputs: torch.Tensor
    eval_targets: torch.Tensor

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None = None) -> tuple[float, float]:
        """(held-out loss, held-out accuracy) of `model` (default: the task's)."""
        model = model if model is not None else self.model
        was_training = model.training
        model.eval()
        logits = model(self.eval_inputs).float()
        model.train(was_training)
        flat = logits.reshape(-1, logits.shape[-1])
        targets = self.eval_targets.reshape(-1)
        loss = F.cross_entropy(flat, targets).item()
        return loss, (flat.argmax(-1) == targets).float().mean().item()


def build_task(name: str, batch_size: int, seed: int) -> Task:
    """The task's model from `seed` (identical on every rank) and its data."""
    if name == "digits":
        data = digits()
        model = Classifier(data.n_features, (256, 256), data.n_classes, seed=seed)
        return Task(
            name,
            model,
            Classifier.loss,
            Batches(data, batch_size, seed=seed),
            data.x_test,
            data.y_test,
        )
    if name == "chargpt":
        corpus = char_corpus()
        cfg = GPTConfig(vocab_size=corpus.vocab_size, **CHAR_CFG)
        held_out = Batches(corpus.test, EVAL_WINDOWS, seq_len=cfg.seq_len, seed=12345)
        x, y = held_out(0)
        return Task(
            name,
            GPT(cfg, seed=seed),
            GPT.loss,
            Batches(corpus.train, batch_size, seq_len=cfg.seq_len, seed=seed),
            x,
            y,
        )
    raise ValueError(f"task={name!r} is unknown; allowed values: {', '.join(TASKS)}")


def cosine(steps: int) -> Callable[[int], float]:
    """The LR multiplier of step t: half a cosine from 1 down to 0 over `steps` steps."""
    return lambda t: 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps))
