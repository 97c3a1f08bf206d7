"""List schedulers for split-backward schedules, the way Qi et al. build theirs.

Zero Bubble Pipeline Parallelism (ICLR 2024) §3 schedules F, I and W greedily under a
memory limit; "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024)
builds the V-shaped schedules the same way. Transfers are free. Whenever a rank is free it
runs, among what is ready, the action its policy prefers, or idles until the next action
ends somewhere. By default every action costs one time unit (T_F = T_I = T_W, the
papers' equal-cost case); `costs` gives each stage's F, I and W seconds instead (the
paper's automatic scheduler, which orders the actions by profiled times). The order each
rank ends up with is the plan; replaying it at the same costs takes at most the
simulated time (at unit costs exactly it: every action started as soon as it was chosen).
The policies: `greedy_plan` (ZB-H2's) and `v_plan` (ZB-V's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from impls.pipeline.actions import Action, Plan
from impls.pipeline.replay import replay

__all__ = ["StageCosts", "fastest", "greedy_plan", "v_plan"]

# One {"F": s, "I": s, "W": s} for every stage, or one mapping shared by all stages.
StageCosts = Mapping[str, float] | Sequence[Mapping[str, float]]
UNIT = {"F": 1.0, "I": 1.0, "W": 1.0}


class _State:
    """What the policies read: ready times, next forwards, pending W's, pairs held."""

    def __init__(self, placement: Sequence[int], ranks: int, microbatches: int) -> None:
        self.num_stages = len(placement)
        self.microbatches = microbatches
        self.mine = {
            r: sorted((s for s in range(self.num_stages) if placement[s] == r), reverse=True)
            for r in range(ranks)
        }
        self.ready: dict[tuple[str, int, int], float] = {}  # ("F"|"I", stage, mb) -> time
        self.next_f = dict.fromkeys(range(self.num_stages), 0)
        self.pending_w: dict[int, list[tuple[int, int]]] = {r: [] for r in range(ranks)}
        self.held = dict.fromkeys(range(ranks), 0)
        self.inputs_left = {r: len(self.mine[r]) * microbatches for r in range(ranks)}

    def grad(self, stages: Sequence[int], t: float) -> Action | None:
        """The ready `I` among `stages` whose gradient arrived first (later stage on ties)."""
        grads = [
            (at, key)
            for key, at in self.ready.items()
            if key[0] == "I" and key[1] in stages and at <= t
        ]
        if not grads:
            return None
        _, key = min(grads, key=lambda g: (g[0], -g[1][1], g[1][2]))
        return Action(key[1], "I", key[2])

    def forward(self, s: int, t: float) -> Action | None:
        """Stage s's next forward, if its input is there (micro-batch order)."""
        m = self.next_f[s]
        if m < self.microbatches and (s == 0 or self.ready.get(("F", s, m), t + 1) <= t):
            return Action(s, "F", m)
        return None

    def oldest_w(self, rank: int) -> Action | None:
        s, m = self.pending_w[rank][0] if self.pending_w[rank] else (-1, -1)
        return Action(s, "W", m) if s >= 0 else None

    def record(self, rank: int, action: Action, end: float) -> None:
        s, m = action.stage, action.microbatch
        if action.kind == "F":
            self.ready.pop(("F", s, m), None)
            self.next_f[s] += 1
            self.held[rank] += 1
            self.ready[("F", s + 1, m) if s + 1 < self.num_stages else ("I", s, m)] = end
        elif action.kind == "I":
            del self.ready[("I", s, m)]
            self.pending_w[rank].append((s, m))
            self.inputs_left[rank] -= 1
            if s > 0:
                self.ready[("I", s - 1, m)] = end
        else:
            self.pending_w[rank].remove((s, m))
            self.held[rank] -= 1


def _simulate(
    placement: Sequence[int],
    ranks: int,
    microbatches: int,
    choose: Callable[[_State, int, float], Action | None],
    costs: StageCosts | None,
) -> Plan:
    """Run the policy `choose(state, rank, t)` on simulated time; each rank's order."""
    state = _State(placement, ranks, microbatches)
    table = _cost_table(costs, len(placement))
    plan: Plan = {r: [] for r in range(ranks)}
    free = [0.0] * ranks
    total, scheduled, t = 3 * len(placement) * microbatches, 0, 0.0
    while scheduled < total:
        for r in range(ranks):
            action = choose(state, r, t) if free[r] <= t else None
            if action is None:
                continue
            plan[r].append(action)
            scheduled += 1
            free[r] = t + table[action.stage][action.kind]
            state.record(r, action, free[r])
        later = [x for x in free if x > t] + [x for x in state.ready.values() if x > t]
        if scheduled < total and not later:
            raise ValueError("the list schedule cannot progress under its memory limit")
        t = min(later, default=t)
    return plan


