"""`pipeline_utilization`: the lecture's pipeline figure (naive 4 stages 25%, GPipe 4 stages
× 4 micro-batches 57%) measured, then every schedule over micro-batch counts, beside
torch.distributed.pipelining's GPipe / 1F1B / interleaved 1F1B.

- `config.py`: the config schema; `experiment.py`: the grid (each cell's plan built once
  and carried), the row, and the traces a cell leaves (`artefacts`);
- `names.py`: the schedule names and torch's rules, shared by all three sides;
- `ranks.py`: what one rank does in a cell (timed steps, profiling steps, reference check);
- `timeline.py`: a distbench cell's records turned into utilization, spans and traces;
- `report.py`, `schedules_report.py`, `plots.py`: the report's sections and figures.
"""
