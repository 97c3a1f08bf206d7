"""Flat parameter buffers: how a model's parameters are grouped into units and sharded.

ZeRO (Rajbhandari et al., 2020) and FSDP (Zhao et al., 2023) both lay a group of
parameters end to end in one 1-D buffer, so a whole group moves in one collective and
sharding is slicing. A *unit* is such a group: FSDP's "FlatParameter", here one per
transformer block (or MLP layer) plus one for the parameters no unit module holds.

Each unit's buffer is padded to a multiple of the world size N, so every rank owns an
equal contiguous shard `[r·S, (r+1)·S)` with S = padded / N, reduce-scatter and all-gather
work on equal blocks, and any parameter count works. The padding is never read as a
parameter; its gradient is zero and Adam leaves it at zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["FlatUnit", "ParamSlot", "default_unit_modules", "plan_units"]


@dataclass(frozen=True)
class ParamSlot:
    """Where one parameter lives inside its unit's flat buffer."""

    name: str
    param: nn.Parameter
    offset: int
    shape: torch.Size

    @property
    def numel(self) -> int:
        return self.shape.numel()


@dataclass
class FlatUnit:
    """One unit: the module whose forward uses it, its parameters' slots, and its sizes."""

    name: str
    module: nn.Module
    slots: list[ParamSlot]
    numel: int  # parameters only
    padded: int  # numel rounded up to a multiple of the world size
    world_size: int
    start: int = 0  # offset of this unit in the concatenation of all units' full buffers
    shard_start: int = 0  # offset of this unit in the concatenation of all units' shards

    @property
    def shard_numel(self) -> int:
        return self.padded // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[begin, end) of rank `rank`'s shard inside this unit's full buffer."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel


def default_unit_modules(module: nn.Module) -> list[nn.Module]:
    """FSDP's usual wrapping: every element of a top-level ModuleList/Sequential
    (GPT's `blocks`, MLP's `layers`) is a unit; everything else falls to the root unit."""
    units: list[nn.Module] = []
    for child in module.children():
        if isinstance(child, nn.ModuleList | nn.Sequential):
            units.extend(child.children())
    return units


def plan_units(
    module: nn.Module, unit_modules: list[nn.Module] | None, world_size: int
) -> list[FlatUnit]:
    """Group `module`'s parameters into units, in forward order where the model's
    registration order is its forward order: the root unit (parameters outside every unit
    module) first, then the unit modules. A parameter shared by two units is refused
    (ZeRO-3 would free it under the other unit); unit modules must not nest."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if unit_modules is None:
        unit_modules = default_unit_modules(module)
    names = {m: n for n, m in module.named_modules()}
    for m in unit_modules:
        if m not in names or m is module:
            raise ValueError("units must be submodules of the module (not the module itself)")
    owner: dict[nn.Parameter, nn.Module] = {}
    for m in unit_modules:
        for p in m.parameters():
            if p in owner:
                raise ValueError(
                    f"parameter of unit {names[m]!r} is also in unit {names[owner[p]]!r}: "
                    "units must not nest or share parameters"
                )
            owner[p] = m
    grouped: dict[nn.Module, list[tuple[str, nn.Parameter]]] = {m: [] for m in unit_modules}
    root: list[tuple[str, nn.Parameter]] = []
    for name, p in module.named_parameters():  # deduplicates tied parameters
        if not p.requires_grad:
            raise ValueError(f"parameter {name!r} does not require grad; freeze it outside ZeRO")
        (grouped[owner[p]] if p in owner else root).append((name, p))
    groups = ([("", module, root)] if root else []) + [
        (names[m], m, grouped[m]) for m in unit_modules if grouped[m]
    ]
    units, start, shard_start = [], 0, 0
    for unit_name, unit_module, params in groups:
        unit = _layout(unit_name or "<root>", unit_module, params, world_size)
        unit.start, unit.shard_start = start, shard_start
        start, shard_start = start + unit.padded, shard_start + unit.shard_numel
        units.append(unit)
    return units


def _layout(
    name: str, module: nn.Module, params: list[tuple[str, nn.Parameter]], world_size: int
) -> FlatUnit:
    slots, offset = [], 0
    for param_name, p in params:
        slots.append(ParamSlot(param_name, p, offset, p.shape))
        offset += p.numel()
    padded = -(-offset // world_size) * world_size
    return FlatUnit(name, module, slots, offset, padded, world_size)