def _cost_table(costs: StageCosts | None, num_stages: int) -> list[dict[str, float]]:
    if costs is None:
        costs = UNIT
    per_stage = [costs] * num_stages if isinstance(costs, Mapping) else list(costs)
    if len(per_stage) != num_stages:
        raise ValueError(f"costs: {len(per_stage)} stages' costs given, the plan has {num_stages}")
    table = []
    for s, row in enumerate(per_stage):
        if not {"F", "I", "W"} <= set(row) or any(float(row[k]) <= 0 for k in "FIW"):
            raise ValueError(f"costs[{s}]={dict(row)!r}: give positive seconds for F, I and W")
        table.append({k: float(row[k]) for k in "FIW"})
    return table


def greedy_plan(
    placement: Sequence[int],
    microbatches: int,
    limits: Sequence[int],
    reserves: Sequence[int] | None = None,
    costs: StageCosts | None = None,
) -> Plan:
    """Schedule every (stage, micro-batch)'s F, I and W; stage s on rank `placement[s]`.

    `limits[r]` caps how many (stage, micro-batch) pairs rank r holds between F and W.
    `reserves[r]` (default 0) W's are kept back from gaps until the rank's last `I` (or
    until its limit blocks the next forward), so that they fill the drain instead.
    Forwards of a stage run in micro-batch order; a rank prefers its later stage's forward
    and input gradient (the one nearer the loss) when two are ready.

    `greedy_plan` (ZB-H2's policy): the input gradient `I` whose gradient arrived first (it
    is on the critical path); else the next forward, if the rank holds fewer than its limit
    of (stage, micro-batch) pairs; else the oldest deferred weight gradient `W`.
    """
    reserve = [0] * len(limits) if reserves is None else list(reserves)

    def choose(state: _State, r: int, t: float) -> Action | None:
        may_forward = state.held[r] < limits[r]
        kept = reserve[r] if state.inputs_left[r] and may_forward else 0
        action = state.grad(state.mine[r], t)
        for s in state.mine[r] if may_forward and action is None else ():
            action = action or state.forward(s, t)  # later stage first
        if action is None and len(state.pending_w[r]) > kept:
            action = state.oldest_w(r)
        return action

    return _simulate(placement, len(limits), microbatches, choose, costs)


def v_plan(ranks: int, microbatches: int, limit: int, costs: StageCosts | None = None) -> Plan:
    """ZB-V's order: stages r and 2P−1−r on rank r, at most `limit` (stage, mb) pairs held.

    The policy: a rank whose `limit` is reached frees a pair with its oldest `W`;
    otherwise it runs the first ready of: its first chunk's `I` (stage r, the end of a
    micro-batch's backward), its second chunk's `F` (stage 2P−1−r), its first chunk's
    `F`, its second chunk's `I`, the oldest `W`. At unit costs with limit = 2P this yields
    the paper's V: rank r runs 2P−1−2r forwards down the first chunk before the first
    forward comes back up, then alternates the chunks' forwards until its first input
    gradient arrives, then repeats F, I, W triples, and drains the pending W's between
    its last input gradients.
    """
    placement = tuple(range(ranks)) + tuple(range(ranks - 1, -1, -1))

    def choose(state: _State, r: int, t: float) -> Action | None:
        first, second = r, 2 * ranks - 1 - r
        if state.held[r] >= limit:
            return state.oldest_w(r) or state.grad([first], t) or state.grad([second], t)
        return (
            state.grad([first], t)
            or state.forward(second, t)
            or state.forward(first, t)
            or state.grad([second], t)
            or state.oldest_w(r)
        )

    return _simulate(placement, ranks, microbatches, choose, costs)


def fastest(
    build: Callable[[StageCosts | None], Plan],
    costs: StageCosts | None,
    placement: Sequence[int],
) -> Plan:
    """`build(None)` (the unit-time order) or `build(costs)`, whichever replays faster.

    At the given costs (transfers free) each candidate is replayed and the shorter step
    kept, the unit-time order on ties: a list schedule built on the costs is not always
    the better one (its greedy choices are myopic), so the auto-scheduled plan is never
    slower than the fixed one, and with equal costs it is the fixed one.
    """
    unit = build(None)
    if costs is None:
        return unit
    table = _cost_table(costs, len(placement))
    placed = tuple(placement)

    def makespan(plan: Plan) -> float:
        timeline = replay(
            plan, lambda a: table[a.stage][a.kind], num_stages=len(placed), stage_ranks=placed
        )
        return timeline.makespan

    tuned = build(costs)
    return tuned if makespan(tuned) < makespan(unit) else unit
