"""Experiment `pipeline_utilization`: the lecture's pipeline figure (naive 4 stages: 25%,
GPipe 4 stages × 4 micro-batches: 57%) measured, then every schedule over micro-batch
counts, with torch.distributed.pipelining's GPipe / 1F1B / interleaved 1F1B as baselines.

A cell is (schedule, stages P, micro-batches M, virtual stages V) on P ranks. The grid is
schedules × stages × microbatches; a combination a schedule cannot take is left out of it
rather than failing the run: `naive` runs at M = 1 only, the interleaved schedules need M
divisible by P, torch's `Schedule1F1B` needs M ≥ P. A schedule left with no cell at all is
refused, naming `microbatches`. Everything else that cannot work — more stages than
layers, a batch that M does not divide, an unknown schedule — is refused before any
process starts.

Each distbench row carries utilization measured two ways — wall clock, and replayed: the
plan's dependency graph with each compute action costing its measured thread CPU time
(the fastest of its stage's actions of its kind, in two profiling steps in which ranks
compute one at a time: `bench.pipeline_cells.HostComputeLock`) and each transfer the measured cost of
one activation between two otherwise idle ranks (the fastest of its round trips), as if
every rank had its own device —
beside the bound from theory, peak activation memory and in-flight micro-batches. The
distbench cells with M in `trace_microbatches` also leave a Chrome trace and the spans
the report's Gantt charts are drawn from under `<trace_dir>/traces/`.
"""

from __future__ import annotations

import csv
import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.experiments.common import Cell, Experiment, check_choices, check_positive
from bench.pipeline_cells import (
    TORCH_SCHEDULES,
    PipelineCell,
    run_distbench_pipeline,
    run_torch_pipeline,
)
from bench.reports import pipeline_utilization as report
from impls.models import GPTConfig
from impls.pipeline import SCHEDULES, Action, build_plan, max_inflight_microbatches, replay
from impls.pipeline.actions import COMPUTE_KINDS
from impls.pipeline.theory import utilization_bound

__all__ = ["ALLOWED", "EXPERIMENT", "PipelineUtilizationConfig", "grid", "why_not"]

log = logging.getLogger("bench")

ALLOWED = [*SCHEDULES, *TORCH_SCHEDULES]
INTERLEAVED = frozenset({"interleaved_1f1b", "torch_interleaved_1f1b"})
REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_KEYS = ("d_model", "n_layers", "n_heads", "seq_len", "vocab_size")


@dataclass(kw_only=True)
class PipelineUtilizationConfig:
    schedules: list[str] = field(default_factory=lambda: list(ALLOWED))
    """distbench schedules, and torch.distributed.pipelining baselines (`torch_*`)."""
    stages: list[int] | int = field(default_factory=lambda: [2, 4])
    """Pipeline degrees P (one rank per stage; world size = P). An int means one."""
    microbatches: list[int] | int = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    """Micro-batch counts M; combinations a schedule cannot take are left out."""
    virtual_stages: int = 2
    """Model chunks per rank V for the interleaved schedules (the others use 1)."""
    d_model: int = 128
    n_layers: int = 16
    """GPT blocks; every stage (P·V of them when interleaved) needs at least one."""
    n_heads: int = 4
    seq_len: int = 64
    vocab_size: int = 64
    batch_size: int = 32
    """Sequences per step, split into M micro-batches (so every M must divide it)."""
    warmup: int = 1
    """Untimed steps per cell (the first step builds buffers and, for torch, infers shapes)."""
    repeats: int = 5
    """Timed steps per cell; medians are reported."""
    timeout_s: float = 600.0
    """A cell whose ranks have not all finished by then is recorded as failed."""
    paired: bool = True
    """distbench cells whose schedule torch also has (gpipe, 1f1b, interleaved_1f1b) time
    torch's twin in alternating steps too: the side-by-side speed ratio the report leads with."""
    trace_microbatches: list[int] = field(default_factory=lambda: [1, 4])
    """distbench cells with these M export a Chrome trace and Gantt spans (`[]`: none)."""
    trace_dir: str | None = None
    """Where traces go; the YAML sets it to report_dir (None: reports/pipeline_utilization)."""
    seed: int = 0
    """Seeds the weights and the batch (the same on every rank and for torch's rows)."""

    def __post_init__(self) -> None:
        for key in ("schedules", "stages", "microbatches", "trace_microbatches"):
            setattr(self, key, _as_list(getattr(self, key)))
        check_choices("schedules", self.schedules, ALLOWED)
        check_positive("stages", self.stages)
        check_positive("microbatches", self.microbatches)
        if self.trace_microbatches:
            check_positive("trace_microbatches", self.trace_microbatches)
        for key in (*MODEL_KEYS, "batch_size", "repeats"):
            _check_count(key, getattr(self, key), 1)
        _check_count("warmup", self.warmup, 0)
        interleaved = sorted(set(self.schedules) & INTERLEAVED)
        if interleaved:
            _check_count("virtual_stages", self.virtual_stages, 2, f" for {interleaved[0]}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s} must be > 0")
        GPTConfig(**self.model())  # n_heads must divide d_model: its message names both
        self._check_layers(bool(interleaved))
        bad = [m for m in self.microbatches if self.batch_size % m]
        if bad:
            raise ValueError(
                f"microbatches={bad} do not divide batch_size={self.batch_size}: every "
                f"micro-batch must hold the same number of sequences"
            )
        self._check_grid()
        self.trace_dir = str(self.trace_dir or REPO_ROOT / "reports" / "pipeline_utilization")

    def model(self) -> dict[str, int]:
        """The `GPTConfig` keyword arguments."""
        return {key: getattr(self, key) for key in MODEL_KEYS}

    def _check_layers(self, interleaved: bool) -> None:
        chunks = self.virtual_stages if interleaved else 1
        needed = max(self.stages) * chunks
        if needed > self.n_layers:
            how = (
                f"the interleaved schedules cut stages × virtual_stages = {needed} stages"
                if chunks > 1
                else f"{needed} stages"
            )
            raise ValueError(
                f"stages={self.stages}: {how}, more than the model's n_layers={self.n_layers} "
                f"(each stage needs at least one layer), so stages must be ≤ "
                f"{self.n_layers // chunks} (or raise n_layers)"
            )

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


