"""The measurement kit every experiment uses, written once: `timing` (barrier-opened
steps, the slowest rank's time, sides alternating with a twin), `reference` (the
single-process run and the update-error check), `workloads` / `tasks` (the seeded GPT,
batches and real-data tasks), `memory` (model-state bytes, a ledger over one pass), `host`
(the compute lock and transfer probes behind "as if every rank had its own device"),
`collectives` / `collective_specs` (timed collectives, nccl-tests style), `profile` (a
device's microbenchmarks, what a hardware preset is measured from), `prediction` (a
simulator prediction as result columns) and `fit` (the one α–β fit, numpy and scipy only,
so report writers use it too).

Rank-side modules import torch and `impls` only (no pandas, no plotting): they run in
every rank process.
"""
