"""ZeRO-1/2/3 (Rajbhandari et al., 2020, arXiv 1910.02054) with FSDP-style units, on
`impls.collectives` (ring reduce-scatter / all-gather) so every byte is counted.

    ZeroDataParallel(module, comm, *, stage=0..3, optimizer="adam"|"adamw", lr, betas, eps,
                     weight_decay, precision="fp32"|"fp16"|"bf16", loss_scale=None|"dynamic"|x,
                     ledger=MemoryLedger|None, units=None)
    out = zdp(inputs); zdp.backward(loss); report = zdp.step(); zdp.zero_grad()

- stage 0: plain data parallelism (all-reduce the gradients, everyone steps everything);
- stage 1: optimizer state sharded: reduce-scatter gradients, step the shard, all-gather;
- stage 2: + gradients sharded: each unit's gradients reduce-scattered during backward;
- stage 3 / FSDP: + parameters sharded: a unit is all-gathered before its forward and its
  backward and freed right after each.

Parameters are flattened per unit (`flat.py`) into buffers padded to a multiple of the world
size; rank r owns block r of every unit. `FlatAdam` (`adam.py`) is Adam/AdamW on those fp32
blocks. Under fp16/bf16 the model's weights and gradients are 2 bytes and the optimizer
keeps an fp32 master copy (K = 12 bytes per parameter with m and v); fp16 scales the loss,
agrees on overflow across ranks and skips the step everywhere. `step()` returns a
`StepReport`: whether it stepped, this rank's traffic over the step, and the
`MemoryLedger` snapshot (per-category bytes and peaks).
"""

from impls.zero.adam import OPTIMIZERS, FlatAdam
from impls.zero.flat import FlatUnit, ParamSlot, default_unit_modules, plan_units
from impls.zero.zero import STAGES, StepReport, ZeroDataParallel

__all__ = [
    "OPTIMIZERS",
    "STAGES",
    "FlatAdam",
    "FlatUnit",
    "ParamSlot",
    "StepReport",
    "ZeroDataParallel",
    "default_unit_modules",
    "plan_units",
]
