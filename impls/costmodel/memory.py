"""Memory and traffic of data-parallel training with ZeRO, from the formulas (theory only).

Model states are what the ZeRO paper (Rajbhandari et al. 2019, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", §3.1, §5 and Fig. 1) counts per device for a model of
Ψ parameters on N data-parallel ranks, with P, G, O the bytes per parameter of weights,
gradients and optimizer state:

    stage 0 (plain DP)      (P + G + O) Ψ
    stage 1 (ZeRO-1, O)     (P + G) Ψ + O Ψ / N
    stage 2 (ZeRO-2, G + O) P Ψ + (G + O) Ψ / N
    stage 3 (ZeRO-3, all)   (P + G + O) Ψ / N

The lecture (`seeds/003`, "ZeRO-1 / 2 / 3 and FSDP") takes mixed-precision Adam, P = G = 2
and O = K = 12 ("fp32 copy of the parameters, momentum and variance"): 16 bytes per
parameter, so an 80 GB device (GB = 1e9 bytes: 80e9 / 16 = 5e9) trains 5B parameters
unsharded and, at N = 64, 19B / 36B / 320B under ZeRO-1 / 2 / 3 (`max_trainable_params`).

A real implementation cuts Ψ into N equal shards, padding each flat unit to a multiple of
N; `pad=True` predicts that: a sharded quantity of a unit of Ψ_u parameters holds
ceil(Ψ_u / N) per rank. Activations are not model states; `activation_bytes` models what
autograd saves for the backward of the small GPT and MLP, so a peak can be predicted too.
Per transformer layer, `activation_bytes_per_layer` gives Korthikanti et al. 2022's
equations under each recomputation mode, TP and SP, and
`implementation_activation_bytes_per_layer` what `impls.models.Block` and its parallel
versions save, exactly (materialized attention).
Nothing here touches torch.distributed: these are the numbers measured runs are held to.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from impls.costmodel.compute import RECOMPUTE, TransformerSpec
from impls.models import GPTConfig, MLPConfig

__all__ = [
    "MIXED_PRECISION_ADAM",
    "PRESETS",
    "STAGES",
    "BytesPerParam",
    "ModelStateBytes",
    "ACTIVATION_SP",
    "activation_bytes",
    "activation_bytes_per_layer",
    "bytes_per_param_for",
    "comm_bytes_per_step",
    "comm_psi_multiple",
    "floor_billions",
    "implementation_activation_bytes_per_layer",
    "max_trainable_params",
    "model_state_bytes",
]

STAGES = (0, 1, 2, 3)
# Bytes of the int64 position ids the GPT embedding saves, and of the fp32 statistics
# (LayerNorm mean and 1/std, attention log-sum-exp) autograd keeps whatever the dtype.
_INDEX_BYTES = 8
_STAT_BYTES = 4


def _is_number(value: object) -> bool:
    """A finite real number (numpy scalars included, bools not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, kw_only=True)
class BytesPerParam:
    """Bytes each parameter costs in weights, gradients and optimizer state (P, G, O)."""

    weights: float = 2
    gradients: float = 2
    optimizer: float = 12
    """K in the ZeRO paper: Adam's fp32 master copy, momentum and variance = 4 + 4 + 4."""

    def __post_init__(self) -> None:
        for key in ("weights", "gradients", "optimizer"):
            value = getattr(self, key)
            if not _is_number(value) or not value > 0:
                raise ValueError(
                    f"bytes_per_param.{key}={value!r}: must be a number > 0 (bytes per parameter)"
                )

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


MIXED_PRECISION_ADAM = BytesPerParam(weights=2, gradients=2, optimizer=12)
PRESETS: dict[str, BytesPerParam] = {
    # fp32 Adam: no master copy, the weights are the fp32 values; momentum + variance = 8.
    "fp32": BytesPerParam(weights=4, gradients=4, optimizer=8),
    # Mixed precision (Micikevicius et al. 2018): half-precision weights and gradients,
    # fp32 master weights + momentum + variance in the optimizer (the ZeRO paper's K = 12).
    "fp16": MIXED_PRECISION_ADAM,
    "bf16": MIXED_PRECISION_ADAM,
}


def bytes_per_param_for(precision: str) -> BytesPerParam:
    """The Adam preset for a precision name (`fp32`, `fp16` or `bf16`)."""
    if precision not in PRESETS:
        raise ValueError(
            f"precision={precision!r} is unknown; allowed values: {', '.join(PRESETS)}"
        )
    return PRESETS[precision]


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-device bytes of weights, gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_stage(stage: int) -> None:
    if not _is_int(stage) or stage not in STAGES:
        raise ValueError(f"stage={stage!r} is unknown; allowed values: 0, 1, 2, 3")


