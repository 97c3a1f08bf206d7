"""Model presets: parameter counts against the sizes their papers state, and by hand."""

import pytest

from impls.costmodel.compute import TransformerSpec
from impls.costmodel.models import (
    CARDS,
    DP_MODELS,
    MODELS,
    card_params,
    data_parallel_model,
    model,
    param_count,
    rule_of_thumb_params,
)


def test_required_presets_exist():
    for name in ("gpt3_175b", "gpt3_1_3b", "llama2_7b", "llama2_70b", "small_gpt"):
        assert isinstance(model(name), TransformerSpec)
    assert set(MODELS) == set(CARDS)


def test_unknown_model_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"model='gpt5': unknown; choose one of .*gpt3_175b"):
        model("gpt5")
    with pytest.raises(ValueError, match=r"model='vgg': unknown; choose one of .*resnet50"):
        data_parallel_model("vgg")


def test_param_count_by_hand_small_gpt_style():
    """h = 4, f = 16, V = 10, s = 3, one layer, biases, untied, learned positions:
    weights 4·4·4 + 2·4·16 = 192; biases 4·4 + 16 + 4 = 36; two LayerNorms 16;
    token and LM-head tables 2·10·4 = 80; positions 12; final LayerNorm 8."""
    spec = TransformerSpec(n_layers=1, d_model=4, n_heads=2, vocab_size=10, seq_len=3)
    assert param_count(spec) == 192 + 36 + 16 + 80 + 12 + 8
    # Tied, no biases, no position table: 192 + 2·4 (norm scales) + 40 + 4 (final norm).
    assert param_count(spec, tied_embeddings=True, biases=False, learned_positions=False) == 244


def test_param_count_by_hand_gqa_swiglu():
    """h = 8, a = 4 heads, k = 2 kv heads, f = 12, SwiGLU, V = 5, no biases:
    q, o 2·64 + k, v 2·8·4 = 192; MLP 3·8·12 = 288; norms 16; tables 2·5·8 = 80; final 8."""
    spec = TransformerSpec(
        n_layers=1,
        d_model=8,
        n_heads=4,
        vocab_size=5,
        seq_len=7,
        d_ff=12,
        kv_heads=2,
        gated_mlp=True,
    )
    assert param_count(spec, biases=False, learned_positions=False) == 192 + 288 + 16 + 80 + 8


def test_rule_of_thumb_by_hand():
    spec = TransformerSpec(n_layers=2, d_model=4, n_heads=2, vocab_size=10, seq_len=3)
    assert rule_of_thumb_params(spec) == 12 * 2 * 16 + 40


@pytest.mark.parametrize(
    ("name", "stated", "rel"),
    [
        ("gpt3_175b", 175e9, 0.01),
        ("llama2_7b", 6.738e9, 0.001),  # 6,738,415,616 in the released checkpoint
        ("llama2_13b", 13.016e9, 0.001),
        ("llama2_70b", 68.977e9, 0.001),  # GQA: 8 kv heads
        ("megatron_1t", 1008.0e9, 0.001),
        ("megatron_529_6b", 529.6e9, 0.001),
        ("bloom_176b", 176.247e9, 0.001),
    ],
)
def test_exact_counts_match_the_papers(name, stated, rel):
    assert card_params(name) == pytest.approx(stated, rel=rel)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_preset_within_3_percent_of_its_stated_size(name):
    """3%: Narayanan et al. round 1.652B to "1.7B", the widest rounding among the presets."""
    assert card_params(name) == pytest.approx(CARDS[name].stated_params, rel=0.03)


def test_rule_of_thumb_is_close_for_gpt3_and_misses_gqa():
    assert rule_of_thumb_params(model("gpt3_175b")) == pytest.approx(175e9, rel=0.01)
    # 12lh² assumes k = a and f = 4h; Llama 2 70B has k = a/8 and a 3.5h SwiGLU MLP.
    assert rule_of_thumb_params(model("llama2_70b")) < 0.95 * card_params("llama2_70b")


def test_small_gpt_counts_equal_the_torch_model():
    torch_gpt = pytest.importorskip("impls.models.gpt")
    for name, extra in (("small_gpt", {}), ("small_gpt_8l", {"bias": False})):
        spec = model(name)
        cfg = torch_gpt.GPTConfig(
            d_model=spec.d_model,
            n_layers=spec.n_layers,
            n_heads=spec.n_heads,
            seq_len=spec.seq_len,
            vocab_size=spec.vocab_size,
            **extra,
        )
        built = sum(p.numel() for p in torch_gpt.GPT(cfg).parameters())
        assert card_params(name) == built == CARDS[name].stated_params


def test_small_gpt_matches_the_pipeline_experiment_defaults():
    config = pytest.importorskip("bench.experiments.pipeline_utilization.config")
    cfg = config.PipelineUtilizationConfig()
    spec = model("small_gpt")
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.seq_len, spec.vocab_size) == (
        cfg.n_layers,
        cfg.d_model,
        cfg.n_heads,
        cfg.seq_len,
        cfg.vocab_size,
    )


def test_data_parallel_models_by_hand():
    resnet = DP_MODELS["resnet50"]
    assert resnet.params == 25_557_032
    assert resnet.flops_per_sample == pytest.approx(3 * 2 * 4.09e9)  # 24.5 GFLOP per image
    tsm = DP_MODELS["tsm_resnet50"]
    assert tsm.flops_per_sample == pytest.approx(8 * resnet.flops_per_sample)
    assert tsm.params == 25_557_032 - 600 * 2049 == 24_327_632
