"""`bench.kit.meeting`: what a collective costs after compute, on a fresh pool of ranks.

A failure means the probe does not time its three loops as documented (the call after
compute paired with the compute alone, the call back to back), or that it cannot start its
pool from a process that is itself a rank (it runs in a child interpreter for that)."""

from __future__ import annotations

import math

import pytest

from bench.kit import meeting


def test_measure_times_a_call_after_compute_and_back_to_back():
    got = meeting.measure(2, segment_s=5e-4, rounds=2, per_round=3, timeout_s=120.0)
    assert got["world_size"] == 2 and (got["rounds"], got["per_round"]) == (2, 3)
    assert got["call"] == meeting.CALL and got["gemms"] >= 1
    for key in ("after_compute_s", "segment_s", "iteration_s", "call_s"):
        assert math.isfinite(got[key]), key
    assert got["segment_s"] > 0 and got["call_s"] > 0
    # per round, a meeting iteration is the segment and then the call: each side's median
    # over the rounds, and the median of the paired differences, bound one another loosely
    assert got["iteration_s"] > got["segment_s"] * 0.5
    assert got["after_compute_s"] > -got["segment_s"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 1}, "world_size=1"),
        ({"segment_s": 0.0}, "segment_s=0.0"),
        ({"rounds": 0}, "rounds=0"),
    ],
)
def test_bad_settings_are_refused_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):  # before any process starts
        meeting.measure(**{"world_size": 2, "rounds": 1, "per_round": 1, **kwargs})