def why_not(schedule: str, stages: int, microbatches: int, virtual_stages: int) -> str | None:
    """Why `schedule` cannot run P = `stages`, M = `microbatches`; None if it can."""
    if schedule == "torch_1f1b" and microbatches < stages:
        return f"torch's Schedule1F1B needs microbatches ≥ stages={stages}"
    twin = schedule.removeprefix("torch_")
    v = virtual_stages if schedule in INTERLEAVED else 1
    try:
        build_plan(twin, stages, microbatches, v)  # torch's cells follow distbench's rules
    except ValueError as error:
        return str(error)
    return None


def grid(cfg: PipelineUtilizationConfig) -> list[tuple[str, int, int, int]]:
    """(schedule, P, M, V) of every cell, P ascending (the runner reuses one pool per P)."""
    out, skipped = [], []
    for p in sorted(set(cfg.stages)):
        for schedule in cfg.schedules:
            for m in cfg.microbatches:
                v = cfg.virtual_stages if schedule in INTERLEAVED else 1
                if why_not(schedule, p, m, cfg.virtual_stages) is None:
                    out.append((schedule, p, m, v))
                else:
                    skipped.append(f"{schedule} P={p} M={m}")
    if skipped:
        log.info("left out (the schedule cannot take them): %s", ", ".join(skipped))
    return out


def _stem(schedule: str, p: int, m: int) -> str:
    return f"{schedule}_p{p}_m{m}"


def cells(cfg: PipelineUtilizationConfig) -> list[Cell]:
    out = []
    for schedule, p, m, v in grid(cfg):
        torch_baseline = schedule in TORCH_SCHEDULES
        traced = not torch_baseline and m in cfg.trace_microbatches
        twin = f"torch_{schedule}"
        paired = (
            cfg.paired
            and twin in TORCH_SCHEDULES
            and why_not(twin, p, m, cfg.virtual_stages) is None
        )
        task = PipelineCell(
            schedule=schedule,
            stages=p,
            microbatches=m,
            virtual_stages=v,
            model=cfg.model(),
            batch_size=cfg.batch_size,
            warmup=cfg.warmup,
            repeats=cfg.repeats,
            seed=cfg.seed,
            paired=paired,
            trace_path=str(Path(cfg.trace_dir) / "traces" / _stem(schedule, p, m))
            if traced
            else None,
        )
        key = {"schedule": schedule, "stages": p, "microbatches": m, "virtual_stages": v}
        fn = run_torch_pipeline if torch_baseline else run_distbench_pipeline
        out.append(Cell(world_size=p, key=key, fn=fn, task=task))
    return out


def _theory(schedule: str, p: int, m: int, v: int) -> float:
    try:
        return utilization_bound(schedule, p, m, v)
    except ValueError:  # e.g. ZB-H1's bound assumes M ≥ P
        return math.nan


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: PipelineCell = cell.task
    step_time = statistics.median(per_rank[0]["step_times_s"])  # already the slowest rank's
    losses = [r["loss"] for r in per_rank if r.get("loss") is not None]
    row = {
        **cell.key,
        "impl": "torch" if task.schedule in TORCH_SCHEDULES else "distbench",
        "util_wall": math.nan,
        "util_replayed": math.nan,
        "util_theory": math.nan,
        "bubble_fraction": math.nan,
        "step_time_s": step_time,
        "torch_step_time_s": math.nan,
        "step_time_vs_torch": math.nan,
        "peak_activation_bytes": math.nan,
        "max_inflight_microbatches": math.nan,
        "max_inflight_plan": math.nan,
        "loss": losses[0] if losses else math.nan,
        **task.model,
        "batch_size": task.batch_size,
        "microbatch_size": task.batch_size // task.microbatches,
        "repeats": task.repeats,
        "trace_file": "",
        "spans_file": "",
        "transfer_s": math.nan,
        "util_replayed_raw": math.nan,
        "replayed_makespan_s": math.nan,
    }
    if row["impl"] == "torch":
        return row  # torch's schedule is opaque: no per-action timeline, no memory count
    if task.paired:  # torch's twin, timed in steps alternating with ours
        row["torch_step_time_s"] = statistics.median(per_rank[0]["torch_step_times_s"])
        row["step_time_vs_torch"] = step_time / row["torch_step_time_s"]
    return row | _timeline_columns(task, per_rank)


