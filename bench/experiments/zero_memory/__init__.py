"""Experiment `zero_memory`: plain DP and ZeRO-1/2/3 trained for real, every byte a rank
holds counted, beside the ZeRO paper's formulas (per-rank model states, 2Ψ / 3Ψ of traffic
per step) and torch's DDP, ZeroRedundancyOptimizer and FSDP2 on the same model and ranks,
timed side by side; distbench's DDP with and without overlap.

- `config.py`: the config schema; `experiment.py`: the grid, a cell's row (with the cost
  model's prediction beside every measurement);
- `methods.py`: the methods, their stage and torch twin, and `Plan` (a cell's `carry`);
- `ranks.py`: what one rank does in a cell (train, check against one process, count, time);
- `report.py`: the report's memory, traffic and correctness sections and the targets;
  `speed.py`: the step-time ratios and their section; `plots.py`: the two figures.
"""
