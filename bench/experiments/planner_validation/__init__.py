"""planner_validation: the simulator (`impls.simulator`), calibrated on this host in the run
itself, predicts the step time and peak memory per rank of configurations distbench measured
here (`parallelism_comparison`, `zero_memory`, `pipeline_utilization`), and the report
compares prediction with measurement.

- `config.py`: the typed config;
- `experiment.py`: the ground-truth rows read from the sources' results.csv, one cell each;
- `ranks.py`: the prediction of one row; `calibration.py`, `rounds.py`, `pool_probes.py`:
  what this run measures on the host (GEMM table, bandwidth, per-kernel overhead, the
  reference fits, the link and the TP call work), so no ground-truth cell prices itself;
- `report.py`, `plots.py`: errors of the development and the held-out half (`held_out`),
  rank correlation, the scatter plots.
"""
