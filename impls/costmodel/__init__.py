"""The theory side: what the formulas predict, for measured runs to be held against.

`memory` gives per-device model-state bytes under ZeRO stages 0–3, the largest trainable
model, per-step communication volume and saved activations (Rajbhandari et al. 2019).
`compute` counts a transformer step's FLOPs (model and hardware, under activation
recomputation) and gives MFU / HFU (Narayanan et al. 2021; Korthikanti et al. 2022).
"""

from impls.costmodel.compute import (
    RECOMPUTE,
    StepFlops,
    TransformerSpec,
    hfu,
    layer_forward_flops,
    mfu,
    step_flops,
)
from impls.costmodel.memory import (
    MIXED_PRECISION_ADAM,
    PRESETS,
    STAGES,
    BytesPerParam,
    ModelStateBytes,
    activation_bytes,
    bytes_per_param_for,
    comm_bytes_per_step,
    comm_psi_multiple,
    floor_billions,
    max_trainable_params,
    model_state_bytes,
)

__all__ = [
    "MIXED_PRECISION_ADAM",
    "PRESETS",
    "RECOMPUTE",
    "STAGES",
    "StepFlops",
    "TransformerSpec",
    "BytesPerParam",
    "ModelStateBytes",
    "activation_bytes",
    "bytes_per_param_for",
    "comm_bytes_per_step",
    "comm_psi_multiple",
    "floor_billions",
    "hfu",
    "layer_forward_flops",
    "max_trainable_params",
    "mfu",
    "model_state_bytes",
    "step_flops",
]
