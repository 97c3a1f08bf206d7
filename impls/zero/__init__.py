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
  backward and freed right after each. Flat units, the fp32 master copy and the step's report: `ZeroDataParallel`.
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
