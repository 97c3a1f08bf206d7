"""Experiment `tensor_parallel`: Megatron tensor parallelism of the GPT beside torch's
DTensor `parallelize_module`, at each TP degree t.

- `config.py`: the typed config schema (light: every rank unpickles it);
- `experiment.py`: the grid (method × t), a cell's row beside Megatron's analytic count;
- `ranks.py`: what one rank does in a cell (train and check against one process, count
  one block's traffic, account its memory, time the blocks beside the twin method);
- `report.py` / `plots.py`: the report's sections and its plots.
"""
