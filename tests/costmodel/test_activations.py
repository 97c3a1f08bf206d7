"""`activation_bytes_per_layer` against Korthikanti et al. 2022 Table 2 by hand.

A failure means a row of the paper's table (no parallelism, TP, TP + SP, selective and
full recomputation), its generalisation to a SwiGLU MLP or grouped-query attention, the
Ulysses split, the dtype scaling or a refusal changed.
"""

from __future__ import annotations

import pytest

from impls.costmodel.activations import activation_bytes_per_layer
from impls.costmodel.compute import TransformerSpec

# s = 8, h = 16, a = 4, b = 2: sbh = 256, as²b = 512
SMALL = TransformerSpec(n_layers=2, d_model=16, n_heads=4, vocab_size=32, seq_len=8)
SBH, AS2B = 256, 512
GPT3 = TransformerSpec(n_layers=96, d_model=12288, n_heads=96, vocab_size=51200, seq_len=2048)


@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "expected"),
    [
        (1, "none", "none", 34 * SBH + 5 * AS2B),  # sbh(34 + 5as/h)
        (2, "none", "none", (10 + 12) * SBH + 5 * AS2B / 2),  # sbh(10 + 24/t + 5as/ht)
        (2, "megatron_sp", "none", 17 * SBH + 5 * AS2B / 2),  # sbh(34/t + 5as/ht)
        (4, "ulysses", "none", 34 * SBH / 4 + 5 * AS2B / 4),  # Jacobs et al. §3
        (2, "none", "selective", (10 + 12) * SBH),  # sbh(10 + 24/t)
        (2, "megatron_sp", "selective", 17 * SBH),  # sbh·34/t
        (1, "none", "full", 2 * SBH),  # the layer's input
        (2, "none", "full", 2 * SBH),
        (2, "megatron_sp", "full", SBH),
    ],
)
def test_table_2_by_hand(tp, sp, recompute, expected):
    got = activation_bytes_per_layer(SMALL, 2, tp=tp, sp=sp, recompute=recompute)
    assert got == pytest.approx(expected)


def test_dtype_scales_the_two_byte_formula():
    two = activation_bytes_per_layer(SMALL, 2)
    assert activation_bytes_per_layer(SMALL, 2, dtype_bytes=4) == pytest.approx(2 * two)
    assert activation_bytes_per_layer(SMALL, 2, dtype_bytes=1) == pytest.approx(two / 2)


def test_gpt3_175b_per_layer():
    # §4.1: for GPT-3 5as/h = 5·96·2048/12288 = 80, so one layer without parallelism
    # keeps sbh(34 + 80) = 114 sbh; at t = 8 with SP and selective recompute, 34/8 sbh.
    sbh = 2048 * 12288
    assert activation_bytes_per_layer(GPT3, 1) == pytest.approx(114 * sbh)
    assert activation_bytes_per_layer(GPT3, 1, tp=8) == pytest.approx(23 * sbh)
    got = activation_bytes_per_layer(GPT3, 1, tp=8, sp="megatron_sp", recompute="selective")
    assert got == pytest.approx(4.25 * sbh)


def test_swiglu_and_grouped_query_generalise_the_24():
    # f = 32, gated: MLP sharded 6sbf = 6·8·2·32; k = 2 of 4 heads: K and V at half width.
    spec = TransformerSpec(n_layers=1, d_model=16, n_heads=4, vocab_size=32, seq_len=8,
                           d_ff=32, kv_heads=2, gated_mlp=True)  # fmt: skip
    sharded = (2 + 1 + 1 + 2) * SBH + 6 * 8 * 2 * 32
    expected = 10 * SBH + sharded + 5 * AS2B
    assert activation_bytes_per_layer(spec, 2) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 3}, "tp=3: must divide n_heads=4"),
        ({"sp": "ring"}, "sp='ring': unknown; allowed values: none, megatron_sp, ulysses"),
        ({"recompute": "half"}, "recompute='half': unknown"),
        ({"dtype_bytes": 0}, "dtype_bytes=0"),
    ],
)
def test_refusals_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        activation_bytes_per_layer(SMALL, 1, **kwargs)


def test_microbatch_must_be_positive():
    with pytest.raises(ValueError, match="microbatch"):
        activation_bytes_per_layer(SMALL, 0)
