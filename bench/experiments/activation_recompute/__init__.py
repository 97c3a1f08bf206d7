"""Experiment `activation_recompute`: activation recomputation (none, selective, full;
Korthikanti et al. 2022, arXiv 2205.05198) on one transformer layer, per (mode, TP degree
t, sequence parallelism, s): the bytes the layer saves for backward beside the paper's
equations and the implementation model, the step time's overhead beside the FLOPs the
paper predicts, and the longest sequence within a byte budget, found by running.

- `config.py`: the typed config schema (light: every rank unpickles it);
- `experiment.py`: the grid and a cell's row beside the predictions;
- `ranks.py`: what one rank does in a cell (the layer built, counted, checked against
  itself without recomputation, timed, and the budget search);
- `report.py`: the report's tables and plot.
"""
