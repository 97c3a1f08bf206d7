"""Mixed-precision training: fp16 with loss scaling and fp32 master weights, and bf16.

The pieces every data-parallel and ZeRO variant combines: `compute_dtype`,
`check_precision` (refuses pairs that cannot train, before anything runs),
`make_loss_scaler` and `MasterWeights`. One step (single process)::

    loss = loss_fn(model(x.to(dtype)).float(), y)
    scaler.scale_loss(loss).backward()               # low-precision gradients, scaled
    grads = master.master_grads_from_model()         # fp32 flat copy
    found_inf = scaler.unscale_([grads])
    # distributed: found_inf = agreed over ranks (all-reduce "max" of the flag)
    if scaler.update(found_inf):                     # False: skip this step
        optimizer.step()                             # over master.master_params
        master.copy_to_model()
"""

from impls.precision.config import (
    FP16_MAX,
    PRECISIONS,
    check_precision,
    compute_dtype,
    make_loss_scaler,
)
from impls.precision.loss_scaler import DynamicLossScaler, StaticLossScaler
from impls.precision.master_weights import MasterWeights

__all__ = [
    "FP16_MAX",
    "PRECISIONS",
    "DynamicLossScaler",
    "MasterWeights",
    "StaticLossScaler",
    "check_precision",
    "compute_dtype",
    "make_loss_scaler",
]
