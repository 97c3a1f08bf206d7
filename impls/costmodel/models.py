"""Model presets for the cost model: transformer shapes from their papers, and the
data-parallel image / video models of the lecture's examples.

`MODELS[name]` is the `TransformerSpec` the FLOP and memory formulas take; `CARDS[name]`
adds what the spec does not carry (the size the paper states, its citation, and the
layout details the parameter count depends on: tied embeddings, biases, learned position
embeddings). `param_count(spec, ...)` counts every weight:

    per layer   h·h·(2 + 2k/a)        q and o projections, k and v (k of a heads, GQA)
              + m·h·f                 MLP, m = 2 matrices (GELU) or 3 (SwiGLU)
              + biases and norms      see `_layer_extras`
    once        V·h (+ V·h for an untied LM head) + s·h (learned positions) + final norm

With f = 4h, k = a and no biases the layer is 12h², the rule of thumb P ≈ 12·l·h² + V·h
(Narayanan et al. 2021, SC'21, §5.1: P = 12lh²(1 + 13/12h + (V + s)/12lh))."""

from __future__ import annotations

from dataclasses import dataclass

from impls.costmodel.compute import TransformerSpec

__all__ = [
    "CARDS",
    "DP_MODELS",
    "MODELS",
    "DataParallelModel",
    "ModelCard",
    "data_parallel_model",
    "card_params",
    "model",
    "param_count",
    "rule_of_thumb_params",
]


@dataclass(frozen=True, kw_only=True)
class ModelCard:
    """A preset's spec with the facts its parameter count and citation need."""

    spec: TransformerSpec
    stated_params: float
    """The size the source states (e.g. 175e9); rounded as the source rounds it."""
    source: str
    tied_embeddings: bool = False
    """LM head shares the token-embedding matrix (GPT-2/GPT-3, Megatron GPT, BLOOM)."""
    biases: bool = True
    """Linear layers carry biases and norms are LayerNorm (weight and bias)."""
    learned_positions: bool = True
    """A learned s × h position table (False: rotary or ALiBi, no parameters)."""


def _gpt(layers: int, width: int, heads: int, vocab: int, seq: int) -> TransformerSpec:
    return TransformerSpec(
        n_layers=layers, d_model=width, n_heads=heads, vocab_size=vocab, seq_len=seq
    )


def _llama(
    layers: int,
    width: int,
    heads: int,
    d_ff: int,
    seq: int,
    kv_heads: int | None = None,
    vocab: int = 32000,
) -> TransformerSpec:
    """A Llama-style spec with memory-efficient (flash) attention, as LLaMA was trained:
    Touvron et al. 2023 (arXiv 2302.13971) §2.4, xformers' causal attention that stores no
    attention weights and uses the backward of Dao et al. 2022 (FlashAttention)."""
    return TransformerSpec(
        n_layers=layers,
        d_model=width,
        n_heads=heads,
        vocab_size=vocab,
        seq_len=seq,
        d_ff=d_ff,
        kv_heads=kv_heads,
        gated_mlp=True,
        attention="flash",
    )


_NARAYANAN = "Narayanan et al. 2021 (SC'21, arXiv 2104.04473), Table 1; V = 51200, s = 2048"
_KORTHIKANTI = "Korthikanti et al. 2022 (arXiv 2205.05198), Table 3; V = 51200, s = 2048"
_LLAMA2 = "Touvron et al. 2023, Llama 2 (arXiv 2307.09288), Table 1 and §2.2; d_ff from the \
released params.json / HF config"


def _megatron(layers: int, width: int, heads: int, stated: float, source: str) -> ModelCard:
    return ModelCard(
        spec=_gpt(layers, width, heads, 51200, 2048),
        stated_params=stated,
        source=source,
        tied_embeddings=True,
    )


def _llama_card(spec: TransformerSpec, stated: float, source: str) -> ModelCard:
    return ModelCard(
        spec=spec, stated_params=stated, source=source, biases=False, learned_positions=False
    )


