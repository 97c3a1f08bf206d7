"""The experiments `python -m bench experiment=NAME` can run, by name."""

from bench.experiments import allreduce_scaling, collectives, pipeline_utilization
from bench.experiments.common import Cell, Experiment

EXPERIMENTS: dict[str, Experiment] = {
    allreduce_scaling.EXPERIMENT.name: allreduce_scaling.EXPERIMENT,
    collectives.EXPERIMENT.name: collectives.EXPERIMENT,
    pipeline_utilization.EXPERIMENT.name: pipeline_utilization.EXPERIMENT,
}

__all__ = ["EXPERIMENTS", "Cell", "Experiment"]
