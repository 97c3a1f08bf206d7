"""distbench's Megatron tensor parallelism against torch DTensor's `parallelize_module` on
2 CPU gloo ranks.

`make bench` runs this. Every rank builds the same GPT twice, splits one copy with
distbench's column/row layers and the other with DTensor's ColwiseParallel /
RowwiseParallel plan, and times forward + backward of their transformer blocks (attention
and MLP) in alternating steps on the same replicated activation; the recorded figure is
the ratio of median step times. The issue's target: ≤ 1.1× DTensor at t = 2 (aiming for
≤ 1.0×). Two ranks on two cores: one core per rank, so wall clock is a fair race.
"""

from __future__ import annotations

import pytest

from bench.experiments.tensor_parallel.config import TensorParallelConfig
from bench.experiments.tensor_parallel.experiment import EXPERIMENT
from bench.experiments.tensor_parallel.ranks import paired_block_times
from bench.launch import RankPool

TARGET = 1.1


@pytest.fixture(scope="module")
def ranks2():
    with RankPool(2, timeout_s=600.0) as pool:
        yield pool


def test_tp_blocks_step_vs_dtensor(benchmark, ranks2):
    # The experiment's default GPT and batch (its schema), timed at t = 2.
    cfg = TensorParallelConfig(tp_degrees=[2], methods=["distbench"], warmup=3, repeats=31)
    (cell,) = EXPERIMENT.cells(cfg)
    benchmark.group = "tensor-parallel blocks step, t=2"
    result = benchmark.pedantic(ranks2.run, args=(paired_block_times, cfg, cell), rounds=1)[0]
    benchmark.extra_info.update(result)
    print(f"\ndistbench / DTensor step time: {result['ratio']:.2f}x (target ≤ {TARGET}x)")
    assert result["ratio"] <= TARGET, result