CARDS: dict[str, ModelCard] = {
    # Brown et al. 2020 (arXiv 2005.14165), Table 2.1; GPT-2 style, tied embeddings.
    "gpt3_175b": ModelCard(
        spec=_gpt(96, 12288, 96, 50257, 2048),
        stated_params=175e9,
        source="Brown et al. 2020, GPT-3, Table 2.1 (GPT-3 175B)",
        tied_embeddings=True,
    ),
    # Table 2.1 lists GPT-3 XL with 24 heads *and* d_head = 128, which cannot both hold at
    # d_model = 2048; we keep d_head = 128, i.e. 16 heads (the FLOPs do not depend on it).
    "gpt3_1_3b": ModelCard(
        spec=_gpt(24, 2048, 16, 50257, 2048),
        stated_params=1.3e9,
        source="Brown et al. 2020, GPT-3, Table 2.1 (GPT-3 XL; 16 heads of "
        "d_head 128, the table's '24 heads' contradicts d_model 2048)",
        tied_embeddings=True,
    ),
    "llama2_7b": _llama_card(_llama(32, 4096, 32, 11008, 4096), 6.74e9, _LLAMA2),
    "llama2_13b": _llama_card(_llama(40, 5120, 40, 13824, 4096), 13.0e9, _LLAMA2),
    # 8 key/value heads (grouped-query attention, Llama 2 §2.2 / Table 1: GQA for 70B).
    "llama2_70b": _llama_card(_llama(80, 8192, 64, 28672, 4096, kv_heads=8), 68.98e9, _LLAMA2),
    # Megatron-LM's weak-scaling family (Narayanan et al. 2021, Table 1).
    "megatron_1_7b": _megatron(24, 2304, 24, 1.7e9, _NARAYANAN),
    "megatron_3_6b": _megatron(30, 3072, 32, 3.6e9, _NARAYANAN),
    "megatron_7_5b": _megatron(36, 4096, 32, 7.5e9, _NARAYANAN),
    "megatron_18_4b": _megatron(40, 6144, 48, 18.4e9, _NARAYANAN),
    "megatron_39_1b": _megatron(48, 8192, 64, 39.1e9, _NARAYANAN),
    "megatron_76_1b": _megatron(60, 10240, 80, 76.1e9, _NARAYANAN),
    "megatron_145_6b": _megatron(80, 12288, 96, 145.6e9, _NARAYANAN),
    "megatron_310_1b": _megatron(96, 16384, 128, 310.1e9, _NARAYANAN),
    "megatron_529_6b": _megatron(105, 20480, 128, 529.6e9, _NARAYANAN),
    "megatron_1t": _megatron(128, 25600, 160, 1008.0e9, _NARAYANAN),
    # Korthikanti et al. 2022 benchmark models (the Megatron-LM README's MFU/HFU table).
    "megatron_22b": _megatron(48, 6144, 64, 22e9, _KORTHIKANTI),
    "megatron_gpt_175b": _megatron(96, 12288, 96, 175e9, _KORTHIKANTI),
    # MT-NLG 530B (Smith et al. 2022, arXiv 2201.11990, §2.1/Table: 105 layers, h = 20480,
    # 128 heads, s = 2048) is the same shape as Narayanan's 529.6B model.
    "mt_nlg_530b": _megatron(
        105, 20480, 128, 530e9, "Smith et al. 2022, MT-NLG (arXiv 2201.11990), §2.1"
    ),
    # BigScience BLOOM: 70 layers, h = 14336, 112 heads, s = 2048, V = 250680, ALiBi (no
    # position table), tied embeddings (Le Scao et al. 2022, arXiv 2211.05100, Table 3;
    # bigscience-workshop/bigscience train/tr11-176B-ml/README.md). Stated: 176,247M.
    "bloom_176b": ModelCard(
        spec=_gpt(70, 14336, 112, 250680, 2048),
        stated_params=176.247e9,
        source="Le Scao et al. 2022, BLOOM, Table 3; bigscience tr11-176B-ml README",
        tied_embeddings=True,
        learned_positions=False,
    ),
    # This repo's GPT (impls/models/gpt.py, GPTConfig): biases on, untied LM head, learned
    # positions. `small_gpt` is the 16-block model of the pipeline_utilization experiment
    # (bench/experiments/pipeline_utilization/config.py defaults); `small_gpt_8l` the
    # parallelism_comparison model (its config.py default `model`, bias=False).
    "small_gpt": ModelCard(
        spec=_gpt(16, 128, 4, 64, 64),
        stated_params=3_197_184,
        source="bench/experiments/pipeline_utilization/config.py defaults; "
        "GPT(GPTConfig(...)) has 3,197,184 parameters",
    ),
    "small_gpt_8l": ModelCard(
        spec=_gpt(8, 128, 8, 256, 64),
        stated_params=1_648_768,
        source="bench/experiments/parallelism_comparison/config.py "
        "default model (bias=False); GPT(...) has 1,648,768 parameters",
        biases=False,
    ),
    # MPT as llm-foundry benchmarks it (mosaicml/llm-foundry scripts/train/yamls/pretrain/
    # mpt-7b.yaml, mpt-70b.yaml: d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368,
    # attn_impl flash; MPT's defaults: biases on, learned positions, tied LM head). Not the
    # released MPT-7B (ALiBi, no biases): the benchmark table's NumParams column at seq 2048
    # equals this count exactly, position table included.
    "llm_foundry_mpt_7b": ModelCard(
        spec=_gpt(32, 4096, 32, 50368, 2048),
        stated_params=6_658_859_008,
        source="mosaicml/llm-foundry scripts/train/benchmarking/README.md, NumParams of the "
        "7b rows at SeqLen 2048; shape from scripts/train/yamls/pretrain/mpt-7b.yaml",
        tied_embeddings=True,
    ),
    "llm_foundry_mpt_70b": ModelCard(
        spec=_gpt(80, 8192, 64, 50368, 2048),
        stated_params=64_862_437_376,
        source="mosaicml/llm-foundry scripts/train/benchmarking/README.md, NumParams of the "
        "70b rows; shape from scripts/train/yamls/pretrain/mpt-70b.yaml",
        tied_embeddings=True,
    ),
    # Llama 3 70B as torchtitan builds it (torchtitan/models/llama/__init__.py at 157a12c,
    # llama3_configs["70B"]: dim 8192, 80 layers, 64 heads, 8 kv heads, ffn_dim_multiplier
    # 1.3 and multiple_of 4096 -> d_ff 28672), untied, V = 128256 (the Llama 3 tokenizer):
    # 70,553,706,496 parameters, the count that reproduces torchtitan's stated MFU
    # (tests/costmodel/test_published.py); "70B" in the model's name.
    "llama3_70b": _llama_card(
        _llama(80, 8192, 64, 28672, 8192, kv_heads=8, vocab=128256),
        70e9,
        "pytorch/torchtitan torchtitan/models/llama/__init__.py llama3_configs['70B'] "
        "(commit 157a12c); vocabulary 128,256",
    ),
    # Llama 3 8B: the same family at 32 layers, h = 4096, 32 heads, 8 kv heads, SwiGLU 14336
    # (torchtitan llama3_configs["8B"]: ffn_dim_multiplier 1.3, multiple_of 1024), untied,
    # V = 128256: 8,030,261,248 parameters; "8B" in the model's name. NeMo's model TFLOP/s
    # for LLAMA3-8B equals its tokens/s times this shape's FLOPs per token.
    "llama3_8b": _llama_card(
        _llama(32, 4096, 32, 14336, 8192, kv_heads=8, vocab=128256),
        8e9,
        "pytorch/torchtitan torchtitan/models/llama/__init__.py llama3_configs['8B'] "
        "(commit 157a12c); vocabulary 128,256",
    ),
    # IBM's Llama 2 34B shape in foundation-model-stack/fms-fsdp (fms_fsdp/utils/
    # config_utils.py, variant "34b": emb_dim 8192, 64 heads, 8 kv heads, 48 layers, hidden
    # 22016, vocab 32000; seq 4096, the train config's default): "34b" in fms-fsdp's table.
    "llama2_34b": _llama_card(
        _llama(48, 8192, 64, 22016, 4096, kv_heads=8),
        34e9,
        "foundation-model-stack/fms-fsdp fms_fsdp/utils/config_utils.py, model_variant "
        "'34b' (commit 5e522b4)",
    ),
    # TinyLlama 1.1B: 22 layers, h = 2048, 32 heads, 4 query groups, SwiGLU 5632, V = 32000,
    # s = 2048 (jzhang38/TinyLlama README, model table; lit_gpt/config.py tiny_LLaMA_1b).
    "tinyllama_1_1b": _llama_card(
        _llama(22, 2048, 32, 5632, 2048, kv_heads=4),
        1.1e9,
        "jzhang38/TinyLlama README ('Layers: 22, Heads: 32, Query Groups: 4, Embedding "
        "Size: 2048, Intermediate Size (Swiglu): 5632'); lit_gpt/config.py tiny_LLaMA_1b",
    ),
}

