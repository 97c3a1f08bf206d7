"""Per-layer pricing against hand counts: GEMM FLOPs, element-wise bytes, TP collectives.

A failure means a layer's seconds or its communication no longer follow the formulas the
module docstring of `impls.simulator.costs` states (Megatron/Korthikanti counts).
"""

from __future__ import annotations

import pytest

from impls.costmodel.compute import TransformerSpec
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
    gqa = TransformerSpec(n_layers=2, d_model=64, n_heads=4, kv_heads=2, vocab_size=128,
                          seq_len=16)  # fmt: skip
    forward, backward = tp_collectives(gqa, B, 2, "ulysses", "bf16")
    # q and the output: T/t × h; k and v: T/t × h·k/a.
    expected = (("all_to_all", full / 2), ("all_to_all", full / 4), ("all_to_all", full / 4),
                ("all_to_all", full / 2))  # fmt: skip
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
