"""fp16 with loss scaling and fp32 master weights, and bf16, train like fp32.

A failure here means low-precision training no longer tracks the fp32 run: gradients
underflow (the loss scale is not applied or not undone), updates are lost (the master
copy is not what the optimizer steps), or the rounded weights never reach the model.
The first test shows the problem loss scaling exists for: the same fp16 run without a
scale flushes most gradients to zero and drifts away from fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from impls.models import MLP, MLPConfig
from impls.precision import (
    DynamicLossScaler,
    MasterWeights,
    StaticLossScaler,
    compute_dtype,
)

CFG = MLPConfig(in_dim=16, hidden_dim=32, out_dim=8, n_layers=3)
STEPS = 10
# The loss is multiplied by 2^-20 so that its gradients (~1e-2 for an MSE on this MLP)
# fall to ~1e-8, below fp16's smallest subnormal 2^-24 ≈ 6e-8. The learning rate is
# multiplied by 2^20 to compensate, so the fp32 run trains exactly as on the plain MSE.
TINY = 2.0**-20
LR = 0.05 / TINY


@dataclass
class Run:
    losses: torch.Tensor  # per step, divided by TINY
    weights: torch.Tensor  # final fp32 master weights, flat
    zero_grad_fraction: float  # of the first step's fp32 gradients (after unscaling)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randn(32, 16, generator=g), torch.randn(32, 8, generator=g)) for _ in range(STEPS)
    ]


def _train(precision: str, scaler: DynamicLossScaler | StaticLossScaler | None) -> Run:
    """The mixed-precision recipe of `impls.precision`'s docstring, one process."""
    dtype = compute_dtype(precision)
    model = MLP(CFG, seed=0).to(dtype)
    master = MasterWeights(list(model.parameters()))
    optimizer = torch.optim.SGD(master.master_params, lr=LR)
    losses, zero_fraction = [], []
    for x, y in _batches():
        loss = TINY * F.mse_loss(model(x.to(dtype)).float(), y)
        losses.append(loss.item() / TINY)
        (scaler.scale_loss(loss) if scaler else loss).backward()
        grads = master.master_grads_from_model()
        found_inf = scaler.unscale_([grads]) if scaler else False
        zero_fraction.append((grads == 0).float().mean().item())
        if scaler is None or scaler.update(found_inf):
            optimizer.step()
            master.copy_to_model()
        model.zero_grad(set_to_none=True)
    return Run(torch.tensor(losses), master.master.clone(), zero_fraction[0])


def test_fp16_without_loss_scaling_loses_its_gradients() -> None:
    reference, unscaled = _train("fp32", None), _train("fp16", None)
    # A ReLU MLP has a few exact zeros in fp32 (dead units); fp16 flushes most of the rest.
    assert reference.zero_grad_fraction < 0.05
    assert unscaled.zero_grad_fraction > 0.5
    drift = ((unscaled.losses - reference.losses) / reference.losses).abs().max()
    assert drift > 0.1, f"unscaled fp16 should drift from fp32, drifted only {drift:.3g}"


def test_fp16_with_dynamic_loss_scaling_tracks_fp32() -> None:
    reference = _train("fp32", None)
    scaler = DynamicLossScaler()
    run = _train("fp16", scaler)
    assert run.zero_grad_fraction == reference.zero_grad_fraction
    assert scaler.skipped_steps == 0
    # fp16 rounds weights and activations at 2^-11 ≈ 4.9e-4 relative; measured ≤ 2e-4 on
    # the loss and ≤ 6e-4 absolute on weights of size ~0.3 over 10 steps: 10x margin.
    torch.testing.assert_close(run.losses, reference.losses, rtol=2e-3, atol=0)
    torch.testing.assert_close(run.weights, reference.weights, rtol=0, atol=6e-3)


def test_fp16_with_a_static_loss_scale_tracks_fp32() -> None:
    reference, run = _train("fp32", None), _train("fp16", StaticLossScaler(2.0**15))
    # Same rounding as the dynamic case (the scale only moves the exponent).
    torch.testing.assert_close(run.losses, reference.losses, rtol=2e-3, atol=0)
    torch.testing.assert_close(run.weights, reference.weights, rtol=0, atol=6e-3)


def test_bf16_needs_no_loss_scale_and_tracks_fp32() -> None:
    reference, run = _train("fp32", None), _train("bf16", None)
    # bf16 has float32's exponent range: the tiny gradients survive unscaled.
    assert run.zero_grad_fraction == reference.zero_grad_fraction
    # bf16 rounds at 2^-8 ≈ 3.9e-3 relative; measured ≤ 2.3e-3 on the loss and ≤ 3e-3
    # absolute on the weights over 10 steps; the bounds leave about 10x margin.
    torch.testing.assert_close(run.losses, reference.losses, rtol=2e-2, atol=0)
    torch.testing.assert_close(run.weights, reference.weights, rtol=0, atol=3e-2)


def test_master_weights_keep_updates_fp16_would_round_away() -> None:
    """An update of 1e-4 on a weight of 1.0 is below fp16's half-ulp there (2^-11 ≈ 4.9e-4):
    applied to the fp16 weight it vanishes; the fp32 master accumulates ten of them."""
    one = torch.tensor([1.0], dtype=torch.float16)
    assert torch.equal(one - 1e-4, one)  # the update a pure-fp16 optimizer would make
    model = torch.nn.Linear(1, 1, bias=False).half()
    with torch.no_grad():
        model.weight.fill_(1.0)
    master = MasterWeights(list(model.parameters()))
    optimizer = torch.optim.SGD(master.master_params, lr=1e-4)
    for _ in range(10):
        model.weight.grad = torch.ones_like(model.weight)
        master.master_grads_from_model()
        optimizer.step()
        master.copy_to_model()
    # 1 - 10 * 1e-4 in fp32 (float32 rounding only); fp16 rounds it to its grid (ulp 4.9e-4).
    torch.testing.assert_close(master.master, torch.tensor([0.999]), rtol=0, atol=1e-6)
    assert model.weight.item() == torch.tensor(0.999, dtype=torch.float16).item() != 1.0


def test_master_grads_read_missing_gradients_as_zero() -> None:
    model = torch.nn.Linear(2, 2).half()
    master = MasterWeights(list(model.parameters()))
    model.weight.grad = torch.full_like(model.weight, 3.0)
    grads = master.master_grads_from_model()
    assert grads.dtype == torch.float32
    torch.testing.assert_close(grads, torch.tensor([3.0] * 4 + [0.0] * 2), rtol=0, atol=0)
    # The optimizer's gradients are views of the same buffer.
    assert master.master_params[0].grad.data_ptr() == grads.data_ptr()
