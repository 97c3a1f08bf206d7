"""The experiments `python -m bench experiment=NAME` can run, found by their folders.

Each folder `bench/experiments/<name>/` with an `experiment.py` defining `EXPERIMENT` is
an experiment (see README.md beside this file): adding one is adding a folder, its YAML
and its tests, with no registry to edit. Discovery imports the experiment modules only
when asked (`experiments()`): rank processes import a folder's rank-side module alone.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path

from bench.experiments.base import Cell, Experiment

__all__ = ["Cell", "Experiment", "experiments"]

_HERE = Path(__file__).resolve().parent


@cache
def experiments() -> dict[str, Experiment]:
    """Every experiment by name, in name order; each schema registered with Hydra."""
    from bench.config import register

    found: dict[str, Experiment] = {}
    for info in sorted(pkgutil.iter_modules([str(_HERE)]), key=lambda i: i.name):
        if not info.ispkg or not (_HERE / info.name / "experiment.py").exists():
            continue
        module = importlib.import_module(f"{__name__}.{info.name}.experiment")
        experiment = module.EXPERIMENT
        if experiment.name != info.name:
            raise RuntimeError(f"{module.__name__} defines experiment {experiment.name!r}")
        found[experiment.name] = experiment
        register(experiment.name, experiment.schema)
    return found
