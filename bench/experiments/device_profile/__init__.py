"""Experiment `device_profile`: the device this runs on, measured for the simulator, and
written as a hardware preset file (`hardware.yaml`) that `hardware=<path>` takes.

- `config.py`: the GEMM shapes and dtypes, the copy size, the ring's ranks and sizes;
- `experiment.py`: a cell per measurement (one rank for the device, N for the ring);
- `ranks.py`: what each cell times (`bench.kit.profile`, `bench.kit.collectives`);
- `preset.py`: the rows as a `Hardware`, written through `impls.costmodel.hardware_file`;
- `report.py`: the preset, and the measurements behind each of its numbers.
"""
