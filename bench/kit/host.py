"""Measuring as if every rank had a device of its own, on a host whose ranks share cores:
`HostComputeLock` (ranks compute one at a time), `probe_pairs` (what one transfer costs
with the pair alone) and `host_probe` (how fast this host runs right now), each saying why
it is needed.
"""

from __future__ import annotations

import fcntl
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import torch
import torch.distributed as dist

from bench.launch import RUN_DIR_ENV
from impls.comm import Communicator

__all__ = ["PROBE_MICRO", "PROBE_WINDOW_S", "HostComputeLock", "host_probe", "probe_pairs"]

PROBE_MICRO = 4
"""Micro-batch of the host probe's step: between the overhead-bound b = 1 and the
GEMM-bound b = 16 of the calibration's reference."""
PROBE_WINDOW_S = 0.3
"""Seconds the host probe steps for (about a dozen steps)."""


class HostComputeLock:
    """A lock every rank on this host shares (`fcntl.flock` on a file rank 0 names).

    Entering is collective (rank 0 broadcasts the file's name); the lock itself is called
    (`with lock(): ...`) around each compute action. Ranks on other hosts lock their own
    file. The file lives in the rank pool's private run directory (`DISTBENCH_RUN_DIR`;
    the system's temporary directory where that is unset, as under torchrun), and its name
    is removed as soon as every rank holds it open: `flock` works on the open file, so
    nothing is left behind even by a rank killed while it holds the lock.

    a lock all ranks of the host share, taken around each compute action
    of a profiling step, so ranks compute one at a time and each action's CPU time is what
    that work costs with the host to itself (ranks sharing a core slow each other down by
    an amount that depends on how many the schedule keeps busy at that moment).
    """

    def __enter__(self) -> HostComputeLock:
        name = [None]
        if dist.get_rank() == 0:
            folder = os.environ.get(RUN_DIR_ENV) or None  # None: the system's temp dir
            handle, name[0] = tempfile.mkstemp(".lock", "distbench-compute-", folder)
            os.close(handle)
        dist.broadcast_object_list(name, src=0)
        self.path: str = name[0]  # where the file was made; the name is gone once entered
        # O_NOFOLLOW: a rank on another host creates the file itself; never through a link.
        handle = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._file = os.fdopen(handle, "r+b")
        dist.barrier()  # every rank holds the file open: its name can go
        with suppress(FileNotFoundError):  # one rank per host wins
            os.unlink(self.path)
        return self

    @contextmanager
    def __call__(self) -> Iterator[None]:
        fcntl.flock(self._file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._file, fcntl.LOCK_UN)

    def __exit__(self, *exc: object) -> None:
        # No collective here: a rank leaving on an error must not wait for its peers.
        self._file.close()


def probe_pairs(
    tensor: torch.Tensor, *, exchange: bool, wraps: bool = False, trials: int = 20
) -> float | None:
    """Seconds one transfer of `tensor` costs between neighbouring ranks, the pair alone.

    `exchange=False`: one-way, half the fastest of `trials` round trips (what a pipeline
    stage boundary does). `exchange=True`: one round in which both ranks send the other
    `tensor` (what every ring round does). Pairs (r, r+1) take turns, the other ranks
    waiting at a barrier; `wraps` adds the pair (N−1, 0). Returns the median over the
    pairs this rank took part in of each pair's fastest trial (None on a single rank).

    what one transfer costs with the pair of ranks alone. Timed inside a
    step on shared cores, a transfer mostly measures the wait for a descheduled peer; so
    each pair of neighbouring ranks takes turns while the others wait at a barrier, and
    keeps its *fastest* trial: on shared cores a slower one is one where a peer was
    descheduled, the interference such a replay sets out to remove (on busy shared cores
    the median swings between runs; the fastest is steady).
    """
    comm = Communicator()
    rank, ranks = comm.rank, comm.world_size
    inbox = torch.empty_like(tensor)
    pairs = [(a, a + 1) for a in range(ranks - 1)] + ([(ranks - 1, 0)] if wraps else [])
    fastest = []
    for first, second in pairs:
        dist.barrier()
        if rank not in (first, second) or first == second:
            continue
        peer = second if rank == first else first
        trips = []
        for trial in range(trials + 1):  # the first trial is a warm-up
            start = time.perf_counter()
            if exchange:
                with comm.round() as rnd:
                    rnd.recv(inbox, peer)
                    rnd.send(tensor, peer)
            elif rank == first:
                comm.send(tensor, peer)
                comm.recv(inbox, peer)
            else:
                comm.recv(inbox, peer)
                comm.send(tensor, peer)
            if trial:
                seconds = time.perf_counter() - start
                trips.append(seconds if exchange else seconds / 2)
        fastest.append(min(trips))
    dist.barrier()
    return statistics.median(fastest) if fastest else None


@functools.lru_cache(maxsize=1)
def _probe_step():
    from bench.kit.workloads import reference_step

    return reference_step(PROBE_MICRO, "fp32")


def host_probe(window_s: float = PROBE_WINDOW_S) -> float:
    """Median seconds of one fp32 training step (forward, loss, backward, zero_grad) of
    `REFERENCE_GPT` at micro-batch `PROBE_MICRO` on one thread, stepping for `window_s`
    seconds after one warm-up step (at least one timed step).

    how fast this host runs right now. A shared host drifts between fast and
    slow phases lasting seconds to minutes; a prediction calibrated at one time and compared
    with a measurement taken at another reads that drift as its own error. The runner
    times the probe between cells of an experiment that asks for it
    (`Experiment.host_probe`), and `planner_validation` times it again where it calibrates.
    """
    step, before = _probe_step(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step()
        times, end = [], time.perf_counter() + window_s
        while not times or time.perf_counter() < end:
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return statistics.median(times)
