"""FLOPs of a decoder-only transformer step, and the utilisation figures built on them.

One multiply-add is 2 FLOPs; only matrix multiplications are counted (element-wise work,
softmax and norms are < 1% of a large model's FLOPs and are priced as memory-bound work
elsewhere). A layer's forward is `layer_forward_flops` (Narayanan et al. 2021's count); a
step's model and hardware FLOPs, with recomputation, `step_flops`; MFU and HFU, `mfu` and
`hfu` (Chowdhery et al. 2022, PaLM, Appendix B). The FLOPs do not depend on how attention
is run ("materialized" or "flash", FlashAttention-2, Dao 2023, arXiv 2307.08691): the
full s² terms stay in the model-FLOPs convention, as that paper keeps them (§4.3); what
flash changes, the core's time and memory, is priced in `impls.simulator.costs` and
`impls.costmodel.activations`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ATTENTION",
    "RECOMPUTE",
    "StepFlops",
    "TransformerSpec",
    "hfu",
    "layer_forward_flops",
    "mfu",
    "step_flops",
]

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("materialized", "flash")


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """The shape the FLOPs depend on; `of(model)` reads it from a `GPTConfig`."""

    # Ranges (read by bench's config checks): far past any published model, and small
    # enough that the planner's per-layer and per-token arithmetic stays bounded.
    n_layers: int = field(metadata={"ge": 1, "le": 10_000})
    d_model: int = field(metadata={"ge": 1, "le": 1_000_000})
    n_heads: int = field(metadata={"ge": 1, "le": 100_000})
    vocab_size: int = field(metadata={"ge": 1, "le": 100_000_000})
    seq_len: int = field(metadata={"ge": 1, "le": 100_000_000})
    d_ff: int | None = field(default=None, metadata={"ge": 1, "le": 10_000_000})
    """MLP width; None: 4 × d_model."""
    kv_heads: int | None = field(default=None, metadata={"ge": 1})
    """Heads with their own keys and values (grouped-query attention); None: n_heads."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three matrices (LLaMA) instead of two."""
    attention: str = "materialized"
    """The attention core's kernel: "materialized" (the s × s scores, softmax and dropout
    mask in memory) or "flash" (FlashAttention: one fused kernel, only its output and the
    per-row log-sum-exp kept for the backward)."""

    def __post_init__(self) -> None:
        for key in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TransformerSpec.{key}={value!r}: must be an integer ≥ 1")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerSpec.n_heads={self.n_heads} does not divide d_model={self.d_model}"
            )
        if self.kv_heads is not None and (self.kv_heads < 1 or self.n_heads % self.kv_heads):
            raise ValueError(
                f"TransformerSpec.kv_heads={self.kv_heads}: must divide n_heads={self.n_heads}"
            )
        if self.attention not in ATTENTION:
            raise ValueError(
                f"TransformerSpec.attention={self.attention!r}: allowed values "
                f"{', '.join(ATTENTION)}"
            )

    @classmethod
    def of(cls, model: Any) -> TransformerSpec:
        """The spec of a `GPTConfig` (or anything with the same fields)."""
        return cls(
            n_layers=model.n_layers,
            d_model=model.d_model,
            n_heads=model.n_heads,
            vocab_size=model.vocab_size,
            seq_len=model.seq_len,
            d_ff=getattr(model, "d_ff", None),
        )

    @property
    def ffn(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def kv_fraction(self) -> float:
        return (self.kv_heads or self.n_heads) / self.n_heads


def layer_forward_flops(spec: TransformerSpec, batch: int, seq_len: int | None = None) -> dict:
    """One layer's forward FLOPs by part: `projections` (q, k, v and the output), `attention`
    (the two s² products) and `mlp`.

    Per layer, for b sequences of s tokens, width h, MLP width f, a heads of
    which k carry keys and values (k = a without grouped-query attention):

        forward = 2bsh·(h + 2h·k/a)      q, k, v projections
                + 2bs²h + 2bs²h          scores QKᵀ and the weighted sum of V (full, unmasked
                                         matrices, as Megatron-LM counts them)
                + 2bsh²                  output projection
                + 2bshf · m              MLP, m = 2 matrices (GELU) or 3 (SwiGLU)

    and the LM head 2bshV. With a = k, f = 4h, m = 2 that is 24bsh² + 4bs²h per layer, the
    count of Narayanan et al. 2021 (Megatron-LM, SC'21, §5.1, Appendix), whose step total with
    full recomputation, 96bslh²(1 + s/6h + V/16lh), `tests/costmodel/test_compute.py` checks.
    """
    s, h = seq_len or spec.seq_len, spec.d_model
    tokens = batch * s
    qkv = 2 * tokens * h * (h + 2 * h * spec.kv_fraction)
    return {
        "projections": qkv + 2 * tokens * h * h,
        "attention": 4 * batch * s * s * h,
        "mlp": 2 * tokens * h * spec.ffn * (3 if spec.gated_mlp else 2),
    }


@dataclass(frozen=True)
class StepFlops:
    """A training step's FLOPs: what the model needs, and what the hardware does."""

    model: float
    hardware: float
    forward: float
    """One forward pass (layers and LM head)."""


def step_flops(
    spec: TransformerSpec, batch: int, *, recompute: str = "none", seq_len: int | None = None
) -> StepFlops:
    """FLOPs of one training step (forward and backward) over `batch` sequences.

    Backward costs twice the forward (a gradient for the input and one for the weights). The
    FLOPs a step *needs* (model FLOPs) are 3× the forward; activation recomputation adds work
    the hardware does but the model does not need (hardware FLOPs):
    - `none`: nothing recomputed;
    - `selective`: the attention core (QKᵀ, softmax, ·V) is recomputed in the backward,
      4bs²h per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
      Transformer Models", §4.2);
    - `full`: every layer's forward runs again in the backward (the LM head does not).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}; allowed values: {', '.join(RECOMPUTE)}")
    if batch < 1:
        raise ValueError(f"batch={batch}: must be ≥ 1")
    parts = layer_forward_flops(spec, batch, seq_len)
    layer = sum(parts.values())
    head = 2 * batch * (seq_len or spec.seq_len) * spec.d_model * spec.vocab_size
    forward = spec.n_layers * layer + head
    extra = {"none": 0.0, "selective": parts["attention"], "full": layer}[recompute]
    return StepFlops(
        model=3 * forward, hardware=3 * forward + spec.n_layers * extra, forward=forward
    )


def mfu(model_flops: float, step_time_s: float, devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: model FLOPs per second over the devices' peak."""
    if step_time_s <= 0 or devices < 1 or peak_flops <= 0:
        raise ValueError("step_time_s, devices and peak_flops must be > 0")
    return model_flops / (step_time_s * devices * peak_flops)


def hfu(hardware_flops: float, step_time_s: float, devices: int, peak_flops: float) -> float:
    """Hardware FLOPs utilisation: as `mfu`, counting recomputed work too."""
    return mfu(hardware_flops, step_time_s, devices, peak_flops)
