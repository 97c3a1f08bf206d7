"""Stage slicing for a `pipeline_utilization` cell: equal, or Alpa's cut from costs
measured on this host.

Alpa's inter-operator pass (Zheng et al. 2022, §5.1–5.2; `impls.planner.slicing`) cuts a
chain of layers into P contiguous stages minimising Eq. 2, Σ tᵢ + (B − 1) · max tᵢ, over
the stages' forward + backward times tᵢ of one micro-batch. Here the chain is the GPT as
the executor runs it: the embedding, `n_layers` identical blocks, and the final norm + LM
head + loss, each a layer of its own cost. The three costs are measured once per cell
shape, in the parent before any rank starts: forward + backward of each on one
micro-batch of the cell's shape, thread CPU time (the clock the replay prices actions
with), one intra-op thread (a rank's share when ranks outnumber cores), the median of
`COST_REPEATS` after a warm-up call. Eq. 2 with these costs is also each split's
predicted step time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench.experiments.pipeline_utilization.names import SLICINGS
from bench.kit.workloads import lm_loss, seeded_gpt_and_batch
from impls.models import stage_layer_ranges
from impls.planner import alpa_stage_slicing, pipeline_objective

__all__ = [
    "COST_REPEATS",
    "SLICINGS",
    "LayerCosts",
    "alpa_layers",
    "costs_columns",
    "equal_layers",
    "layers_text",
    "measure_layer_costs",
    "predicted_step_s",
]

COST_REPEATS = 7


@dataclass(frozen=True)
class LayerCosts:
    """Forward + backward seconds of one micro-batch through each kind of layer."""

    embedding_s: float
    block_s: float
    head_s: float
    """The final LayerNorm, the LM head and the loss."""

    def chain(self, n_layers: int) -> list[float]:
        """The GPT as a chain of layer costs: embedding, every block, head."""
        return [self.embedding_s, *[self.block_s] * n_layers, self.head_s]


def _cpu_seconds(call: Callable[[], None], repeats: int, prepare: Callable[[], None]) -> float:
    """The median thread CPU time of `call`, `prepare` run untimed before each (and before
    the warm-up call: allocator and autograd caches)."""
    prepare()
    call()
    samples = []
    for _ in range(repeats):
        prepare()
        start = time.thread_time()
        call()
        samples.append(time.thread_time() - start)
    return statistics.median(samples)


def measure_layer_costs(
    model: dict[str, int], microbatch_size: int, seed: int, repeats: int = COST_REPEATS
) -> LayerCosts:
    """The three layer costs of the GPT `model` (`GPTConfig` keywords) on one micro-batch of
    `microbatch_size` sequences, measured in this process."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gpt, inputs, targets = seeded_gpt_and_batch(model, microbatch_size, seed)
        with torch.no_grad():
            hidden = gpt.embedding(inputs)  # (b, s) -> (b, s, h): what a block receives

        def embedding() -> None:
            out = gpt.embedding(inputs)
            out.backward(torch.ones_like(out))

        def block() -> None:
            x = hidden.detach().requires_grad_()  # a stage also returns its input's gradient
            out = gpt.blocks[0](x)
            out.backward(torch.ones_like(out))

        def head() -> None:
            x = hidden.detach().requires_grad_()
            lm_loss(gpt.lm_head(gpt.ln_f(x)), targets).backward()

        # Clearing the whole GPT's gradients is no layer's work: timed inside each call, it
        # added ~0.23 ms to every layer here (a block read 1.53 ms for 1.26, the embedding
        # 0.33 ms for 0.06) and made the end layers weigh 0.2 of a block in Alpa's DP.
        def clear() -> None:
            gpt.zero_grad(set_to_none=True)

        costs = [_cpu_seconds(f, repeats, clear) for f in (embedding, block, head)]
    finally:
        torch.set_num_threads(before)
    return LayerCosts(*costs)


def equal_layers(n_layers: int, stages: int) -> tuple[int, ...]:
    """Blocks per stage of the equal split (`impls.models.stage_layer_ranges`)."""
    return tuple(len(r) for r in stage_layer_ranges(n_layers, stages, unit="blocks"))


def alpa_layers(
    costs: LayerCosts, n_layers: int, stages: int, microbatches: int
) -> tuple[int, ...]:
    """Blocks per stage of Alpa's cut (Algorithm 1's DP over the chain, B = M): the first
    stage holds the embedding and the last the head whatever the counts, so an end stage
    may hold no block."""
    cut = alpa_stage_slicing(costs.chain(n_layers), [0.0] * (n_layers + 2), stages, microbatches)
    assert cut is not None  # no memory limit: every cut fits
    blocks = list(cut)
    blocks[0] -= 1  # the embedding
    blocks[-1] -= 1  # the head
    return tuple(blocks)


def predicted_step_s(costs: LayerCosts, blocks: tuple[int, ...], microbatches: int) -> float:
    """Eq. 2 of Alpa for the split `blocks` (transformer blocks per stage)."""
    counts = [*blocks]
    counts[0] += 1
    counts[-1] += 1
    return pipeline_objective(costs.chain(sum(blocks)), counts, microbatches)


def layers_text(blocks: tuple[int, ...] | list[int]) -> str:
    """Blocks per stage as the row records them: "4/4/4/4"."""
    return "/".join(str(b) for b in blocks)


def costs_columns(costs: LayerCosts | None, blocks: tuple[int, ...], m: int) -> dict[str, Any]:
    """The row's slicing columns: the split, the layer costs and Eq. 2's prediction."""
    nan = float("nan")
    return {
        "stage_layers": layers_text(blocks),
        "embedding_s": costs.embedding_s if costs else nan,
        "block_s": costs.block_s if costs else nan,
        "head_s": costs.head_s if costs else nan,
        "predicted_step_s": predicted_step_s(costs, blocks, m) if costs else nan,
    }
