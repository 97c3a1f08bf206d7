"""Pipeline bubble and utilization bounds, as the papers state them.

Utilization is Σ busy / (P × makespan) with P ranks; the bubble fraction is 1 − it. Every
bound assumes equal work per stage, free transfers, and the same cost for every
micro-batch; a replayed timeline under those assumptions (`impls.pipeline.replay`)
meets them exactly, which the tests pin. Each schedule's spec names its bound
(`ScheduleSpec.utilization`); `impls.pipeline.schedules.utilization_bound` looks it up.
"""

from __future__ import annotations

from impls.pipeline.schedules._checks import require_count

__all__ = [
    "gpipe_bubble_fraction",
    "gpipe_utilization",
    "interleaved_bubble_ratio",
    "interleaved_utilization",
    "naive_utilization",
    "one_f_one_b_utilization",
    "zero_bubble_h1_bubble_time",
    "zero_bubble_h1_utilization",
    "zero_bubble_h2_utilization",
    "zero_bubble_max_inflight",
    "zero_bubble_v_utilization",
]


def naive_utilization(stages: int) -> float:
    """1/P: only one of P stages computes at any moment (GPipe paper, Fig. 2b; lecture: 25%)."""
    return 1.0 / require_count("stages", stages)


def gpipe_bubble_fraction(stages: int, microbatches: int) -> float:
    """(P−1)/(M+P−1) of each rank's time is idle fill and drain.

    Huang et al. 2019, "GPipe", §2.3: the bubble overhead is O((P−1)/(M+P−1)); the
    (M+P−1)-slot timeline of Fig. 2c makes it exact for equal stage costs.
    """
    p, m = require_count("stages", stages), require_count("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


def gpipe_utilization(stages: int, microbatches: int) -> float:
    """M/(M+P−1): the lecture's 4 stages × 4 micro-batches give 4/7 ≈ 57%."""
    return 1.0 - gpipe_bubble_fraction(stages, microbatches)


def one_f_one_b_utilization(stages: int, microbatches: int) -> float:
    """Same as GPipe: 1F1B reorders work to save memory but keeps the (P−1) fill/drain slots.

    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters",
    §2.2.1: bubble time fraction (P−1)/M of the ideal time, i.e. utilization M/(M+P−1).
    """
    return gpipe_utilization(stages, microbatches)


def interleaved_bubble_ratio(stages: int, microbatches: int, virtual_stages: int) -> float:
    """(P−1)/(V·M): bubble time relative to the ideal (bubble-free) compute time.

    Narayanan et al. 2021, §2.2.2: with V model chunks per rank each fill/drain slot costs
    1/V as much, so the 1F1B ratio (P−1)/M shrinks by V.
    """
    p, m = require_count("stages", stages), require_count("microbatches", microbatches)
    return (p - 1) / (require_count("virtual_stages", virtual_stages) * m)


def interleaved_utilization(stages: int, microbatches: int, virtual_stages: int) -> float:
    """1/(1 + (P−1)/(V·M)) = M/(M + (P−1)/V)."""
    return 1.0 / (1.0 + interleaved_bubble_ratio(stages, microbatches, virtual_stages))


def zero_bubble_h1_bubble_time(
    stages: int, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 1.0
) -> float:
    """Idle time per rank of ZB-H1: (P−1)(T_F + T_I − T_W), against 1F1B's (P−1)(T_F+T_I+T_W).

    Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR), §2.1 and Fig. 3 (their B is
    our I). The paper states the equal-cost case T_F = T_I = T_W, where the bubble rate is
    (P−1)/(3M), a third of 1F1B's (P−1)/M. The general form is read off the ZB-H1 timeline:
    I races ahead, so the drain ramp costs T_F + T_I per stage, and the deferred W's fill
    T_W of it. It holds while a W fits in every gap it fills (T_W ≤ min(T_F, T_I)) and
    M ≥ P; outside that range this raises rather than return a bound no schedule meets.
    """
    p = require_count("stages", stages)
    if not 0 <= t_w <= min(t_f, t_i):
        raise ValueError(f"t_w={t_w!r}: the ZB-H1 bound needs 0 <= t_w <= min(t_f, t_i)")
    return (p - 1) * (t_f + t_i - t_w)


def zero_bubble_h1_utilization(
    stages: int, microbatches: int, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 1.0
) -> float:
    """M(T_F+T_I+T_W) / (M(T_F+T_I+T_W) + (P−1)(T_F+T_I−T_W)); equal costs: 3M/(3M+P−1).

    Needs M ≥ P (below that the warm-up is cut short and the bound is not met).
    """
    m = require_count("microbatches", microbatches)
    if m < stages:
        raise ValueError(
            f"microbatches={m}: the ZB-H1 bound assumes microbatches >= stages={stages}"
        )
    work = m * (t_f + t_i + t_w)
    return work / (work + zero_bubble_h1_bubble_time(stages, t_f, t_i, t_w))


def zero_bubble_h2_utilization(
    stages: int, microbatches: int, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 1.0
) -> float:
    """M(T_F+T_I+T_W) / (M(T_F+T_I+T_W) + (P−1)T_F); equal costs: 3M/(3M+P−1).

    Qi et al. 2024, §2.2 and Fig. 3 (bottom): ZB-H2 leaves no rank idle between its first
    and last action (the paper's zero bubble; its optimizer post-validation lets the next
    step start on rank 0 at once). A synchronous step, as measured here, still waits the
    parallelogram's skew: rank r starts r·T_F late and rank 0 ends (P−1)·T_F early. At
    equal costs that is ZB-H1's bound too; ZB-H2 gains where T_I > T_W, since ZB-H1's idle
    is (P−1)(T_F+T_I−T_W). Stated for equal costs (which the replay meets exactly for
    M ≥ 2P−1, the warm-up it needs); other costs are the paper's reading, not pinned.
    """
    p, m = require_count("stages", stages), require_count("microbatches", microbatches)
    if m < 2 * p - 1:
        raise ValueError(
            f"microbatches={m}: the ZB-H2 bound assumes microbatches >= 2·stages−1={2 * p - 1}"
        )
    work = m * (t_f + t_i + t_w)
    return work / (work + (p - 1) * t_f)


def zero_bubble_v_utilization(stages: int, microbatches: int) -> float:
    """6M / (6M + P − 1) with equal chunk costs (T_F = T_I = T_W per chunk = half a stage).

    Qi et al., "Pipeline Parallelism with Controllable Memory" (2024), §3 / Fig. 3 and the
    ZB-V of "Zero Bubble Pipeline Parallelism" §6: with two chunks per rank in a V every
    rank works without a gap, and the synchronous step's only idle is the ramp skew of
    P−1 chunk units (half a 1F1B stage each), against 6M units of work per rank: the step
    ends at 6M + P − 1 (for M ≥ 2P−1 rank r works without a gap from r to r + 6M). This
    holds with each rank holding at most 2P chunk pairs (`zero_bubble_max_inflight`),
    1F1B's activation memory (the Controllable Memory paper's V-ZB). Met exactly by the
    replay for M ≥ P.
    """
    p, m = require_count("stages", stages), require_count("microbatches", microbatches)
    if m < p:
        raise ValueError(f"microbatches={m}: the ZB-V bound assumes microbatches >= stages={p}")
    return 6 * m / (6 * m + p - 1)


def zero_bubble_max_inflight(schedule: str, stages: int, microbatches: int) -> int:
    """Most (stage, micro-batch) pairs a rank holds between F and W (rank 0's peak).

    ZB-H1: min(P, M), 1F1B's (Qi et al. 2024 §2.1). ZB-H2: min(2P−1, M) micro-batches,
    the paper's 2P−1 (§2.2). ZB-V: min(2P, 2M) chunk pairs, every rank (each chunk half
    a stage, so P micro-batches' worth: 1F1B's peak activation memory, as Zero Bubble §6
    and "Pipeline Parallelism with Controllable Memory" (Qi et al. 2024) §3 state for it).
    """
    p, m = require_count("stages", stages), require_count("microbatches", microbatches)
    limits = {
        "zero_bubble_h1": min(p, m),
        "zero_bubble_h2": min(2 * p - 1, m),
        "zero_bubble_v": min(2 * p, 2 * m),
    }
    if schedule not in limits:
        raise ValueError(f"schedule={schedule!r}: choose one of {', '.join(limits)}")
    return limits[schedule]
