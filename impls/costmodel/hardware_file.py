"""A `Hardware` preset as a YAML file: what `device_profile` writes after measuring a device,
and what `hardware=path/to/file.yaml` reads wherever a preset name is taken. It holds
every field of `Hardware` under its own name, the links (`intra`, `inter`) as mappings of
`Link`'s fields, tables as lists of lists and `sources` as a mapping from a field to
where its number came from::

    name: this host (2 × CPU ranks)
    devices_per_node: 2
    peak_flops: {fp32: 52000000000.0, bf16: 9000000000.0}
    intra: {name: loopback (gloo), alpha_s: 0.0003, bandwidth: 1500000000.0, efficiency: 1.0}
    gemm_efficiency: [[2097152.0, 0.41], [1073741824.0, 1.0]]
    sources: {peak_flops: "measured here, 2026-11-28, cpu, host"}

Reading and its refusals: `load_hardware`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from impls.costmodel.hardware import Hardware

__all__ = ["dump_hardware", "is_hardware_file", "load_hardware", "read_hardware", "to_plain"]


def is_hardware_file(name: str) -> bool:
    """Whether a `hardware=` value names a file rather than a preset: it ends in .yaml or
    .yml, or holds a path separator."""
    return name.endswith((".yaml", ".yml")) or "/" in name or "\\" in name


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _at_default(field: dataclasses.Field, value: Any) -> bool:
    if field.default is not dataclasses.MISSING:
        return value == field.default
    if field.default_factory is not dataclasses.MISSING:
        return value == field.default_factory()
    return False


def to_plain(value: Any) -> Any:
    """`value` as YAML's plain types: a dataclass as a mapping of its fields (in order, a
    field at its default left out: it reads back as that), mappings as dicts, tuples as
    lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not _at_default(f, getattr(value, f.name))
        }
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    return value


class _Dumper(yaml.SafeDumper):
    """Block mappings, one per line; a list of numbers (a table's point) on one line."""

    def represent_list(self, data: list) -> yaml.Node:
        flat = all(not isinstance(v, list | dict) for v in data)
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _Dumper.represent_list)


def dump_hardware(hw: Hardware, path: str | Path) -> Path:
    """Write `hw` to `path` as YAML (its fields in the dataclass's order, those at their
    default left out); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(to_plain(hw), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


class _Bad(ValueError):
    """A problem at one key of the file (the key's dotted path, and what is wrong)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")


def _number(value: Any, key: str, kind: type) -> Any:
    if isinstance(value, bool):
        raise _Bad(key, f"expected a number, got {value!r}")
    if kind is int:
        if not isinstance(value, int):
            raise _Bad(key, f"expected an integer, got {value!r}")
        return value
    if isinstance(value, str):  # YAML 1.1 reads 1e9 (no dot) as a string: take it as meant
        try:
            value = float(value)
        except ValueError:
            raise _Bad(key, f"expected a number, got {value!r}") from None
    if not isinstance(value, int | float):
        raise _Bad(key, f"expected a number, got {value!r}")
    if math.isnan(value):
        raise _Bad(key, "expected a number, got nan")
    return value


def _convert(value: Any, hint: Any, key: str) -> Any:
    """`value` read from YAML as type `hint`, or `_Bad` naming `key`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, key)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    if hint in (int, float):
        return _number(value, key, hint)
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise _Bad(key, f"expected {'text' if hint is str else 'true or false'}, got {value!r}")
        return value
    if origin is Mapping or origin is dict:
        if not isinstance(value, dict):
            raise _Bad(key, f"expected a mapping, got {value!r}")
        return {str(k): _convert(v, args[1], f"{key}[{k}]") for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _Bad(key, f"expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise _Bad(key, f"expected a list of {len(args)} numbers, got {value!r}")
        pairs = enumerate(zip(value, args, strict=True))
        return tuple(_convert(v, a, f"{key}[{i}]") for i, (v, a) in pairs)
    raise _Bad(key, f"cannot read a value of type {hint}")  # a new field of a new kind


def _build(cls: type, data: Any, prefix: str = "") -> Any:
    """An instance of dataclass `cls` from the mapping `data`, every field converted."""
    where = prefix or cls.__name__
    if not isinstance(data, dict):
        raise _Bad(where, f"expected a mapping of {cls.__name__}'s fields, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    dotted = (lambda name: f"{prefix}.{name}") if prefix else (lambda name: name)
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise _Bad(
            dotted(unknown[0]), f"unknown field of {cls.__name__}; allowed: {', '.join(fields)}"
        )
    required = (dataclasses.MISSING,)
    missing = [
        name
        for name, f in fields.items()
        if name not in data and f.default in required and f.default_factory in required
    ]
    if missing:
        raise _Bad(dotted(missing[0]), f"missing (a {cls.__name__} field without a default)")
    hints = _hints(cls)
    values = {name: _convert(value, hints[name], dotted(name)) for name, value in data.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:  # the dataclass's own checks name the key
        if not prefix:
            raise ValueError(str(error)) from None
        raise _Bad(prefix, str(error)) from None


def load_hardware(path: str | Path) -> Hardware:
    """The `Hardware` in the YAML file at `path`; ValueError (one line naming the file and
    the key) for a missing, unreadable or malformed file.

    Fields are read generically from the dataclasses (`dataclasses.fields`), so a field added
    to `Hardware` or `Link` is written and read without a change here. A field without a
    default must be present; one with a default may be left out and takes it, and is left
    out when written at its default (a file then stays readable where `Hardware` gains or
    drops an optional field the preset does not use). A bad file is
    refused with one line naming the file and the key (missing, unknown, of the wrong type);
    the values themselves are checked by `Hardware` and `Link` (`__post_init__`), whose error
    is prefixed with the file too.
    """
    shown = f"hardware file {str(path)!r}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{shown}: cannot read it ({error.strerror or error})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{shown}: not YAML{at}") from None
    return read_hardware(data, shown)


def read_hardware(data: Any, shown: str) -> Hardware:
    """The `Hardware` a mapping of its fields describes (a preset file's contents, or the
    `hardware` config group's); ValueError (one line, prefixed with `shown`) naming the key."""
    try:
        return _build(Hardware, data)
    except ValueError as error:
        raise ValueError(f"{shown}: {' '.join(str(error).split())}") from None
