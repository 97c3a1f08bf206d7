"""Experiment `parallelism_comparison`: the lecture's table of DP, TP and PP — utilization,
memory per rank, communication per step — filled with numbers measured on one GPT, with
the 2D and 3D compositions beside them.

A cell is one mesh layout (dp, pp, tp) on dp·pp·tp ranks, trained by
`impls.hybrid.HybridTrainer` (Megatron-LM's PTD-P, Narayanan et al. 2021, arXiv
2104.04473, §2.3: TP inside a stage, a pipeline over the stages, gradients averaged over
the replicas); `bench.hybrid_cells` says what each rank measures. Every layout trains the
same model on the same global batch, split into the same number of micro-batches, with
the same schedule, so that the layouts differ only in how the work is cut.

What the row holds, per rank and step (the busiest rank where ranks differ):

- **memory**: model states (parameters, gradients, AdamW's two moments — 16 bytes per
  parameter in fp32, ZeRO paper §3.1) and the pipeline executor's peak of saved
  activations. Theory beside it: DP holds the whole model on every rank, TP and PP hold
  one copy cut k = pp·tp ways, 16Ψ/k per rank on average (PTD-P §2).
- **communication**: bytes sent on each axis, counted by the mesh's communicators, beside
  the count from the papers: DP one ring all-reduce of the stage's gradients,
  2(d−1)/d·(Ψ_rank + 1) elements (the loss rides along); TP Megatron's all-reduces of the
  (b, s, h) activations, two per block each way (Shoeybi et al. 2019, §3) plus the
  vocab-parallel embedding, LM head and cross-entropy; PP one activation forward and one
  gradient backward per micro-batch and stage boundary (GPipe, Huang et al. 2019).
- **utilization**: the share of the step's rank-time spent computing rather than in
  communication or waiting for peers (pipeline bubbles included), Σ_r compute_r /
  (N · step time). Compute is thread CPU time outside communication rounds, less the
  collectives' own work between their rounds (measured per TP all-reduce). Reported
  twice, as DESIGN.md requires: wall clock (ranks share cores here, so it is stretched),
  and replayed — the executed plan placed on its dependency graph
  (`impls.pipeline.replay`) with each compute action priced at its compute measured while
  the host's ranks computed one at a time, and every round of communication at α +
  β·bytes, α and β measured between two otherwise idle ranks: as if every rank had its
  own device and its own link. The bubble bound M/(M+pp−1) (GPipe §2.3) stands beside it.
- **step time**: wall clock (slowest rank, median of repeats) and the replayed makespan.
- **correctness**: losses, parameters and the last gradients after `steps` steps against
  single-device AdamW.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from bench.experiments.common import (
    Cell,
    Experiment,
    check_choices,
    check_gpt_model,
    check_positive,
    check_training,
)
from bench.hybrid_cells import AXES, PROBE_BYTES, HybridCell, run_hybrid_cell
from bench.reports import parallelism_comparison as report
from impls.models import GPTConfig
from impls.models.stages import stage_layer_ranges
from impls.pipeline import Action, build_plan, replay
from impls.pipeline.theory import gpipe_utilization
from impls.tensor_parallel import check_tp_config

__all__ = ["EXPERIMENT", "ParallelismComparisonConfig", "cells", "predicted_traffic", "to_row"]

SCHEDULES = ("1f1b", "gpipe")  # one stage per rank, as HybridTrainer runs them
BYTES_PER_PARAM = 16  # fp32 AdamW: weight, gradient, first and second moment
# Relative errors against single-device training. float32 throughout: TP sums partial
# matmuls in another order, micro-batches and the dp average add gradients in pieces.
# After 3 AdamW steps the update ends 1e-6 (CI's GPT) to 1.1e-4 (the full grid's) from the
# reference's — Adam turns the rounding of near-zero gradient elements into full steps, as
# zero_memory found (its tolerance: 1e-3) — the last gradients 4e-7 to 5e-5, the losses
# within 1e-7. Adam cannot see a gradient's scale, hence the gradient check: a sum over
# replicas instead of a mean is off by d − 1, a lost micro-batch by tens of percent.
TOLERANCES = {"update": 1e-3, "grad": 1e-3, "loss": 1e-5}
DEFAULT_LAYOUTS = [
    {"dp": 4}, {"tp": 4}, {"pp": 4}, {"dp": 2, "tp": 2}, {"dp": 2, "pp": 2}, {"pp": 2, "tp": 2},
    {"dp": 8}, {"tp": 8}, {"pp": 8}, {"dp": 2, "pp": 2, "tp": 2},
]  # fmt: skip


@dataclass(kw_only=True)
class ParallelismComparisonConfig:
    world_sizes: list[int] = field(default_factory=lambda: [4, 8])
    """Numbers of ranks; every layout must use exactly one of them."""
    layouts: list[dict[str, int]] = field(default_factory=lambda: list(DEFAULT_LAYOUTS))
    """Mesh degrees per cell, e.g. `{dp: 2, tp: 2}`; an axis left out has degree 1."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "d_model": 128, "n_layers": 8, "n_heads": 8, "seq_len": 64, "vocab_size": 256,
            "bias": False,
        }
    )  # fmt: skip
    """`GPTConfig` keyword arguments. tp must divide n_heads, d_ff and vocab_size; pp must
    not exceed n_layers. Without biases: k_proj's bias has an identically zero gradient,
    which Adam turns into noise steps no distributed run matches (see zero_memory)."""
    batch_size: int = 32
    """Sequences per step over all ranks: dp replicas × microbatches must divide it."""
    microbatches: int = 4
    """Micro-batches per replica and step, the same for every layout (pp = 1 accumulates)."""
    schedule: str = "1f1b"
    """Pipeline schedule: 1f1b or gpipe (same bubble, M/(M+pp−1))."""
    steps: int = 3
    """AdamW steps checked against single-device training."""
    lr: float = 1e-3
    warmup: int = 1
    repeats: int = 5
    """Timed steps per cell; the median of the slowest rank's step is reported."""
    profile_steps: int = 2
    """Steps with the host's compute serialised, whose costs the replay uses."""
    timeout_s: float = 900.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive("world_sizes", self.world_sizes)
        check_training(self, ("batch_size", "microbatches", "steps", "repeats", "profile_steps"))
        check_choices("schedule", [self.schedule], SCHEDULES)
        model = _gpt_config(self.model)
        if not isinstance(self.layouts, list) or not self.layouts:
            raise ValueError(f"layouts={self.layouts!r}: give a non-empty list such as [{{dp: 4}}]")
        self.layouts = [
            self._check_layout(i, layout, model) for i, layout in enumerate(self.layouts)
        ]
        unused = sorted(set(self.world_sizes) - {math.prod(lay.values()) for lay in self.layouts})
        if unused:
            raise ValueError(f"world_sizes={self.world_sizes}: no layout has {unused} ranks")

    def _check_layout(self, i: int, layout: Any, model: GPTConfig) -> dict[str, int]:
        """`layout` with every axis filled in, or a ValueError naming `layouts[i]`."""
        where = f"layouts[{i}]={layout!r}"
        if not isinstance(layout, dict) or not layout:
            raise ValueError(f"{where}: each layout maps axes to degrees, e.g. {{dp: 2, tp: 2}}")
        unknown = sorted(set(layout) - set(AXES))
        if unknown:
            raise ValueError(f"{where}: unknown axis {unknown}; allowed axes: {', '.join(AXES)}")
        degrees = {axis: layout.get(axis, 1) for axis in AXES}
        for axis, value in degrees.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {axis}={value!r} must be an integer ≥ 1")
        ranks = math.prod(degrees.values())
        if ranks not in self.world_sizes:
            raise ValueError(
                f"{where}: dp × pp × tp = {ranks}, but world_sizes={self.world_sizes}: the "
                "degrees must multiply to a world size"
            )
        try:
            check_tp_config(model, degrees["tp"])
        except ValueError as error:
            raise ValueError(f"{where}: model: {error}") from error
        if degrees["pp"] > model.n_layers:
            raise ValueError(
                f"{where}: pp={degrees['pp']} exceeds model n_layers={model.n_layers}: each "
                f"pipeline stage needs at least one block, so pp must be in 1..{model.n_layers}"
            )
        shares = degrees["dp"] * self.microbatches
        if self.batch_size % shares:
            raise ValueError(
                f"{where}: batch_size={self.batch_size} is not divisible by dp × microbatches "
                f"= {degrees['dp']} × {self.microbatches} = {shares}: every micro-batch of "
                "every replica must be equal"
            )
        if degrees["pp"] > 1 and model.tie_embeddings:
            raise ValueError(f"{where}: model tie_embeddings=True needs pp=1; allowed: False")
        return degrees


