"""The activation model: `activation_bytes_per_layer` against Korthikanti et al. 2022
Table 2 by hand, and `activation_bytes` against what autograd saves.

A failure means a row of the paper's table (no parallelism, TP, TP + SP, selective and
full recomputation), its generalisation to a SwiGLU MLP or grouped-query attention, the
Ulysses split, the dtype scaling or a refusal changed, or that the implementation's exact
count disagrees with the tensors autograd keeps for backward.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from impls.costmodel.activations import activation_bytes, activation_bytes_per_layer
from impls.costmodel.compute import TransformerSpec
from impls.models import GPT, MLP, GPTConfig, MLPConfig

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
    spec = TransformerSpec(
        n_layers=1,
        d_model=16,
        n_heads=4,
        vocab_size=32,
        seq_len=8,
        d_ff=32,
        kv_heads=2,
        gated_mlp=True,
    )
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


def _saved_bytes(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """What autograd saves for backward in forward + loss, as a saved_tensors_hooks count:
    each storage once, the parameters, inputs and targets left out."""
    held = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held |= {inputs.untyped_storage().data_ptr(), targets.untyped_storage().data_ptr()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        type(model).loss(model(inputs), targets)
    return sum(seen.values())


GPT_CASES = [
    (GPTConfig(), 2, None),
    (GPTConfig(d_model=32, n_heads=2, n_layers=2, seq_len=16, vocab_size=64), 3, 16),
    (
        GPTConfig(
            d_model=24,
            n_heads=3,
            n_layers=3,
            seq_len=32,
            vocab_size=40,
            d_ff=40,
            bias=False,
            tie_embeddings=True,
        ),
        1,
        20,
    ),
]


@pytest.mark.parametrize("cfg, batch, seq_len", GPT_CASES)
def test_gpt_activation_model_matches_autograd(cfg, batch, seq_len) -> None:
    s = seq_len or cfg.seq_len
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, cfg.vocab_size, (batch, s), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (batch, s), generator=g)
    measured = _saved_bytes(GPT(cfg), inputs, targets)
    predicted = activation_bytes(cfg, batch, seq_len=seq_len)
    # The model leaves out one 4-byte fp32 scalar the loss saves (nll_loss's total weight);
    # every term that grows with the model or the batch must match to the byte.
    torch.testing.assert_close(predicted, measured, rtol=0, atol=4)


@pytest.mark.parametrize(
    "cfg", [MLPConfig(), MLPConfig(n_layers=1), MLPConfig(in_dim=5, hidden_dim=7, n_layers=3)]
)
def test_mlp_activation_model_matches_autograd(cfg) -> None:
    g = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(6, cfg.in_dim, generator=g), torch.randn(6, cfg.out_dim)
    measured = _saved_bytes(MLP(cfg), inputs, targets)
    # Exact: the ReLU outputs and the output are all the MLP and its MSE loss keep.
    torch.testing.assert_close(activation_bytes(cfg, 6), measured, rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, needles",
    [
        (lambda: activation_bytes(GPTConfig(), 0), ["micro_batch=0"]),
        (lambda: activation_bytes("gpt", 1), ["model=str", "GPTConfig, MLPConfig"]),
    ],
)
def test_activation_bytes_refusals_name_the_key(call, needles) -> None:
    with pytest.raises(ValueError) as error:
        call()
    for needle in needles:
        assert needle in str(error.value)


def test_flash_attention_keeps_no_s_squared_term():
    """FlashAttention (Dao et al. 2022; FlashAttention-2, arXiv 2307.08691): the 5as²b
    scores, softmax and dropout mask are gone, the fp32 log-sum-exp (4·a·s·b/t) is kept."""
    flash = replace(SMALL, attention="flash")
    assert activation_bytes_per_layer(flash, 2) == 34 * SBH + 4 * 4 * 8 * 2
    assert activation_bytes_per_layer(flash, 2, tp=2, sp="megatron_sp") == 17 * SBH + 4 * 4 * 8
    assert activation_bytes_per_layer(flash, 2, recompute="selective") == 34 * SBH
    assert activation_bytes_per_layer(flash, 2, recompute="full") == 2 * SBH
    # Doubling s at a fixed number of tokens (b halves) keeps flash's bytes, and doubling s
    # at a fixed b doubles them; the materialized core quadruples.
    long_ = replace(GPT3, seq_len=4096, attention="flash")
    short = replace(GPT3, attention="flash")
    per_token = activation_bytes_per_layer(short, 2, tp=8, sp="megatron_sp")
    assert activation_bytes_per_layer(long_, 1, tp=8, sp="megatron_sp") == per_token
    assert activation_bytes_per_layer(long_, 2, tp=8, sp="megatron_sp") == 2 * per_token
    core = activation_bytes_per_layer(GPT3, 1) - activation_bytes_per_layer(
        GPT3, 1, recompute="selective"
    )
    long_core = activation_bytes_per_layer(replace(GPT3, seq_len=4096), 1) - (
        activation_bytes_per_layer(replace(GPT3, seq_len=4096), 1, recompute="selective")
    )
    assert long_core == 4 * core
