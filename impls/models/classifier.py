"""A multi-layer perceptron classifier: the model of the digits task.

`in_dim -> hidden_dims... -> n_classes`, ReLU between layers, cross-entropy loss over
class logits. Built deterministically from a seed, so every rank holds identical weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from impls.models._checks import require_positive_ints

__all__ = ["Classifier"]


class Classifier(nn.Module):
    def __init__(
        self, in_dim: int, hidden_dims: tuple[int, ...], n_classes: int, *, seed: int = 0
    ) -> None:
        super().__init__()
        require_positive_ints(
            "Classifier",
            in_dim=in_dim,
            n_classes=n_classes,
            **{f"hidden_dims[{i}]": h for i, h in enumerate(hidden_dims)},
        )
        widths = [in_dim, *hidden_dims, n_classes]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(
                nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)

    @staticmethod
    def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
        return (logits.argmax(dim=-1) == targets).float().mean().item()