def _gpt_config(model: dict[str, Any]) -> GPTConfig:
    cfg = check_gpt_model(model)
    if cfg.dropout:
        raise ValueError(
            f"model dropout={cfg.dropout}: the 3D step draws no coordinated dropout masks "
            "across TP ranks; allowed: 0.0"
        )
    return cfg


def layout_name(degrees: dict[str, int]) -> str:
    """`dp2×tp2`: the axes with a degree above 1 (`dp1` for a single rank)."""
    used = [f"{axis}{degrees[axis]}" for axis in AXES if degrees[axis] > 1]
    return "×".join(used) or "dp1"


def strategy(degrees: dict[str, int]) -> str:
    """The lecture's row: DP, TP, PP, 2D (two axes) or 3D."""
    used = [axis for axis in AXES if degrees[axis] > 1]
    return used[0].upper() if len(used) == 1 else f"{len(used)}D" if used else "DP"


def cells(cfg: ParallelismComparisonConfig) -> list[Cell]:
    """One cell per layout, world sizes ascending (the runner keeps one pool per size)."""
    out = []
    for degrees in sorted(cfg.layouts, key=lambda d: math.prod(d.values())):
        task = HybridCell(**degrees, model=dict(cfg.model), batch_size=cfg.batch_size,
                          microbatches=cfg.microbatches, schedule=cfg.schedule, steps=cfg.steps,
                          warmup=cfg.warmup, repeats=cfg.repeats,
                          profile_steps=cfg.profile_steps, lr=cfg.lr, seed=cfg.seed)  # fmt: skip
        key = {"world_size": math.prod(degrees.values()), **degrees}
        out.append(Cell(world_size=key["world_size"], key=key, fn=run_hybrid_cell, task=task))
    return out


