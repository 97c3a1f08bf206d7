"""distbench's pipeline executor against torch.distributed.pipelining on 2 CPU gloo ranks.

`make bench` runs these. For GPipe and 1F1B at P = 2 (the issue's reference point), each
rank builds the same GPT twice, one copy driven by distbench's `PipelineExecutor`, one by
torch's `PipelineStage` + `ScheduleGPipe` / `Schedule1F1B`, and times their steps in
alternation on the same batch and micro-batches (machine drift hits both alike). The
recorded figure is the ratio of the median step times; the issue's target is ≤ 1.1×
(aiming for ≤ 1.0×).
"""

from __future__ import annotations

import pytest

from bench.launch import RankPool
from bench.pipeline_cells import PipelineCell, paired_step_times

TARGET = 1.1
# The experiment's default GPT (experiments/experiment/pipeline_utilization.yaml).
MODEL = {"d_model": 128, "n_layers": 16, "n_heads": 4, "seq_len": 64, "vocab_size": 64}


@pytest.fixture(scope="module")
def ranks2():
    with RankPool(2, timeout_s=600.0) as pool:
        yield pool


@pytest.mark.parametrize("microbatches", [4, 8])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_step_time_vs_torch(benchmark, ranks2, schedule, microbatches):
    cell = PipelineCell(
        schedule=schedule,
        stages=2,
        microbatches=microbatches,
        model=MODEL,
        batch_size=32,
        warmup=2,
        repeats=15,
    )
    benchmark.group = f"pipeline step P=2 M={microbatches}"
    result = benchmark.pedantic(ranks2.run, args=(paired_step_times, cell), rounds=1)[0]
    benchmark.extra_info.update(result)
    ratio = result["distbench_vs_torch"]
    print(f"\n{schedule} P=2 M={microbatches}: distbench/torch step time {ratio:.2f}x")
    assert ratio <= TARGET, result
