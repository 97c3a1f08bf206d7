"""Adam and AdamW on flat fp32 segments: the optimizer whose state ZeRO shards.

Adam (Kingma & Ba, 2015, algorithm 1) keeps two fp32 moments per parameter, m and v:

    m ← β1·m + (1−β1)·g          v ← β2·v + (1−β2)·g²
    θ ← θ − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε)

Adam's weight decay is L2 regularisation (g ← g + λθ before the moments); AdamW
(Loshchilov & Hutter, 2019) decouples it (θ ← θ·(1 − lr·λ) before the update). With the
fp32 master copy of mixed precision that is the ZeRO paper's K = 12 bytes per parameter;
in plain fp32 the parameters are their own master copy and the state is 8 bytes.

The state is one contiguous buffer per moment, split into the segments the caller steps
(a rank's shard of each unit), so its bytes can be counted, and sharded, as one block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["OPTIMIZERS", "FlatAdam"]

OPTIMIZERS = ("adam", "adamw")


class FlatAdam:
    """Adam/AdamW over fixed-size 1-D fp32 segments, stepped together.

    `numels` are the segment lengths; `step(params, grads)` updates each `params[i]` in
    place from `grads[i]` (both fp32, `numels[i]` elements). The update matches
    `torch.optim.Adam` / `torch.optim.AdamW` elementwise.
    """

    def __init__(
        self,
        numels: Sequence[int],
        *,
        optimizer: str = "adam",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        device: torch.device | str = "cpu",
    ) -> None:
        if optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer={optimizer!r} is unknown; allowed values: {', '.join(OPTIMIZERS)}"
            )
        if not lr > 0:
            raise ValueError(f"lr={lr} must be > 0")
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas={betas} must be two values in [0, 1)")
        if not eps > 0 or weight_decay < 0:
            raise ValueError(f"eps={eps} must be > 0 and weight_decay={weight_decay} >= 0")
        self.decoupled = optimizer == "adamw"
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.numels = list(numels)
        total = sum(self.numels)
        self.exp_avg = torch.zeros(total, dtype=torch.float32, device=device)
        self.exp_avg_sq = torch.zeros(total, dtype=torch.float32, device=device)
        self._m = self.exp_avg.split(self.numels)
        self._v = self.exp_avg_sq.split(self.numels)
        self.steps = 0

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
        """One update of every segment; `grads` are read, never modified."""
        if [p.numel() for p in params] != self.numels or len(grads) != len(params):
            raise ValueError(f"params must be {len(self.numels)} segments of sizes {self.numels}")
        self.steps += 1
        beta1, beta2 = self.betas
        step_size = self.lr / (1 - beta1**self.steps)
        bias2_sqrt = math.sqrt(1 - beta2**self.steps)
        for param, grad, m, v in zip(params, grads, self._m, self._v, strict=True):
            if self.weight_decay and self.decoupled:
                param.mul_(1 - self.lr * self.weight_decay)
            elif self.weight_decay:
                grad = grad.add(param, alpha=self.weight_decay)
            m.lerp_(grad, 1 - beta1)  # m + (1-β1)(g - m) = β1·m + (1-β1)·g
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v.sqrt() / bias2_sqrt).add_(self.eps)
            param.addcdiv_(m, denom, value=-step_size)