def _timeline_columns(task: PipelineCell, per_rank: list[dict]) -> dict[str, Any]:
    """Utilization wall-clock and replayed, memory and in-flight counts, traces."""
    from impls.pipeline.trace import chrome_trace, replay_measured, utilization_wall

    p, m, v = task.stages, task.microbatches, task.virtual_stages
    plan = build_plan(task.schedule, p, m, v)
    steps = [{r["rank"]: r["records"][i] for r in per_rank} for i in range(task.repeats)]
    probes = [r["transfer_s"] for r in per_rank if r.get("transfer_s") is not None]
    transfer = statistics.median(probes) if probes else 0.0
    alone = [{r["rank"]: r["isolated_records"][i] for r in per_rank} for i in range(2)]
    timeline = replay(plan, _action_costs(alone), transfer, p * v)
    in_step = [replay_measured(plan, records, p * v) for records in steps]
    walls = [utilization_wall(records) for records in steps]
    columns = {
        "util_wall": statistics.median(walls),
        "util_replayed": timeline.utilization,
        "util_theory": _theory(task.schedule, p, m, v),
        "bubble_fraction": 1.0 - timeline.utilization,
        "peak_activation_bytes": max(r["peak_activation_bytes"] for r in per_rank),
        "max_inflight_microbatches": max(r["max_inflight"] for r in per_rank),
        "max_inflight_plan": max(max_inflight_microbatches(plan).values()),
        "transfer_s": transfer,
        "util_replayed_raw": statistics.median(t.utilization for t in in_step),
        "replayed_makespan_s": timeline.makespan,
    }
    if task.trace_path:
        # The step whose wall-clock utilization is the median stands for the cell.
        chosen = sorted(range(len(walls)), key=walls.__getitem__)[len(walls) // 2]
        stem = Path(task.trace_path)
        stem.parent.mkdir(parents=True, exist_ok=True)
        chrome_trace(steps[chosen], str(stem) + ".json")
        _write_spans(Path(str(stem) + "_spans.csv"), steps[chosen], timeline)
        columns["trace_file"] = f"traces/{stem.name}.json"
        columns["spans_file"] = f"traces/{stem.name}_spans.csv"
    return columns


def _action_costs(steps: list[dict[int, list]]) -> dict[Action, float]:
    """Each compute action's cost: the fastest CPU time of its stage's actions of its kind.

    Every micro-batch of a stage does the same work on same-shaped tensors, so each sample
    is that work's cost plus whatever the host added while it ran (another process on the
    core, a cold cache): the disturbance only ever adds, so the fastest of the cell's
    micro-batches and profiling steps is the closest to the cost, as the fastest ping-pong
    prices a transfer. A median drifted with the host's load, and unevenly across stages
    (CI measured GPipe 4 × 4 at 53% with stage costs 1.5× a quiet run's and ±15% apart).
    """
    seen: dict[tuple[int, str], list[float]] = {}
    actions: set[Action] = set()
    for records_by_rank in steps:
        for records in records_by_rank.values():
            for record in records:
                if record.kind in COMPUTE_KINDS:
                    action = Action.parse(record.action)
                    actions.add(action)
                    seen.setdefault((action.stage, action.kind), []).append(record.cpu_s)
    cost = {key: min(times) for key, times in seen.items()}
    return {action: cost[(action.stage, action.kind)] for action in actions}


def _write_spans(path: Path, records_by_rank: dict[int, list], timeline) -> None:
    """The Gantt data the report draws: one row per action, replayed and wall clock."""
    rows = []
    for span in timeline.spans:
        action = span.action
        rows.append(["replayed", span.rank, str(action), action.stage, action.kind,
                     action.microbatch, span.start, span.end])  # fmt: skip
    origin = min((rec.start_s for recs in records_by_rank.values() for rec in recs), default=0.0)
    for rank, records in sorted(records_by_rank.items()):
        for rec in records:
            action = Action.parse(rec.action)
            rows.append(["wall", rank, rec.action, action.stage, action.kind, action.microbatch,
                         rec.start_s - origin, rec.end_s - origin])  # fmt: skip
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["timeline", "rank", "action", "stage", "kind", "microbatch",
                         "start_s", "end_s"])  # fmt: skip
        writer.writerows(rows)
    tmp.replace(path)


EXPERIMENT = Experiment(
    name="pipeline_utilization",
    schema=PipelineUtilizationConfig,
    key_columns=["schedule", "stages", "microbatches", "virtual_stages"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
