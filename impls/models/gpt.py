"""A small GPT-2-style decoder, the transformer every distbench experiment trains.

Architecture after GPT-2 (Radford et al., 2019, "Language Models are Unsupervised Multitask
Learners"): token + learned position embeddings, pre-LayerNorm blocks
(`x + attn(ln1(x))`, then `x + mlp(ln2(x))`), a final LayerNorm and a linear LM head.

For the parallel implementations built on it, attention keeps q, k, v and the output
projection as four `nn.Linear` layers, so Megatron tensor parallelism (Shoeybi et al.,
arXiv 1909.08053) can shard q/k/v column-wise by heads and `o_proj` row-wise (the head
count is read from `q_proj`'s width), and weights come from an explicit `torch.Generator`,
never the global RNG, so every rank builds bit-identical weights without coordinating.
Activation recomputation and the attention core's forms: `GPTConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from impls.models._checks import divisors, require_positive_ints, require_probability

__all__ = [
    "ATTENTION_MODES",
    "GPT",
    "RECOMPUTE_MODES",
    "Block",
    "CausalSelfAttention",
    "Dropout",
    "FeedForward",
    "GPTConfig",
    "GPTEmbedding",
    "attention_core",
    "check_choice",
]

INIT_STD = 0.02  # GPT-2's initializer range
RECOMPUTE_MODES = ("none", "selective", "full")
ATTENTION_MODES = ("fused", "materialized")


def check_choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise ValueError naming `key` and the allowed values unless `value` is one of them."""
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not allowed; allowed values: {', '.join(allowed)}")


@dataclass(kw_only=True)
class GPTConfig:
    """Shape of the GPT. Checked on construction; every error names the key and the rule.

    Activation recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in
    Large Transformer Models", arXiv 2205.05198): `recompute="full"` keeps only each block's
    input and recomputes the block in backward; `recompute="selective"` recomputes only the
    attention core's s² part (QK^T, softmax, dropout, attention over V; §4.2). Both use
    `torch.utils.checkpoint` (use_reentrant=False), which restores the RNG state before the
    recomputation, so dropout draws the same masks twice. `attention="materialized"` computes
    the scores, softmax and dropout explicitly, so the s² tensors the paper counts exist;
    `"fused"` is `F.scaled_dot_product_attention`. Dropout keeps a 1-byte mask
    (`torch.native_dropout`), as the paper's accounting assumes; on CPU `F.dropout` would keep
    one of the activation's dtype.
    """

    vocab_size: int = 256
    """Number of token ids; the LM head predicts one logit per id."""
    seq_len: int = 64
    """Longest sequence the learned position embedding covers."""
    d_model: int = 64
    """Width of the residual stream (h in the shape comments)."""
    n_heads: int = 4
    """Attention heads per block; must divide `d_model` (head_dim = d_model / n_heads)."""
    n_layers: int = 4
    """Number of transformer blocks; the unit that pipeline stages are cut from."""
    d_ff: int | None = None
    """Hidden width of each block's MLP; None means 4 * d_model, as in GPT-2."""
    dropout: float = 0.0
    """Drop probability for embeddings, attention weights and residual branches."""
    bias: bool = True
    """Whether the Linear and LayerNorm layers carry biases (the LM head never does)."""
    tie_embeddings: bool = False
    """Share the token-embedding matrix with the LM head (GPT-2 does)."""
    recompute: str = "none"
    """Activation recomputation: "none", "selective" (the attention core's s² part) or
    "full" (each block from its input), Korthikanti et al. 2022."""
    attention: str = "fused"
    """"fused" (F.scaled_dot_product_attention) or "materialized" (explicit scores,
    softmax and dropout: the s² tensors Korthikanti et al. count)."""

    def __post_init__(self) -> None:
        check_choice("GPTConfig.recompute", self.recompute, RECOMPUTE_MODES)
        check_choice("GPTConfig.attention", self.attention, ATTENTION_MODES)
        require_positive_ints(
            "GPTConfig",
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.n_layers,
        )
        if self.d_ff is not None:
            require_positive_ints("GPTConfig", d_ff=self.d_ff)
        require_probability("GPTConfig", "dropout", self.dropout)
        if self.d_model % self.n_heads != 0:
            allowed = divisors(self.d_model) if self.d_model <= 1 << 20 else None
            raise ValueError(
                f"GPTConfig.n_heads={self.n_heads} must divide d_model={self.d_model}"
                + (f"; allowed n_heads: {allowed}" if allowed else "")
            )

    @property
    def ff_dim(self) -> int:
        """The MLP hidden width actually used (`d_ff`, or 4 * d_model when unset)."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads


class Dropout(nn.Dropout):
    """`nn.Dropout` whose backward keeps a bool (1-byte) mask, as Korthikanti et al. count."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


