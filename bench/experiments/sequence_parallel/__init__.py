"""Experiment `sequence_parallel`: Megatron-SP, DeepSpeed-Ulysses and Ring Attention on one
transformer block, per (method, P, s).

- `config.py`: the typed config schema (light: every rank unpickles it);
- `experiment.py`: the grid, a cell's row beside the papers' formulas;
- `theory.py`: what each cell is predicted to move and save (the papers' formulas and the
  implementation's own activation model), built once per cell, and the longest sequence
  within a memory budget;
- `ranks.py`: what one rank does in a cell (one block's forward and backward, counted,
  accounted, checked against the single-device block, timed);
- `report.py` / `plots.py`: the report's sections and its plots.
"""
