"""A unit-time list scheduler for split-backward schedules, the way Qi et al. build theirs.

Zero Bubble Pipeline Parallelism (ICLR 2024) §3 schedules F, I and W greedily under a
memory limit; "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024)
builds the V-shaped schedules the same way. Here every action costs one time unit and
transfers are free (T_F = T_I = T_W, the paper's equal-cost case). At each unit every rank
runs, among what is ready: the input-gradient `I` whose gradient arrived first (it is on
the critical path); else the next forward, if the rank holds fewer than its limit of
(stage, micro-batch) pairs; else the oldest deferred weight gradient `W`; else it idles.
The order each rank ends up with is the plan; replaying it at equal costs reproduces this
timeline, since every action here started as soon as its inputs existed.
"""

from __future__ import annotations

from collections.abc import Sequence

from impls.pipeline.actions import Action, Plan

__all__ = ["greedy_plan"]


def greedy_plan(
    placement: Sequence[int],
    microbatches: int,
    limits: Sequence[int],
    reserves: Sequence[int] | None = None,
) -> Plan:
    """Schedule every (stage, micro-batch)'s F, I and W; stage s on rank `placement[s]`.

    `limits[r]` caps how many (stage, micro-batch) pairs rank r holds between F and W.
    `reserves[r]` (default 0) W's are kept back from gaps until the rank's last `I` (or
    until its limit blocks the next forward), so that they fill the drain instead.
    Forwards of a stage run in micro-batch order; a rank prefers its later stage's forward
    and input gradient (the one nearer the loss) when two are ready.
    """
    num_stages, ranks = len(placement), len(limits)
    mine = {r: sorted((s for s in range(num_stages) if placement[s] == r), reverse=True)
            for r in range(ranks)}  # fmt: skip
    ready: dict[tuple[str, int, int], int] = {}  # ("F"|"I", stage, mb) -> first unit usable
    next_f = dict.fromkeys(range(num_stages), 0)
    done_i: dict[int, list[tuple[int, int]]] = {r: [] for r in range(ranks)}  # W pending
    held = dict.fromkeys(range(ranks), 0)
    inputs_left = {r: len(mine[r]) * microbatches for r in range(ranks)}  # I's still to run
    reserves = [0] * ranks if reserves is None else list(reserves)
    plan: Plan = {r: [] for r in range(ranks)}
    total = 3 * num_stages * microbatches
    t = scheduled = 0
    while scheduled < total:
        chosen = [
            _pick(r, t, mine[r], ready, next_f, done_i[r], held[r] < limits[r],
                  reserves[r] if inputs_left[r] and held[r] < limits[r] else 0,
                  microbatches)
            for r in range(ranks)
        ]  # fmt: skip
        if not any(chosen) and t > total + num_stages:
            raise ValueError(f"limits={list(limits)}: the greedy schedule cannot progress")
        for r, action in enumerate(chosen):
            if action is None:
                continue
            plan[r].append(action)
            scheduled += 1
            s, m = action.stage, action.microbatch
            if action.kind == "F":
                next_f[s] += 1
                held[r] += 1
                if s + 1 < num_stages:
                    ready[("F", s + 1, m)] = t + 1
                else:
                    ready[("I", s, m)] = t + 1
            elif action.kind == "I":
                done_i[r].append((s, m))
                inputs_left[r] -= 1
                if s > 0:
                    ready[("I", s - 1, m)] = t + 1
            else:
                held[r] -= 1
        t += 1
    return plan


def _pick(
    rank: int,
    t: int,
    stages: list[int],
    ready: dict[tuple[str, int, int], int],
    next_f: dict[int, int],
    pending_w: list[tuple[int, int]],
    may_forward: bool,
    reserve: int,
    microbatches: int,
) -> Action | None:
    """The action `rank` runs at unit `t` (and its bookkeeping), or None to idle."""
    grads = [(ready[key], key) for key in ready if key[0] == "I" and key[1] in stages]
    grads = [g for g in grads if g[0] <= t]
    if grads:
        _, key = min(grads, key=lambda g: (g[0], -g[1][1], g[1][2]))
        del ready[key]
        return Action(key[1], "I", key[2])
    if may_forward:
        for s in stages:  # later stage first
            m = next_f[s]
            if m < microbatches and (s == 0 or ready.get(("F", s, m), t + 1) <= t):
                ready.pop(("F", s, m), None)
                return Action(s, "F", m)
    if len(pending_w) > reserve:
        s, m = pending_w.pop(0)
        return Action(s, "W", m)
    return None
