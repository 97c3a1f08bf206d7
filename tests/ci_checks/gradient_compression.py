"""gradient_compression on the CI grid: DP's counted bytes equal the ring all-reduce's,
Top-K at 1% moves ≥ 50× fewer bytes than DP on every seed (issue #6's bytes half) and,
with error feedback, keeps the accuracy the CI run can support (the accuracy half), the
quantizers are unbiased and within their papers' variance bounds, and distbench's
PowerSGD trains like torch's hook."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.ci_checks import ran, rows

ARTEFACTS = ("curves", "pareto")
REQUIRED = (
    *("method", "setting", "seed", "bytes_per_step", "compression_ratio", "step_time_s"),
    *("comm_time_s", "final_loss", "final_accuracy", "baseline_accuracy", "loss_curve"),
    "eval_curve",
)


def _one(df: pd.DataFrame, **where: object) -> pd.Series:
    hit = rows(df, **where)
    assert len(hit) == 1, (where, len(hit))
    return hit.iloc[0]


def _target(headline: dict, column: str) -> dict:
    (target,) = [t for t in headline["targets"] if t["column"] == column]
    return target


def every_cell_ran_and_learned(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    assert set(REQUIRED) <= set(df.columns), set(REQUIRED) - set(df.columns)
    assert headline["failed_cells"] == 0
    # Digits has 10 classes: every method, even Top-K without error feedback, ends above
    # chance (10%); a step that does not train, or an accuracy that is not one, fails.
    assert (done["final_accuracy"] > 0.2).all() and (done["final_accuracy"] <= 1).all()
    assert (done["step_time_s"] > 0).all() and (done["final_loss"] > 0).all()


def dp_bytes_equal_the_ring_all_reduce(df: pd.DataFrame, headline: dict) -> None:
    """DP's ring all-reduce sends 2(N−1)/N of the fp32 gradient per rank per step."""
    for dp in rows(ran(df), method="dp").itertuples():
        assert dp.params > 0 and dp.dense_grad_bytes == 4 * dp.params, dp
        n = dp.world_size
        assert dp.bytes_per_step == pytest.approx(2 * (n - 1) / n * 4 * dp.params, rel=1e-3)


def topk_moves_50x_fewer_bytes(df: pd.DataFrame, headline: dict) -> None:
    """Issue #6's bytes half, on every seed: each rank all-gathers ~3.4 bytes per kept
    element to N−1 peers, against DP's 2(N−1)/N·4 bytes per element."""
    done = ran(df)
    for seed in sorted(done["seed"].unique()):
        topk = _one(done, method="topk", setting="density=0.01", seed=seed)
        noef = _one(done, method="topk_noef", setting="density=0.01", seed=seed)
        dp = _one(done, method="dp", seed=seed)
        assert topk["compression_ratio"] >= 50, (seed, topk["compression_ratio"])
        assert topk["compression_ratio"] == pytest.approx(
            dp["bytes_per_step"] / topk["bytes_per_step"]
        )
        assert topk["bytes_per_step"] == noef["bytes_per_step"]
        powersgd = rows(done, method="powersgd", seed=seed)
        assert (powersgd["bytes_per_step"] < dp["bytes_per_step"] / 4).all()
    assert rows(done, method="torch_powersgd")["bytes_per_step"].isna().all(), "not our bytes"
    target = _target(headline, "compression_ratio")
    assert target["met"] and target["cells"] == done["seed"].nunique(), target
    assert headline["done_when"]["topk_1pct"]["compression_ratio"] >= 50


def topk_with_error_feedback_keeps_its_accuracy(df: pd.DataFrame, headline: dict) -> None:
    """Issue #6's accuracy half, on every seed. Its "within 1 point of DP" is a claim about
    the full grid's 300 steps (both seeds within it there: +1.1 and −0.6 points). The CI
    grid trains 60: Top-K's error-feedback residuals have not caught up yet, and it ends
    14.8 points below DP (seeded init and data order: the same every run). What 60 steps
    can support: within 25 points of DP, and at least 15 points above Top-K without error
    feedback (31.2%, 46 points below DP) — so error feedback switched off, or Top-K
    keeping the wrong elements, fails it. The report's target is judged on every seed."""
    done = ran(df)
    seeds = sorted(done["seed"].unique())
    for seed in seeds:
        dp = _one(done, method="dp", seed=seed)["final_accuracy"]
        topk = _one(done, method="topk", setting="density=0.01", seed=seed)["final_accuracy"]
        noef = _one(done, method="topk_noef", setting="density=0.01", seed=seed)["final_accuracy"]
        assert 100 * (topk - dp) >= -25, (seed, topk, dp)
        assert 100 * (topk - noef) >= 15, (seed, topk, noef)
    target = _target(headline, "accuracy_vs_dp_points")
    assert target["cells"] == target["measured"] == len(seeds), target
    assert target["where"] == {"method": "topk", "setting": "density=0.01"}
    worst = min(
        100
        * (
            _one(done, method="topk", setting="density=0.01", seed=s)["final_accuracy"]
            - _one(done, method="dp", seed=s)["final_accuracy"]
        )
        for s in seeds
    )
    assert target["worst"] == pytest.approx(worst, abs=1e-6)
    assert target["met"] == (worst >= -1)


def quantizers_unbiased_within_their_bounds(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    for quantizer in ("qsgd", "terngrad"):
        for row in rows(done, method=quantizer).itertuples():
            assert 0.5 < row.quant_bias_stat < 2.0, ("unbiased: S ≈ 1", quantizer, row.seed)
            assert 0 < row.quant_variance <= row.quant_variance_bound, (quantizer, row.seed)
    found = {q["method"] for q in headline["quantizers"]}
    assert found == {"qsgd", "terngrad"}, found


def powersgd_trains_like_torchs_hook(df: pd.DataFrame, headline: dict) -> None:
    """Same model, data and schedule: distbench's PowerSGD ends within 3 points of torch's
    powerSGD_hook (−0.6 here), and both well above chance."""
    done = ran(df)
    for ours in rows(done, method="powersgd").itertuples():
        theirs = _one(done, method="torch_powersgd", setting=ours.setting, seed=ours.seed)
        assert ours.final_accuracy > 0.5 and theirs["final_accuracy"] > 0.5
        assert abs(ours.final_accuracy - theirs["final_accuracy"]) <= 0.03
        assert not math.isnan(theirs["step_time_s"]) and theirs["step_time_s"] > 0


CHECKS = (
    every_cell_ran_and_learned,
    dp_bytes_equal_the_ring_all_reduce,
    topk_moves_50x_fewer_bytes,
    topk_with_error_feedback_keeps_its_accuracy,
    quantizers_unbiased_within_their_bounds,
    powersgd_trains_like_torchs_hook,
)
