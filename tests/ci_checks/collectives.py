"""collectives on the CI grid: every primitive of both implementations ran and is right,
and distbench's counted traffic equals each algorithm's analytic count (binomial trees for
broadcast / reduce, one round from the root for scatter / gather, rings for all-gather /
reduce-scatter, one round of pairwise exchange for all-to-all)."""

from __future__ import annotations

import math

import pandas as pd

from tests.ci_checks import ran

ARTEFACTS = ("busbw_by_collective",)


def _expected(collective: str, n: int, s: int) -> dict[str, float]:
    """Rounds, the busiest rank's bytes sent and received, and the total sent."""
    log, block = math.ceil(math.log2(n)), s // n
    return {
        "broadcast": (log, log * s, s, (n - 1) * s),
        "reduce": (log, s, log * s, (n - 1) * s),
        "scatter": (1, (n - 1) * block, block, (n - 1) * block),
        "gather": (1, block, (n - 1) * block, (n - 1) * block),
        "all_gather": (n - 1, (n - 1) * block, (n - 1) * block, n * (n - 1) * block),
        "reduce_scatter": (n - 1, (n - 1) * block, (n - 1) * block, n * (n - 1) * block),
        "all_to_all": (1, (n - 1) * block, (n - 1) * block, n * (n - 1) * block),
    }[collective]


def every_collective_of_both_impls_ran_right(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    assert done.groupby(["collective", "impl"]).size().shape[0] == 7 * 2
    assert (done["wrong"] == 0).all() and (done["time_s"] > 0).all()
    assert headline["wrong_total"] == 0 and headline["failed_cells"] == 0


def counted_traffic_equals_the_algorithms(df: pd.DataFrame, headline: dict) -> None:
    ours = ran(df)[df["impl"] == "distbench"]
    assert len(ours)
    for row in ours.itertuples():
        want = _expected(row.collective, row.world_size, row.message_bytes)
        got = (row.rounds, row.max_rank_bytes_sent, row.max_rank_bytes_recv, row.total_bytes_sent)
        assert got == want, (row.collective, row.world_size, row.message_bytes, got, want)
    assert df.loc[df["impl"] == "torch", "rounds"].isna().all(), "torch's traffic is opaque"


CHECKS = (every_collective_of_both_impls_ran_right, counted_traffic_equals_the_algorithms)
