"""`pipeline_utilization`'s typed config, the rules for which cells a schedule can take,
and what a cell carries. Light on purpose: every rank unpickles the config and the carry,
so this imports no pandas or plotting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.config import (
    batch_key,
    bounded,
    cell_timeout,
    check_choices,
    check_directory,
    check_number,
    check_positive,
    gpt_rank_bytes,
    iterations_key,
    ranks_key,
    seed_key,
)
from bench.experiments.pipeline_utilization.names import (
    SLICINGS,
    TORCH_SCHEDULES,
    torch_refuses,
    torch_twin,
)
from impls.models import GPTConfig
from impls.pipeline import SCHEDULES, Plan, build_plan
from impls.pipeline.schedules import INTERLEAVED as DISTBENCH_INTERLEAVED
from impls.pipeline.schedules import V_SHAPED

__all__ = [
    "ALLOWED",
    "PAIR_KEYS",
    "Carry",
    "PipelineUtilizationConfig",
    "alpa_refuses",
    "declared_columns",
    "plan_or_reason",
    "why_not",
]

ALLOWED = [*SCHEDULES, *TORCH_SCHEDULES]
# torch's twin of an interleaved schedule interleaves too
INTERLEAVED = DISTBENCH_INTERLEAVED | {torch_twin(s) for s in DISTBENCH_INTERLEAVED} - {None}
MODEL_KEYS = ("d_model", "n_layers", "n_heads", "seq_len", "vocab_size")
LIST_KEYS = (
    "schedules",
    "stages",
    "microbatches",
    "trace_microbatches",
    "slicings",
    "slicing_pairs",
)
PAIR_KEYS = ("schedule", "stages", "microbatches")


@dataclass(kw_only=True)
class PipelineUtilizationConfig:
    RANK_KEY: ClassVar[str] = "stages"
    SIZE_KEYS: ClassVar[tuple[str, ...]] = (*MODEL_KEYS, "batch_size")

    schedules: Any = field(default_factory=lambda: list(ALLOWED))
    """distbench schedules, and torch.distributed.pipelining baselines (`torch_*`); a lone
    name means one."""
    stages: Any = ranks_key([2, 4])
    """Pipeline degrees P (one rank per stage; world size = P). A lone int means one."""
    microbatches: Any = iterations_key([1, 2, 4, 8, 16, 32])
    """Micro-batch counts M; combinations a schedule cannot take are left out."""
    virtual_stages: int = bounded(2, ge=1, le=1024, why="model chunks on one stage")
    """Model chunks per rank V for the interleaved schedules (zero_bubble_v always uses 2,
    the others 1)."""
    d_model: int = bounded(128, ge=1, le=1_000_000)
    """GPT hidden size h."""
    n_layers: int = bounded(16, ge=1, le=10_000)
    """GPT blocks; every stage (P·V of them when interleaved) needs at least one. 4 blocks
    per stage at P = 4 keep an activation transfer small beside a stage's compute."""
    n_heads: int = bounded(4, ge=1, le=100_000)
    """Attention heads per block."""
    seq_len: int = bounded(64, ge=1, le=2**20, why="a million tokens")
    """Tokens per sequence."""
    vocab_size: int = bounded(64, ge=1, le=100_000_000)
    """A 64-token vocabulary keeps the LM head from weighing down the last stage."""
    batch_size: int = batch_key(32)
    """Sequences per step, split into M micro-batches (so every M must divide it)."""
    warmup: int = iterations_key(1, ge=0)
    """Untimed steps per cell (the first step builds buffers and, for torch, infers shapes)."""
    repeats: int = iterations_key(5)
    """Timed steps per cell; medians are reported."""
    profile_samples: int = iterations_key(12)
    """Profiling steps per cell (at least 2) give each stage's F, B, I and W at least this
    many samples, of which the replay prices the fastest: ceil(samples / M) steps. Two steps
    at M = 1 left two samples, and a stage's cost moved 20–30% between stages of one cell."""
    timeout_s: float = cell_timeout(600.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""
    paired: bool = True
    """distbench cells whose schedule torch also has (gpipe, 1f1b, interleaved_1f1b) time
    torch's twin in alternating steps too: the side-by-side speed ratio the report leads
    with; and ZB-H1 cells profile a 1F1B twin in alternating steps (ZB-H1 ÷ 1F1B, one cell)."""
    slicings: Any = field(default_factory=lambda: ["equal"])
    """How every grid cell cuts the model into stages: `equal` block counts, or `alpa`
    (Alpa's stage slicing on layer costs measured on this host before the cell runs).
    `alpa` takes distbench's schedules with one stage per rank; other cells run `equal`
    only."""
    slicing_pairs: Any = field(default_factory=list)
    """Extra cells, each run with both slicings (equal vs alpa), beside the grid:
    `[{schedule: gpipe, stages: 4, microbatches: 8}, ...]` (the report compares each pair)."""
    trace_microbatches: Any = iterations_key([1, 4])
    """distbench cells with these M export a Chrome trace and Gantt spans (`[]`: none)."""
    trace_dir: str | None = None
    """Where traces go (under `traces/`); None: the run's report_dir."""
    seed: int = seed_key(0)
    """Seeds the weights and the batch (the same on every rank and for torch's rows)."""

    def profiling_steps(self, microbatches: int) -> int:
        """Profiling steps of a cell of M micro-batches: `profile_samples` per action kind
        of each stage, and never fewer than two."""
        return max(2, -(-self.profile_samples // microbatches))

    def __post_init__(self) -> None:
        for key in LIST_KEYS:
            setattr(self, key, _as_list(getattr(self, key)))
        check_choices("schedules", self.schedules, ALLOWED)
        check_choices("slicings", self.slicings, SLICINGS)
        if self.trace_dir is not None:
            check_directory("trace_dir", self.trace_dir)
        check_positive("stages", self.stages)
        check_positive("microbatches", self.microbatches)
        if self.trace_microbatches:
            check_positive("trace_microbatches", self.trace_microbatches)
        for key in (*MODEL_KEYS, "batch_size", "repeats", "profile_samples"):
            _check_count(key, getattr(self, key), 1)
        _check_count("warmup", self.warmup, 0)
        _check_count("seed", self.seed, 0)
        interleaved = sorted(set(self.schedules) & INTERLEAVED)
        if interleaved:
            _check_count("virtual_stages", self.virtual_stages, 2, f" for {interleaved[0]}")
        check_number("timeout_s", self.timeout_s)
        GPTConfig(**self.model())  # n_heads must divide d_model: its message names both
        self._check_layers(bool(interleaved), bool(set(self.schedules) & V_SHAPED))
        bad = [m for m in self.microbatches if self.batch_size % m]
        if bad:
            raise ValueError(
                f"microbatches={bad} do not divide batch_size={self.batch_size}: every "
                f"micro-batch must hold the same number of sequences"
            )
        self._check_grid()
        self._check_pairs()

    def rank_bytes(self) -> int:
        """An upper bound on what one rank holds: the whole model (P = 1) and torch's twin,
        on the whole batch."""
        return gpt_rank_bytes(GPTConfig(**self.model()), self.batch_size)

    def model(self) -> dict[str, int]:
        """The `GPTConfig` keyword arguments."""
        return {key: getattr(self, key) for key in MODEL_KEYS}

    def virtual(self, schedule: str) -> int:
        """V for `schedule`: `virtual_stages` when interleaved, 2 for ZB-V, else 1."""
        return virtual_of(schedule, self.virtual_stages)

    def _check_layers(self, interleaved: bool, v_shaped: bool = False) -> None:
        chunks = max(self.virtual_stages if interleaved else 1, 2 if v_shaped else 1)
        needed = max(self.stages) * chunks
        if needed > self.n_layers:
            how = (
                f"the interleaved or V-shaped schedules cut stages × chunks = {needed} stages"
                if chunks > 1
                else f"{needed} stages"
            )
            raise ValueError(
                f"stages={self.stages}: {how}, more than the model's n_layers={self.n_layers} "
                f"(each stage needs at least one layer), so stages must be ≤ "
                f"{self.n_layers // chunks} (or raise n_layers)"
            )

    def _check_pairs(self) -> None:
        for pair in self.slicing_pairs:
            if not isinstance(pair, dict) or set(pair) != set(PAIR_KEYS):
                raise ValueError(
                    f"slicing_pairs: {pair!r} must be a mapping with exactly the "
                    f"keys {', '.join(PAIR_KEYS)}"
                )
            schedule, p, m = (pair[k] for k in PAIR_KEYS)
            for key, value in (("stages", p), ("microbatches", m)):
                _check_count(f"slicing_pairs {key}", value, 1)
            refused = alpa_refuses(schedule) or why_not(schedule, p, m, 1)
            if p > self.n_layers:
                refused = f"more stages than the model's n_layers={self.n_layers}"
            if self.batch_size % m:
                refused = f"microbatches={m} does not divide batch_size={self.batch_size}"
            if refused:
                raise ValueError(f"slicing_pairs: {pair!r} cannot run: {refused}")

    def _check_grid(self) -> None:
        for schedule in self.schedules:
            combos = [(p, m) for p in self.stages for m in self.microbatches]
            reasons = [why_not(schedule, p, m, self.virtual_stages) for p, m in combos]
            if all(reasons):
                raise ValueError(
                    f"microbatches={self.microbatches}: schedule {schedule!r} can run none of "
                    f"them at stages={self.stages} ({reasons[0]})"
                )


def _as_list(value: Any) -> list:
    """A lone value (`stages=4`, `schedules=gpipe`) as a one-element list."""
    return list(value) if isinstance(value, list | tuple) else [value]


def _check_count(key: str, value: Any, minimum: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}={value!r}: must be an integer ≥ {minimum}{why}")


def declared_columns(schedule: str) -> dict[str, Any]:
    """What the report needs of a schedule's spec, as columns of its rows (the report reads
    results only): `schedule_rank` (its place in the registry), `schedule_label`,
    `bound_source`, `marker` and `split_backward` (1 or 0). Empty for torch's schedules,
    which have no spec."""
    spec = SCHEDULES.get(schedule)
    if spec is None:
        return {
            "schedule_rank": None,
            "schedule_label": "",
            "bound_source": "",
            "marker": "",
            "split_backward": None,
        }
    return {
        "schedule_rank": list(SCHEDULES).index(schedule),
        "schedule_label": spec.label,
        "bound_source": spec.bound_source,
        "marker": spec.marker,
        "split_backward": int(spec.split_backward),
    }


def plan_or_reason(schedule: str, p: int, m: int, v: int) -> tuple[Plan | None, str | None]:
    """(the plan of `schedule` at P, M, V, None), or (None, why it cannot run). A torch
    cell is checked against its distbench twin's rules and torch's own."""
    refused = torch_refuses(schedule, p, m)
    if refused:
        return None, refused
    try:
        return build_plan(schedule.removeprefix("torch_"), p, m, v), None
    except ValueError as error:
        return None, str(error)


def alpa_refuses(schedule: str) -> str | None:
    """Why Alpa's slicing cannot cut `schedule`'s stages; None if it can."""
    if schedule not in SCHEDULES:
        return f"schedule {schedule!r}: alpa slicing runs distbench's {', '.join(SCHEDULES)}"
    if schedule in INTERLEAVED | V_SHAPED:
        return f"schedule {schedule!r} cuts P·V stages; alpa slicing cuts one stage per rank"
    return None


def why_not(schedule: str, stages: int, microbatches: int, virtual_stages: int) -> str | None:
    """Why `schedule` cannot run P = `stages`, M = `microbatches`; None if it can."""
    return plan_or_reason(schedule, stages, microbatches, virtual_of(schedule, virtual_stages))[1]


def virtual_of(schedule: str, virtual_stages: int) -> int:
    """Chunks per rank `schedule` runs: `virtual_stages` when interleaved, 2 for ZB-V, else 1."""
    if schedule in V_SHAPED:
        return 2
    return virtual_stages if schedule in INTERLEAVED else 1


@dataclass(frozen=True)
class Carry:
    """What a cell's parent derives once and its ranks, `to_row` and `artefacts` share."""

    plan: Plan | None
    """distbench's plan (rank -> actions); None for a torch.distributed.pipelining cell."""
    torch_schedule: str | None
    """The torch schedule class the cell times: its own (torch cells), or its twin's, in
    steps alternating with distbench's (paired distbench cells); None: none."""
    trace: str | None
    """File stem of the cell's Chrome trace and Gantt spans under `traces/` (None: none)."""
    stage_layers: tuple[int, ...] | None = None
    """Transformer blocks per stage when not the equal split (Alpa's cut); None: equal."""
    layer_costs: Any = None
    """The `slicing.LayerCosts` the cut was decided on (also for an equal cell of a pair);
    None: not measured."""
    fused_twin: Plan | None = None
    """A ZB-H1 cell's 1F1B plan of the same P and M, profiled in steps alternating with the
    cell's own on a twin model, so that ZB-H1 ÷ 1F1B is a ratio measured in one cell (None:
    no twin)."""
