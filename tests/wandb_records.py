"""Read back what an offline wandb run logged, from its ``run-<id>.wandb`` transaction log.

The installed wandb (0.31, wandb-core) no longer ships a Python reader for this file nor
writes ``wandb-summary.json`` offline, so this parses the format itself: a 7-byte header
(``:W&B``, magic 0xBEE1, version 0), then LevelDB's log format — 32 KiB blocks of chunks,
each ``crc32 (4) | length (2) | type (1) | data``, where type 1 is a whole record and 2/3/4
the first/middle/last piece of one. Every chunk's checksum is verified (CRC-32 of the type
byte, then the data), so a misparse fails loudly instead of yielding garbage. Each record
is a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

__all__ = [
    "first_of",
    "logged_artifacts",
    "logged_config",
    "logged_history",
    "logged_metrics",
    "logged_summary",
    "records",
]

BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(path: Path) -> Iterator[bytes]:
    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:CHUNK_HEADER])
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path} is not a wandb transaction log (header {data[:7]!r})")
    pos, pieces = CHUNK_HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # the block's tail is zero padding
            pos += left_in_block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if (crc, length, kind) == (0, 0, 0):
            break  # preallocated, never written
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"{path}: bad checksum in the chunk at byte {pos}")
        pos += CHUNK_HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pieces = chunk
        elif kind == MIDDLE:
            pieces += chunk
        elif kind == LAST:
            yield pieces + chunk
        else:
            raise ValueError(f"{path}: unknown chunk type {kind} at byte {pos}")


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    for payload in _payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _items(items) -> dict[str, Any]:
    """A record's items as ``{"a/b": value}``; nested keys are joined with ``/``."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def logged_history(path: Path) -> list[dict[str, Any]]:
    """Every `run.log` step, in order, as ``{key: value}`` (with ``_step``)."""
    return [
        _items(r.history.item) for r in records(path) if r.WhichOneof("record_type") == "history"
    ]


def logged_summary(path: Path) -> dict[str, Any]:
    """The run summary as the log leaves it: later updates win."""
    summary: dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "summary":
            summary.update(_items(record.summary.update))
    return summary


def logged_config(path: Path) -> dict[str, Any]:
    """The run config: the run record's (from `wandb.init`), then later config updates."""
    config: dict[str, Any] = {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update(_items(record.run.config.update))
        elif kind == "config":
            config.update(_items(record.config.update))
    return config


def first_of(path: Path, kind: str):
    """The first record of one kind (``run``, ``exit``...), unwrapped; None if none."""
    for record in records(path):
        if record.WhichOneof("record_type") == kind:
            return getattr(record, kind)
    return None


def logged_metrics(path: Path) -> dict[str, str]:
    """Each `run.define_metric`: the metric's name and its step metric ("" if none)."""
    return {
        r.metric.name: r.metric.step_metric
        for r in records(path)
        if r.WhichOneof("record_type") == "metric" and r.metric.name
    }


def logged_artifacts(path: Path) -> dict[str, Any]:
    """Each artifact the run logged, by name: its type, metadata and file paths."""
    return {
        r.artifact.name: {
            "type": r.artifact.type,
            "metadata": json.loads(r.artifact.metadata or "{}"),
            "files": sorted(entry.path for entry in r.artifact.manifest.contents),
        }
        for r in records(path)
        if r.WhichOneof("record_type") == "artifact"
    }
