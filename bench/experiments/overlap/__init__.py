"""Experiment `overlap`: distbench DDP's step with its bucket all-reduces overlapped with
backward and without, across bucket caps, on loopback and on a simulated link: step time
side by side (paired twins), the share of all-reduce time hidden, the ideal derived from
the serial step (Li et al. 2020); issue #4's target judged on every multi-bucket cap on
the simulated link.

- `config.py`: the typed config (light: every rank unpickles it) and the network labels;
- `experiment.py`: the grid (each cell carries its `ranks.Plan`) and a cell's row;
- `ranks.py`: what one rank does (its sides' steps alternated and timed by the kit);
- `report.py`: the target and the main sections; `pairs.py`: serial and overlapped cells
  paired, the derived ideal; `sections.py`: the cell table, replica agreement and the
  notes under the pairs table; `plots.py`: the two plots.
"""
