"""The models and batches experiments train, built the same way on every rank.

Every rank builds the GPT from one seed and draws the batch from one generator, so ranks
start identical without a broadcast and a single-process reference can rebuild both.
The loss is the model's own (`GPT.loss`: mean next-token cross-entropy); the training
tasks on real data are in `bench.kit.tasks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from impls.data_parallel import shard_batch
from impls.models import GPT, GPTConfig

__all__ = [
    "REFERENCE_GPT",
    "gpt",
    "lm_loss",
    "rank_shard",
    "reference_step",
    "seeded_batch",
    "seeded_gpt_and_batch",
]

lm_loss = GPT.loss

REFERENCE_GPT = {
    "d_model": 128,
    "n_layers": 4,
    "n_heads": 4,
    "seq_len": 64,
    "vocab_size": 256,
    "bias": False,
}
"""A small GPT timed on one process to measure this host itself (no experiment trains
it): `planner_validation`'s calibration and the host probe (`bench.kit.host.host_probe`)."""


def gpt(model: Mapping[str, Any], seed: int) -> GPT:
    """The GPT a grid's `model` key describes (`GPTConfig` keywords), weights from `seed`."""
    return GPT(GPTConfig(**model), seed=seed)


def seeded_batch(cfg: GPTConfig, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) token ids of shape (batch_size, seq_len), the same on every rank."""
    generator = torch.Generator().manual_seed(seed + 1)
    shape = (batch_size, cfg.seq_len)
    inputs = torch.randint(0, cfg.vocab_size, shape, generator=generator)
    targets = torch.randint(0, cfg.vocab_size, shape, generator=generator)
    return inputs, targets


def seeded_gpt_and_batch(
    model: Mapping[str, Any], batch_size: int, seed: int
) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    """The seeded GPT and its seeded whole batch."""
    net = gpt(model, seed)
    return net, *seeded_batch(net.cfg, batch_size, seed)


def reference_step(micro: int, dtype: str = "fp32") -> Callable[[], None]:
    """One training step of `REFERENCE_GPT` on this process, built once: forward, loss (in
    fp32), backward and zero_grad, the gradients kept allocated as the training runs zero
    them (`set_to_none=False`). What measures the host itself times: the calibration's
    reference and the host probe."""
    net, inputs, targets = seeded_gpt_and_batch(REFERENCE_GPT, micro, seed=0)
    if dtype == "bf16":
        net = net.to(torch.bfloat16)

    def step() -> None:
        net.loss(net(inputs).float(), targets).backward()
        net.zero_grad(set_to_none=False)

    return step


def rank_shard(batch: torch.Tensor, group: Any = None) -> torch.Tensor:
    """This rank's contiguous 1/N of `batch` (N the group's size)."""
    return shard_batch(batch, dist.get_rank(group), dist.get_world_size(group))
