"""The shape of one published run, and the checks every row passes.

Metrics are kept exactly as the source states them, with the FLOP convention it counts by:
- `model`: the FLOPs the model needs, counted matrix by matrix as `costmodel.compute`
  does (Korthikanti et al. 2022 MFU; NeMo's "model TFLOP/s");
- `model_6n`: 6·N per token with N *every* parameter (embedding and position tables
  included) plus 12·l·h·s for attention scores (PaLM, Chowdhery et al. 2022, App. B, as
  llm-foundry, torchtitan and lit-gpt count it); it exceeds `model` by the embedding
  table's share of N;
- `hardware_full_recompute`: Megatron-LM SC'21 style, counting the recomputed forward:
  96·B·s·l·h²(1 + s/6h + V/16lh) per step (Narayanan et al. 2021, §5.1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from impls.costmodel.models import CARDS, MODELS, param_count
from impls.simulator.plan import ParallelPlan

__all__ = [
    "ATTENTION_KINDS",
    "FLOPS_CONVENTIONS",
    "HARDWARE_NAMES",
    "LAYOUTS",
    "PublishedRun",
    "published_plan",
]

HARDWARE_NAMES = ("a100_40gb", "a100_80gb", "h100_sxm", "v100_32gb", "v100_summit")
FLOPS_CONVENTIONS = ("model", "model_6n", "hardware_full_recompute")
ATTENTION_KINDS = ("materialized", "flash")
LAYOUTS = ("equal", "megatron")
DERIVED = ("gpus", "global_batch")
"""What a source states that the plan derives: `assumed` may name them too."""


def _allowed(key: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"PublishedRun.{key}={value!r}: allowed values: {', '.join(allowed)}")


def published_plan(
    *, global_batch: int, dp: int, microbatch_size: int = 1, gpus: int | None = None, **plan: object
) -> ParallelPlan:
    """A run's `ParallelPlan` from the figures sources state: the global batch (sequences
    per optimizer step) rather than micro-batches per replica, and, if given, the GPU count
    the degrees must multiply to. The plan's own checks name any other bad field."""
    if gpus is not None:
        cp, tp, pp = (plan.get(key, 1) for key in ("cp", "tp", "pp"))
        if dp * cp * tp * pp != gpus:  # type: ignore[operator]
            raise ValueError(f"dp·cp·tp·pp = {dp}·{cp}·{tp}·{pp} != gpus={gpus}")
    if global_batch % (dp * microbatch_size):
        raise ValueError(
            f"global_batch={global_batch} is not a multiple of "
            f"dp·microbatch_size={dp * microbatch_size}"
        )
    return ParallelPlan(
        dp=dp,
        microbatch_size=microbatch_size,
        num_microbatches=global_batch // (dp * microbatch_size),
        **plan,
    )  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One published run: its plan (layout, batch, schedule), the model and cluster it ran
    on, and the throughput its source reports. Every parallelism field lives in `plan`."""

    name: str
    model: str
    """A key of `impls.costmodel.models.MODELS`."""
    hardware: str
    gpus_per_node: int
    plan: ParallelPlan
    """Degrees, ZeRO stage, micro-batching, schedule and recomputation as the source
    states them (`published_plan` builds it from the global batch); its stage layout is
    `layout`'s, applied by `impls.simulator.validation.run_plan`."""
    seq_len: int
    dtype: str
    flops_convention: str
    source: str
    """The citation: document, table, version."""
    origin: str
    """A short key of the independent source family (`nemo` for every NeMo release):
    the unit of per-source and leave-one-source-out errors."""
    notes: str
    tflops_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    attention: str = "materialized"
    """`flash`: the run's framework used FlashAttention or a fused attention kernel (no s²
    score matrix kept); `materialized`: the scores were stored (Megatron-LM 2021/2022)."""
    layout: str = "equal"
    """`megatron`: Megatron-LM's pipeline layout (L/pp blocks per stage, the embedding on
    the first stage and the LM head on the last); `equal`: blocks sliced evenly."""
    node_network_gbps: float | None = None
    """The inter-node network of one node as the source states it (Gb/s, all its NICs),
    where that is not the preset's; shared evenly by the node's GPUs. None: the preset's
    per-GPU NIC."""
    assumed: tuple[str, ...] = ()
    """Fields (of the run or of its plan) whose value is not published: chosen here,
    explained in `notes`."""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"PublishedRun.model={self.model!r}: not a key of MODELS")
        if not isinstance(self.plan, ParallelPlan):
            raise ValueError(f"{self.name}: plan={self.plan!r}: must be a ParallelPlan")
        if self.plan.stage_layers is not None:
            raise ValueError(f"{self.name}: plan.stage_layers: set by layout, not by the run")
        _allowed("hardware", self.hardware, HARDWARE_NAMES)
        _allowed("flops_convention", self.flops_convention, FLOPS_CONVENTIONS)
        _allowed("attention", self.attention, ATTENTION_KINDS)
        _allowed("layout", self.layout, LAYOUTS)
        if self.seq_len % self.plan.cp:
            raise ValueError(
                f"{self.name}: cp={self.plan.cp} does not divide seq_len={self.seq_len}"
            )
        gbps = self.node_network_gbps
        if gbps is not None and (
            isinstance(gbps, bool)
            or not isinstance(gbps, int | float)
            or not 0 < gbps < float("inf")
        ):
            raise ValueError(f"{self.name}: node_network_gbps={gbps!r} must be > 0 or None")
        if not self.origin:
            raise ValueError(f"{self.name}: origin must name the source family")
        names = {f.name for f in fields(self)} | {f.name for f in fields(ParallelPlan)}
        unknown = [key for key in self.assumed if key not in names | set(DERIVED)]
        if unknown:
            raise ValueError(f"{self.name}: assumed names unknown fields {unknown}")
        if not any(
            v is not None
            for v in (self.tflops_per_gpu, self.tokens_per_s_per_gpu, self.mfu, self.hfu)
        ):
            raise ValueError(f"{self.name}: no published metric")

    @property
    def gpus(self) -> int:
        return self.plan.gpus

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.plan.sequences_per_step

    @property
    def params(self) -> int:
        """Every parameter of the run's model at the run's sequence length (a learned
        position table grows with it): the N of the `model_6n` convention, which equals
        llm-foundry's NumParams column at every SeqLen."""
        card = CARDS[self.model]
        return param_count(
            replace(card.spec, seq_len=self.seq_len),
            tied_embeddings=card.tied_embeddings,
            biases=card.biases,
            learned_positions=card.learned_positions,
        )

    @property
    def model_6n_flops_per_token(self) -> float:
        """6·N + 12·l·h·s (PaLM, Chowdhery et al. 2022, App. B): the `model_6n` count."""
        spec = MODELS[self.model]
        return 6 * self.params + 12 * spec.n_layers * spec.d_model * self.seq_len

    @property
    def tokens_per_s(self) -> float | None:
        """Whole-job tokens per second, where the source gives a per-GPU rate."""
        if self.tokens_per_s_per_gpu is None:
            return None
        return self.tokens_per_s_per_gpu * self.gpus
