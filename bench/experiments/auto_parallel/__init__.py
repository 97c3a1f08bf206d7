"""Experiment `auto_parallel`: the planner's best parallel plans for a model on a GPU
cluster, predicted by the simulator (Alpa-style search; nothing here is measured).

For each GPU count of the grid, `impls.planner.search` enumerates DP × TP × PP × sequence
parallelism × ZeRO stage × micro-batch size × schedule × virtual stages × recomputation
(with equal and Alpa-sliced pipeline stages), prices every plan with `impls.simulator` on
the chosen hardware preset, and keeps the top plans and the best plans it rejected.

- `config.py`: the typed config (model preset and overrides, hardware, GPUs, fixed axes);
- `experiment.py`: the grid (GPU count × slot in the ranking), a row per plan;
- `ranks.py`: the search, run once per GPU count on the one-rank pool, cached;
- `report.py` / `plots.py`: the best plans and why, the step-time breakdown, MFU against
  GPU count, memory against plan, the search time.
"""
