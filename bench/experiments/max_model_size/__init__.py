"""Experiment `max_model_size`: the largest trainable model per ZeRO stage, from the cost
model.

The lecture's table (80 GB, N = 64: 5B / 19B / 36B / 320B) and the ZeRO paper's per-device
memory of a given model (its Figure 1: Ψ = 7.5B), over GPU memories × data-parallel
degrees N × stages 0–3, all computed by `impls.costmodel.memory` — the model whose
prediction `zero_memory` holds against measured runs; the report reads that experiment's
`results.csv` to say how well it matched.

- `config.py`: the config schema; `experiment.py`: the grid, a cell's row;
- `ranks.py`: the cost model evaluated at one grid point (on a one-rank pool);
- `report.py`: the lecture's table, the plots, the comparison with measured runs.
"""
