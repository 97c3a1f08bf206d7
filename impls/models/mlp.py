"""A plain multi-layer perceptron: the simplest model to cut into pipeline stages.

`n_layers` Linear layers, each but the last followed by a ReLU:
`in_dim -> hidden_dim -> ... -> hidden_dim -> out_dim`. Its loss is the mean squared error
against real-valued targets of shape (b, out_dim): a regression needs no labels or vocab,
so synthetic batches are just two random tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from impls.models._checks import require_positive_ints

__all__ = ["MLP", "DenseLayer", "MLPConfig"]


@dataclass(kw_only=True)
class MLPConfig:
    """Shape of the MLP. Checked on construction; every error names the key and the rule."""

    in_dim: int = 32
    """Width of the input features."""
    hidden_dim: int = 64
    """Width of every hidden layer."""
    out_dim: int = 8
    """Width of the output (the regression target)."""
    n_layers: int = 4
    """Number of Linear layers (>= 1); the unit that pipeline stages are cut from."""
    bias: bool = True
    """Whether the Linear layers carry biases."""

    def __post_init__(self) -> None:
        require_positive_ints(
            "MLPConfig",
            in_dim=self.in_dim,
            hidden_dim=self.hidden_dim,
            out_dim=self.out_dim,
            n_layers=self.n_layers,
        )

    def layer_dims(self) -> list[tuple[int, int]]:
        """(fan_in, fan_out) of each Linear layer, first to last."""
        widths = [self.in_dim] + [self.hidden_dim] * (self.n_layers - 1) + [self.out_dim]
        return list(zip(widths[:-1], widths[1:], strict=True))


class DenseLayer(nn.Module):
    """One Linear layer, followed by a ReLU unless it is the network's last."""

    def __init__(self, fan_in: int, fan_out: int, *, relu: bool, bias: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(fan_in, fan_out, bias=bias)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)  # (b, fan_in) @ (fan_in, fan_out) -> (b, fan_out)
        return F.relu(y) if self.relu else y


class MLP(nn.Module):
    """`layers[0] -> ... -> layers[n_layers - 1]`; `forward(x) (b, in_dim) -> (b, out_dim)`.

    Weights come from an explicit generator (or `seed`), never the global RNG, so every rank
    builds identical weights; `generator`, when given, takes precedence and is advanced.
    """

    def __init__(
        self, cfg: MLPConfig, seed: int = 0, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        last = cfg.n_layers - 1
        with torch.device("meta"):  # no default init: every tensor is drawn below
            self.layers = nn.ModuleList(
                DenseLayer(fan_in, fan_out, relu=i < last, bias=cfg.bias)
                for i, (fan_in, fan_out) in enumerate(cfg.layer_dims())
            )
        self.to_empty(device="cpu")
        if generator is None:
            generator = torch.Generator().manual_seed(seed)
        self.init_weights(generator)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """He init (He et al., 2015): weights N(0, 2 / fan_in), which keeps activation variance
        steady through ReLUs; zero biases. Draws happen in layer order."""
        for layer in self.layers:
            fan_in = layer.linear.in_features
            nn.init.normal_(layer.linear.weight, 0.0, math.sqrt(2.0 / fan_in), generator=generator)
            if layer.linear.bias is not None:
                nn.init.zeros_(layer.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    @staticmethod
    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean squared error over every element: (b, out_dim), (b, out_dim) -> scalar."""
        return F.mse_loss(outputs, targets)
