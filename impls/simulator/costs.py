"""Seconds and bytes of one micro-batch through each layer on one rank of a plan.

Notation: b micro-batch, s sequence, h width, a heads (k of them with keys and values),
d = h/a, f MLP width, V vocabulary, t the tp degree, B bytes per activation element, T = bs.

`transformer_price` prices one layer (its GEMMs on the shapes one rank runs, the
element-wise work at memory bandwidth, the backward and recomputation);
`tp_collectives` lists its tensor-parallel collectives, which are exposed (not overlapped).
"""

from __future__ import annotations

from dataclasses import dataclass

from impls.costmodel.activations import activation_bytes_per_layer
from impls.costmodel.comm import collective_seconds
from impls.costmodel.compute import TransformerSpec
from impls.costmodel.hardware import Hardware
from impls.simulator.context_parallel import local_spec, ring_exposed_seconds

__all__ = [
    "DTYPE_BYTES",
    "LayerPrice",
    "embedding_price",
    "head_price",
    "layer_prices",
    "logit_gradient_bytes",
    "tp_collectives",
    "transformer_price",
]

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}
"""Bytes of one activation element; fp8 training keeps activations in bf16 (assumption)."""
_MASK = 1  # bytes per element of a dropout mask (torch stores bool)
_LOGIT = 4  # the softmax of the LM head is kept in fp32 (Megatron's cross-entropy)
_FORWARD_KERNELS = 9  # 2 LayerNorm, 2 residual, 1 activation, 1 softmax, 3 dropout

Collective = tuple[str, float]
"""(kind, bytes of the full buffer) as `impls.costmodel.comm.collective_seconds` takes it."""


@dataclass(frozen=True, kw_only=True)
class LayerPrice:
    """One layer on one rank for one micro-batch: compute and TP communication apart."""

    forward_s: float
    input_s: float
    """Backward for the input gradient (and any recomputation), compute only."""
    weight_s: float
    """Backward for the weight gradient, compute only."""
    tp_forward_s: float
    tp_backward_s: float
    """Exposed communication inside the layer: TP collectives, and the ring attention's
    traffic that its compute does not hide (context parallelism)."""
    params: float
    """Parameters of this layer that one rank holds (after tp sharding)."""
    activation_bytes: float
    """Saved for the backward, per micro-batch."""


def _shard(sp: str, tp: int) -> int:
    """How many ways the weights are split: Ulysses keeps them whole."""
    return 1 if sp == "ulysses" else tp


def tp_collectives(
    spec: TransformerSpec, microbatch: int, tp: int, sp: str, dtype: str, recompute: str = "none"
) -> tuple[tuple, tuple]:
    """(forward, backward) collectives of one transformer layer over the tp group.

    TP collectives per transformer layer (Korthikanti §4.2.2, Fig. 5): Megatron 2 all-reduces of
    T·h·B forward and 2 backward; Megatron-SP each all-reduce becomes an all-gather plus a
    reduce-scatter of the same buffer; Ulysses 4 all-to-alls forward (q, k, v in, the output
    back; each rank's buffer T/t × its width) and 4 backward. They are exposed (not overlapped).
    """
    if tp == 1:
        return (), ()
    full = microbatch * spec.seq_len * spec.d_model * DTYPE_BYTES[dtype]
    if sp == "none":
        forward: tuple[Collective, ...] = (("all_reduce", full),) * 2
    elif sp == "megatron_sp":
        forward = (("all_gather", full), ("reduce_scatter", full)) * 2
    else:
        kv = full * spec.kv_fraction / tp
        forward = (
            ("all_to_all", full / tp),
            ("all_to_all", kv),
            ("all_to_all", kv),
            ("all_to_all", full / tp),
        )
    backward = forward + (forward if recompute == "full" else ())
    return forward, backward


def _comm(collectives: tuple, tp: int, hw: Hardware) -> float:
    return sum(collective_seconds(kind, nbytes, tp, hw) for kind, nbytes in collectives)


