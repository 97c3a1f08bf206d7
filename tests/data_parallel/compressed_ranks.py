"""What the compressed data-parallel tests run *inside* pool ranks (module-level, so ranks
can unpickle it).

Every rank of the pool calls these with the same arguments; the first N ranks form the
group (`prefix_communicator`) and the others return None. Everything a rank feeds in
(its gradients, its compressor's seed) comes from functions the test process calls too,
so the tests can recompute each rank's payload on their own.
"""

from __future__ import annotations

import torch

from impls.compression import QSGD, Cast, OneBit, TernGrad, TopK
from impls.compression.exchange import all_gather_average, all_reduce_average
from impls.data_parallel import shard_batch
from impls.data_parallel.compressed import CompressedDP
from tests.data_parallel.dp_ranks import Case
from tests.rank_support import prefix_communicator

TOPK_DENSITY = 0.25

# Compressors the exchange is checked with, built per rank (stochastic ones seeded by it):
# between them their payloads put uint8, int8, int32, fp16 and fp32 tensors on the wire,
# at odd byte offsets from each other.
EXCHANGE_COMPRESSORS = {
    "topk_blocks": lambda rank: TopK(0.3),  # uint8 counts and offsets, fp16 values
    "topk_coo": lambda rank: TopK(0.001),  # int32 indices on the 1000-element tensor
    "topk_fp32": lambda rank: TopK(0.3, value_dtype="fp32"),
    "qsgd": lambda rank: QSGD(5, seed=rank),  # int8 levels, then an fp32 norm
    "onebit": lambda rank: OneBit(),  # packed signs, then two fp32 means
    "terngrad": lambda rank: TernGrad(seed=rank),
}
EXCHANGE_SHAPES = [(5, 7), (13,), (1000,), (3, 3, 3), (1,)]


def exchange_grads(rank: int, step: int = 0) -> list[torch.Tensor]:
    """Rank `rank`'s Gaussian gradients, one per shape of EXCHANGE_SHAPES."""
    g = torch.Generator().manual_seed(7919 * rank + 31 * step)
    return [torch.randn(shape, generator=g) for shape in EXCHANGE_SHAPES]


def integer_grads(rank: int) -> list[torch.Tensor]:
    """Multiples of 4 in [−32, 32]: divided by N = 4 and summed over ranks, exact in fp16."""
    g = torch.Generator().manual_seed(104_729 + rank)
    return [4.0 * torch.randint(-8, 9, shape, generator=g).float() for shape in EXCHANGE_SHAPES]


def _train(case: Case, comm, compressor) -> dict:
    """`case.steps` steps of CompressedDP; per step the gradients this rank computed, the
    averaged ones it stepped with, and what `comm.measure()` counted."""
    dp = CompressedDP(case.build_model(), comm, case.make_optimizer, compressor)
    local, averaged = [], []
    own_grads, own_step = dp.local_grads, dp.updater.step

    def record_local():
        grads = own_grads()
        local.append([g.detach().clone() for g in grads])
        return grads

    def record_step(c):
        averaged.append([p.grad.detach().clone() for p in dp.params])
        return own_step(c)

    dp.local_grads, dp.updater.step = record_local, record_step
    losses, traffic = [], []
    for x, y in case.batches():
        x = shard_batch(x, comm.rank, comm.world_size)
        y = shard_batch(y, comm.rank, comm.world_size)
        with comm.measure() as counted:
            stats = dp.train_step(x, y, case.loss)
        losses.append(stats.loss)
        traffic.append(counted.as_dict())
    return {
        "names": list(dp.param_names),
        "losses": losses,
        "traffic": traffic,
        "local": local,
        "averaged": averaged,
        "params": {n: p.detach().clone() for n, p in dp.module.named_parameters()},
    }


def compressed_training(n: int) -> dict | None:
    """Case("allreduce", n)'s model and batches trained by CompressedDP without a
    compressor, with an fp16 cast and with Top-K; plus the refusal of a non-compressor."""
    comm = prefix_communicator(n)
    if comm is None:
        return None
    case = Case("allreduce", n)
    out = {
        "rank": comm.rank,
        "none": _train(case, comm, None),
        "fp16": _train(case, comm, Cast("fp16")),
        "topk": _train(case, comm, TopK(TOPK_DENSITY)),
    }
    try:
        CompressedDP(case.build_model(), comm, case.make_optimizer, "topk")
        out["refusal"] = "accepted"
    except TypeError as err:  # raised before broadcast_parameters: no rank waits on it
        out["refusal"] = f"TypeError: {err}"
    return out


def exchanges(n: int) -> dict | None:
    """`all_gather_average` with each EXCHANGE_COMPRESSORS entry (two steps, so error
    feedback memories are carried) and `all_reduce_average` in fp32 and fp16."""
    comm = prefix_communicator(n)
    if comm is None:
        return None
    gathered = {}
    for name, make in EXCHANGE_COMPRESSORS.items():
        compressor, steps = make(comm.rank), []
        for step in range(2):
            named = [(f"t{i}", g) for i, g in enumerate(exchange_grads(comm.rank, step))]
            with comm.measure() as counted:
                averaged = all_gather_average(compressor, named, comm)
            steps.append({"averaged": averaged, "traffic": counted.as_dict()})
        gathered[name] = steps
    reduced = {}
    for label, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        with comm.measure() as counted:
            averaged = all_reduce_average(integer_grads(comm.rank), comm, dtype)
        reduced[label] = {"averaged": averaged, "traffic": counted.as_dict()}
    return {"rank": comm.rank, "gathered": gathered, "reduced": reduced}
