"""Deliberate model errors: each a context manager that makes the simulator wrong in one
known way, so that `test_mutations.py` can show some check of `model_checks.py` notices.

Every patch goes through a name in `TARGETS` below, and nowhere else: when the model is
refactored, retarget the table. Patches replace a module attribute (`mock.patch`) or a
field of the cluster presets (`dataclasses.replace` on the `HARDWARE` entries, which
`impls.costmodel.presets.hardware` reads at call time). The simulator caches layer prices
per (spec, hardware object), so each mutation forgets them on entry and on exit.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, replace
from unittest import mock

__all__ = ["MUTATIONS", "TARGETS", "Mutation", "forget_cached_prices"]

TARGETS = {
    "dp_exposure": "impls.simulator.zero_comm.exposed",
    "forward_kernels": "impls.simulator.costs._FORWARD_KERNELS",
    "tp_collective": "impls.simulator.costs.collective_seconds",
    "layer_activations": (
        "impls.simulator.costs.activation_bytes_per_layer",
        "impls.simulator.step.activation_bytes_per_layer",
    ),
    "pipeline_send": "impls.simulator.step.p2p_seconds",
    "optimizer": "impls.simulator.step._optimizer_seconds",
    "schedule_replay": "impls.simulator.step.evaluate",
    "memory_bytes_per_param": "impls.simulator.memory.bytes_per_param",
    "memory_model_states": "impls.simulator.memory.model_state_bytes",
    "presets": "impls.costmodel.presets.HARDWARE",
    "price_cache": "impls.simulator.costs._CACHE",
}
"""Every attribute a mutation patches, by role: the one table to retarget."""


@dataclass(frozen=True)
class Mutation:
    """A named model error; `apply()` is the context manager in which the model has it."""

    name: str
    description: str
    apply: Callable[[], ContextManager[None]]


def _resolve(target: str):
    module, _, attribute = target.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def forget_cached_prices() -> None:
    """Drop the simulator's layer-price cache (keyed on the hardware object, not on the
    module constants a mutation patches)."""
    _resolve(TARGETS["price_cache"]).clear()


@contextlib.contextmanager
def _patched(role: str, new: object) -> Iterator[None]:
    targets = TARGETS[role]
    with contextlib.ExitStack() as stack:
        for target in (targets,) if isinstance(targets, str) else targets:
            stack.enter_context(mock.patch(target, new))
        forget_cached_prices()
        try:
            yield
        finally:
            forget_cached_prices()


def _wrapped(role: str, wrapper: Callable) -> ContextManager[None]:
    """Patch `role` with wrapper(original, arguments): arguments bound by name."""
    targets = TARGETS[role]
    original = _resolve(targets if isinstance(targets, str) else targets[0])
    signature = inspect.signature(original)

    @functools.wraps(original)  # a second wrapper binds by the same signature
    def patched(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return wrapper(original, bound.arguments)

    return _patched(role, patched)


def _exposure(wrapper: Callable) -> Callable[[], ContextManager[None]]:
    return lambda: _wrapped("dp_exposure", wrapper)


def _with(arguments: dict, **changes) -> dict:
    return {**arguments, **changes}


def _reduce_scatter_never_hidden(exposed, a):
    if a["plan"].zero_stage != 3:
        return exposed(**a)
    reduce = tuple(t for t in a["transfers"] if t[0] == "reduce_scatter")
    rest = tuple(t for t in a["transfers"] if t[0] != "reduce_scatter")
    return exposed(**_with(a, transfers=rest)) + exposed(**_with(a, transfers=reduce, window=0.0))


def _allreduce_never_hidden(exposed, a):
    if any(kind == "all_reduce" for kind, _ in a["transfers"]):
        return exposed(**_with(a, window=0.0))
    return exposed(**a)


def _always_hidden(exposed, a):
    return 0.0 if a["hw"].comm_overlap else exposed(**a)


def _prefetch_unlimited(exposed, a):
    """Every unit prefetched at once: the whole window hides the whole transfer."""
    if not a["hw"].comm_overlap:
        return exposed(**a)
    unit = exposed(**_with(a, window=math.inf))
    return max(unit, exposed(**_with(a, window=0.0)) - a["window"])


def _side_by_side(exposed, a):
    """Each collective on a link of its own: the longest one, not their sum."""
    return max((exposed(**_with(a, transfers=(t,))) for t in a["transfers"]), default=0.0)


@contextlib.contextmanager
def _presets(change: Callable) -> Iterator[None]:
    """Every cluster preset replaced by change(preset) (None: unchanged)."""
    presets = _resolve(TARGETS["presets"])
    changed = {name: change(hw) for name, hw in presets.items()}
    with mock.patch.dict(presets, {k: hw for k, hw in changed.items() if hw is not None}):
        forget_cached_prices()
        try:
            yield
        finally:
            forget_cached_prices()


def _nvlink_050(hw):
    if math.isclose(hw.intra.efficiency, 0.69):
        return replace(hw, intra=replace(hw.intra, efficiency=0.50))
    return None


def _node_nic_per_gpu(hw):
    return replace(hw, inter=replace(hw.inter, bandwidth=hw.inter.bandwidth * hw.devices_per_node))


def _plateau(hw):
    changes = {"gemm_efficiency": (hw.gemm_efficiency[-1],)}
    if getattr(hw, "sms", 0):  # shape-priced GEMMs: their tile-and-wave share off too
        changes["sms"] = 0
    return replace(hw, **changes)


def _collectives_take_no_sms(hw):
    return replace(hw, comm_compute_share=0.0) if hw.comm_compute_share else None


def _sparse_peak(hw):
    return replace(hw, peak_flops={dtype: 2 * flops for dtype, flops in hw.peak_flops.items()})


def _no_optimizer_state(bytes_per_param, a):
    return replace(bytes_per_param(**a), optimizer=1e-9)  # > 0, as BytesPerParam requires


def _unsharded_states(model_state_bytes, a):
    return model_state_bytes(**_with(a, dp=1))  # states as if the ZeRO group were one rank


def _scores_dropped(activation_bytes, a):
    """The attention core's 5·a·s²·b bytes left out: what `selective` recomputes."""
    if a["recompute"] == "none":
        return activation_bytes(**_with(a, recompute="selective"))
    return activation_bytes(**a)


