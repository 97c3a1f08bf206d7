"""What `planner_validation` measures on pools of ranks of its own, so that no number
measured in a ground-truth cell prices that cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from functools import partial
from typing import Any

import torch

from impls.comm import Communicator, Round

__all__ = ["LINK_BYTES", "measure", "probe"]

LINK_BYTES = (4, 1 << 20)
"""The α probe's message and the β probe's (as `parallelism_comparison` probes them)."""
CALLS = 20
TRIALS = 200
"""Exchanges per size of the link probe, the fastest kept: on a busy host a pair of ranks
is rarely scheduled at once, and the fastest of a few stays far above the quiet α."""


class _ClockedRound(Round):
    """A `Round` that adds the thread CPU it spends posting and waiting to `clock[0]`."""

    def __init__(self, comm: Communicator, clock: list[float]) -> None:
        super().__init__(comm)
        self._clock = clock

    def _add(self, fn, tensor, peer, tag) -> None:
        start = time.thread_time()
        try:
            super()._add(fn, tensor, peer, tag)
        finally:
            self._clock[0] += time.thread_time() - start

    def _block(self, indices) -> None:
        start = time.thread_time()
        try:
            super()._block(indices)
        finally:
            self._clock[0] += time.thread_time() - start


def probe_tp_call(numel: int, calls: int = CALLS) -> float:
    """Thread CPU seconds one all-reduce of `numel` float32 spends outside its rounds on
        this pool (collective: every rank calls it); the median of `calls` calls, each opened
    by a barrier."""
    import torch.distributed as dist

    from impls.collectives import all_reduce

    comm, clock = Communicator(), [0.0]
    comm.round_type = partial(_ClockedRound, clock=clock)  # this instance only
    x = torch.zeros(numel)
    seconds = []
    for call in range(calls + 1):  # the first is a warm-up
        dist.barrier()  # every rank starts the call together, as a timed step does
        cpu, in_rounds = time.thread_time(), clock[0]
        all_reduce(x.clone(), comm)
        if call:
            seconds.append(time.thread_time() - cpu - (clock[0] - in_rounds))
    return statistics.median(seconds)


def probe_link() -> tuple[float, float]:
    """(α s per round, β s per byte) of this pool's link (collective)."""
    from bench.kit.host import probe_pairs

    small, large = (
        probe_pairs(torch.zeros(max(1, n // 4)), exchange=True, trials=TRIALS) for n in LINK_BYTES
    )
    # a 1 MiB exchange no slower than 4 bytes (a disturbed α): β floored above 0, as the
    # ring fits floor theirs, so the link keeps a finite bandwidth
    return small, max((large - small) / (LINK_BYTES[1] - LINK_BYTES[0]), 1e-15)


def probe(link: bool, numels: list[int]) -> dict[str, Any]:
    """One rank's share: the link (where asked) and the TP call work at each of `numels`.

    - `probe_link`: the link's α (per round) and β (per byte), defined as
      `parallelism_comparison`'s probe defines it (`bench.kit.host.probe_pairs`: the fastest
      exchange of 4 bytes and of 1 MiB between two ranks while any others wait; α the first,
      β the difference over the extra bytes). A replayed row is priced on it, and a wall-clock
      row whose rank count `allreduce_scaling` did not run.
    - `probe_tp_call`: the thread CPU one TP all-reduce of `numel` float32 spends outside its
      rounds — the clone Megatron's f/g make, the ring's slicing and additions — on a group of
      t ranks: the work a replay of TP charges each call beside α per round and β per byte.
      The median of `calls` calls after one warm-up, then the median over the ranks.
    """
    torch.set_num_threads(1)
    out: dict[str, Any] = {"tp_call_cpu_s": {n: probe_tp_call(n) for n in numels}}
    if link:
        out["link"] = probe_link()
    return out


def _merge(per_rank: list[dict[str, Any]], numels: list[int]) -> dict[str, Any]:
    """The medians over the ranks, as `parallelism_comparison` takes them."""
    out: dict[str, Any] = {
        "world_size": len(per_rank),
        "tp_call_cpu_s": {
            n: statistics.median(r["tp_call_cpu_s"][n] for r in per_rank) for n in numels
        },
    }
    if "link" in per_rank[0]:
        out["link"] = tuple(statistics.median(r["link"][i] for r in per_rank) for i in range(2))
    return out


def measure(
    world_size: int, numels: list[int], *, link: bool = False, timeout_s: float = 300.0
) -> dict[str, Any]:
    """`probe` on a fresh pool of `world_size` gloo ranks, in a child interpreter:
    {"world_size", "tp_call_cpu_s": {numel: s}, and with `link`, "link": (α, β)}.

    `measure` runs them on a fresh pool in a child interpreter (`python -m
    bench.experiments.planner_validation.pool_probes`): a rank of the experiment's own pool is
    a daemonic process, which may not start processes of its own.
    """
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: a pool probe needs at least 2 ranks")
    args = [
        sys.executable,
        "-m",
        "bench.experiments.planner_validation.pool_probes",
        f"--world-size={world_size}",
        *(f"--numel={n}" for n in numels),
        *(["--link"] if link else []),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"the pool probe on {world_size} ranks failed: " + " | ".join(tail))
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["tp_call_cpu_s"] = {int(n): s for n, s in result["tp_call_cpu_s"].items()}
    if "link" in result:
        result["link"] = tuple(result["link"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--numel", type=int, action="append", default=[])
    parser.add_argument("--link", action="store_true")
    args = parser.parse_args(argv)
    from bench.experiments.planner_validation import pool_probes  # picklable by its name
    from bench.launch import run_on_ranks

    per_rank = run_on_ranks(
        pool_probes.probe, args.world_size, args.link, args.numel, timeout_s=300.0
    )
    print(json.dumps(_merge(per_rank, args.numel)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