def _attention_core(
    spec: TransformerSpec, microbatch: int, tp: int, hw: Hardware, dtype: str, cp: int = 1
) -> tuple[float, float, float, int]:
    """The attention core of one rank: (forward s, backward s, bytes of its element-wise
    work, element-wise kernels of the whole layer's forward).

    Both Megatron and Ulysses run a/t heads of every sequence; under context parallelism
    a rank's s/cp queries meet all s keys, 1/cp of the core (`context_parallel`), in cp
    ring steps whose kernels each span s/cp keys. Materialized: the two
    batched products at `gemm_seconds`, causal masking not exploited, the backward two
    products per forward one; softmax and attention dropout over the a·s²/t scores are
    memory-bound kernels. Flash: one fused kernel that skips the masked blocks, so it
    computes half of Megatron's 4·b·s²·h/t (FlashAttention-2 §4.1 counts causal FLOPs so);
    its backward recomputes the scores inside the kernel, 5 products against the forward's
    2 (2.5 ×, same section), and launches 2 kernels (the rowsum of dO∘O, then the main
    loop: Algorithm 2), each at `Hardware.attention_seconds`. Softmax and dropout are fused
    away: no score bytes, and 2 fewer element-wise kernels.

    With dtype fp8 the core still runs in bf16 (assumption: Transformer Engine's fp8 recipe
    casts the GEMMs of its linear layers; dot-product attention stays 16-bit unless its
    separate fp8 attention is switched on).
    """
    b, s, h, a, B = microbatch, spec.seq_len, spec.d_model, spec.n_heads, DTYPE_BYTES[dtype]
    heads, q = b * a / tp, s // cp  # q: this rank's queries
    dtype = "bf16" if dtype == "fp8" else dtype  # the core stays 16-bit under fp8 training
    if spec.attention == "flash":
        computed = 4 * heads * q * s * (h / a) / 2  # the causal half of QKᵀ and ·V
        forward = hw.attention_seconds(computed, q, dtype, backward=False, kernels=cp)
        backward = hw.attention_seconds(2.5 * computed, q, dtype, backward=True, kernels=2 * cp)
        return forward, backward, 0.0, _FORWARD_KERNELS - 2
    core = hw.gemm_seconds(q * heads, s, h / a, dtype) + hw.gemm_seconds(q * heads, h / a, s, dtype)
    scores = heads * q * s
    core_bytes = 2 * B * scores + (2 * B + _MASK) * scores  # softmax, attention dropout
    return core, 2 * core, core_bytes, _FORWARD_KERNELS


