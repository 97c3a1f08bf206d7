"""planner_validation: the simulator (`impls.simulator`), calibrated on this host in the run
itself, predicts the step time and peak memory per rank of configurations distbench measured
here (`parallelism_comparison`, `zero_memory`, `pipeline_utilization`), and the report
compares prediction with measurement.

- `config.py`: the typed config;
- `experiment.py`: the ground-truth rows read from the sources' results.csv, one cell each;
- `ranks.py`: the calibration (GEMM table, bandwidth, per-kernel overhead) and the prediction;
- `report.py`, `plots.py`: errors, rank correlation, the scatter plots.
"""
