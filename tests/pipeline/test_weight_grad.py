"""The zero-bubble split: I (one backward, weight GEMMs deferred) then W equals one B.

A failure means `I` + `W` trains a different model than a fused backward (a weight GEMM
lost, run twice, or against the wrong tensors), that `I` still computes the linear
layers' weight gradients (so the split saves nothing), that the store outlives its `W`,
or that a forward recomputed under activation checkpointing breaks the split.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from impls.models import GPT, GPTConfig, split_into_virtual_stages
from impls.pipeline.weight_grad import DeferWeightGrads, WeightGradSlot, reroute_linears

CONFIG = GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=4)


def _stage_run(stage: int, split: bool, recompute: str | None = None, config=CONFIG):
    """One stage of a 2-stage GPT forward and backward; (its grads, input grad, slot)."""
    model = GPT(config, seed=0)
    module = split_into_virtual_stages(model, 2, 1)[stage]
    g = torch.Generator().manual_seed(7)
    if stage == 0:
        inputs = torch.randint(0, 32, (2, 8), generator=g)
    else:
        inputs = torch.randn(2, 8, 16, generator=g).requires_grad_()
    targets = torch.randint(0, 32, (2, 8), generator=g)
    slot = WeightGradSlot()
    reroute_linears(module)
    with DeferWeightGrads(slot):
        if recompute is None:
            out = module(inputs)
        else:
            out = checkpoint(module, inputs, use_reentrant=recompute == "reentrant")
        loss = GPT.loss(out, targets) if stage == 1 else out.square().mean()
    slot.deferring = split
    stage_input = inputs if stage == 1 else None
    input_grad = slot.backward(loss, params=list(module.parameters()), stage_input=stage_input)
    linear_grads_after_i = [
        p.grad for n, p in module.named_parameters() if n.endswith("weight") and p.dim() == 2
    ]
    stored = len(slot.pending)
    slot.run()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    return grads, input_grad, slot, stored, linear_grads_after_i


@pytest.mark.parametrize("stage", [0, 1])
def test_i_then_w_equals_one_backward(stage: int) -> None:
    want, want_input, _, _, _ = _stage_run(stage, split=False)
    got, got_input, slot, stored, after_i = _stage_run(stage, split=True)
    assert stored > 0 and slot.pending == []  # W ran every stored GEMM and emptied the store
    # The embedding (2-D too) gets its gradient in I; every deferred linear weight has none.
    assert sum(g is None for g in after_i) == stored
    for name, grad in want.items():
        # Same GEMMs in the same float32 order: equal up to summation order, a few ulps.
        torch.testing.assert_close(got[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    if stage == 1:
        torch.testing.assert_close(got_input, want_input, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("recompute", ["non_reentrant", "reentrant"])
def test_split_survives_activation_checkpointing(recompute: str) -> None:
    want, want_input, _, _, _ = _stage_run(1, split=False)
    got, got_input, slot, _, _ = _stage_run(1, split=True, recompute=recompute)
    assert slot.pending == []
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    torch.testing.assert_close(got_input, want_input, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_split_equals_one_backward_under_the_models_recomputation(mode: str) -> None:
    """GPTConfig.recompute checkpoints (non-reentrant) inside the stage: selective leaves
    the linears outside the checkpoint, full puts them inside, where the recomputation in
    I takes the same rerouted path: every GEMM is deferred either way. Both must train the
    same model as a fused backward."""
    config = GPTConfig(**{**CONFIG.__dict__, "recompute": mode})
    want, want_input, _, _, _ = _stage_run(1, split=False, config=config)
    got, got_input, slot, stored, _ = _stage_run(1, split=True, config=config)
    # Stage 1 of 4 blocks: 2 blocks × 6 linears + the LM head (outside every checkpoint).
    assert slot.pending == [] and stored == 13
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    torch.testing.assert_close(got_input, want_input, rtol=1e-6, atol=1e-7)


def test_captured_linears_stay_autograds_own_and_skip_grad_w_in_i() -> None:
    """Without recomputation the forward is autograd's own F.linear (no Python Function
    per linear: F costs what 1F1B's F costs) and I leaves every linear weight without a
    gradient; a weight shared with an embedding goes through the Function, whole."""
    model = GPT(CONFIG, seed=0)
    module = split_into_virtual_stages(model, 2, 1)[1]
    reroute_linears(module)
    slot = WeightGradSlot()
    x = torch.randn(2, 8, 16).requires_grad_()
    with DeferWeightGrads(slot):
        out = module(x)
    nodes = {type(node).__name__ for _, _, node, _ in slot.captured}
    assert slot.captured and not any("Deferring" in n for n in nodes), nodes
    slot.deferring = True
    grad_x = slot.backward(out.square().mean(), params=list(module.parameters()), stage_input=x)
    assert grad_x is not None and x.grad is None  # returned, not accumulated
    assert slot.captured == [] and len(slot.pending) == 13  # 2 blocks x 6 linears + head
    assert all(w.grad is None for w, _, _ in slot.pending)


def test_a_weight_shared_with_an_embedding_keeps_both_parts() -> None:
    """A tied LM head (one Parameter in the embedding and in an nn.Linear) gets the
    embedding's part in I and the head's GEMM in W: the sum equals a fused backward."""

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(32, 16)
            self.mid = torch.nn.Linear(16, 16)
            self.head = torch.nn.Linear(16, 32, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, idx):
            return self.head(torch.tanh(self.mid(self.embed(idx))))

    idx = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(3))
    grads = []
    for split in (False, True):
        module = Tied()
        assert reroute_linears(module) == 2
        slot = WeightGradSlot()
        with DeferWeightGrads(slot):
            loss = module(idx).square().mean()
        slot.deferring = split
        slot.backward(loss, params=list(module.parameters()))
        assert len(slot.pending) == (2 if split else 0)
        slot.run()
        grads.append({n: p.grad.clone() for n, p in module.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-6, atol=1e-7, msg=name)
