"""Experiment `parallelism_comparison`: the lecture's table of DP, TP and PP (utilization,
memory per rank, communication per step) filled with numbers measured on one GPT, with the
2D and 3D compositions beside them, every layout trained by `impls.hybrid.HybridTrainer`
and checked against single-device AdamW.

- `config.py`: the config schema; `experiment.py`: the grid (one cell per mesh layout,
  carrying its `Layout`: GPT config, micro-batch, pipeline plan) and a cell's row;
- `ranks.py`: what one rank does in a cell (train, count, compare, time, profile, probe);
- `columns.py`: memory and traffic columns beside the papers' counts;
- `replay.py`: utilization, wall clock and replayed as if every rank had its own device;
- `report.py`: the report's sections and targets; `tables.py`: the lecture's table, its
  orderings (findings) and the index's figures; `plots.py`: the three plots.
"""
