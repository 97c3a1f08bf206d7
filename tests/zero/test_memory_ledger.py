"""The memory ledger counts exactly what it is told and exactly what autograd saves.

A failure here means a measured-memory figure is wrong at its source: a category that
drifts after alloc/free, a peak (or the breakdown at the peak) that misses the moment the
total was highest, activations counted twice when two saved tensors share a storage,
parameters or tracked buffers counted as activations, or activations that stay counted
after the backward that freed them.
"""

from __future__ import annotations

import gc

import pytest
import torch

from impls.memory import CATEGORIES, MemoryLedger
from impls.models import GPT, MLP, GPTConfig, MLPConfig


def test_peak_and_breakdown_at_peak() -> None:
    ledger = MemoryLedger()
    ledger.alloc("params", 100)
    ledger.alloc("gathered", 50)
    ledger.free("gathered", 50)
    ledger.alloc("buffers", 30)  # total 130 < 150: not a new peak
    snap = ledger.snapshot()
    assert snap["current"] == {**dict.fromkeys(CATEGORIES, 0), "params": 100, "buffers": 30}
    assert snap["total"] == 130
    assert snap["peak_total"] == 150
    assert snap["at_peak"] == {**dict.fromkeys(CATEGORIES, 0), "params": 100, "gathered": 50}
    assert snap["peak"]["gathered"] == 50 and snap["peak"]["buffers"] == 30
    ledger.reset_peak()
    assert ledger.snapshot()["peak_total"] == 130
    assert ledger.snapshot()["peak"]["gathered"] == 0
    assert "cuda_max_allocated" not in snap  # CPU ledger: no allocator to ask


def test_misuse_is_refused() -> None:
    ledger = MemoryLedger()
    with pytest.raises(ValueError, match="category='weights'.*params, grads"):
        ledger.alloc("weights", 1)
    with pytest.raises(ValueError, match="cannot free 5 bytes of 'optim': 0 are held"):
        ledger.free("optim", 5)
    t = torch.zeros(4)
    ledger.track("params", t)
    with pytest.raises(ValueError, match="already tracked as 'params'"):
        ledger.track("grads", t[1:])  # a view of the same storage
    ledger.untrack(t)
    with pytest.raises(ValueError, match="not tracked"):
        ledger.untrack(t)


def test_track_counts_the_whole_storage_once() -> None:
    ledger = MemoryLedger()
    flat = torch.zeros(10, dtype=torch.float16)
    ledger.track("grads", flat[2:5])  # a view: its storage is what is held
    assert ledger.current["grads"] == 20
    ledger.untrack(flat)
    assert ledger.current["grads"] == 0


def test_mlp_activations_match_a_hand_count_and_are_freed_by_backward() -> None:
    model = MLP(MLPConfig(in_dim=5, hidden_dim=7, out_dim=3, n_layers=3))
    x, b = torch.randn(4, 5), 4
    ledger = MemoryLedger()
    with ledger.saved_activations(exclude=model.parameters()):
        out = model(x)
    # Layer 0's linear saves its input x (no weight: x needs no gradient); each ReLU saves
    # its output, which the next linear saves again as its input (same storage, counted
    # once); the linears' transposed weights are parameter storage and not counted.
    hand_count = b * 5 * 4 + b * 7 * 4 + b * 7 * 4
    assert ledger.current["activations"] == hand_count
    out.sum().backward()
    gc.collect()
    assert ledger.current["activations"] == 0
    assert ledger.peak["activations"] == hand_count


def test_parameters_and_tracked_buffers_are_not_activations() -> None:
    ledger = MemoryLedger()
    weight = torch.nn.Parameter(torch.randn(3))
    buffer = ledger.track("buffers", torch.randn(3))
    x = torch.randn(3, requires_grad=True)
    with ledger.saved_activations():
        h = x.exp()  # saves its output h
        y = (h * weight) * buffer  # saves h again and weight, then only buffer
        z = (x * x).sum()  # saves x, twice
    assert ledger.current["activations"] == 3 * 4 + 3 * 4  # h and x, once each
    (y.sum() + z).backward()
    gc.collect()
    assert ledger.current["activations"] == 0
    assert ledger.current["buffers"] == 12


def test_gpt_activations_peak_then_drain() -> None:
    cfg = GPTConfig(vocab_size=29, seq_len=6, d_model=10, n_heads=2, n_layers=2)
    model = GPT(cfg)
    idx = torch.randint(0, 29, (2, 6))
    ledger = MemoryLedger()
    with ledger.saved_activations(exclude=model.parameters()):
        loss = GPT.loss(model(idx), idx)
    held = ledger.current["activations"]
    # At least the logits (b, s, V) in fp32 that cross-entropy keeps, at most a few dozen
    # (b, s, 4h)-sized tensors per block: counted, and counted once.
    assert 2 * 6 * 29 * 4 <= held < 2 * 50 * 2 * 6 * 40 * 4
    loss.backward()
    gc.collect()
    assert ledger.current["activations"] == 0
    assert ledger.snapshot()["peak"]["activations"] == held
