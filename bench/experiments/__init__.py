"""The experiments `python -m bench experiment=NAME` can run, by name.

`make reports` runs them in this order: `zero_memory` before `max_model_size`, whose
report states how well the cost model matched zero_memory's measured runs.
"""

from bench.experiments import (
    allreduce_scaling,
    collectives,
    delayed_averaging,
    gradient_compression,
    max_model_size,
    overlap,
    parallelism_comparison,
    pipeline_utilization,
    sequence_parallel,
    tensor_parallel,
    zero_memory,
)
from bench.experiments.common import Cell, Experiment

EXPERIMENTS: dict[str, Experiment] = {
    allreduce_scaling.EXPERIMENT.name: allreduce_scaling.EXPERIMENT,
    collectives.EXPERIMENT.name: collectives.EXPERIMENT,
    pipeline_utilization.EXPERIMENT.name: pipeline_utilization.EXPERIMENT,
    zero_memory.EXPERIMENT.name: zero_memory.EXPERIMENT,
    max_model_size.EXPERIMENT.name: max_model_size.EXPERIMENT,
    tensor_parallel.EXPERIMENT.name: tensor_parallel.EXPERIMENT,
    sequence_parallel.EXPERIMENT.name: sequence_parallel.EXPERIMENT,
    parallelism_comparison.EXPERIMENT.name: parallelism_comparison.EXPERIMENT,
    gradient_compression.EXPERIMENT.name: gradient_compression.EXPERIMENT,
    overlap.EXPERIMENT.name: overlap.EXPERIMENT,
    delayed_averaging.EXPERIMENT.name: delayed_averaging.EXPERIMENT,
}

__all__ = ["EXPERIMENTS", "Cell", "Experiment"]