def _check_count(key: str, value: int) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{key}={value!r}: must be an integer ≥ 1")


def _units(params: float | Sequence[float], pad: bool) -> list[float]:
    """Ψ as a list of flat units (one unit when a single count is given)."""
    units = list(params) if isinstance(params, Sequence) else [params]
    bad = [u for u in units if not _is_number(u) or u < 0]
    if bad or not units:
        raise ValueError(f"params={params!r}: every parameter count must be a number ≥ 0")
    if pad and any(not float(u).is_integer() for u in units):
        raise ValueError(f"params={params!r}: pad=True needs whole parameter counts")
    return units


def _shard(units: list[float], dp: int, pad: bool) -> float:
    """Parameters one rank holds of a quantity sharded over `dp` ranks."""
    if pad:
        return float(sum(math.ceil(u / dp) for u in units))
    return sum(units) / dp


def model_state_bytes(
    params: float | Sequence[float],
    stage: int,
    dp: int,
    bytes_per_param: BytesPerParam = MIXED_PRECISION_ADAM,
    *,
    pad: bool = False,
) -> ModelStateBytes:
    """Per-device model-state bytes of Ψ = `params` parameters at ZeRO `stage` on `dp` ranks.

    `params` is one count, or the sizes of the flat units the implementation shards
    separately (FSDP-style units); with `pad=True` each unit is padded to a multiple of `dp`
    before sharding, so a rank holds ceil(Ψ_u / N) of every sharded quantity.
    """
    _check_stage(stage)
    _check_count("dp", dp)
    units = _units(params, pad)
    full, shard = float(sum(units)), _shard(units, dp, pad)
    b = bytes_per_param
    return ModelStateBytes(
        weights=b.weights * (shard if stage >= 3 else full),
        gradients=b.gradients * (shard if stage >= 2 else full),
        optimizer=b.optimizer * (shard if stage >= 1 else full),
    )


def _bytes_per_param_on_device(stage: int, dp: int, b: BytesPerParam) -> Fraction:
    """Model-state bytes per parameter on one device, exactly (fractions, not floats)."""
    p, g, o = (Fraction(v) for v in (b.weights, b.gradients, b.optimizer))
    n = Fraction(dp)
    return {0: p + g + o, 1: p + g + o / n, 2: p + (g + o) / n, 3: (p + g + o) / n}[stage]


def max_trainable_params(
    gpu_memory_bytes: float,
    stage: int,
    dp: int,
    mp: int = 1,
    bytes_per_param: BytesPerParam = MIXED_PRECISION_ADAM,
) -> int:
    """The largest Ψ whose model states fit in `gpu_memory_bytes` per device.

    floor(mp · M / c) with c the stage's bytes per parameter on one device (module
    docstring). A model-parallel degree `mp` (tensor or pipeline) splits every model state
    evenly over `mp` devices, so it multiplies the model that fits. Activations, buffers and
    fragmentation are left out, as the lecture leaves them out. Computed in
    exact fractions: 80e9 / 16 is 5_000_000_000, not 4_999_999_999.
    """
    _check_stage(stage)
    _check_count("dp", dp)
    _check_count("mp", mp)
    if not _is_number(gpu_memory_bytes) or gpu_memory_bytes < 0:
        raise ValueError(f"gpu_memory_bytes={gpu_memory_bytes!r}: must be a number ≥ 0")
    fits = Fraction(gpu_memory_bytes) * mp / _bytes_per_param_on_device(stage, dp, bytes_per_param)
    return math.floor(fits)


def floor_billions(params: float) -> int:
    """Ψ in whole billions, rounded down: the largest whole-billion model that fits.

    The lecture's figures are this rounding: ZeRO-1 at N = 64 fits 80e9 / 4.1875 = 19.10e9
    (the slide writes 80 GB / 4.2 B = 19B), ZeRO-2 36.06e9 → 36B; rounding to nearest would
    agree here but could claim a model that does not fit.
    """
    return math.floor(params / 1e9)