MODELS: dict[str, TransformerSpec] = {name: card.spec for name, card in CARDS.items()}


def _choices(names) -> str:
    return ", ".join(sorted(names))


def model(name: str) -> TransformerSpec:
    """The preset `name` (a key of `MODELS`)."""
    if name not in MODELS:
        raise ValueError(f"model={name!r}: unknown; choose one of {_choices(MODELS)}")
    return MODELS[name]


def _layer_extras(spec: TransformerSpec, biases: bool) -> int:
    """Bias and norm parameters of one block: with biases, q/k/v/o biases h·(2 + 2k/a),
    MLP biases f·(m − 1) + h, and two LayerNorms (4h); without, two scale-only norms (2h)."""
    h = spec.d_model
    if not biases:
        return 2 * h
    kv = round(h * spec.kv_fraction)
    mlp_in = spec.ffn * (2 if spec.gated_mlp else 1)
    return 2 * h + 2 * kv + mlp_in + h + 4 * h


def param_count(
    spec: TransformerSpec,
    *,
    tied_embeddings: bool = False,
    biases: bool = True,
    learned_positions: bool = True,
) -> int:
    """Every parameter of a decoder-only transformer of shape `spec` (see the module doc)."""
    h, f = spec.d_model, spec.ffn
    kv = round(h * spec.kv_fraction)
    weights = 2 * h * h + 2 * h * kv + (3 if spec.gated_mlp else 2) * h * f
    layers = spec.n_layers * (weights + _layer_extras(spec, biases))
    embeddings = spec.vocab_size * h * (1 if tied_embeddings else 2)
    positions = spec.seq_len * h if learned_positions else 0
    final_norm = 2 * h if biases else h
    return layers + embeddings + positions + final_norm


