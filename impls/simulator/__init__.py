"""Predict one training step of any DP × TP × PP × SP × ZeRO × schedule × recompute plan on a
cluster described by `impls.costmodel.hardware.Hardware`, in pure Python (no processes).

`simulate` prices each layer from the hardware (`costs`), replays the pipeline schedule
(`impls.pipeline.replay`), adds the data-parallel / ZeRO communication it cannot hide
(`zero_comm`) and the optimizer, and reports the step's breakdown and peak memory
(`memory`). `simulate_data_parallel` does the same for a data-parallel-only model given by
its parameter count and FLOPs per sample.
"""

from impls.simulator.data_parallel import simulate_data_parallel
from impls.simulator.plan import (
    PLANNER_SCHEDULES,
    SEQUENCE_PARALLEL,
    ParallelPlan,
    Prediction,
    megatron_stage_layers,
    stage_slices,
    validate_plan,
)
from impls.simulator.step import LayerCost, layer_costs, simulate

__all__ = [
    "PLANNER_SCHEDULES",
    "SEQUENCE_PARALLEL",
    "LayerCost",
    "ParallelPlan",
    "Prediction",
    "layer_costs",
    "megatron_stage_layers",
    "simulate",
    "simulate_data_parallel",
    "stage_slices",
    "validate_plan",
]