def transformer_price(
    spec: TransformerSpec,
    microbatch: int,
    tp: int,
    sp: str,
    recompute: str,
    hw: Hardware,
    dtype: str,
    cp: int = 1,
) -> LayerPrice:
    """One transformer layer; with cp > 1 one context-parallel rank: its s/cp tokens, and
    the ring's exposed traffic added to the layer's exposed communication
    (`context_parallel`).

    Matrix multiplications are priced with `Hardware.gemm_seconds` (efficiency by GEMM size)
    on the shapes one rank runs. Megatron-LM's tensor parallelism (Shoeybi et al. 2019, §3)
    shards q/k/v and the first MLP matrix by columns, the output projection and the second by
    rows: q/k/v (T × h)·(h × h(1 + 2k/a)/t), output (T × h/t)·(h/t × h), MLP (T × h)·(h × f/t)
    (twice with a gated MLP) and (T × f/t)·(f/t × h). The attention core runs a/t heads as
    batched (s × d)·(d × s) and (s × s)·(s × d) products, causal masking not exploited, as
    Megatron counts them (Narayanan et al. 2021, App.); a batched GEMM is priced as one kernel
    of its total FLOPs. Ulysses (Jacobs et al. 2023) keeps the weights whole and shards the
    tokens instead: T/t rows through full matrices, and all a/t heads' attention over the
    whole sequence after the all-to-all, so its FLOPs per rank equal Megatron's.

    Backward: the input gradient I runs the weight GEMMs again with the same FLOPs (dX = dY·Wᵀ)
    plus both attention-core backward products (4 GEMMs, no weights; FlashAttention instead
    runs one fused kernel each way, `_attention_core`); the weight gradient W
    runs the weight GEMMs once more (dW = Xᵀ·dY), so I + W = 2 × forward FLOPs. Element-wise
    work (LayerNorms, GELU/SwiGLU, softmax over the a·s²/t scores, residual adds, dropout with
    1-byte masks) moves bytes at memory bandwidth; its backward moves twice the forward's bytes
    (assumption: read the saved input and the incoming gradient, write the gradient). With
    `megatron_sp` or `ulysses` the token-wise work runs on T/t tokens (Korthikanti et al. 2022,
    §4.2.2), otherwise every tp rank repeats it on all T. Recompute adds work to I: `full` the
    layer's forward with its TP collectives, `selective` the attention core (Korthikanti §4.2).
    """
    full, spec = spec, local_spec(spec, cp)
    b, s, h = microbatch, spec.seq_len, spec.d_model
    f, B, shard = spec.ffn, DTYPE_BYTES[dtype], _shard(sp, tp)
    tokens = b * s
    rows = tokens / tp if sp == "ulysses" else tokens  # rows through the weight GEMMs
    local = tokens / tp if sp != "none" else tokens  # tokens of the token-wise work
    qkv_width = h * (1 + 2 * spec.kv_fraction)
    matrices = 3 if spec.gated_mlp else 2
    weights = (
        hw.gemm_seconds(rows, qkv_width / shard, h, dtype)
        + hw.gemm_seconds(rows, h, h / shard, dtype)
        + hw.gemm_seconds(rows, f / shard, h, dtype, count=matrices - 1)
        + hw.gemm_seconds(rows, h, f / shard, dtype)
    )
    core, core_backward, core_bytes, kernels = _attention_core(full, b, tp, hw, dtype, cp)
    hidden = tokens * f / tp
    other_bytes = B * (10 * local * h + matrices * hidden) + (2 * B + _MASK) * 2 * local * h
    elementwise = hw.elementwise_seconds(core_bytes + other_bytes, kernels)
    forward = weights + core + elementwise
    extra = {
        "none": 0.0,
        "selective": core + (hw.elementwise_seconds(core_bytes, 2) if core_bytes else 0.0),
        "full": forward,
    }[recompute]
    backward_elementwise = hw.elementwise_seconds(2 * (core_bytes + other_bytes), 2 * kernels)
    fwd_comm, bwd_comm = tp_collectives(spec, b, tp, sp, dtype, recompute)
    ring_f, ring_b = ring_exposed_seconds(full, b, tp, cp, hw, B, core, core_backward)
    if recompute == "full":
        ring_b += ring_f  # the recomputed forward sends its K/V round again
    matrix_params = h * qkv_width + h * h + matrices * h * f
    return LayerPrice(
        forward_s=forward,
        input_s=weights + core_backward + backward_elementwise + extra,
        weight_s=weights,
        tp_forward_s=_comm(fwd_comm, tp, hw) + ring_f,
        tp_backward_s=_comm(bwd_comm, tp, hw) + ring_b,
        params=matrix_params / shard + 4 * h,  # + two LayerNorms' gain and bias, replicated
        activation_bytes=activation_bytes_per_layer(
            spec, b, tp=tp, sp=sp, recompute=recompute, dtype_bytes=B
        ),
    )


def embedding_price(
    spec: TransformerSpec, microbatch: int, tp: int, sp: str, hw: Hardware, dtype: str
) -> LayerPrice:
    """The token embedding: a row lookup (memory-bound), vocabulary-sharded under Megatron.

    Each rank writes T × h (zeros for rows it does not own) and the tp group sums them with
    an all-reduce (Megatron's VocabParallelEmbedding), a reduce-scatter under Megatron-SP.
    Its backward is the weight gradient only: a scatter-add of the T × h output gradient.
    Learned position embeddings are left out (assumption: < 0.1% of a large model).
    """
    tokens, h, B = microbatch * spec.seq_len, spec.d_model, DTYPE_BYTES[dtype]
    local = tokens / tp if sp != "none" else tokens
    forward = hw.elementwise_seconds(2 * B * local * h + (2 * B + _MASK) * local * h, 2)
    comm: tuple[Collective, ...] = ()
    if tp > 1 and sp != "ulysses":
        kind = "all_reduce" if sp == "none" else "reduce_scatter"
        comm = ((kind, tokens * h * B),)
    params = spec.vocab_size * h
    return LayerPrice(
        forward_s=forward,
        input_s=0.0,
        weight_s=hw.elementwise_seconds(3 * B * local * h + (2 * B + _MASK) * local * h, 2),
        tp_forward_s=_comm(comm, tp, hw),
        tp_backward_s=0.0,
        params=params / _shard(sp, tp),
        activation_bytes=local * h * _MASK + 8 * tokens,  # dropout mask, int64 token ids
    )