def _no_bubble(evaluate, a):
    """Each rank's idle time of the free replay taken off its end: no fill and drain."""
    timeline = evaluate(**a)
    free = evaluate(**_with(a, send_forward=None, send_backward=None))
    ends = tuple(
        end - (f_end - busy)
        for end, f_end, busy in zip(timeline.ends, free.ends, free.busy, strict=True)
    )
    return replace(timeline, ends=ends, makespan=max(ends))


def _kernels_doubled() -> ContextManager[None]:
    return _patched("forward_kernels", 2 * _resolve(TARGETS["forward_kernels"]))


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "zero3_reduce_scatter_never_hidden",
        "ZeRO-3's gradient reduce-scatter is never overlapped with the backward",
        _exposure(_reduce_scatter_never_hidden),
    ),
    Mutation(
        "dp_allreduce_never_hidden",
        "DDP's bucketed gradient all-reduce is never overlapped with the backward",
        _exposure(_allreduce_never_hidden),
    ),
    Mutation(
        "dp_collectives_always_hidden",
        "every DP/ZeRO collective hides entirely, whatever its size (no overlap limit)",
        _exposure(_always_hidden),
    ),
    Mutation(
        "zero_prefetch_unlimited",
        "every ZeRO unit prefetched at once: the whole compute window hides the transfer",
        _exposure(_prefetch_unlimited),
    ),
    Mutation(
        "zero3_gather_and_reduce_scatter_side_by_side",
        "ZeRO-3's backward gather and reduce-scatter each get a link of their own",
        _exposure(_side_by_side),
    ),
    Mutation(
        "kernel_count_doubled",
        "twice the element-wise kernels per layer, each paying a launch",
        _kernels_doubled,
    ),
    Mutation(
        "nvlink_efficiency_050",
        "NVLink busbw at 0.50 of the line rate instead of nccl-tests' 0.69",
        lambda: _presets(_nvlink_050),
    ),
    Mutation(
        "internode_bandwidth_node_aggregate",
        "a node's aggregate NIC bandwidth used per GPU (×8 on DGX nodes)",
        lambda: _presets(_node_nic_per_gpu),
    ),
    Mutation(
        "gemm_plateau_every_shape",
        "every GEMM at the large-GEMM plateau (no wave-quantisation roll-off)",
        lambda: _presets(_plateau),
    ),
    Mutation(
        "hidden_collectives_free",
        "a collective hidden under compute takes none of the SMs the compute runs on",
        lambda: _presets(_collectives_take_no_sms),
    ),
    Mutation(
        "sparse_peak_flops",
        "peak FLOP/s read from the datasheet's sparsity figures (2× the dense peak)",
        lambda: _presets(_sparse_peak),
    ),
    Mutation(
        "optimizer_state_not_in_memory",
        "Adam's master weights, momentum and variance left out of a rank's memory",
        lambda: _wrapped("memory_bytes_per_param", _no_optimizer_state),
    ),
    Mutation(
        "zero_sharding_not_in_memory",
        "ZeRO's sharding of weights, gradients and optimizer state ignored in memory",
        lambda: _wrapped("memory_model_states", _unsharded_states),
    ),
    Mutation(
        "attention_scores_memory_dropped",
        "the s² attention scores, softmax and dropout mask are not kept for the backward",
        lambda: _wrapped("layer_activations", _scores_dropped),
    ),
    Mutation(
        "pipeline_transfers_free",
        "pipeline sends of activations and gradients cost nothing",
        lambda: _patched("pipeline_send", lambda *a, **k: 0.0),
    ),
    Mutation(
        "tp_collectives_free",
        "tensor-parallel all-reduces / all-gathers / all-to-alls cost nothing",
        lambda: _patched("tp_collective", lambda *a, **k: 0.0),
    ),
    Mutation(
        "optimizer_free",
        "the optimizer step costs nothing",
        lambda: _patched("optimizer", lambda *a, **k: 0.0),
    ),
    Mutation(
        "bubble_ignored",
        "the pipeline's fill and drain are ignored: each rank busy from start to end",
        lambda: _wrapped("schedule_replay", _no_bubble),
    ),
)
