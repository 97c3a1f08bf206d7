"""What one rank does in an `overlap` cell: DDP training steps of the GPT with its bucket
all-reduces overlapped with backward or run after it, timed step by step.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.experiments.base import Cell
from bench.experiments.overlap.config import OverlapConfig
from bench.kit.reference import compare, parameters, train_reference
from bench.kit.timing import Timed, alternate
from bench.kit.workloads import gpt, lm_loss, rank_shard, seeded_batch
from impls.comm import Communicator, SimulatedNetwork
from impls.data_parallel import DDP, SyncTimeline
from impls.data_parallel.common import release_group
from impls.models import GPTConfig

__all__ = ["Plan", "hidden_seconds", "run"]

LR = 0.01
# fp32: the ring sums the ranks' gradients in another order than one process does, so the
# replica drifts from the single-process run by rounding only (~1e-6 of the update here);
# averaging wrongly (a sum, a stale bucket) moves it by the size of the update itself.
UPDATE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Plan:
    """What a cell's ranks build, decided once per cell: the simulated link under the
    bucket all-reduces (None: loopback) and the overlap flag of each side — the cell's
    own first, then its twin's when the cell is paired."""

    network: Mapping[str, float] | None
    sides: tuple[bool, ...]

    @property
    def paired(self) -> bool:
        return len(self.sides) > 1


def hidden_seconds(timeline: SyncTimeline) -> tuple[float, float, float]:
    """(all-reduce seconds, the part of them before backward ended, exposed seconds)."""
    end = timeline.backward_end
    total = sum(b.finished - b.started for b in timeline.buckets)
    hidden = sum(max(0.0, min(b.finished, end) - b.started) for b in timeline.buckets)
    exposed = max(0.0, max(b.finished for b in timeline.buckets) - end)
    return total, hidden, exposed


def _fingerprint(model: torch.nn.Module) -> tuple[str, bool]:
    """SHA-256 of every parameter's fp32 bytes (first 16 hex digits), and whether all
    are finite."""
    digest, finite = hashlib.sha256(), True
    for p in model.parameters():
        data = p.detach().float().contiguous()
        finite = finite and bool(torch.isfinite(data).all())
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()[:16], finite