def head_price(
    spec: TransformerSpec, microbatch: int, tp: int, sp: str, hw: Hardware, dtype: str
) -> LayerPrice:
    """Final LayerNorm, the LM head (T × h)·(h × V/t) and the softmax cross-entropy.

    Megatron's vocabulary-parallel cross-entropy all-reduces 3 per-token fp32 values (the
    max, the target logit, the sum of exponentials); the head's input passes the `f`
    operator, whose backward all-reduces T × h (Shoeybi et al. 2019, §3). Megatron-SP
    all-gathers the sequence before the head and reduce-scatters in the backward. The head
    has its own V × h weights (untied, or the copy Megatron keeps on the last stage).
    Not recomputed under `full` (as `impls.costmodel.compute` counts it).
    """
    tokens, h, V, B = microbatch * spec.seq_len, spec.d_model, spec.vocab_size, DTYPE_BYTES[dtype]
    shard = _shard(sp, tp)
    rows = tokens / tp if sp == "ulysses" else tokens
    local = tokens / tp if sp != "none" else tokens
    logits = logit_gradient_bytes(spec, microbatch, tp, sp) / _LOGIT
    gemm = hw.gemm_seconds(rows, V / shard, h, dtype)
    norm = hw.elementwise_seconds(2 * B * local * h, 1)
    forward = gemm + norm + hw.elementwise_seconds(logits * (B + 2 * _LOGIT), 2)
    fwd_comm: tuple[Collective, ...] = ()
    bwd_comm: tuple[Collective, ...] = ()
    if tp > 1 and sp != "ulysses":
        fwd_comm = (("all_reduce", 4.0 * tokens),) * 3
        if sp == "none":
            bwd_comm = (("all_reduce", tokens * h * B),)
        else:
            fwd_comm += (("all_gather", tokens * h * B),)
            bwd_comm = (("reduce_scatter", tokens * h * B),)
    params = V * h
    return LayerPrice(
        forward_s=forward,
        input_s=gemm + 2 * norm + hw.elementwise_seconds(logits * (_LOGIT + B), 1),
        weight_s=gemm,
        tp_forward_s=_comm(fwd_comm, tp, hw),
        tp_backward_s=_comm(bwd_comm, tp, hw),
        params=params / shard + 2 * h,
        activation_bytes=B * local * h + B * rows * h + _LOGIT * logits,
    )


def logit_gradient_bytes(
    spec: TransformerSpec, microbatch: int, tp: int, sp: str, cp: int = 1
) -> float:
    """The fp32 gradient of the logits, alive during the head's backward (s/cp tokens)."""
    tokens = microbatch * spec.seq_len // cp
    rows = tokens / tp if sp == "ulysses" else tokens
    return _LOGIT * rows * spec.vocab_size / _shard(sp, tp)


_CACHE: dict[tuple, tuple[Hardware, tuple[LayerPrice, ...]]] = {}
_CACHE_LIMIT = 4096


def layer_prices(
    spec: TransformerSpec,
    microbatch: int,
    tp: int,
    sp: str,
    recompute: str,
    hw: Hardware,
    dtype: str,
    cp: int = 1,
) -> tuple[LayerPrice, ...]:
    """Embedding, `n_layers` identical transformer layers and the head, priced once.

    Cached: the planner prices the same (spec, b, tp, sp, recompute) thousands of times.
    `Hardware` holds dicts and is not hashable, so the cache keys on its identity and keeps
    a reference to it (a different object never matches a stale entry).
    """
    key = (spec, microbatch, tp, sp, recompute, id(hw), dtype, cp)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is hw:
        return hit[1]
    layer = transformer_price(spec, microbatch, tp, sp, recompute, hw, dtype, cp)
    local = local_spec(spec, cp)  # the embedding and head see s/cp tokens a sequence
    prices = (
        embedding_price(local, microbatch, tp, sp, hw, dtype),
        *([layer] * spec.n_layers),
        head_price(local, microbatch, tp, sp, hw, dtype),
    )
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[key] = (hw, prices)
    return prices
