"""The step FLOPs against hand computations and the published closed forms.

A failure here means a predicted step time, MFU or GPU-hour figure rests on a wrong FLOP
count: every later number in the simulator and planner would be off by the same factor.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from impls.costmodel.compute import TransformerSpec, hfu, layer_forward_flops, mfu, step_flops
from impls.models import GPTConfig

GPT3 = TransformerSpec(n_layers=96, d_model=12288, n_heads=96, vocab_size=51200, seq_len=2048)


def test_one_layer_by_hand():
    # b=2, s=3, h=4, f=16, a=k: q,k,v 2·6·4·12 = 576, output 2·6·16 = 192,
    # scores and values 4·2·9·4 = 288, MLP 2·6·4·16·2 = 1536.
    spec = TransformerSpec(n_layers=1, d_model=4, n_heads=2, vocab_size=5, seq_len=3)
    assert layer_forward_flops(spec, 2) == {"projections": 768, "attention": 288, "mlp": 1536}
    flops = step_flops(spec, 2)
    head = 2 * 6 * 4 * 5
    assert flops.forward == 768 + 288 + 1536 + head
    assert flops.model == flops.hardware == 3 * flops.forward


def test_megatron_closed_form_with_full_recomputation():
    """Narayanan et al. 2021: F = 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration."""
    b, s, n_l, h, v = 8, GPT3.seq_len, GPT3.n_layers, GPT3.d_model, GPT3.vocab_size
    closed = 96 * b * s * n_l * h**2 * (1 + s / (6 * h) + v / (16 * n_l * h))
    assert step_flops(GPT3, b, recompute="full").hardware == pytest.approx(closed, rel=1e-12)


def test_model_flops_are_about_six_n_per_token():
    """Kaplan et al. 2020: C ≈ 6N per token; the exact count adds attention's s² terms."""
    n = 12 * GPT3.n_layers * GPT3.d_model**2  # weights of the blocks
    per_token = step_flops(GPT3, 1).model / GPT3.seq_len
    attention = 12 * GPT3.n_layers * GPT3.seq_len * GPT3.d_model  # 3 × 4s h per token
    head = 6 * GPT3.d_model * GPT3.vocab_size
    assert per_token == pytest.approx(6 * n + attention + head, rel=1e-12)
    assert 1.0 < per_token / (6 * 175e9) < 1.1


def test_selective_recomputation_adds_the_attention_core_only():
    b = 4
    none, selective = step_flops(GPT3, b), step_flops(GPT3, b, recompute="selective")
    full = step_flops(GPT3, b, recompute="full")
    assert none.model == selective.model == full.model
    core = 4 * b * GPT3.seq_len**2 * GPT3.d_model * GPT3.n_layers
    assert selective.hardware - none.hardware == core
    # Relative to a layer's 72bsh²(1 + s/6h) that is s / (18h + 3s): under 1% for GPT-3's
    # s = 2048, h = 12288, where full recomputation costs a third more (the LM head aside).
    assert core / none.model == pytest.approx(2048 / (18 * 12288 + 3 * 2048), rel=0.01)
    assert full.hardware / none.hardware == pytest.approx(4 / 3, abs=0.01)


def test_grouped_query_attention_and_a_gated_mlp():
    h, a, k, f = 64, 8, 2, 172
    spec = TransformerSpec(
        n_layers=1,
        d_model=h,
        n_heads=a,
        vocab_size=10,
        seq_len=16,
        d_ff=f,
        kv_heads=k,
        gated_mlp=True,
    )
    parts = layer_forward_flops(spec, 1)
    assert parts["projections"] == 2 * 16 * h * (h + 2 * h * k // a) + 2 * 16 * h * h
    assert parts["mlp"] == 3 * 2 * 16 * h * f


def test_a_gpt_config_is_read_as_its_spec():
    spec = TransformerSpec.of(GPTConfig(d_model=32, n_heads=4, n_layers=2, d_ff=48))
    assert (spec.d_model, spec.ffn, spec.n_layers, spec.seq_len) == (32, 48, 2, 64)


def test_mfu_and_hfu():
    # 1 PFLOP of model work in 1 s on 8 devices of 250 TFLOP/s: 50%.
    assert mfu(1e15, 1.0, 8, 250e12) == pytest.approx(0.5)
    assert hfu(1.5e15, 1.0, 8, 250e12) == pytest.approx(0.75)


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"n_layers": 0}, "n_layers=0"),
        ({"n_heads": 5}, "n_heads=5 does not divide"),
        ({"kv_heads": 3}, "kv_heads=3"),
    ],
)
def test_bad_shapes_are_refused_naming_the_key(bad, needle):
    shape = {"n_layers": 2, "d_model": 64, "n_heads": 8, "vocab_size": 10, "seq_len": 8}
    with pytest.raises(ValueError, match=needle):
        TransformerSpec(**{**shape, **bad})


def test_unknown_recompute_mode_is_refused():
    with pytest.raises(ValueError, match="recompute='some'"):
        step_flops(GPT3, 1, recompute="some")


@pytest.mark.parametrize("value", ["Flash", "sdpa", None])
def test_attention_refuses_unknown_kernels_naming_the_key(value):
    with pytest.raises(ValueError, match=r"attention=.*materialized, flash"):
        TransformerSpec(n_layers=1, d_model=8, n_heads=2, vocab_size=8, seq_len=4, attention=value)


def test_flash_does_not_change_the_model_flops():
    """Megatron's convention (full s² terms) is kept whatever runs the core."""
    spec = TransformerSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=128, seq_len=256)
    flash = replace(spec, attention="flash")
    assert step_flops(flash, 2) == step_flops(spec, 2)
