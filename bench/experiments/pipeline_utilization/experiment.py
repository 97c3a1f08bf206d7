"""`pipeline_utilization`: every schedule over micro-batch counts, with
torch.distributed.pipelining's GPipe / 1F1B / interleaved 1F1B as baselines.

The grid and what it leaves out: `cells`; what each row carries: `to_row`.
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.pipeline_utilization import ranks, report, slicing, timeline
from bench.experiments.pipeline_utilization.config import (
    PAIR_KEYS,
    Carry,
    PipelineUtilizationConfig,
    alpa_refuses,
    declared_columns,
    plan_or_reason,
)
from bench.experiments.pipeline_utilization.names import TORCH_SCHEDULES, torch_refuses, torch_twin

__all__ = ["EXPERIMENT", "PipelineUtilizationConfig"]

log = logging.getLogger("bench")

# fp32, micro-batches summed in another order than one whole batch: rounding alone puts the
# loss ~1e-7 and the gradients ~1e-6 (relative) off the reference; a wrong gradient
# (a micro-batch dropped or counted twice, a missing 1/M) is off by 1e-2 or more.
LOSS_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-4


def cells(cfg: PipelineUtilizationConfig) -> list[Cell]:
    """Every (schedule, P, M, slicing) a schedule can take, then the slicing pairs, P
    ascending (one pool of ranks per P).

    A cell is (schedule, stages P, micro-batches M, virtual stages V, slicing) on P ranks. The
    grid is schedules × stages × microbatches × slicings, plus `slicing_pairs` (each cell
    with both slicings); a combination a schedule cannot take is left out of it
    rather than failing the run: `naive` runs at M = 1 only, the interleaved schedules need M
    divisible by P, torch's `Schedule1F1B` needs M ≥ P. A schedule left with no cell at all is
    refused, naming `microbatches`. Everything else that cannot work — more stages than
    layers, a batch that M does not divide, an unknown schedule — is refused before any
    process starts.
    """
    keys, skipped = [], []
    for p in sorted(set(cfg.stages)):
        for schedule in cfg.schedules:
            for m in cfg.microbatches:
                for cut in cfg.slicings:
                    if cut == "alpa" and alpa_refuses(schedule):
                        skipped.append(f"{schedule} P={p} M={m} alpa")
                    elif plan_or_reason(schedule, p, m, cfg.virtual(schedule))[1]:
                        skipped.append(f"{schedule} P={p} M={m}")
                    else:
                        keys.append(_key(cfg, schedule, p, m, cut))
    paired = [
        _key(cfg, *(pair[k] for k in PAIR_KEYS), cut)
        for pair in cfg.slicing_pairs
        for cut in ("equal", "alpa")
    ]
    keys += [k for k in paired if k not in keys]
    if skipped:
        log.info("left out (the schedule cannot take them): %s", ", ".join(skipped))
    costs: dict[int, slicing.LayerCosts] = {}  # micro-batch size -> the layer costs
    out = []
    for key in sorted(keys, key=lambda k: k["stages"]):
        measured = key["slicing"] == "alpa" or key in paired
        carry = _carry(cfg, key, _costs(cfg, key, costs) if measured else None)
        out.append(Cell(world_size=key["stages"], key=key, fn=ranks.run, carry=carry))
    return out


def _key(cfg: PipelineUtilizationConfig, schedule: str, p: int, m: int, cut: str) -> dict:
    return {
        "schedule": schedule,
        "stages": p,
        "microbatches": m,
        "virtual_stages": cfg.virtual(schedule),
        "slicing": cut,
    }


def _costs(
    cfg: PipelineUtilizationConfig, key: dict[str, Any], cache: dict[int, slicing.LayerCosts]
) -> slicing.LayerCosts:
    size = cfg.batch_size // key["microbatches"]
    if size not in cache:
        cache[size] = slicing.measure_layer_costs(cfg.model(), size, cfg.seed)
        log.info("layer costs, micro-batch of %d: %s", size, cache[size])
    return cache[size]


def _carry(
    cfg: PipelineUtilizationConfig, key: dict[str, Any], costs: slicing.LayerCosts | None
) -> Carry:
    schedule, p, m = key["schedule"], key["stages"], key["microbatches"]
    if schedule in TORCH_SCHEDULES:
        return Carry(plan=None, torch_schedule=TORCH_SCHEDULES[schedule], trace=None)
    plan = plan_or_reason(schedule, p, m, key["virtual_stages"])[0]
    alpa = key["slicing"] == "alpa"
    twin = torch_twin(schedule)
    paired = cfg.paired and twin is not None and torch_refuses(twin, p, m) is None
    traced = m in cfg.trace_microbatches and not alpa
    fused = cfg.paired and schedule == "zero_bubble_h1" and not alpa
    return Carry(
        plan=plan,
        torch_schedule=TORCH_SCHEDULES[twin] if paired else None,
        trace=f"{schedule}_p{p}_m{m}" if traced else None,
        stage_layers=slicing.alpa_layers(costs, cfg.n_layers, p, m) if alpa else None,
        layer_costs=costs,
        fused_twin=plan_or_reason("1f1b", p, m, 1)[0] if fused else None,
    )


def to_row(cfg: PipelineUtilizationConfig, cell: Cell, per_rank: list[dict]) -> dict:
    """Each distbench cell's plan is built once, here, and carried (`Carry`): its ranks run it,
    `to_row` replays it, and `artefacts` draws its trace from it. Each distbench row carries
    utilization measured two ways — wall clock, and replayed (`timeline.py`) — beside the
    bound from theory, peak activation memory and in-flight micro-batches. The distbench
    cells with M in `trace_microbatches` also leave a Chrome trace and the spans the report's
    Gantt charts are drawn from under `<trace_dir>/traces/` (by default the report's folder).
    """
    carry: Carry = cell.carry
    step_time = statistics.median(per_rank[0]["step_times_s"])  # already the slowest rank's
    losses = [r["loss"] for r in per_rank if r.get("loss") is not None]
    row = {
        **cell.key,
        "impl": "torch" if carry.plan is None else "distbench",
        **dict.fromkeys(("util_wall", "util_replayed", "util_theory", "bubble_fraction"), math.nan),
        "step_time_s": step_time,
        "torch_step_time_s": math.nan,
        "step_time_vs_torch": math.nan,
        "peak_activation_bytes": math.nan,
        "max_inflight_microbatches": math.nan,
        "max_inflight_plan": math.nan,
        "loss": losses[0] if losses else math.nan,
        **declared_columns(cell.key["schedule"]),
        **cfg.model(),
        "batch_size": cfg.batch_size,
        "microbatch_size": cfg.batch_size // cell.key["microbatches"],
        "repeats": cfg.repeats,
        "profiling_steps": math.nan,  # torch's schedule is not profiled
        "trace_file": "",
        "spans_file": "",
        **dict.fromkeys(("transfer_s", "util_replayed_raw", "replayed_makespan_s"), math.nan),
    }
    row |= _against_reference(per_rank, row["loss"])
    row |= slicing.costs_columns(carry.layer_costs, _blocks(cfg, cell), cell.key["microbatches"])
    if carry.plan is None:
        return row  # torch's schedule is opaque: no per-action timeline, no memory count
    if carry.torch_schedule:  # torch's twin, timed in steps alternating with ours
        row["torch_step_time_s"] = statistics.median(per_rank[0]["torch_step_times_s"])
        row["step_time_vs_torch"] = step_time / row["torch_step_time_s"]
    row["profiling_steps"] = cfg.profiling_steps(cell.key["microbatches"])
    return row | timeline.columns(carry.plan, cell.key, per_rank, carry.fused_twin)


def _blocks(cfg: PipelineUtilizationConfig, cell: Cell) -> tuple[int, ...]:
    """Transformer blocks per stage of the cell's cut (P·V stages when interleaved)."""
    if cell.carry.stage_layers is not None:
        return cell.carry.stage_layers
    return slicing.equal_layers(cfg.n_layers, cell.key["stages"] * cell.key["virtual_stages"])


def _against_reference(per_rank: list[dict], loss: float) -> dict[str, Any]:
    """The cell against one process computing the whole batch (`bench.kit.reference`):
    `grad_error` the largest over ranks of ‖g − g_ref‖ / ‖g_ref‖ over the rank's
    parameters, and `wrong` the ranks whose gradients miss, plus 1 if the loss does."""
    reference = per_rank[0]["reference_loss"]
    errors = [r["grad_error"] for r in per_rank]
    missed = sum(not error <= GRAD_TOLERANCE for error in errors)
    missed += not abs(loss - reference) <= LOSS_TOLERANCE * abs(reference)
    worst = math.nan if any(map(math.isnan, errors)) else max(errors)
    return {"reference_loss": reference, "grad_error": worst, "wrong": int(missed)}


def artefacts(
    cfg: PipelineUtilizationConfig, cell: Cell, per_rank: list[dict], report_dir: Path
) -> dict:
    """A traced distbench cell's Chrome trace and Gantt spans, under `<trace_dir>/traces/`."""
    carry: Carry = cell.carry
    if carry.plan is None or carry.trace is None:
        return {}
    folder = Path(cfg.trace_dir) if cfg.trace_dir else Path(report_dir)
    return timeline.write_trace(folder, carry.trace, carry.plan, cell.key, per_rank)


EXPERIMENT = Experiment(
    name="pipeline_utilization",
    summary="the lecture's 25% → 57% pipeline figure; schedules over M vs torch.pipelining",
    schema=PipelineUtilizationConfig,
    key_columns=("schedule", "stages", "microbatches", "virtual_stages", "slicing"),
    key_defaults={"slicing": "equal"},
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Utilization against micro-batches",
            x="microbatches",
            y="util_replayed",
            group="schedule",
            log_x=True,
        ),
        Chart(
            title="Bubble fraction against micro-batches",
            x="microbatches",
            y="bubble_fraction",
            group="schedule",
            log_x=True,
        ),
        Chart(
            title="Peak activation bytes",
            x="microbatches",
            y="peak_activation_bytes",
            group="schedule",
            log_x=True,
        ),
    ),
    artefacts=artefacts,
    unmeasured=("trace_dir",),
    host_probe=True,  # planner_validation holds its predictions to these rows
)