def _materialized_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + causal mask), dropped out, times v, each step explicit."""
    s, hd = q.shape[-2], q.shape[-1]
    # (b, nh, s, hd) @ (b, nh, hd, s) -> (b, nh, s, s); the scale enters as a tensor op
    # (div by a 0-dim tensor would be saved for backward, a Python scalar is not)
    scores = torch.matmul(q, k.transpose(-2, -1)).div_(math.sqrt(hd))
    causal = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=scores.device)
    probs = torch.softmax(scores + causal.triu(1), dim=-1)  # saves its (b, nh, s, s) output
    if dropout:
        probs = torch.native_dropout(probs, dropout, True)[0]  # saves a bool (b, nh, s, s) mask
    return torch.matmul(probs, v)  # (b, nh, s, s) @ (b, nh, s, hd) -> (b, nh, s, hd)


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attention: str,
    recompute: str,
    dropout: float,
) -> torch.Tensor:
    """Causal attention of (b, nh, s, hd) q, k, v -> (b, nh, s, hd): the s² part of a layer.

    `dropout` is the drop probability in force (0.0 when not training). Under
    `recompute="selective"` only q, k and v are kept and the rest is recomputed in
    backward (Korthikanti et al. 2022, §4.2).
    """

    def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if attention == "materialized":
            return _materialized_attention(q, k, v, dropout)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)

    if recompute == "selective" and torch.is_grad_enabled():
        return checkpoint(core, q, k, v, use_reentrant=False)
    return core(q, k, v)


class GPTEmbedding(nn.Module):
    """Token ids -> residual stream: token embedding plus learned position embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.seq_len = cfg.seq_len
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = Dropout(cfg.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        s = idx.shape[1]
        if s > self.seq_len:
            raise ValueError(f"input length {s} exceeds GPTConfig.seq_len={self.seq_len}")
        positions = torch.arange(s, device=idx.device)
        # (b, s) -> (b, s, h), plus (s, h) broadcast over the batch
        return self.drop(self.tok(idx) + self.pos(positions))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q/k/v/o projections."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h = cfg.d_model
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        self.attention, self.recompute = cfg.attention, cfg.recompute
        self.q_proj = nn.Linear(h, h, bias=cfg.bias)
        self.k_proj = nn.Linear(h, h, bias=cfg.bias)
        self.v_proj = nn.Linear(h, h, bias=cfg.bias)
        self.o_proj = nn.Linear(h, h, bias=cfg.bias)
        self.resid_drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # (b, s, h) -> (b, s, nh, hd) -> (b, nh, s, hd); nh is inferred so a head-sharded
        # q_proj (fewer output features) runs unchanged.
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        # softmax(q k^T / sqrt(hd) + causal mask) v: (b, nh, s, hd) -> (b, nh, s, hd)
        y = attention_core(
            q,
            k,
            v,
            attention=self.attention,
            recompute=self.recompute,
            dropout=self.dropout if self.training else 0.0,
        )
        # (b, nh, s, hd) -> (b, s, nh, hd) -> (b, s, nh * hd)
        y = y.transpose(1, 2).reshape(b, s, -1)
        return self.resid_drop(self.o_proj(y))  # (b, s, nh * hd) @ (nh * hd, h) -> (b, s, h)


class FeedForward(nn.Module):
    """The block's MLP: fc1 (h -> ff), GELU, fc2 (ff -> h)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.ff_dim, bias=cfg.bias)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.fc2 = nn.Linear(cfg.ff_dim, cfg.d_model, bias=cfg.bias)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (b, s, h) @ (h, ff) -> (b, s, ff) -> GELU -> (b, s, ff) @ (ff, h) -> (b, s, h)
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.

    Under `recompute="full"` only the block's input is kept for backward; the block is
    run again there (the attention and MLP may be swapped for parallel ones: the
    recomputation runs whatever they are, collectives included, on every rank alike).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.recompute = cfg.recompute
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        """The block's computation, kept or recomputed as `forward` decides."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The GPT: `embedding` -> `blocks` -> `ln_f` -> `lm_head`; `forward(idx) -> logits`.

    `GPT(cfg, seed=0)` and `GPT(cfg, generator=torch.Generator().manual_seed(0))` build the
    same weights; `generator`, when given, takes precedence over `seed` and is advanced.
    The global RNG is neither read nor advanced.
    """

    def __init__(
        self, cfg: GPTConfig, seed: int = 0, generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        # Build on the meta device (no default init, no global RNG use), then allocate and
        # fill every tensor from the explicit generator.
        with torch.device("meta"):
            self.embedding = GPTEmbedding(cfg)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
            self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.to_empty(device="cpu")
        if cfg.tie_embeddings:  # after to_empty, which would allocate two separate tensors
            self.lm_head.weight = self.embedding.tok.weight
        if generator is None:
            generator = torch.Generator().manual_seed(seed)
        self.init_weights(generator)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, unit LayerNorm; the residual
        projections (`o_proj`, `fc2`) get std 0.02 / sqrt(2 * n_layers), GPT-2's scaling
        by the number of residual additions. Draws happen in module order."""
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if module is self.lm_head and self.cfg.tie_embeddings:
                continue  # already drawn as the token embedding
            if isinstance(module, nn.Linear | nn.Embedding):
                is_residual = name.endswith(("o_proj", "fc2"))
                std = residual_std if is_residual else INIT_STD
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (b, s) -> logits (b, s, vocab_size)."""
        x = self.embedding(idx)  # (b, s) -> (b, s, h)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (b, s, h) @ (h, vocab) -> (b, s, vocab)

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over every position: (b, s, V), (b, s) -> scalar."""
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten())