def _ring_bytes(numel: int, ranks: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `numel` float32: 2(n−1)/n · 4 numel."""
    return 2 * (ranks - 1) / ranks * numel * 4


def predicted_traffic(task: HybridCell, stage: int, rank_params: int) -> dict[str, float]:
    """Bytes a rank of pipeline stage `stage` sends per step on each axis, from the papers'
    counts (see the module docstring); the step's barrier and loss broadcast, a few bytes,
    are left out."""
    cfg = GPTConfig(**task.model)
    m, t = task.microbatches, task.tp
    micro = task.batch_size // (task.dp * m)
    act = micro * cfg.seq_len * cfg.d_model  # one (b, s, h) activation, in elements
    first, last = stage == 0, stage == task.pp - 1
    blocks = len(stage_layer_ranges(cfg.n_layers, task.pp)[stage])
    tp = 0.0
    if t > 1:  # per micro-batch: 2 per block each way; embedding's g; LM head's f; the loss's
        forward = (2 * blocks + first) * _ring_bytes(act, t)
        forward += last * (
            _ring_bytes(micro * cfg.seq_len, t) + _ring_bytes(2 * micro * cfg.seq_len, t)
        )
        backward = (2 * blocks + last) * _ring_bytes(act, t)
        tp = m * (forward + backward)
    pp = m * act * 4 * ((not last) + (not first)) if task.pp > 1 else 0.0
    dp = _ring_bytes(rank_params + 1, task.dp) if task.dp > 1 else 0.0
    return {"dp": dp, "pp": pp, "tp": tp}


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: HybridCell = cell.task
    first = per_rank[0]
    degrees = {axis: getattr(task, axis) for axis in AXES}
    loss_error = max(abs(a - b) / abs(b) for a, b in zip(first["losses"],
                                                          first["reference_losses"], strict=True))  # fmt: skip
    update_error = max(r["update_error"] for r in per_rank)
    grad_error = max(r["grad_error"] for r in per_rank)
    errors = {"update": update_error, "grad": grad_error, "loss": loss_error}
    within = all(errors[k] <= tolerance for k, tolerance in TOLERANCES.items())
    row: dict[str, Any] = {
        **cell.key,
        "layout": layout_name(degrees),
        "strategy": strategy(degrees),
        "params": first["params"],
        **task.model,
        "batch_size": task.batch_size,
        "microbatches": task.microbatches,
        "schedule": task.schedule,
        "steps": task.steps,
        "loss": first["losses"][-1],
        "loss_error": loss_error,
        "update_error": update_error,
        "grad_error": grad_error,
        "max_param_diff": max(r["max_param_diff"] for r in per_rank),
        "wrong": int(not within),
        "step_time_s": statistics.median(first["step_times_s"]),
        "util_wall": _wall_utilization(task, per_rank),
        "util_theory": gpipe_utilization(task.pp, task.microbatches),
    }
    row.update(_memory_columns(per_rank, first["params"], task.pp * task.tp))
    row.update(_traffic_columns(task, per_rank))
    row.update(_replay_columns(task, per_rank))
    return row


def _memory_columns(per_rank: list[dict], params: int, shards: int) -> dict[str, float]:
    """The rank with the most bytes held (model states + peak activations), its parts,
    and the mean over ranks against one model copy cut `shards` ways."""
    states = [sum(r["held"].values()) for r in per_rank]
    totals = [s + r["peak_activation_bytes"] for s, r in zip(states, per_rank, strict=True)]
    top = per_rank[max(range(len(per_rank)), key=totals.__getitem__)]
    return {
        "param_bytes": top["held"]["params"],
        "grad_bytes": top["held"]["grads"],
        "optim_bytes": top["held"]["optim"],
        "model_state_bytes": max(states),
        "model_state_bytes_mean": statistics.fmean(states),
        "theory_model_state_bytes": BYTES_PER_PARAM * params / shards,
        "activation_peak_bytes": max(r["peak_activation_bytes"] for r in per_rank),
        "memory_per_rank_bytes": max(totals),
        "rank_params_max": max(r["rank_params"] for r in per_rank),
    }


def _traffic_columns(task: HybridCell, per_rank: list[dict]) -> dict[str, float]:
    """Bytes and rounds sent per step by the busiest rank, per axis and in total."""
    columns: dict[str, float] = {}
    predicted = [predicted_traffic(task, r["coords"]["pp"], r["rank_params"]) for r in per_rank]
    for axis in AXES:
        columns[f"comm_bytes_{axis}"] = max(r["traffic"][axis]["bytes_sent"] for r in per_rank)
        columns[f"predicted_comm_bytes_{axis}"] = max(p[axis] for p in predicted)
    columns["comm_bytes_per_step"] = max(
        sum(r["traffic"][axis]["bytes_sent"] for axis in AXES) for r in per_rank
    )
    columns["predicted_comm_bytes_per_step"] = max(sum(p.values()) for p in predicted)
    columns["comm_rounds_per_step"] = max(
        sum(r["traffic"][axis]["rounds"] for axis in AXES) for r in per_rank
    )
    return columns


def _tp_calls(rounds: float, tp: int) -> float:
    """TP all-reduces behind `rounds` rounds: every TP collective is a ring all-reduce,
    2(t−1) rounds each."""
    return rounds / (2 * (tp - 1)) if tp > 1 else 0.0


def _wall_utilization(task: HybridCell, per_rank: list[dict]) -> float:
    """Median over timed steps of Σ_r busy_r / (N · slowest step), where busy is the rank's
    own step minus its time in rounds and its TP collectives' own work between rounds."""
    values = []
    for i, step in enumerate(per_rank[0]["step_times_s"]):
        busy = 0.0
        for r in per_rank:
            calls = _tp_calls(r["traffic"]["tp"]["rounds"], task.tp)
            busy += r["own_s"][i] - r["round_s"][i] - calls * r["tp_call_cpu_s"]
        values.append(busy / (len(per_rank) * step))
    return statistics.median(values)


def _link(per_rank: list[dict]) -> tuple[float, float]:
    """(α seconds per round, β seconds per byte) from the exchange probes."""
    small, large = (statistics.median(r["probe_s"][i] for r in per_rank) for i in range(2))
    return small, max(0.0, large - small) / (PROBE_BYTES[1] - PROBE_BYTES[0])


def _replay_columns(task: HybridCell, per_rank: list[dict]) -> dict[str, float]:
    """The step as if every rank had its own device (see the module docstring).

    Every rank of a pipeline stage does the same work (equal TP shards of equal DP
    shares), so a stage's action of a kind (F or B) is priced at the median, over the
    stage's ranks, micro-batches and profiled steps, of its compute plus its TP
    all-reduces (see `_price_step`); likewise the stage's work after the pipeline — its
    optimizer and bookkeeping, the dp all-reduce and the loss broadcast. On shared cores
    a rank's CPU time varies by ±20% with whatever else runs, which no rank with a device
    of its own would see. Pipeline transfers cost α + β·activation bytes; the stage with
    the most work after the pipeline adds it to the makespan.
    """
    link = _link(per_rank)
    call_cpu = statistics.median(r["tp_call_cpu_s"] for r in per_rank)
    kinds: dict[tuple[int, str], list[tuple[float, ...]]] = defaultdict(list)
    after: dict[int, list[tuple[float, ...]]] = defaultdict(list)
    for rank in per_rank:
        for profile in rank["profile"]:
            priced = _price_step(profile, link, call_cpu, task.tp)
            for action, cost in priced["actions"]:
                kinds[(action.stage, action.kind)].append(cost)
            after[rank["coords"]["pp"]].append(priced["after"])
    typical = {key: _medians(costs) for key, costs in kinds.items()}
    tails = {stage: _medians(costs) for stage, costs in after.items()}
    plan = build_plan(task.schedule, task.pp, task.microbatches)
    stages = []  # (compute, latency, bandwidth) of one rank of each stage
    for stage in range(task.pp):
        mine = [typical[(a.stage, a.kind)] for a in plan[stage] if a.is_compute]
        stages.append([sum(c[i] for c in mine) + tails[stage][i] for i in range(3)])
    cfg = GPTConfig(**task.model)
    micro = task.batch_size // (task.dp * task.microbatches)
    transfer = link[0] + link[1] * micro * cfg.seq_len * cfg.d_model * 4
    timeline = replay(plan, lambda a: sum(typical[(a.stage, a.kind)]), transfer, task.pp)
    makespan = timeline.makespan + max(sum(t) for t in tails.values())
    compute, latency, bandwidth = (statistics.fmean(s[i] for s in stages) for i in range(3))
    return {
        "util_replayed": compute / makespan,
        "comm_fraction_replayed": (latency + bandwidth) / makespan,
        "replayed_step_time_s": makespan,
        "replayed_compute_s": compute,
        "replayed_comm_latency_s": latency,
        "replayed_comm_bandwidth_s": bandwidth,
        "link_alpha_s": link[0],
        "link_beta_s_per_byte": link[1],
        "tp_call_cpu_s": call_cpu,
    }


def _medians(costs: list[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(statistics.median(column) for column in zip(*costs, strict=True))


def _price_step(profile: dict, link: tuple[float, float], call_cpu: float, tp: int) -> dict:
    """One profiled step of one rank, priced as (compute, latency, bandwidth) seconds.

    Compute is thread CPU time outside communication rounds, less `call_cpu` per TP
    all-reduce (the collective's own work between its rounds). A TP all-reduce costs
    `call_cpu` plus α per round (latency) and β per byte (bandwidth). Returns each compute
    action with its parts, and the parts of the work after the pipeline: its compute, and
    the dp all-reduce and loss broadcast.
    """
    alpha, beta = link
    actions, in_actions = [], 0.0
    for a in profile["actions"]:
        calls = _tp_calls(a["tp_rounds"], tp)
        compute = max(0.0, a["cpu_s"] - a["round_cpu_s"] - calls * call_cpu)
        cost = (compute, calls * call_cpu + alpha * a["tp_rounds"], beta * a["tp_bytes"])
        actions.append((Action.parse(a["action"]), cost))
        in_actions += compute
    traffic, pipeline = profile["traffic"], profile["pipeline_traffic"]
    calls = _tp_calls(traffic["tp"]["rounds"], tp)
    compute = max(0.0, profile["cpu_s"] - profile["round_cpu_s"] - calls * call_cpu)
    rounds = traffic["dp"]["rounds"] + traffic["pp"]["rounds"] - pipeline["rounds"]
    sent = traffic["dp"]["bytes_sent"] + traffic["pp"]["bytes_sent"] - pipeline["bytes_sent"]
    after = (max(0.0, compute - in_actions), alpha * rounds, beta * sent)
    return {"actions": actions, "after": after}


EXPERIMENT = Experiment(
    name="parallelism_comparison",
    schema=ParallelismComparisonConfig,
    key_columns=["world_size", "dp", "pp", "tp"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
