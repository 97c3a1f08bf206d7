"""An fp32 master copy of a low-precision model, the core of mixed-precision training.

Micikevicius et al. (2018), "Mixed Precision Training": forward and backward run in fp16
(or bf16), but the optimizer updates an fp32 copy of the weights. An update lr·g is often
below half an fp16 ulp of the weight it is added to and would be lost; in fp32 it
accumulates, and the model receives the rounded result after every step.

The copy is one flat fp32 buffer (`master`), which is what ZeRO shards; `master_params`
are per-parameter views of it, shaped like the model's, for a torch.optim optimizer, and
their `.grad`s are views of one flat fp32 gradient buffer (`grads`).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MasterWeights"]


class MasterWeights:
    """fp32 master copy of low-precision model parameters (mixed-precision training)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        params = list(params)
        if not params:
            raise ValueError("params is empty: MasterWeights needs at least one parameter")
        self.params = params
        self.numels = [p.numel() for p in params]
        with torch.no_grad():
            self.master = torch.cat([p.detach().reshape(-1).float() for p in params])
        self.grads = torch.zeros_like(self.master)
        self.master_params: list[nn.Parameter] = []
        for p, value, grad in zip(
            params, self.master.split(self.numels), self.grads.split(self.numels), strict=True
        ):
            # nn.Parameter shares `value`'s storage, so the optimizer updates `master` itself.
            master_param = nn.Parameter(value.view_as(p))
            master_param.grad = grad.view_as(p)
            self.master_params.append(master_param)

    def master_grads_from_model(self) -> torch.Tensor:
        """The model's gradients as one flat fp32 tensor (`grads`; a missing .grad reads 0).

        Returned by reference: the optimizer over `master_params` reads the same memory,
        so unscaling this tensor in place unscales what the optimizer steps with.
        """
        with torch.no_grad():
            for p, grad in zip(self.params, self.grads.split(self.numels), strict=True):
                if p.grad is None:
                    grad.zero_()
                else:
                    grad.copy_(p.grad.reshape(-1))
        return self.grads

    def copy_to_model(self) -> None:
        """Round the fp32 master weights into the model's (low-precision) parameters."""
        with torch.no_grad():
            for p, value in zip(self.params, self.master.split(self.numels), strict=True):
                p.copy_(value.view_as(p))
