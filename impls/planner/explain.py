"""Why a candidate loses against the best plan, in one line.

A plan that does not fit loses on memory. A fitting plan's step is compared with the
winner's term by term (`Prediction`'s parts add up to the step time): the term that grew
the most names the reason, "bubble" for the pipeline's idle time, a communication axis
for exposed TP / PP / DP time, "compute" for the critical rank's own work (recomputation,
smaller and less efficient GEMMs, an unbalanced stage), "optimizer" for Adam's update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from impls.costmodel.hardware import Hardware

if TYPE_CHECKING:
    from impls.planner.search import Candidate

__all__ = ["TERMS", "explain"]

TERMS = {
    "compute_s": "compute",
    "bubble_s": "pipeline bubble",
    "exposed_tp_s": "tensor-parallel communication",
    "exposed_pp_s": "pipeline (p2p) communication",
    "exposed_dp_s": "data-parallel / ZeRO communication",
    "optimizer_s": "optimizer",
}
"""Prediction fields that add up to the step time, and what they are called in a reason."""

GB = 1e9


def explain(candidate: Candidate, winner: Candidate | None, hw: Hardware) -> str:
    """`memory: needs X GB > Y GB`, or the term that makes the candidate slower."""
    p = candidate.prediction
    if not p.fits:
        return f"memory: needs {p.peak_memory_bytes / GB:.1f} GB > {hw.memory_bytes / GB:.1f} GB"
    if winner is None or candidate.plan == winner.plan:
        return "best" if winner is not None else ""
    w = winner.prediction
    slower = p.step_time_s / w.step_time_s - 1
    term, grew = max(
        ((name, getattr(p, name) - getattr(w, name)) for name in TERMS), key=lambda item: item[1]
    )
    if grew <= 0:
        return f"{100 * slower:.1f}% slower (no single term larger than the best's)"
    return (
        f"{100 * slower:.1f}% slower: {TERMS[term]} +{grew:.3g} s per step "
        f"({getattr(p, term):.3g} s vs {getattr(w, term):.3g} s)"
    )
