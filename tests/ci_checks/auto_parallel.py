"""auto_parallel on the CI grid (GPT-3 1.3B on 8 and 64 A100s): every GPU count gets a
best plan that fits and uses every GPU, plans are ranked by predicted throughput, each
plan's step-time breakdown adds up to its step time, MFU is a fraction, and the index
carries the best plans as model outputs, never as measurements. Accuracy: no plan's
utilisation beats the fastest kernel its preset cites, and the best plan's MFU lies between
what published ~1B-parameter runs reached on A100s."""

from __future__ import annotations

import math

import pandas as pd

from impls.costmodel.presets import hardware
from tests.ci_checks import ran, rows

ARTEFACTS = ("step_time_breakdown", "mfu_vs_gpus", "memory_vs_plan")
PARTS = ("compute_s", "bubble_s", "exposed_tp_s", "exposed_pp_s", "exposed_dp_s", "optimizer_s")


def _plans(df: pd.DataFrame) -> pd.DataFrame:
    done = ran(df)
    found = done[done["found"].astype(str) == "True"]
    assert len(found), "no plan found"
    return found


def every_gpu_count_has_a_best_plan_that_fits(df: pd.DataFrame, headline: dict) -> None:
    for gpus in sorted(set(ran(df)["gpus"])):
        best = rows(_plans(df), gpus=gpus, list="best", rank=1).iloc[0]
        assert str(best["fits"]) == "True", best
        assert best["dp"] * best["tp"] * best["pp"] == gpus, best
        assert best["predicted_peak_memory_gb"] <= best["device_memory_gb"], best
        assert 0 < best["predicted_mfu"] < 1, best
        assert best["predicted_tokens_per_s"] > 0, best


def plans_are_ranked_by_predicted_throughput(df: pd.DataFrame, headline: dict) -> None:
    best = _plans(df)
    best = best[best["list"] == "best"]
    assert len(best) >= 2
    for _, group in best.groupby("gpus"):
        throughput = group.sort_values("rank")["predicted_tokens_per_s"].tolist()
        assert all(t > 0 for t in throughput), throughput
        assert throughput == sorted(throughput, reverse=True), throughput


def breakdown_adds_up_to_the_step(df: pd.DataFrame, headline: dict) -> None:
    fits = _plans(df)
    fits = fits[fits["fits"].astype(str) == "True"]
    assert len(fits)
    for _, row in fits.iterrows():
        total = sum(float(row[p]) for p in PARTS)
        step = float(row["predicted_step_time_s"])
        assert step > 0 and math.isclose(total, step, rel_tol=1e-6), (total, step)
        assert row["compute_s"] > 0, row


def index_labels_predictions_as_model_outputs(df: pd.DataFrame, headline: dict) -> None:
    plans = [f for f in headline["figures"] if f["figure"].startswith("best plan")]
    assert len(plans) == len(set(ran(df)["gpus"])), plans
    assert all(f["measured"] == "—" and "MFU" in f["model"] for f in plans), plans
    assert all(v > 0 for v in headline["search_s"].values()), headline["search_s"]
    best = {int(b["gpus"]): b for b in headline["best"]}
    for gpus, b in best.items():
        assert b["predicted_mfu"] > 0 and b["dp"] * b["tp"] * b["pp"] == gpus


def _kernel_ceiling(name: str) -> float:
    """The highest fraction of peak any kernel of preset `name` reaches: its GEMM plateau
    (MAMF) or FlashAttention's best published fraction, whichever is higher."""
    hw = hardware(name)
    fractions = [fraction for _, fraction in hw.gemm_efficiency]
    for point in getattr(hw, "attention_efficiency", None) or ():
        fractions.extend(point[1:])
    return max(fractions)


def every_plan_is_below_the_kernel_ceiling(df: pd.DataFrame, headline: dict) -> None:
    """A step is GEMMs, attention and slower work: no plan's hardware FLOP utilisation can
    exceed the best kernel's fraction of peak, and MFU (no recomputed FLOPs) ≤ HFU."""
    for _, row in _plans(df).iterrows():
        ceiling = _kernel_ceiling(str(row["hardware"]))
        mfu, hfu = float(row["predicted_mfu"]), float(row["predicted_hfu"])
        assert 0 < mfu <= hfu * (1 + 1e-9) and hfu <= ceiling, (mfu, hfu, ceiling, row)


# Published MFU of ~1B-parameter models on DGX A100 nodes:
TINYLLAMA_MFU = 0.56  # TinyLlama 1.1B, 16 A100-40GB, FlashAttention-2 and fused kernels (README)
MEGATRON_1_7B_MFU = 137e12 * 3 / 4 / 312e12  # SC'21 Table 1, 1.7B on 32 A100: 137 TFLOP/s
# counting full recomputation's extra forward (4 of 3 passes): 32.9% MFU


def best_plan_mfu_is_credible(df: pd.DataFrame, headline: dict) -> None:
    """GPT-3 1.3B on A100s: the best plan's MFU is within 10% above the best published A100
    MFU at this scale (issue #33's tolerance for 175B) and no worse than a published run
    achieved (Megatron-LM's 1.7B with full recomputation: a plan at least that good exists)."""
    best = rows(_plans(df), model="gpt3_1_3b", list="best", rank=1)
    a100 = best[best["hardware"].astype(str).str.startswith("a100")]
    assert len(a100), "no GPT-3 1.3B plan on A100s"
    for _, row in a100.iterrows():
        mfu = float(row["predicted_mfu"])
        assert MEGATRON_1_7B_MFU <= mfu <= 1.1 * TINYLLAMA_MFU, (mfu, row["gpus"])


CHECKS = (
    every_gpu_count_has_a_best_plan_that_fits,
    plans_are_ranked_by_predicted_throughput,
    breakdown_adds_up_to_the_step,
    index_labels_predictions_as_model_outputs,
    every_plan_is_below_the_kernel_ceiling,
    best_plan_mfu_is_credible,
)
