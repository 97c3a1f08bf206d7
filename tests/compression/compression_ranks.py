"""What the PowerSGD and DGC tests run *inside* pool ranks (module-level, so ranks can
unpickle it).

Every rank of the pool calls these with the same arguments; the first N ranks form the
group (`prefix_communicator`) and the others return None. Gradients come from `gradient`,
which the test process calls too, to compute its single-process references.
"""

from __future__ import annotations

import torch

from impls.compression import DGC, PowerSGD
from tests.rank_support import prefix_communicator


def gradient(rank: int, step: int, index: int, shape: tuple[int, ...], integer: bool = False):
    """Rank `rank`'s gradient of tensor `index` at `step`: Gaussian, or small integers
    (exact in fp16 and in every sum and mean over ≤ 8 ranks)."""
    g = torch.Generator().manual_seed(100_003 * rank + 1009 * step + index)
    if integer:
        return torch.randint(-8, 9, shape, generator=g).float()
    return torch.randn(shape, generator=g)


def _named(rank: int, step: int, shapes, integer: bool = False):
    return [(f"t{i}", gradient(rank, step, i, s, integer)) for i, s in enumerate(shapes)]


def powersgd_steps(n: int, shapes, steps: int, kwargs: dict) -> dict | None:
    """`steps` PowerSGD aggregates on N ranks: every step's averages, the bytes this rank
    sent and the all-reduces it started, and the final memories and Qs."""
    comm = prefix_communicator(n)
    if comm is None:
        return None
    compressor = PowerSGD(**kwargs)
    outputs, sent, calls = [], [], []
    for step in range(steps):
        before = comm.calls["all_reduce"]
        with comm.measure() as traffic:
            outputs.append(compressor.aggregate(_named(comm.rank, step, shapes), comm))
        sent.append(traffic.bytes_sent)
        calls.append(comm.calls["all_reduce"] - before)
    return {
        "rank": comm.rank,
        "outputs": outputs,
        "bytes_sent": sent,
        "all_reduces": calls,
        "memory": dict(compressor.memory),
        "q": dict(compressor.q),
    }


def dgc_steps(n: int, shapes, steps: int, kwargs: dict, integer: bool) -> dict | None:
    """`steps` DGC aggregates on N ranks, and beside them a twin DGC on this rank alone
    fed the same (clipped) gradients: what this rank itself sent each step."""
    comm = prefix_communicator(n)
    if comm is None:
        return None
    compressor, twin = DGC(**kwargs), DGC(**kwargs)
    outputs, own = [], []
    for step in range(steps):
        named = _named(comm.rank, step, shapes, integer)
        outputs.append(compressor.aggregate(named, comm))
        clipped = twin.clip_gradients([g for _, g in named], n)
        own.append(
            [
                twin.decompress(twin.compress(g, key))
                for (key, _), g in zip(named, clipped, strict=True)
            ]
        )
        twin.step += 1
    return {"outputs": outputs, "own": own}
