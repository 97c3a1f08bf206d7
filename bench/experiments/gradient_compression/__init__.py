"""Experiment `gradient_compression`: data-parallel training on real data with every
gradient-compression method of the lecture (Top-K ± error feedback, Random-K, DGC, 1-bit
SGD, TernGrad, QSGD, PowerSGD, fp16/bf16), bytes on the wire counted, beside torch's own
DDP comm hooks; issue #6's target (Top-K 1% + error feedback within 1 point of DP with
≥ 50× fewer bytes) judged on every seed.

- `config.py`: the typed config (light: every rank unpickles it) and the methods;
- `experiment.py`: the grid (a cell carries its numeric setting) and a cell's row;
- `ranks.py`: what one rank does (training on `bench.kit.tasks`, each step timed by the
  kit, and the quantizers' bias and variance check);
- `report.py`: the targets, the baseline columns and the main sections; `sections.py`:
  the quantizer and torch-hook sections; `plots.py`: the curves and the Pareto plot.
"""
