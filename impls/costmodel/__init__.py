"""The theory side: what the formulas predict, for measured runs to be held against.

`memory` gives per-device model-state bytes under ZeRO stages 0–3, the largest trainable
model and per-step communication volume (Rajbhandari et al. 2019). `activations` gives the
bytes saved for the backward (per transformer layer under TP/SP/recomputation, Korthikanti
et al. 2022). `comm` prices collectives on α–β links (Thakur et al. 2005).
`compute` counts a transformer step's FLOPs (model and hardware, under activation
recomputation) and gives MFU / HFU (Narayanan et al. 2021; Korthikanti et al. 2022).
"""

from impls.costmodel.activations import (
    ACTIVATION_SP,
    activation_bytes,
    activation_bytes_per_layer,
)
from impls.costmodel.comm import (
    ALLREDUCE_ALGORITHMS,
    COLLECTIVES,
    all_gather_seconds,
    all_to_all_seconds,
    allreduce_seconds,
    best_allreduce,
    collective_seconds,
    hierarchical_allreduce_seconds,
    p2p_seconds,
    reduce_scatter_seconds,
)
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
    bytes_per_param_for,
    comm_bytes_per_step,
    comm_psi_multiple,
    floor_billions,
    max_trainable_params,
    model_state_bytes,
)
from impls.costmodel.presets import HARDWARE, hardware, host_hardware

__all__ = [
    "HARDWARE",
    "hardware",
    "host_hardware",
    "ACTIVATION_SP",
    "ALLREDUCE_ALGORITHMS",
    "COLLECTIVES",
    "all_gather_seconds",
    "all_to_all_seconds",
    "allreduce_seconds",
    "best_allreduce",
    "collective_seconds",
    "hierarchical_allreduce_seconds",
    "p2p_seconds",
    "reduce_scatter_seconds",
    "activation_bytes_per_layer",
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
