"""activation_recompute on the CI grid: every mode equals the layer without recomputation
(dropout on, same masks); the saved bytes per layer equal Korthikanti et al.'s equations
within 1% (bf16, dropout, materialized attention) and the implementation model exactly;
full < selective < none in bytes; the longest sequence within the budget grows the same
way; the FLOPs prediction is the paper's (full 1/3)."""

from __future__ import annotations

import pandas as pd

from tests.ci_checks import ran, rows

ARTEFACTS = ("saved_bytes",)
REQUIRED = [
    "recompute",
    "tp",
    "sp",
    "seq_len",
    "micro_batch",
    "d_model",
    "n_heads",
    "dtype",
    "attention",
    "dropout",
    "saved_bytes_per_layer",
    "paper_bytes_per_layer",
    "model_bytes_per_layer",
    "step_time_s",
    "overhead_vs_none",
    "predicted_flops_overhead",
    "wrong",
    "git_sha",
    "world_size",
]


def every_cell_ran_and_matches_no_recomputation(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    assert set(REQUIRED) <= set(df.columns), set(REQUIRED) - set(df.columns)
    assert set(done["recompute"]) == {"none", "selective", "full"}
    assert set(done["tp"]) == {1, 2} and done["sp"].astype(bool).any()
    assert (done["wrong"] == 0).all(), done.loc[done["wrong"] != 0, ["recompute", "tp", "sp"]]
    assert (done["dropout"] > 0).all() and (done["step_time_s"] > 0).all()
    assert (done["none_step_time_s"] > 0).all()
    assert headline["wrong_total"] == 0 and headline["failed_cells"] == 0


def saved_bytes_equal_the_paper_within_one_percent(df: pd.DataFrame, headline: dict) -> None:
    done = rows(ran(df), attention="materialized")
    saved, paper = done["saved_bytes_per_layer"], done["paper_bytes_per_layer"]
    assert (saved > 0).all() and (paper > 0).all()
    assert ((saved / paper - 1).abs() <= 0.01).all(), (saved / paper).tolist()
    assert 0 <= headline["saved_vs_paper_max_deviation"] <= 0.01


def saved_bytes_equal_the_implementation_model(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    assert (done["saved_bytes_per_layer"] > 0).all()
    assert (done["saved_bytes_per_layer"] == done["model_bytes_per_layer"]).all()
    exact = headline["saved_equal_model_rows"]
    assert exact["rows"] == exact["exact"] == len(done), exact


def recomputation_orders_the_bytes(df: pd.DataFrame, headline: dict) -> None:
    """Per layout and s: full < selective < none; SP divides the full mode's input by t."""
    done = ran(df).set_index(["tp", "sp", "seq_len", "recompute"])["saved_bytes_per_layer"]
    for (t, sp, s), group in done.groupby(level=[0, 1, 2]):
        by = group.droplevel([0, 1, 2])
        assert 0 < by["full"] < by["selective"] < by["none"], (t, sp, s, by.to_dict())
    full = ran(df).pipe(rows, recompute="full", tp=2)
    with_sp = full[full["sp"].astype(bool)].set_index("seq_len")["saved_bytes_per_layer"]
    without = full[~full["sp"].astype(bool)].set_index("seq_len")["saved_bytes_per_layer"]
    assert len(with_sp) and (with_sp * 2 == without[with_sp.index]).all()


def longest_sequence_grows_with_recomputation(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    longest = done[done["seq_len"] == done["seq_len"].max()]
    by = longest.set_index(["tp", "sp", "recompute"])["max_seq_len_in_budget"]
    for (t, sp), group in by.groupby(level=[0, 1]):
        g = group.droplevel([0, 1])
        assert 0 < g["none"] < g["selective"] < g["full"], (t, sp, g.to_dict())


def flops_prediction_is_the_papers(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    predicted = done.set_index("recompute")["predicted_flops_overhead"]
    assert (predicted.loc[["full"]] == 1 / 3).all()
    assert (predicted.loc[["none"]] == 0).all()
    sel = rows(done, recompute="selective")
    s, h = sel["seq_len"], sel["d_model"]
    assert ((sel["predicted_flops_overhead"] - s / (18 * h + 3 * s)).abs() < 1e-12).all()
    assert (sel["predicted_flops_overhead"] > 0).all()


CHECKS = (
    every_cell_ran_and_matches_no_recomputation,
    saved_bytes_equal_the_paper_within_one_percent,
    saved_bytes_equal_the_implementation_model,
    recomputation_orders_the_bytes,
    longest_sequence_grows_with_recomputation,
    flops_prediction_is_the_papers,
)
