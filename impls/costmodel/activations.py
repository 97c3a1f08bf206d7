"""Activation memory: the bytes a forward saves for its backward, from the formulas (theory only).

Model states (weights, gradients, optimizer state under ZeRO) are `impls.costmodel.memory`'s;
this module prices what autograd keeps from a micro-batch's forward until its backward:
`activation_bytes` (the small GPT or MLP of `impls.models`, tensor by tensor),
`activation_bytes_per_layer` (one transformer layer by Korthikanti et al. 2022, arXiv
2205.05198, §4 and Table 2, under recomputation, TP and sequence parallelism) and
`implementation_activation_bytes_per_layer` (what `impls.models.Block` saves, exactly).
Arithmetic on the configs only: saved-tensor counts taken in real runs
(`impls.memory.saved`) are held against these numbers.
"""

from __future__ import annotations

import math

from impls.costmodel._checks import check_count, is_number
from impls.costmodel.compute import RECOMPUTE, TransformerSpec
from impls.models import GPTConfig, MLPConfig

__all__ = [
    "ACTIVATION_SP",
    "activation_bytes",
    "activation_bytes_per_layer",
    "implementation_activation_bytes_per_layer",
]

# Bytes of the int64 position ids the GPT embedding saves, and of the fp32 statistics
# (LayerNorm mean and 1/std, attention log-sum-exp) autograd keeps whatever the dtype.
_INDEX_BYTES = 8
_STAT_BYTES = 4


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
    check_count("micro_batch", micro_batch)
    check_count("bytes_per_elem", bytes_per_elem)
    if isinstance(model, MLPConfig):
        elements = (model.n_layers - 1) * micro_batch * model.hidden_dim
        return (elements + micro_batch * model.out_dim) * bytes_per_elem
    if not isinstance(model, GPTConfig):
        raise ValueError(f"model={type(model).__name__}: allowed types are GPTConfig, MLPConfig")
    s = model.seq_len if seq_len is None else seq_len
    check_count("seq_len", s)
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

    `spec.attention == "flash"` (FlashAttention, Dao et al. 2022 §3.1; FlashAttention-2,
    Dao 2023, arXiv 2307.08691, Algorithms 1–2): the scores, softmax output and attention
    dropout mask never reach memory, so the 5as²b term is gone; the kernel keeps its output
    (already the projection input of the 11sbh) and the per-row log-sum-exp L, one fp32
    value per query and head: 4·as·b/t bytes (the heads are split t ways under every sp).
    The dropout mask is regenerated from the RNG state in the backward (Dao et al. 2022
    §3.1), so nothing else is kept; `selective` recomputes the kernel, L included.
    Everything else is unchanged.
    """
    check_count("microbatch", microbatch)
    check_count("tp", tp)
    if sp not in ACTIVATION_SP:
        raise ValueError(f"sp={sp!r}: unknown; allowed values: {', '.join(ACTIVATION_SP)}")
    if recompute not in RECOMPUTE:
        raise ValueError(
            f"recompute={recompute!r}: unknown; allowed values: {', '.join(RECOMPUTE)}"
        )
    if spec.n_heads % tp:
        raise ValueError(f"tp={tp}: must divide n_heads={spec.n_heads}")
    if not is_number(dtype_bytes) or dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes={dtype_bytes!r}: must be a number > 0")
    s, b, h, a, t = spec.seq_len, microbatch, spec.d_model, spec.n_heads, tp
    sbh = s * b * h
    split_all = sp != "none"
    if recompute == "full":
        paper_bytes = 2 * sbh / (t if split_all else 1)
    else:
        replicated = 10 * sbh
        sharded = s * b * ((4 + 4 * spec.kv_fraction) * h + (6 if spec.gated_mlp else 4) * spec.ffn)
        flash = spec.attention == "flash"
        core = 0 if recompute == "selective" or flash else 5 * a * s * s * b
        paper_bytes = (replicated / t if split_all else replicated) + (sharded + core) / t
        if flash and recompute == "none":  # selective recomputes the kernel, L included
            return paper_bytes * dtype_bytes / 2 + _STAT_BYTES * a * s * b / t
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
    check_count("micro_batch", micro_batch)
    check_count("tp", tp)
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
