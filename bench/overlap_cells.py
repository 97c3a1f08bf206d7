"""What one rank does in an `overlap` cell: DDP training steps of the GPT with its bucket
all-reduces overlapped with backward or run after it, timed step by step.

Every rank builds the same GPT (one seed), takes a seeded batch of `batch_size` sequences
of its own (the global batch is `batch_size` × world size) and wraps the model in
`impls.data_parallel.DDP` with the cell's bucket cap and overlap flag. The bucket
all-reduces run over a process group of their own (`dist.new_group`), through a
`Communicator` that carries the cell's simulated link, if any: with `overlap=True` on
DDP's communication thread during backward, with `overlap=False` on the training thread
once backward has returned. The data-parallel communicator (weight broadcast) is the
WORLD group's, without the link.

Each of `warmup` + `repeats` steps opens with a barrier and is timed on every rank as
forward | backward | the rest (waiting for the buckets, then the optimizer step); the
step's time is the slowest rank's. From the step's `SyncTimeline` come, per rank:

- `allreduce_s`: the bucket all-reduces' time, Σ (finished − started);
- `hidden_s`: the part of it spent before backward ended, Σ |[started, finished] ∩
  (−∞, backward_end]| — what overlap took off the critical path;
- `exposed_sync_s`: max(0, last bucket finished − backward end), the synchronization the
  step still waited for after backward;
- `last_bucket_s`: the last bucket's all-reduce — it holds the gradients backward
  produces last, so no schedule can hide it behind backward.

With `paired`, a twin replica (same seed, same batch, its own sync group) runs the other
overlap setting, its steps alternating with the cell's own: the two settings then share
the host's state step by step, and the ratio of their medians is a side-by-side
measurement that drift between cells (other work on the host) cannot bias.

After the timed steps every rank fingerprints its parameters (SHA-256 of the fp32
bytes); the fingerprints are all-gathered and each rank that differs from rank 0's, or
holds a non-finite value, counts one in `wrong` (the replicas must be identical). The
twin's fingerprint comes back too: overlap changes when buckets are summed, not what.
The groups made here are destroyed at the end, so a pool running many cells leaks none.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from bench.kit.timing import slowest
from bench.kit.workloads import lm_loss
from impls.comm import Communicator, SimulatedNetwork
from impls.data_parallel import DDP, SyncTimeline
from impls.data_parallel.common import release_group
from impls.models import GPT, GPTConfig

__all__ = ["OverlapCell", "hidden_seconds", "run_overlap_cell"]

LR = 0.01


@dataclass(kw_only=True)
class OverlapCell:
    """One measured configuration, as shipped to every rank."""

    bucket_cap_bytes: int
    overlap: bool
    network: dict[str, float] | None = None
    """`SimulatedNetwork.from_units` keywords (latency_ms, bandwidth_mbps); None: loopback."""
    model: dict[str, Any] = field(default_factory=dict)
    """`GPTConfig` keyword arguments."""
    batch_size: int = 8
    """Sequences per rank per step."""
    warmup: int = 3
    repeats: int = 15
    paired: bool = True
    """Also time the other overlap setting on a twin replica, in alternating steps."""
    seed: int = 0


def hidden_seconds(timeline: SyncTimeline) -> tuple[float, float, float]:
    """(all-reduce seconds, the part of them before backward ended, exposed seconds)."""
    end = timeline.backward_end
    total = sum(b.finished - b.started for b in timeline.buckets)
    hidden = sum(max(0.0, min(b.finished, end) - b.started) for b in timeline.buckets)
    exposed = max(0.0, max(b.finished for b in timeline.buckets) - end)
    return total, hidden, exposed


def _batch(cfg: GPTConfig, cell: OverlapCell, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's own seeded (inputs, targets): a shard of a global batch."""
    generator = torch.Generator().manual_seed(cell.seed * 1009 + rank + 1)
    shape = (cell.batch_size, cfg.seq_len)
    inputs = torch.randint(0, cfg.vocab_size, shape, generator=generator)
    return inputs, torch.randint(0, cfg.vocab_size, shape, generator=generator)


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


RECORDED = ("step_times_s", "forward_s", "backward_s", "rest_s", "allreduce_s", "hidden_s",
            "exposed_sync_s", "last_bucket_s", "bytes_sent", "rounds", "simulated_s", "losses",
            "overlapped")  # fmt: skip


class _Side:
    """One DDP replica of the cell's GPT with its own sync group and step record."""

    def __init__(self, cell: OverlapCell, cfg: GPTConfig, overlap: bool) -> None:
        network = SimulatedNetwork.from_units(**cell.network) if cell.network is not None else None
        self.model = GPT(cfg, seed=cell.seed)
        self.group = dist.new_group(list(range(dist.get_world_size())))
        self.sync = Communicator(self.group, network=network)
        self.ddp = DDP(
            self.model,
            Communicator(),
            lambda params: torch.optim.SGD(params, lr=LR),
            bucket_cap_bytes=cell.bucket_cap_bytes,
            overlap=overlap,
            sync_group=self.sync,
        )
        self.record: dict[str, list] = {k: [] for k in RECORDED}

    def step(self, x: torch.Tensor, y: torch.Tensor, keep: bool) -> None:
        """One timed training step (barrier first); recorded when `keep`."""
        ddp, sync = self.ddp, self.sync
        simulated = sync.simulated_s
        with ddp.comm.measure() as dp_traffic, sync.measure() as sync_traffic:
            dist.barrier()
            start = time.perf_counter()
            loss = lm_loss(ddp(x).float(), y)
            forward_end = time.perf_counter()
            loss.backward()
            _, timeline = ddp.synchronize_and_step()
            end = time.perf_counter()
        step_s = slowest(end - start)
        if not keep:
            return
        total, hidden, exposed = hidden_seconds(timeline)
        last = timeline.buckets[-1]
        for key, value in {
            "step_times_s": step_s,
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
        }.items():
            self.record[key].append(value)

    def close(self) -> None:
        self.ddp.close()
        release_group(self.group)


def run_overlap_cell(cell: OverlapCell) -> dict[str, Any]:
    """One rank of a cell: the timed steps, and with `paired` the twin's in alternation."""
    cfg = GPTConfig(**cell.model)
    x, y = _batch(cfg, cell, dist.get_rank())
    sides = [_Side(cell, cfg, cell.overlap)]
    try:
        if cell.paired:
            sides.append(_Side(cell, cfg, not cell.overlap))
        for step in range(cell.warmup + cell.repeats):
            for side in sides:
                side.step(x, y, keep=step >= cell.warmup)
        digests = [_fingerprint(side.model) for side in sides]
        wrong = _replicas_differ(*digests[0])
    finally:
        for side in reversed(sides):
            side.close()
    own, ddp = sides[0], sides[0].ddp
    twin = sides[1].record if cell.paired else {}
    return {
        **own.record,
        "twin_step_times_s": twin.get("step_times_s", []),
        "twin_backward_s": twin.get("backward_s", []),
        "rank": dist.get_rank(),
        "params": sum(p.numel() for p in own.model.parameters()),
        "buckets": len(ddp.buckets),
        "bucket_bytes": [b.nbytes for b in ddp.buckets],
        "param_digest": digests[0][0],
        "twin_param_digest": digests[1][0] if cell.paired else "",
        "wrong": wrong,
    }
