"""The measurement kit every experiment uses, written once.

- `timing`: barrier-opened steps, the slowest rank's time, sides alternating with a twin;
- `reference`: the single-process reference run and the update-error check;
- `workloads` / `tasks`: the seeded GPT and batch (the model's own LM loss), and the
  training tasks on real data;
- `memory`: model-state bytes a rank holds, and a ledger over one forward and backward;
- `host`: the host-wide compute lock and the pairwise transfer probes (replays "as if
  every rank had its own device");
- `collectives` / `collective_specs`: timed collectives, nccl-tests style;
- `profile`: a device's microbenchmarks (GEMM by shape, copy, launch), each checked, and
  the ring all-reduce's α–β fit: what a hardware preset is measured from;
- `fit`: the one α–β fit (numpy and scipy only, so report writers use it too).

Rank-side modules import torch and `impls` only (no pandas, no plotting): they run in
every rank process.
"""