def comm_bytes_per_step(
    params: float | Sequence[float],
    stage: int,
    dp: int,
    bytes_per_elem: float,
    *,
    pad: bool = False,
) -> float:
    """Bytes one rank sends per training step with ring collectives (ZeRO paper §7).

    Stages 0–2 move 2Ψ: an all-reduce (DP) or a reduce-scatter of the gradients plus an
    all-gather of the updated weights (ZeRO-1/2). ZeRO-3 moves 3Ψ: each unit's weights are
    all-gathered for its forward and again for its backward, and its gradients
    reduce-scattered. A ring reduce-scatter or all-gather sends (N−1)/N of its buffer per
    rank, hence 2Ψ(N−1)/N and 3Ψ(N−1)/N elements; with `pad=True`, (N−1)·ceil(Ψ_u/N) per
    unit and collective.
    """
    _check_stage(stage)
    _check_count("dp", dp)
    units = _units(params, pad)
    collectives = 3 if stage == 3 else 2
    per_collective = (dp - 1) * _shard(units, dp, pad)
    return collectives * per_collective * bytes_per_elem


def comm_psi_multiple(stage: int, dp: int) -> float:
    """`comm_bytes_per_step` in units of Ψ elements: 2(N−1)/N, or 3(N−1)/N for ZeRO-3."""
    _check_stage(stage)
    _check_count("dp", dp)
    return (3 if stage == 3 else 2) * (dp - 1) / dp


def activation_bytes(
    model: GPTConfig | MLPConfig,
    micro_batch: int,
    *,
    seq_len: int | None = None,
    bytes_per_elem: int = 4,
) -> int:
    """Bytes autograd saves for the backward of one micro-batch's forward and loss (a model).

    What a `saved_tensors_hooks` count sees, each storage once, with the parameters and the
    caller's inputs and targets left out (they are held whatever the parallelism). Derived
    from the ops `impls.models` runs, with dropout 0 (dropout would add its masks); exact for
    fp32 on CPU with the torch this project pins (the tests check it), apart from a 4-byte
    scalar the loss keeps. With half-precision activations every saved activation is
    counted at `bytes_per_elem` and the statistics at 4 bytes: an estimate.

    GPT, T = b·s tokens, h = d_model, f = the MLP width, a = heads, V = vocabulary, per
    block: LayerNorm inputs and outputs 4Th, q/k/v 3Th, attention output Th, MLP 2Tf (the
    GELU's input and output), statistics 2·2T (LayerNorm) + Ta (log-sum-exp). Then the final
    LayerNorm 2Th + 2T, the loss's log-softmax TV, and the int64 positions s.
    MLP: each hidden ReLU output b·hidden, and the output b·out_dim the loss keeps.
    """
    _check_count("micro_batch", micro_batch)
    _check_count("bytes_per_elem", bytes_per_elem)
    if isinstance(model, MLPConfig):
        elements = (model.n_layers - 1) * micro_batch * model.hidden_dim
        return (elements + micro_batch * model.out_dim) * bytes_per_elem
    if not isinstance(model, GPTConfig):
        raise ValueError(f"model={type(model).__name__}: allowed types are GPTConfig, MLPConfig")
    s = model.seq_len if seq_len is None else seq_len
    _check_count("seq_len", s)
    t, h = micro_batch * s, model.d_model
    per_block = (8 * t * h + 2 * t * model.ff_dim) * bytes_per_elem
    per_block += (4 * t + t * model.n_heads) * _STAT_BYTES
    head = (2 * t * h + t * model.vocab_size) * bytes_per_elem + 2 * t * _STAT_BYTES
    return model.n_layers * per_block + head + s * _INDEX_BYTES


ACTIVATION_SP = ("none", "megatron_sp", "ulysses")


