"""Experiment `collectives`: the nccl-tests table for every primitive.

Broadcast, reduce, scatter, gather, all-gather, reduce-scatter and all-to-all, each built
from scratch on the counted point-to-point layer, timed beside torch.distributed's own on
the same buffers: algbw, busbw (nccl-tests' bus factors, derived in the report) and
`wrong` against a known answer.

- `config.py`: the config schema; `experiment.py`: the grid, a cell's row;
- the rank side is `bench.kit.collectives.measure_collective` (shared with
  `allreduce_scaling`);
- `report.py`: the bus factors, the per-collective tables and the plot.
"""
