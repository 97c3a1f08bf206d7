"""overlap on the CI grid: the replicas agree with each other and with a single-process
run (overlap changes when buckets are summed, not what), the counters equal the ring
all-reduce's count, the simulated link charges every round, the bucket timelines obey
what backward can cover, and issue #4's target is judged on every multi-bucket cap on the
simulated link with loopback's result kept as a finding.

The CI model's backward lasts a few milliseconds against tens of milliseconds of bucket
all-reduces: the most overlap can save (the ideal derived from the serial cell) is ~5%
of a step, inside this shared host's step-to-step spread, so the target's verdict on the
CI grid is noise either way. What is checked is that it is judged on the right cells and
agrees with the rows; the timeline facts below are exact and do not depend on the host."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.ci_checks import ran

ARTEFACTS = ("step_time_vs_bucket", "hidden_fraction")


def _flags(df: pd.DataFrame) -> pd.Series:
    return df["overlap"].astype(str) == "True"


def replicas_agree(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    assert (done["wrong"] == 0).all() and (done["step_time_s"] > 0).all()
    assert headline["wrong_total"] == 0 and headline["failed_cells"] == 0
    assert headline["pairs"] == headline["pairs_bitwise_equal"] == len(done) // 2 > 0
    assert done["twin_same_parameters"].astype(str).eq("True").all()
    assert done["param_digest"].nunique() == 1, "every cell trains the same replicas"
    # ...and lands where one process training on the whole batch does (fp32 rounding: ~1e-6)
    assert (done["update_error"] < 1e-4).all(), done["update_error"].tolist()


def counters_equal_the_ring(df: pd.DataFrame, headline: dict) -> None:
    """Each bucket's ring all-reduce: 2(N−1) rounds, 2(N−1)/N of its bytes sent per rank
    (up to one element per chunk); the same buckets either way."""
    done = ran(df)
    for row in done.itertuples():
        n = row.world_size
        assert row.params > 0 and row.grad_bytes == 4 * row.params, row
        assert row.buckets >= 1 and row.rounds_per_step == 2 * (n - 1) * row.buckets, row
        least = 2 * (n - 1) * row.grad_bytes / n
        assert least <= row.bytes_per_step <= least + 2 * (n - 1) * 4 * row.buckets, row
    on, off = done[_flags(done)], done[~_flags(done)]
    merged = on.merge(off, on=["network", "bucket_cap_bytes"], suffixes=("_on", "_off"))
    assert len(merged) and (merged["bytes_per_step_on"] == merged["bytes_per_step_off"]).all()


def simulated_link_charges_every_round(df: pd.DataFrame, headline: dict) -> None:
    """latency + bytes / bandwidth per round of the bucket all-reduces; none on loopback."""
    done = ran(df)
    linked = done[done["network"] != "loopback"]
    assert len(linked) and (done.loc[done["network"] == "loopback", "simulated_s"] == 0).all()
    for row in linked.itertuples():
        assert row.bandwidth_mbps > 0 and row.latency_ms >= 0, row
        charged = row.rounds_per_step * row.latency_ms / 1e3
        charged += 8 * row.bytes_per_step / (row.bandwidth_mbps * 1e6)
        assert row.simulated_s > 0 and row.simulated_s == pytest.approx(charged, rel=1e-6), row


def timelines_obey_backward(df: pd.DataFrame, headline: dict) -> None:
    """Serial: nothing hidden, and the step waits for every all-reduce after backward.
    Overlapped: no more hidden than backward lasted; with several buckets on the link,
    some all-reduce runs while backward still computes (a timeline fact, not a speed
    claim)."""
    done = ran(df)
    off, on = done[~_flags(done)], done[_flags(done)]
    assert len(off) and (off["hidden_fraction"] == 0).all() and (off["overlapped_steps"] == 0).all()
    assert (off["exposed_sync_s"] >= off["allreduce_s"] - 1e-9).all()
    assert (off["allreduce_s"] > 0).all()
    assert (on["hidden_s"] <= on["backward_s"] + 1e-9).all()
    assert ((on["hidden_fraction"] >= 0) & (on["hidden_fraction"] <= 1)).all()
    assert (done["last_bucket_s"] <= done["allreduce_s"] + 1e-9).all()
    linked = on[(on["buckets"] > 1) & (on["network"] != "loopback")]
    assert len(linked) and (linked["hidden_fraction"] > 0).all(), linked["hidden_fraction"]
    assert (linked["overlapped_steps"] >= 1).all()


def _pair_speedups(done: pd.DataFrame) -> pd.Series:
    """Per (network, cap): the geometric mean of both cells' side-by-side ratios."""
    product = done.groupby(["network", "bucket_cap_bytes"])["paired_speedup"].prod()
    return product**0.5


def target_judged_on_every_multi_bucket_cap(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    speedups = _pair_speedups(done)
    buckets = done.groupby(["network", "bucket_cap_bytes"])["buckets"].max()
    several = buckets[buckets > 1].index
    linked = [k for k in several if k[0] != "loopback"]
    (target,) = headline["targets"]
    assert target["cells"] == target["measured"] == len(linked) > 0, target
    assert target["worst"] == pytest.approx(min(speedups[k] for k in linked))
    assert target["met"] == all(speedups[k] > 1 for k in linked)
    loopback = [k for k in several if k[0] == "loopback"]
    finding = [f for f in headline["findings"] if f["claim"].startswith("On loopback")]
    assert len(loopback) and len(finding) == 1, "loopback's result is kept as a finding"
    assert finding[0]["holds"] == all(speedups[k] > 1 for k in loopback)
    assert all(math.isfinite(speedups[k]) and speedups[k] > 0 for k in several)


CHECKS = (
    replicas_agree,
    counters_equal_the_ring,
    simulated_link_charges_every_round,
    timelines_obey_backward,
    target_judged_on_every_multi_bucket_cap,
)
