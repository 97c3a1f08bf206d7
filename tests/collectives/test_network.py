"""The simulated network: each round held for latency + bytes / bandwidth, kept apart.

A failure here means a rank's rounds are not slowed as the modelled link would slow them
(so latency- and bandwidth-bound regimes could not be studied on one host), the added time
is not accounted separately from the real transfer, the data is changed, or a bad network
setting is accepted instead of refused naming the key.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from impls.collectives import all_reduce
from impls.comm import Communicator, SimulatedNetwork
from tests.rank_support import prefix_communicator

NUMEL = 1 << 18  # 1 MiB of float32: a 2-rank ring sends 512 KiB in each of its 2 rounds


def test_a_round_costs_latency_plus_its_larger_direction_over_bandwidth():
    net = SimulatedNetwork.from_units(latency_ms=100, bandwidth_mbps=100)
    assert net.latency_s == pytest.approx(0.1) and net.bandwidth_bps == pytest.approx(1e8)
    assert net.round_seconds(1_000_000, 10) == pytest.approx(0.1 + 0.08)
    assert SimulatedNetwork(latency_s=0.01).round_seconds(10**9, 10**9) == pytest.approx(0.01)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda: SimulatedNetwork(latency_s=-0.1), "latency_s=-0.1"),
        (lambda: SimulatedNetwork(latency_s=math.inf), "latency_s"),
        (lambda: SimulatedNetwork(bandwidth_bps=0), "bandwidth_bps=0"),
        (lambda: SimulatedNetwork.from_units(latency_ms=-5), "latency_ms=-5"),
        (lambda: SimulatedNetwork.from_units(bandwidth_mbps=-1.0), "bandwidth_mbps=-1.0"),
    ],
)
def test_bad_network_settings_are_refused_naming_the_key(make, needle):
    with pytest.raises(ValueError) as error:
        make()
    assert needle in str(error.value)


def ring_on_network(latency_ms: float | None) -> dict | None:
    base = prefix_communicator(2)
    if base is None:
        return None
    network = None if latency_ms is None else SimulatedNetwork.from_units(latency_ms, 100)
    comm = Communicator(base.group, network=network)
    x = torch.full((NUMEL,), float(comm.rank + 1))
    start = time.perf_counter()
    all_reduce(x, comm, algorithm="ring")
    return {
        "wall_s": time.perf_counter() - start,
        "simulated_s": comm.simulated_s,
        "rounds": comm.counters.rounds,
        "correct": bool((x == 3.0).all()),
    }


def test_every_round_is_held_for_the_modelled_time_and_counted_apart(ranks8):
    per_round = 0.010 + 8 * (NUMEL * 4 // 2) / 1e8  # 10 ms + 512 KiB at 100 Mbit/s
    for out in ranks8.run(ring_on_network, 10.0)[:2]:
        assert out["correct"] and out["rounds"] == 2
        assert out["simulated_s"] == pytest.approx(2 * per_round)
        assert out["wall_s"] >= out["simulated_s"]  # added on top of the real transfer


def test_off_by_default(ranks8):
    for out in ranks8.run(ring_on_network, None)[:2]:
        assert out["correct"] and out["simulated_s"] == 0.0
