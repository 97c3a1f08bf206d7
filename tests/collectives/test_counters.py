"""Traffic counters equal the analytic counts of each algorithm, exactly.

A failure means either an algorithm moves different traffic than its textbook form (so the
lecture's comparison table in reports/allreduce_scaling would be wrong) or the counting
layer in impls/comm miscounts."""

from __future__ import annotations

import math

import pytest
import torch

from impls.collectives import all_gather, all_reduce, barrier, reduce_scatter
from impls.collectives.algorithms import ALGORITHMS
from tests.rank_support import prefix_communicator

ELEMENTS = 8 * 105  # divisible by every N ≤ 8, and by every power of two ≤ 8: no padding
M = ELEMENTS * 4  # float32 bytes


def expected(algorithm: str, n: int, rank: int) -> dict[str, int]:
    """(bytes_sent, bytes_recv, rounds) of `rank` for an all-reduce of M bytes on N ranks."""
    if algorithm in ("parameter_server", "sequential"):
        server = rank == 0
        moved = (n - 1) * M if server else M
        rounds = (2 if algorithm == "parameter_server" else 2 * (n - 1)) if server else 2
        return {"bytes_sent": moved, "bytes_recv": moved, "rounds": rounds}
    if algorithm == "ring":
        moved = 2 * (n - 1) * M // n
        return {"bytes_sent": moved, "bytes_recv": moved, "rounds": 2 * (n - 1)}
    if algorithm == "parallel":
        return {"bytes_sent": (n - 1) * M, "bytes_recv": (n - 1) * M, "rounds": 1}
    if algorithm == "recursive_halving":
        assert n & (n - 1) == 0, "closed form below is for power-of-two N"
        moved = 2 * (n - 1) * M // n
        return {"bytes_sent": moved, "bytes_recv": moved, "rounds": 2 * int(math.log2(n))}
    if algorithm == "tree":
        # Binomial reduce then broadcast: a rank receives from one child per trailing zero
        # bit (bounded by N) and sends once to its parent; the broadcast mirrors it.
        children = sum(1 for b in range(int(math.log2(n))) if rank % (2 << b) == 0)
        parent = 0 if rank == 0 else 1
        moved = (children + parent) * M
        return {"bytes_sent": moved, "bytes_recv": moved, "rounds": 2 * (children + parent)}
    raise AssertionError(algorithm)


def measure(algorithm: str, n: int) -> dict | None:
    comm = prefix_communicator(n)
    if comm is None:
        return None
    with comm.measure() as traffic:
        all_reduce(torch.ones(ELEMENTS), comm, algorithm=algorithm)
    return traffic.as_dict()


CASES = [(alg, n) for alg in ALGORITHMS for n in (2, 4, 8)]


@pytest.mark.parametrize(("algorithm", "n"), CASES)
def test_counters_equal_analytic_counts(ranks8, algorithm, n):
    per_rank = ranks8.run(measure, algorithm, n)[:n]
    for rank, got in enumerate(per_rank):
        want = expected(algorithm, n, rank)
        assert {k: got[k] for k in want} == want, f"rank {rank}"
        assert got["messages_sent"] > 0


def test_recursive_halving_non_power_of_two_adds_two_rounds(ranks8):
    # N=6: p=4 power-of-two core, two folded pairs; the folded-in ranks take 2 extra rounds.
    per_rank = ranks8.run(measure, "recursive_halving", 6)[:6]
    assert max(t["rounds"] for t in per_rank) == 2 * 2 + 2
    total = sum(t["bytes_sent"] for t in per_rank)
    assert total == 2 * 2 * M + 4 * 2 * (4 - 1) * M // 4  # folds (2 pairs × 2M) + core ranks


def test_totals_match_lecture_table(ranks8):
    # parallel moves N(N−1)·M in total; ring 2(N−1)·M; the server (N−1)·M each way.
    par = ranks8.run(measure, "parallel", 8)[:8]
    assert sum(t["bytes_sent"] for t in par) == 8 * 7 * M
    ring = ranks8.run(measure, "ring", 8)[:8]
    assert sum(t["bytes_sent"] for t in ring) == 2 * 7 * M


def run_barrier(n: int) -> dict | None:
    comm = prefix_communicator(n)
    if comm is None:
        return None
    with comm.measure() as traffic:
        barrier(comm)
    return traffic.as_dict()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_barrier_is_dissemination(ranks8, n):
    per_rank = ranks8.run(run_barrier, n)[:n]
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    assert all(t["rounds"] == rounds and t["bytes_sent"] == rounds for t in per_rank)


def count_calls(n: int) -> dict | None:
    """The collective calls one rank's communicator recorded for a fixed script."""
    comm = prefix_communicator(n)
    if comm is None:
        return None
    before = comm.calls.copy()
    x = torch.ones(4 * n)
    all_reduce(x, comm, algorithm="ring")
    all_reduce(x, comm, algorithm="tree")
    all_gather(torch.empty(4 * n * n), x, comm)
    reduce_scatter(torch.empty(4), x, comm)
    barrier(comm)
    return dict(comm.calls - before)


def test_each_collective_is_counted_once_whatever_it_runs_inside(ranks8):
    # The unit papers count in (Megatron: 2 all-reduces per layer each way): a ring
    # all-reduce is one call, not its reduce-scatter and all-gather phases.
    for got in ranks8.run(count_calls, 4)[:4]:
        assert got == {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "barrier": 1}


def round_in_flight() -> dict | None:
    """Two ranks swap a tensor on one round left in flight, then wait for its parts."""
    comm = prefix_communicator(2)
    if comm is None:
        return None
    peer = 1 - comm.rank
    mine, theirs = torch.full((4,), float(comm.rank)), torch.empty(4)
    with comm.measure() as traffic:
        rnd = comm.round()
        rnd.send(mine, peer)
        rnd.recv(theirs, peer)
        rnd.wait(sends=False, receives=False)  # counts the round, waits for nothing
        rnd.wait_received(theirs)
        got = theirs.tolist()
        try:
            rnd.wait_received(mine)  # a send's buffer, not a receive's
            refused = False
        except ValueError:
            refused = True
        rnd.wait()  # the send; the receive already waited for is not waited for again
    return {"got": got, "refused": refused, "traffic": traffic.as_dict()}


def test_a_round_left_in_flight_counts_once_and_waits_for_each_part_once(ranks8) -> None:
    """What a pipeline rank does with its messages (`impls.pipeline.executor`): count the
    round when it is posted, wait for a receive when its data is needed, for the sends at
    the step's end. A second wait on a completed gloo receive would never return."""
    outs = [out for out in ranks8.run(round_in_flight) if out is not None]
    assert len(outs) == 2
    for rank, out in enumerate(outs):
        assert out["got"] == [float(1 - rank)] * 4
        assert out["refused"]
        assert out["traffic"]["rounds"] == 1
        assert out["traffic"]["messages_sent"] == out["traffic"]["messages_recv"] == 1
