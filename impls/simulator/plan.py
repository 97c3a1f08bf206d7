"""A parallel plan (how one training step is cut over GPUs) and what the simulator predicts.

The GPUs form a dp × cp × tp × pp grid laid out with tp innermost, then cp, then dp, then
pp outermost: global rank = tp_index + tp · (cp_index + cp · (dp_index + dp · pp_index)),
the layout of Megatron-LM (Narayanan et al. 2021, §3: tensor parallelism inside a node,
pipeline across nodes) with Megatron-core's context-parallel axis next to tp (its
`initialize_model_parallel(order="tp-cp-ep-dp-pp")`, megatron/core/parallel_state.py). The
model is the embedding, `n_layers` transformer layers and the LM head, `n_layers + 2`
"layers" in a row; pipeline stage s holds a contiguous run of them (`stage_layers`): equal
slicing by default, Megatron-LM's own layout with `megatron_stage_layers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from impls.costmodel.compute import RECOMPUTE, TransformerSpec
from impls.pipeline.schedules import INTERLEAVED, PLANNER_SCHEDULES, SCHEDULES

__all__ = [
    "PLANNER_SCHEDULES",
    "SEQUENCE_PARALLEL",
    "ParallelPlan",
    "Prediction",
    "megatron_stage_layers",
    "stage_slices",
    "validate_plan",
]

SEQUENCE_PARALLEL = ("none", "megatron_sp", "ulysses")


def _count(key: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}={value!r}: must be an integer ≥ {minimum}")


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """One point of the search space: degrees, sequence parallelism, ZeRO, schedule."""

    dp: int
    """Data-parallel replicas."""
    tp: int
    """Tensor-parallel degree (Megatron column/row sharding), or the Ulysses group size."""
    pp: int
    """Pipeline ranks."""
    cp: int = 1
    """Context-parallel degree: each rank holds seq_len/cp tokens of every sequence, and
    attention runs as ring attention over the cp group (Liu et al. 2023, arXiv 2310.01889;
    Megatron-core's context parallelism)."""
    sp: str = "none"
    """`none`, `megatron_sp` (Korthikanti et al. 2022 §4.2.2) or `ulysses` (Jacobs et al.
    2023: the tp-axis group shards the sequence and all-to-alls heads; weights unsharded)."""
    zero_stage: int = 0
    """ZeRO stage over the data-parallel group (Rajbhandari et al. 2019)."""
    microbatch_size: int = 1
    num_microbatches: int = 1
    """Micro-batches per step and replica (gradient accumulation when pp == 1)."""
    schedule: str = "1f1b"
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved_1f1b only)."""
    recompute: str = "none"
    stage_layers: tuple[int, ...] | None = field(default=None)
    """Layers per (virtual) stage, embedding and LM head counted as layers; None: equal."""

    def __post_init__(self) -> None:
        for key in (
            "dp",
            "tp",
            "pp",
            "cp",
            "microbatch_size",
            "num_microbatches",
            "virtual_stages",
        ):
            _count(key, getattr(self, key))
        if self.sp not in SEQUENCE_PARALLEL:
            raise ValueError(
                f"sp={self.sp!r}: unknown; choose one of {', '.join(SEQUENCE_PARALLEL)}"
            )
        if self.sp == "megatron_sp" and self.tp == 1:
            raise ValueError("sp='megatron_sp': needs tp > 1 (it shards the tp group's sequence)")
        if self.sp == "ulysses" and self.tp == 1:
            raise ValueError("sp='ulysses': needs tp > 1 (the tp axis is the Ulysses group)")
        if isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage!r}: allowed values 0, 1, 2, 3")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute={self.recompute!r}: choose one of {', '.join(RECOMPUTE)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule={self.schedule!r}: unknown; choose one of {', '.join(SCHEDULES)}"
            )
        if not SCHEDULES[self.schedule].microbatched and self.num_microbatches != 1:
            raise ValueError(
                f"num_microbatches={self.num_microbatches}: schedule {self.schedule!r} "
                "does no micro-batching (use 'gpipe' or '1f1b')"
            )
        if self.schedule in INTERLEAVED:
            if self.virtual_stages < 2:
                raise ValueError(
                    f"virtual_stages={self.virtual_stages}: schedule "
                    f"{self.schedule!r} needs ≥ 2 chunks per rank"
                )
            if self.num_microbatches % self.pp:
                raise ValueError(
                    f"num_microbatches={self.num_microbatches}: schedule "
                    f"{self.schedule!r} needs a multiple of pp={self.pp}"
                )
        elif self.virtual_stages != 1:
            raise ValueError(
                f"virtual_stages={self.virtual_stages}: only "
                f"{', '.join(sorted(INTERLEAVED))} takes more than 1"
            )
        if self.stage_layers is not None:
            layers = tuple(self.stage_layers)
            object.__setattr__(self, "stage_layers", layers)
            if len(layers) != self.stages:
                raise ValueError(
                    f"stage_layers={layers}: needs pp·virtual_stages={self.stages} entries"
                )
            for count in layers:
                _count("stage_layers entry", count)

    @property
    def stages(self) -> int:
        """Pipeline stages in all (pp · virtual_stages)."""
        return self.pp * self.virtual_stages

    @property
    def gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def sequences_per_step(self) -> int:
        """The global batch in sequences: dp · num_microbatches · microbatch_size (the cp
        ranks of a replica share its sequences)."""
        return self.dp * self.num_microbatches * self.microbatch_size


def validate_plan(spec: TransformerSpec, plan: ParallelPlan) -> None:
    """Refuse a plan the model cannot be cut by, naming the key (ValueError)."""
    if spec.n_heads % plan.tp:
        raise ValueError(f"tp={plan.tp}: must divide n_heads={spec.n_heads}")
    if spec.kv_heads is not None and spec.kv_heads % plan.tp:
        raise ValueError(f"tp={plan.tp}: must divide kv_heads={spec.kv_heads}")
    if spec.seq_len % plan.cp:
        raise ValueError(
            f"cp={plan.cp}: context parallelism splits the sequence, so cp "
            f"must divide seq_len={spec.seq_len}"
        )
    local = spec.seq_len // plan.cp
    if plan.sp != "none" and local % plan.tp:
        what = f"seq_len={spec.seq_len}" if plan.cp == 1 else f"seq_len/cp={local}"
        raise ValueError(
            f"tp={plan.tp}: sp={plan.sp!r} shards the sequence, so tp must divide {what}"
        )
    layers = spec.n_layers + 2
    if plan.stages > layers:
        raise ValueError(
            f"pp={plan.pp}: pp·virtual_stages={plan.stages} exceeds the "
            f"{layers} layers (n_layers + embedding + LM head)"
        )
    if plan.stage_layers is not None and sum(plan.stage_layers) != layers:
        raise ValueError(
            f"stage_layers={plan.stage_layers}: must sum to n_layers + 2 = "
            f"{layers} (the embedding and LM head count as layers)"
        )


def stage_slices(n_layers: int, plan: ParallelPlan) -> tuple[tuple[int, int], ...]:
    """[start, stop) of each (virtual) stage over the n_layers + 2 layers.

    Equal slicing gives the first (L + 2) mod S stages one layer more.
    """
    total = n_layers + 2
    if plan.stage_layers is not None:
        counts = plan.stage_layers
    else:
        q, r = divmod(total, plan.stages)
        counts = tuple(q + (1 if i < r else 0) for i in range(plan.stages))
    bounds, start = [], 0
    for count in counts:
        bounds.append((start, start + count))
        start += count
    return tuple(bounds)


def megatron_stage_layers(n_layers: int, stages: int) -> tuple[int, ...]:
    """`ParallelPlan.stage_layers` for Megatron-LM's layout over `stages` (virtual) stages.

    Megatron-LM builds n_layers / stages transformer blocks on every (virtual) stage
    (`megatron/core/transformer/transformer_block.py`, `get_num_layers_to_build`: the
    blocks per pipeline rank, then ÷ the virtual size) and refuses a count that does not
    divide ("num_layers must be divisible by transformer_pipeline_model_parallel_size",
    `megatron/model/transformer.py`, `_get_num_layers`). The embedding sits on the first
    stage (`pre_process`) and the LM head on the last (`post_process`), on top of their
    blocks: counts (L/S + 1, L/S, …, L/S, L/S + 1), which sum to L + 2. With S = 1 the one
    stage holds everything, L + 2.
    """
    _count("n_layers", n_layers)
    _count("stages", stages)
    if n_layers % stages:
        raise ValueError(
            f"stages={stages}: Megatron-LM's layout needs it to divide "
            f"n_layers={n_layers} (L/S blocks per stage)"
        )
    counts = [n_layers // stages] * stages
    counts[0] += 1  # the embedding
    counts[-1] += 1  # the LM head
    return tuple(counts)


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """One predicted training step. The parts add up: step_time_s = compute_s + bubble_s +
    exposed_tp_s + exposed_pp_s + exposed_dp_s + optimizer_s."""

    step_time_s: float
    compute_s: float
    """Busy compute of the critical (busiest) pipeline rank, TP and DP communication apart."""
    bubble_s: float
    """Idle time of that rank with free pipeline transfers (the schedule's own bubble)."""
    exposed_tp_s: float
    exposed_pp_s: float
    """Makespan with priced transfers minus the makespan with free ones."""
    exposed_dp_s: float
    optimizer_s: float
    peak_memory_bytes: float
    fits: bool
    tokens_per_s: float
    """Tokens per second (for a data-parallel-only model: samples per second)."""
    tflops_per_gpu: float
    mfu: float
    hfu: float
    memory_breakdown: dict
    stage_times: tuple
    """Per (virtual) stage: forward + backward seconds of one micro-batch (TP included)."""
