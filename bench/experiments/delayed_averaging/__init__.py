"""Experiment `delayed_averaging`: time to a target accuracy against simulated link
latency, for synchronous data parallelism and Delayed Gradient Averaging at delays D
(Zhu et al., NeurIPS 2021); the target (DGA sooner than sync DP under latency) judged on
every DGA cell.

- `config.py`: the typed config (light: every rank unpickles it);
- `experiment.py`: the grid (each cell carries its `ranks.Link`) and a cell's row;
- `ranks.py`: what one rank does (training on `bench.kit.tasks`, each step timed by the
  kit);
- `report.py`: the speed-up over sync DP, the target, plots and findings.
"""
