"""A `parallelism_comparison` row's utilization and step-time columns.

**Utilization** is the share of the step's rank-time spent computing rather than in
communication or waiting for peers (pipeline bubbles included), Σ_r compute_r /
(N · step time). Compute is thread CPU time outside communication rounds, less the
collectives' own work between their rounds (measured per TP all-reduce). Reported twice,
as DESIGN.md requires: wall clock (`wall_utilization`; ranks share cores here, so it is
stretched), and replayed (`replay_columns`) — the executed plan placed on its dependency
graph (`impls.pipeline.replay`) with each compute action priced at its compute measured
while the host's ranks computed one at a time, and every round of communication at α +
β·bytes, α and β measured between two otherwise idle ranks: as if every rank had its own
device and its own link. The bubble bound M/(M+pp−1) (GPipe §2.3) stands beside it.
**Step time**: wall clock (slowest rank, median of repeats) and the replayed makespan.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from bench.experiments.parallelism_comparison.ranks import PROBE_BYTES, Layout
from impls.costmodel.comm import allreduce_rounds
from impls.pipeline import Action, replay

__all__ = ["replay_columns", "wall_utilization"]


def _tp_calls(rounds: float, tp: int) -> float:
    """TP all-reduces behind `rounds` rounds: every TP collective is a ring all-reduce,
    2(t−1) rounds each."""
    return rounds / allreduce_rounds(tp) if tp > 1 else 0.0


def wall_utilization(layout: Layout, per_rank: list[dict]) -> float:
    """Median over timed steps of Σ_r busy_r / (N · slowest step), where busy is the rank's
    own step minus its time in rounds and its TP collectives' own work between rounds."""
    values = []
    for i, step in enumerate(per_rank[0]["step_times_s"]):
        busy = 0.0
        for r in per_rank:
            calls = _tp_calls(r["traffic"]["tp"]["rounds"], layout.tp)
            busy += r["own_s"][i] - r["round_s"][i] - calls * r["tp_call_cpu_s"]
        values.append(busy / (len(per_rank) * step))
    return statistics.median(values)


def _link(per_rank: list[dict]) -> tuple[float, float]:
    """(α seconds per round, β seconds per byte) from the exchange probes."""
    small, large = (statistics.median(r["probe_s"][i] for r in per_rank) for i in range(2))
    return small, max(0.0, large - small) / (PROBE_BYTES[1] - PROBE_BYTES[0])


def _stage_costs(layout: Layout, per_rank: list[dict], link, call_cpu: float) -> tuple:
    """(typical (compute, latency, bandwidth) of each (stage, kind) of action, and of each
    stage's work after the pipeline), medians over the stage's ranks and profiled steps."""
    kinds: dict[tuple[int, str], list[tuple[float, ...]]] = defaultdict(list)
    after: dict[int, list[tuple[float, ...]]] = defaultdict(list)
    for rank in per_rank:
        for profile in rank["profile"]:
            priced = _price_step(profile, link, call_cpu, layout.tp)
            for action, cost in priced["actions"]:
                kinds[(action.stage, action.kind)].append(cost)
            after[rank["coords"]["pp"]].append(priced["after"])
    typical = {key: _medians(costs) for key, costs in kinds.items()}
    tails = {stage: _medians(costs) for stage, costs in after.items()}
    return typical, tails


def replay_columns(layout: Layout, per_rank: list[dict]) -> dict[str, float]:
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
    typical, tails = _stage_costs(layout, per_rank, link, call_cpu)
    stages = []  # (compute, latency, bandwidth) of one rank of each stage
    for stage in range(layout.pp):
        mine = [typical[(a.stage, a.kind)] for a in layout.plan[stage] if a.is_compute]
        stages.append([sum(c[i] for c in mine) + tails[stage][i] for i in range(3)])
    model = layout.gpt
    transfer = link[0] + link[1] * layout.micro_batch * model.seq_len * model.d_model * 4
    timeline = replay(layout.plan, lambda a: sum(typical[(a.stage, a.kind)]), transfer, layout.pp)
    after = max(sum(t) for t in tails.values())
    makespan = timeline.makespan + after
    compute, latency, bandwidth = (statistics.fmean(s[i] for s in stages) for i in range(3))
    return {
        "util_replayed": compute / makespan,
        "comm_fraction_replayed": (latency + bandwidth) / makespan,
        "replayed_step_time_s": makespan,
        "replayed_compute_s": compute,
        # the work after the pipeline: a stage's compute in it (mean over stages, part of
        # replayed_compute_s) and the longest stage's whole (part of the makespan)
        "replayed_after_compute_s": statistics.fmean(t[0] for t in tails.values()),
        "replayed_after_s": after,
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
