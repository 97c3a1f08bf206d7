"""Experiment `at_scale`: the simulator's predictions for GPU clusters beside what was
published: the lecture's scale figures and large training runs from papers.

- lecture figures: GPT-3 175B's GPU-hours and "355 years" (C = 6ND, 300B tokens), the
  TSM ResNet-50 data-parallel scaling on SUMMIT (6 → 768 → 1536 V100), a compute-optimal
  Chinchilla run (D ≈ 20N) and its time on a cluster;
- published runs (`impls.costmodel.published`): each run's model, GPUs, layout and batch
  as published, its step priced by `impls.simulator` on the hardware preset, against the
  throughput the paper measured. Calibration never uses these throughputs: the inputs are
  datasheets, GEMM and link microbenchmarks (cited in `impls/costmodel/presets.py`).

- `config.py`: which rows to predict; `experiment.py`: a cell per row;
- `ranks.py`: one prediction per cell (on the one-rank pool); `report.py`: the tables.
"""