def _replicas_differ(digest: str, finite: bool) -> int:
    """Ranks whose parameters differ from rank 0's or are not finite (the same on all)."""
    mine = torch.tensor([int(digest, 16) - 2**63, int(not finite)], dtype=torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    reference = int(gathered[0][0])
    return sum(int(g[0]) != reference or int(g[1]) != 0 for g in gathered)


class _Side:
    """One DDP replica of the cell's GPT with its own sync group."""

    def __init__(
        self, cfg: OverlapConfig, plan: Plan, bucket_cap_bytes: int, overlap: bool
    ) -> None:
        network = SimulatedNetwork.from_units(**plan.network) if plan.network else None
        self.model = gpt(cfg.model, cfg.seed)
        self.group = dist.new_group(list(range(dist.get_world_size())))
        self.sync = Communicator(self.group, network=network)
        self.ddp = DDP(
            self.model,
            Communicator(),
            lambda params: torch.optim.SGD(params, lr=LR),
            bucket_cap_bytes=bucket_cap_bytes,
            overlap=overlap,
            sync_group=self.sync,
        )

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        """One training step (the harness opens it with a barrier and takes the slowest
        rank's time); this rank's phases, traffic and bucket timeline."""
        ddp, sync = self.ddp, self.sync
        simulated = sync.simulated_s
        with ddp.comm.measure() as dp_traffic, sync.measure() as sync_traffic:
            start = time.perf_counter()
            loss = lm_loss(ddp(x).float(), y)
            forward_end = time.perf_counter()
            loss.backward()
            _, timeline = ddp.synchronize_and_step()
            end = time.perf_counter()
        total, hidden, exposed = hidden_seconds(timeline)
        last = timeline.buckets[-1]
        return {
            "forward_s": forward_end - start,
            "backward_s": timeline.backward_end - forward_end,
            "rest_s": end - timeline.backward_end,
            "allreduce_s": total,
            "hidden_s": hidden,
            "exposed_sync_s": exposed,
            "last_bucket_s": last.finished - last.started,
            "bytes_sent": dp_traffic.bytes_sent + sync_traffic.bytes_sent,
            "rounds": dp_traffic.rounds + sync_traffic.rounds,
            "simulated_s": sync.simulated_s - simulated,
            "losses": loss.item(),
            "overlapped": timeline.overlapped,
        }

    def close(self) -> None:
        self.ddp.close()
        release_group(self.group)


def run(cfg: OverlapConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell: the timed steps of its side, and of the twin's in alternation.

    Every rank builds the same GPT (one seed) and takes its shard of one seeded global batch
    (`bench.kit.workloads`: `batch_size` sequences per rank), and wraps the model in
    `impls.data_parallel.DDP` with the cell's bucket cap and overlap flag. The bucket
    all-reduces run over a process group of their own (`dist.new_group`), through a
    `Communicator` that carries the cell's simulated link, if any: with `overlap=True` on
    DDP's communication thread during backward, with `overlap=False` on the training thread
    once backward has returned. The data-parallel communicator (weight broadcast) is the
    WORLD group's, without the link.

    The kit times the steps (`bench.kit.timing.alternate`: `warmup` + `repeats` rounds, each
    step barrier-opened, its time the slowest rank's). Inside its step a side times its own
    phases — forward | backward | the rest (waiting for the buckets, then the optimizer
    step) — and from the step's `SyncTimeline` takes, on this rank:

    - `allreduce_s`: the bucket all-reduces' time, Σ (finished − started);
    - `hidden_s`: the part of it spent before backward ended, Σ |[started, finished] ∩
      (−∞, backward_end]| — what overlap took off the critical path;
    - `exposed_sync_s`: max(0, last bucket finished − backward end), the synchronization the
      step still waited for after backward;
    - `last_bucket_s`: the last bucket's all-reduce — it holds the gradients backward
      produces last, so no schedule can hide it behind backward.

    With `paired`, a twin replica (same seed, same batch, its own sync group) runs the other
    overlap setting, its steps alternating with the cell's own (the sides of `alternate`):
    the two settings then share the host's state step by step, and the ratio of their
    medians is a side-by-side measurement that drift between cells cannot bias.

    After the timed steps every rank fingerprints its parameters (SHA-256 of the fp32
    bytes); the fingerprints are all-gathered and each rank that differs from rank 0's, or
    holds a non-finite value, counts one in `wrong` (the replicas must be identical). The
    twin's fingerprint comes back too: overlap changes when buckets are summed, not what.
    The groups made here are destroyed at the end, so a pool running many cells leaks none.
    """
    plan: Plan = cell.carry
    batch = seeded_batch(GPTConfig(**cfg.model), cfg.batch_size * dist.get_world_size(), cfg.seed)
    x, y = (rank_shard(t) for t in batch)
    sides: list[_Side] = []
    try:
        for overlap in plan.sides:
            sides.append(_Side(cfg, plan, cell.key["bucket_cap_bytes"], overlap))
        steps = {i: functools.partial(side.step, x, y) for i, side in enumerate(sides)}
        timed = alternate(steps, warmup=cfg.warmup, repeats=cfg.repeats)
        digests = [_fingerprint(side.model) for side in sides]
        wrong = _replicas_differ(*digests[0])
        update_error = _update_error(cfg, sides[0], batch) if dist.get_rank() == 0 else None
    finally:
        for side in reversed(sides):
            side.close()
    records = [_record(timed[i]) for i in range(len(sides))]
    twin = records[1] if plan.paired else {}
    ddp = sides[0].ddp
    return {
        **records[0],
        "twin_step_times_s": twin.get("step_times_s", []),
        "twin_backward_s": twin.get("backward_s", []),
        "rank": dist.get_rank(),
        "params": sum(p.numel() for p in sides[0].model.parameters()),
        "buckets": len(ddp.buckets),
        "bucket_bytes": [b.nbytes for b in ddp.buckets],
        "param_digest": digests[0][0],
        "twin_param_digest": digests[1][0] if plan.paired else "",
        "update_error": update_error,
        # Rank 0 also counts its replica off the single-process run (one "rank" more).
        "wrong": wrong + int(update_error is not None and not update_error <= UPDATE_TOLERANCE),
    }


def _update_error(
    cfg: OverlapConfig, side: _Side, batch: tuple[torch.Tensor, torch.Tensor]
) -> float:
    """‖θ − θ_ref‖ / ‖θ_ref − θ_0‖ of the side's replica against the same GPT trained in
    one process on the whole batch for as many SGD steps (`bench.kit.reference`)."""
    model = gpt(cfg.model, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    reference = train_reference(model, *batch, optimizer, cfg.warmup + cfg.repeats)
    return compare(parameters(side.model), reference)["update_error"]


def _record(timed: Timed) -> dict[str, list]:
    """A side's timed steps as lists: the slowest rank's step times and each phase."""
    phases = {key: [o[key] for o in timed.outcomes] for key in timed.outcomes[0]}
    return {"step_times_s": list(timed.seconds), **phases}
