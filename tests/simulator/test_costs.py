"""Per-layer pricing against hand counts: GEMM FLOPs, element-wise bytes, TP collectives.

A failure means a layer's seconds or its communication no longer follow the formulas the
module docstring of `impls.simulator.costs` states (Megatron/Korthikanti counts).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from impls.costmodel.compute import TransformerSpec
from impls.costmodel.presets import HARDWARE
from impls.simulator import ParallelPlan, layer_costs
from impls.simulator.costs import tp_collectives, transformer_price
from tests.simulator import TINY, flat_hardware

B, S, H, A, F = 2, 16, 64, 4, 256  # TINY's shape with micro-batch 2
T = B * S


def _gemm(flops: float) -> float:
    return flops / (1e14 * 0.5)  # flat_hardware: one efficiency, no overhead


def _bytes(nbytes: float) -> float:
    return nbytes / 1e12


def test_transformer_layer_by_hand():
    hw = flat_hardware()
    price = transformer_price(TINY, B, 1, "none", "none", hw, "bf16")
    weights = 2 * T * H * 3 * H + 2 * T * H * H + 2 * 2 * T * H * F  # qkv, out, two MLP
    core = 2 * 2 * B * A * S * S * (H // A)  # QKᵀ and ·V
    scores = B * A * S * S
    elementwise = 2 * (10 * T * H + 2 * T * F + 2 * scores) + 5 * (2 * T * H + scores)
    assert price.forward_s == pytest.approx(_gemm(weights + core) + _bytes(elementwise))
    assert price.weight_s == pytest.approx(_gemm(weights))
    assert price.input_s == pytest.approx(_gemm(weights + 2 * core) + _bytes(2 * elementwise))
    assert price.params == 3 * H * H + H * H + 2 * H * F + 4 * H
    assert price.tp_forward_s == price.tp_backward_s == 0


def test_recompute_adds_to_the_input_gradient_only():
    hw = flat_hardware()
    none = transformer_price(TINY, B, 1, "none", "none", hw, "bf16")
    full = transformer_price(TINY, B, 1, "none", "full", hw, "bf16")
    selective = transformer_price(TINY, B, 1, "none", "selective", hw, "bf16")
    assert full.input_s == pytest.approx(none.input_s + none.forward_s)
    scores = B * A * S * S
    core = _gemm(4 * B * A * S * S * (H // A)) + _bytes(2 * 2 * scores + 5 * scores)
    assert selective.input_s == pytest.approx(none.input_s + core)
    assert full.weight_s == selective.weight_s == none.weight_s


def test_tensor_parallel_shards_the_gemms_by_t():
    hw = flat_hardware()
    one = transformer_price(TINY, B, 1, "none", "none", hw, "bf16")
    four = transformer_price(TINY, B, 4, "none", "none", hw, "bf16")
    assert four.weight_s == pytest.approx(one.weight_s / 4)
    assert four.params == (one.params - 4 * H) / 4 + 4 * H


def test_megatron_two_all_reduces_each_way():
    """Korthikanti et al. 2022 §4.2.2: 2 all-reduces of b·s·h·bytes forward, 2 backward."""
    full = B * S * H * 2
    forward, backward = tp_collectives(TINY, B, 4, "none", "bf16")
    assert forward == backward == (("all_reduce", full),) * 2
    _, with_recompute = tp_collectives(TINY, B, 4, "none", "bf16", recompute="full")
    assert with_recompute == (("all_reduce", full),) * 4
    assert tp_collectives(TINY, B, 1, "none", "bf16") == ((), ())


def test_sequence_parallel_and_ulysses_collectives():
    full = B * S * H * 2
    forward, backward = tp_collectives(TINY, B, 4, "megatron_sp", "bf16")
    assert forward == backward == (("all_gather", full), ("reduce_scatter", full)) * 2
    gqa = TransformerSpec(n_layers=2, d_model=64, n_heads=4, kv_heads=2, vocab_size=128, seq_len=16)
    forward, backward = tp_collectives(gqa, B, 2, "ulysses", "bf16")
    # q and the output: T/t × h; k and v: T/t × h·k/a.
    expected = (
        ("all_to_all", full / 2),
        ("all_to_all", full / 4),
        ("all_to_all", full / 4),
        ("all_to_all", full / 2),
    )
    assert forward == backward == expected


def test_layer_costs_cover_embedding_layers_and_head():
    plan = ParallelPlan(dp=2, tp=2, pp=1, zero_stage=3, microbatch_size=B)
    costs = layer_costs(TINY, plan, flat_hardware())
    assert len(costs) == TINY.n_layers + 2
    embedding, layer, head = costs[0], costs[1], costs[-1]
    assert embedding.backward_input_s == 0  # nothing flows back past the embedding
    assert layer == costs[2]
    # ZeRO-3 over dp = 2: 16 bytes per parameter / 2, of the rank's tp shard.
    assert layer.state_bytes == pytest.approx(
        16 * ((3 * H * H + H * H + 2 * H * F) / 2 + 4 * H) / 2
    )
    assert head.state_bytes == pytest.approx(16 * (128 * H / 2 + 2 * H) / 2)
    # LayerNorm input and output (2 bytes each) and the fp32 softmax of T × V/t logits.
    assert head.activation_bytes == 2 * T * H + 2 * T * H + 4 * T * 128 / 2


def _flash_hardware(efficiency: tuple | None = ((1, 0.4, 0.25),)):
    """flat_hardware with FlashAttention at 40 % of peak forward, 25 % backward."""
    return replace(flat_hardware(), attention_efficiency=efficiency)


def test_flash_attention_core_by_hand():
    """FlashAttention-2 §4.1: the causal half of 4·b·a·s²·d at the forward fraction, 2.5 ×
    that at the backward fraction; no score bytes and 2 fewer element-wise kernels."""
    hw = _flash_hardware()
    flash = transformer_price(replace(TINY, attention="flash"), B, 1, "none", "none", hw, "bf16")
    weights = 2 * T * H * 3 * H + 2 * T * H * H + 2 * 2 * T * H * F
    computed = 4 * B * A * S * S * (H // A) / 2
    elementwise = 2 * (10 * T * H + 2 * T * F) + 5 * 2 * T * H
    forward_core = computed / (1e14 * 0.4)
    assert flash.forward_s == pytest.approx(_gemm(weights) + forward_core + _bytes(elementwise))
    backward_core = 2.5 * computed / (1e14 * 0.25)
    assert flash.input_s == pytest.approx(_gemm(weights) + backward_core + _bytes(2 * elementwise))
    assert flash.weight_s == pytest.approx(_gemm(weights))
    selective = transformer_price(
        replace(TINY, attention="flash"), B, 1, "none", "selective", hw, "bf16"
    )
    assert selective.input_s == pytest.approx(flash.input_s + forward_core)


def test_flash_without_a_benchmark_prices_its_computed_flops_as_gemms():
    flash = transformer_price(
        replace(TINY, attention="flash"), B, 1, "none", "none", _flash_hardware(None), "bf16"
    )
    materialized = transformer_price(TINY, B, 1, "none", "none", flat_hardware(), "bf16")
    scores = B * A * S * S
    core = 4 * B * A * S * S * (H // A)
    saved = _gemm(core / 2) + _bytes(2 * 2 * scores + 5 * scores)  # half the core, the bytes
    assert flash.forward_s == pytest.approx(materialized.forward_s - saved)


@pytest.mark.parametrize("hardware", ["a100_80gb", "h100_sxm"])
def test_flash_is_faster_than_materialized_at_long_sequences(hardware):
    hw = HARDWARE[hardware]
    for seq in (8192, 32768):
        spec = TransformerSpec(n_layers=32, d_model=4096, n_heads=32, vocab_size=32000, seq_len=seq)
        slow = transformer_price(spec, 1, 8, "megatron_sp", "none", hw, "bf16")
        fast = transformer_price(
            replace(spec, attention="flash"), 1, 8, "megatron_sp", "none", hw, "bf16"
        )
        assert fast.forward_s < slow.forward_s
        assert fast.input_s < slow.input_s
        assert fast.weight_s == slow.weight_s  # the weight GEMMs do not change


def test_fp8_is_refused_without_a_source_and_keeps_the_attention_core_16_bit():
    from impls.simulator import simulate

    hw = replace(flat_hardware(), peak_flops={"bf16": 1e14, "fp8": 2e14})
    with pytest.raises(ValueError, match="dtype='fp8'"):
        simulate(TINY, ParallelPlan(dp=1, tp=1, pp=1), hw, dtype="fp8")
    h100 = HARDWARE["h100_sxm"]
    spec = TransformerSpec(
        n_layers=1, d_model=4096, n_heads=32, vocab_size=32000, seq_len=4096, attention="flash"
    )
    fp8 = transformer_price(spec, 1, 1, "none", "none", h100, "fp8")
    bf16 = transformer_price(spec, 1, 1, "none", "none", h100, "bf16")
    assert fp8.forward_s < bf16.forward_s  # the weight GEMMs run at the fp8 rate
    core = h100.attention_seconds(4 * 32 * 4096 * 4096 * 128 / 2, 4096, "bf16", backward=False)
    weights = bf16.forward_s - core
    assert fp8.forward_s - core < weights  # and only they: the core is priced at bf16
