"""Experiment `allreduce_scaling`: the lecture's all-reduce comparison table, measured.

Every all-reduce algorithm (parameter server, sequential, ring, parallel, recursive
halving, tree) × world size × message size, with `torch.distributed.all_reduce` timed on
the same buffers beside each (paired windows): rounds and bytes from the exact counters,
their growth with N fitted and set beside the lecture's O(·), busbw, an α–β fit and its
extrapolation to 1024 ranks (labelled as a model).

- `config.py`: the config schema; `experiment.py`: the grid, a cell's row;
- the rank side is `bench.kit.collectives.measure_collective` (shared with `collectives`);
- `report.py`: the report's sections, plots and targets; `fits.py`: the growth and α–β fits.
"""