def activation_bytes_per_layer(
    spec: TransformerSpec,
    microbatch: int,
    *,
    tp: int = 1,
    sp: str = "none",
    recompute: str = "none",
    dtype_bytes: float = 2,
) -> float:
    """Bytes one transformer layer keeps for its backward, per device (Korthikanti et al.
    2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198,
    §4 and Table 2), for b = `microbatch` sequences of s = `spec.seq_len` tokens, width h,
    a heads, on a tensor-parallel group of t = `tp`:

        sp="none", t = 1           sbh(34 + 5as/h)
        sp="none" (Megatron TP)    sbh(10 + 24/t + 5as/(ht))
        sp="megatron_sp"           sbh(34/t + 5as/(ht))
        recompute="selective"      the 5as²b attention-core term is dropped (recomputed)
        recompute="full"           2sbh, the layer's input only; 2sbh/t with sequence parallel

    The 34 is §4.1's count: attention 11sbh (q/k/v input 2, Q and K 4, V 2, output
    projection input 2, dropout mask 1) + 5as²b (softmax output 2, its dropout mask 1,
    dropout output 2), MLP 19sbh (input 2, GeLU input 8, second matrix input 8, dropout
    mask 1), the two LayerNorm inputs 4sbh. Under TP the 24sbh inside the sharded matrices
    and the s² terms split t ways; the 10sbh around them (LayerNorms, the first matrices'
    inputs, dropout masks) is replicated unless sequence parallelism splits it too.
    `spec`'s MLP width f and key/value heads k generalise the 24sbh to sb(2h + 2hk/a +
    2hk/a + 2h) (Q, K, V, projection input) + 4sbf (GeLU input, second matrix input; 6sbf
    for a SwiGLU's gate, up and product): 24sbh for f = 4h and k = a.

    sp="ulysses" (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv 2309.14509, §3): the tp
    axis is the sequence-parallel group; everything outside attention holds s/t tokens and
    attention holds a/t heads of the whole sequence, so all of it divides by t:
    sbh·34/t + 5as²b/t, the Megatron-SP figure.

    The paper counts 2-byte activations and 1-byte dropout masks; `dtype_bytes` scales the
    whole formula by dtype_bytes/2 (masks included: an approximation for other dtypes).
    """
    _check_count("microbatch", microbatch)
    _check_count("tp", tp)
    if sp not in ACTIVATION_SP:
        raise ValueError(f"sp={sp!r}: unknown; allowed values: {', '.join(ACTIVATION_SP)}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: unknown; allowed values: "
                         f"{', '.join(RECOMPUTE)}")  # fmt: skip
    if spec.n_heads % tp:
        raise ValueError(f"tp={tp}: must divide n_heads={spec.n_heads}")
    if not _is_number(dtype_bytes) or dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes={dtype_bytes!r}: must be a number > 0")
    s, b, h, a, t = spec.seq_len, microbatch, spec.d_model, spec.n_heads, tp
    sbh = s * b * h
    split_all = sp != "none"
    if recompute == "full":
        paper_bytes = 2 * sbh / (t if split_all else 1)
    else:
        replicated = 10 * sbh
        sharded = s * b * ((4 + 4 * spec.kv_fraction) * h + (6 if spec.gated_mlp else 4) * spec.ffn)
        core = 0 if recompute == "selective" else 5 * a * s * s * b
        paper_bytes = (replicated / t if split_all else replicated) + (sharded + core) / t
    return paper_bytes * dtype_bytes / 2


def implementation_activation_bytes_per_layer(
    *,
    micro_batch: int,
    seq_len: int,
    d_model: int,
    n_heads: int,
    d_ff: int | None = None,
    tp: int = 1,
    sp: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 2,
    dropout: bool = True,
) -> int:
    """Bytes one `impls.models.Block` saves for backward per rank, exactly, with
    `attention="materialized"` (a `SavedStorages` count, parameters excluded).

    The per-layer terms of `activation_bytes_per_layer`, each at `dtype_bytes`, with the
    masks at 1 byte (`Dropout` keeps a bool mask), plus what the paper leaves out: the two
    LayerNorms' mean and 1/std, 4·b·s elements in the activation dtype. With dropout off
    no mask is kept and the softmax output doubles as attention-over-V's input. t = `tp`:
    Megatron TP (`parallelize_gpt`); `sp`: `MegatronSPBlock(regather=True)`, where every
    per-position tensor outside the sharded matrices holds L = ceil(s/t) positions and
    attention runs on the padded S = L·t. `recompute="full"`: the block's input only.
    """
    _check_count("micro_batch", micro_batch)
    _check_count("tp", tp)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}; allowed values: {', '.join(RECOMPUTE)}")
    if n_heads % tp:
        raise ValueError(f"tp={tp}: must divide n_heads={n_heads}")
    b, h, a, t, e = micro_batch, d_model, n_heads, tp, dtype_bytes
    f = 4 * h if d_ff is None else d_ff
    local = math.ceil(seq_len / t) if sp else seq_len  # positions outside the matrices
    s = local * t if sp else seq_len  # positions inside attention
    if recompute == "full":
        return e * b * local * h
    replicated = 4 * e * b * local * h + 4 * e * b * local  # LN inputs and outputs, statistics
    sharded = e * b * s * (4 * h + 2 * f) // t  # q, k, v, o_proj input; GELU and fc2 inputs
    masks = 2 * b * local * h if dropout else 0
    core = 0
    if recompute == "none":  # softmax output; with dropout its mask and output too
        core = (2 * e + 1 if dropout else e) * b * (a // t) * s * s
    return replicated + sharded + masks + core
