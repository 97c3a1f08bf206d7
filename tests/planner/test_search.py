"""The planner's answer against simulating every plan of a small space.

A failure means a screen dropped a plan that should have been in the answer (the search is
only a faster way to get the brute-force ranking), a pinned axis was ignored, or the
reasons and the smallest memory are wrong.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from impls.planner import search
from impls.planner.bounds import layer_table
from impls.planner.search import alpa_candidate
from impls.planner.space import plan_space
from impls.simulator import simulate, stage_slices
from tests.planner import GPT8, small_cluster


def brute_force(hw, **kwargs):
    """Every plan of the space, equal and Alpa-sliced, simulated."""
    out = {}
    for plan in plan_space(GPT8, hw, gpus=8, global_batch=16, **kwargs):
        out[plan] = simulate(GPT8, plan, hw)
        if plan.pp > 1 and plan.virtual_stages == 1:
            sliced = alpa_candidate(GPT8, plan, hw, layer_table(GPT8, plan, hw, "bf16"))
            if sliced is not None and sliced not in out:
                out[sliced] = simulate(GPT8, sliced, hw)
    return out


@pytest.mark.parametrize("memory_gb", [3.0, 5.0, 16.0])
def test_top_k_is_the_brute_force_top_k(memory_gb):
    hw = small_cluster(memory_gb * 1e9)
    everything = brute_force(hw)
    fitting = sorted((p.tokens_per_s for p in everything.values() if p.fits), reverse=True)
    result = search(GPT8, hw, gpus=8, global_batch=16, top_k=5)
    assert [c.prediction.tokens_per_s for c in result.best] == pytest.approx(fitting[:5])
    assert result.simulated < len(everything) / 3, "the screens should spare most simulations"
    smallest = min(
        p.peak_memory_bytes for plan, p in everything.items() if plan.stage_layers is None
    )
    assert result.smallest_memory_bytes == pytest.approx(smallest)
    assert result.space == len(plan_space(GPT8, hw, gpus=8, global_batch=16))
    assert result.best[0].reason == "best"
    for candidate in result.best + result.rejected:
        assert candidate.prediction == everything[candidate.plan]


def test_alpa_cuts_reach_the_top_when_memory_is_tight():
    """At 3 GB the top 10 two-stage plans hold Alpa cuts (6, 4): the head's stage gets fewer
    layers. (pp is fixed: with rings over both nodes at the nodes' NIC aggregate, ZeRO
    plans without a pipeline win this small cluster outright.)"""
    hw = small_cluster(3e9)
    result = search(GPT8, hw, gpus=8, global_batch=16, top_k=10, fixed={"pp": 2})
    sliced = [c.plan for c in result.best if c.plan.stage_layers is not None]
    assert sliced
    for plan in sliced:
        assert sum(plan.stage_layers) == GPT8.n_layers + 2
        equal = stage_slices(GPT8.n_layers, replace(plan, stage_layers=None))
        assert stage_slices(GPT8.n_layers, plan) != equal


def test_fixed_axes_hold_in_the_answer():
    hw = small_cluster()
    fixed = {"tp": 2, "recompute": "selective", "schedule": "1f1b"}
    result = search(GPT8, hw, gpus=8, global_batch=16, fixed=fixed, top_k=3)
    assert result.best
    for candidate in result.best + result.rejected:
        assert all(getattr(candidate.plan, k) == v for k, v in fixed.items())
    everything = brute_force(hw, fixed=fixed)
    best = max(p.tokens_per_s for p in everything.values() if p.fits)
    assert result.best[0].prediction.tokens_per_s == pytest.approx(best)


def test_refusals_come_from_the_space():
    with pytest.raises(ValueError, match="tp=3"):
        search(GPT8, small_cluster(), gpus=8, global_batch=16, fixed={"tp": 3})
    with pytest.raises(ValueError, match="top_k=0"):
        search(GPT8, small_cluster(), gpus=8, global_batch=16, top_k=0)


def test_nothing_fits_reports_the_smallest_memory():
    hw = small_cluster(0.5e9)
    result = search(GPT8, hw, gpus=8, global_batch=16)
    assert result.best == []
    smallest = min(p.peak_memory_bytes for p in brute_force(hw).values())
    assert result.smallest_memory_bytes == pytest.approx(smallest)
    assert result.smallest_memory_bytes > hw.memory_bytes
    assert result.rejected and all(c.reason.startswith("memory: needs ") for c in result.rejected)
    first = result.rejected[0].prediction.peak_memory_bytes / 1e9
    assert result.rejected[0].reason == f"memory: needs {first:.1f} GB > 0.5 GB"


def test_reasons_name_the_largest_growing_term():
    result = search(GPT8, small_cluster(5e9), gpus=8, global_batch=16, top_k=3)
    winner = result.best[0].prediction
    terms = {
        "compute_s": "compute",
        "bubble_s": "pipeline bubble",
        "exposed_tp_s": "tensor-parallel",
        "exposed_pp_s": "pipeline (p2p)",
        "exposed_dp_s": "data-parallel",
        "optimizer_s": "optimizer",
    }
    for candidate in result.best[1:] + [c for c in result.rejected if c.prediction.fits]:
        p = candidate.prediction
        grown = max(terms, key=lambda t: getattr(p, t) - getattr(winner, t))
        if getattr(p, grown) > getattr(winner, grown):
            assert terms[grown] in candidate.reason, candidate.reason
        slower = 100 * (p.step_time_s / winner.step_time_s - 1)
        assert candidate.reason.startswith(f"{slower:.1f}% slower")


def test_search_with_cp_finds_what_simulating_every_cp_plan_finds():
    hw = small_cluster(16e9)
    plans = plan_space(GPT8, hw, gpus=8, global_batch=16, cps=(2,))
    best = max(simulate(GPT8, plan, hw).tokens_per_s for plan in plans)
    result = search(GPT8, hw, gpus=8, global_batch=16, top_k=1, cps=(2,))
    assert result.best[0].plan.cp == 2
    assert result.best[0].prediction.tokens_per_s >= best * (1 - 1e-9)  # Alpa cuts may beat it