def card_params(name: str) -> int:
    """`param_count` of preset `name` with its card's embedding, bias and position facts."""
    if name not in CARDS:
        raise ValueError(f"model={name!r}: unknown; choose one of {_choices(CARDS)}")
    card = CARDS[name]
    return param_count(
        card.spec,
        tied_embeddings=card.tied_embeddings,
        biases=card.biases,
        learned_positions=card.learned_positions,
    )


def rule_of_thumb_params(spec: TransformerSpec) -> float:
    """12·l·h² + V·h: the count with f = 4h, no GQA, one embedding table, no biases."""
    return 12 * spec.n_layers * spec.d_model**2 + spec.vocab_size * spec.d_model


@dataclass(frozen=True, kw_only=True)
class DataParallelModel:
    """A model trained with plain data parallelism: its size and its FLOPs per sample.

    `flops_per_sample` is one *training* step's FLOPs for one sample (forward + backward
    ≈ 3 × forward), counting 2 FLOPs per multiply-add."""

    name: str
    params: int
    flops_per_sample: float
    source: str

    def __post_init__(self) -> None:
        if self.params < 1 or self.flops_per_sample <= 0:
            raise ValueError(
                f"DataParallelModel {self.name!r}: params and flops_per_sample must be > 0"
            )


RESNET50_MACS = 4.09e9
"""Multiply-adds of one ResNet-50 forward at 224 × 224 (torchvision ResNet50_Weights.
IMAGENET1K_V1 lists "GFLOPS 4.09", counting one multiply-add as one operation; He et al.
2016, Table 1, gives 3.8 × 10⁹ for the original stride placement)."""
RESNET50_PARAMS = 25_557_032
"""torchvision ResNet50_Weights.IMAGENET1K_V1 `num_params` (1000-class head)."""
TSM_FRAMES = 8
"""TSM clips of the lecture's SUMMIT example: "8-frame ResNet-50 TSM" (seed 003)."""
KINETICS_CLASSES = 400

DP_MODELS: dict[str, DataParallelModel] = {
    "resnet50": DataParallelModel(
        name="resnet50",
        params=RESNET50_PARAMS,
        flops_per_sample=3 * 2 * RESNET50_MACS,
        source="torchvision ResNet50_Weights.IMAGENET1K_V1 (25,557,032 params, 4.09 GMACs "
        "at 224²); training = 3 × forward at 2 FLOPs per multiply-add",
    ),
    # The temporal shift costs "zero computation and zero parameters" (Lin, Gan, Han 2019,
    # TSM, abstract), so a clip is 8 ResNet-50 frames; the 1000-way head becomes 400-way
    # (Kinetics-400): 25,557,032 − 600·(2048 + 1) = 24,327,632 parameters.
    "tsm_resnet50": DataParallelModel(
        name="tsm_resnet50",
        params=RESNET50_PARAMS - (1000 - KINETICS_CLASSES) * 2049,
        flops_per_sample=3 * 2 * TSM_FRAMES * RESNET50_MACS,
        source="Lin, Gan, Han 2019 (TSM, arXiv 1811.08383): ResNet-50 per frame, 8 frames "
        "per clip, shift adds no FLOPs or parameters; Kinetics-400 head",
    ),
}


def data_parallel_model(name: str) -> DataParallelModel:
    """The data-parallel preset `name` (a key of `DP_MODELS`)."""
    if name not in DP_MODELS:
        raise ValueError(f"model={name!r}: unknown; choose one of {_choices(DP_MODELS)}")
    return DP_MODELS[name]
