"""What every experiment supplies to the runner, and checks shared by their configs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd

from impls.models import GPTConfig

__all__ = [
    "Cell",
    "Experiment",
    "TimedGridConfig",
    "check_batch_split",
    "check_choices",
    "check_gpt_model",
    "check_positive",
    "check_timed_grid",
    "check_training",
    "collective_row",
    "parse_config",
]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}


@dataclass(kw_only=True)
class Cell:
    """One grid cell: run `fn(task)` on `world_size` ranks; `key` identifies its row."""

    world_size: int
    key: dict[str, Any]
    fn: Callable[[Any], dict]
    task: Any


@dataclass(frozen=True, kw_only=True)
class Experiment:
    name: str
    schema: type  # a kw_only dataclass whose __post_init__ validates the grid
    key_columns: list[str]
    cells: Callable[[Any], list[Cell]]
    to_row: Callable[[Cell, list[dict]], dict]
    write_report: Callable[[pd.DataFrame, Any], dict]
    summary: str = ""
    reads: tuple[str, ...] = ()

    # The runner's interface (`bench.experiments.base.Experiment`), for modules not yet
    # moved into a folder of their own.
    def parse(self, values: dict[str, Any]) -> Any:
        return parse_config(self, values)

    def rank_call(self, cfg: Any, cell: Cell) -> tuple[Callable[..., dict], tuple]:
        return cell.fn, (cell.task,)

    def row(self, cfg: Any, cell: Cell, per_rank: list[dict], report_dir: Any = None) -> dict:
        return self.to_row(cell, per_rank)

    def report_on(self, df: pd.DataFrame, report_dir: Any, cfg: Any) -> dict:
        return self.write_report(df, report_dir)


def parse_config(experiment: Experiment, values: dict[str, Any]):
    """Build the typed config, refusing keys the experiment does not have."""
    allowed = [f.name for f in fields(experiment.schema)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} for experiment {experiment.name}; "
            f"allowed keys: {', '.join(allowed)}"
        )
    return experiment.schema(**values)


def check_choices(key: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ValueError(
            f"{key}={list(values)} has unknown value(s) {bad}; allowed values: {', '.join(allowed)}"
        )


def check_positive(key: str, values: Sequence[int], minimum: int = 1) -> None:
    bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < minimum]
    if bad or not values:
        raise ValueError(f"{key}={list(values)}: every value must be an integer ≥ {minimum}")


def check_training(cfg, counts: Sequence[str]) -> None:
    """Checks every training grid shares: each key of `counts` an integer ≥ 1, `warmup`
    ≥ 0 and `lr` a finite number > 0 (where the config has them), `timeout_s` > 0."""
    for key in counts:
        check_positive(key, [getattr(cfg, key)])
    if hasattr(cfg, "warmup"):
        check_positive("warmup", [cfg.warmup], minimum=0)
    lr = getattr(cfg, "lr", None)
    if lr is not None and not (isinstance(lr, int | float) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr={lr}: must be a finite number > 0")
    if cfg.timeout_s <= 0:
        raise ValueError(f"timeout_s={cfg.timeout_s} must be > 0")


def check_batch_split(batch_size: int, world_size: int) -> None:
    """A global batch every rank gets an equal shard of (`shard_batch`'s rule)."""
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} is not divisible by world_size={world_size}")


def check_gpt_model(model: dict[str, Any], **extra: Any) -> GPTConfig:
    """The `GPTConfig` a grid's `model` key describes, or a ValueError naming the key."""
    try:
        return GPTConfig(**model, **extra)
    except (TypeError, ValueError) as error:
        raise ValueError(f"model={model}: {error}") from error


def check_message_bytes(message_bytes: Sequence[int], dtype: str) -> None:
    check_positive("message_bytes", message_bytes)
    size = DTYPE_BYTES[dtype]
    bad = [m for m in message_bytes if m % size]
    if bad:
        raise ValueError(
            f"message_bytes={bad} is not a multiple of the {dtype} element size ({size} bytes)"
        )


@dataclass(kw_only=True)
class TimedGridConfig:
    """Keys shared by every grid of timed collectives (subclasses add `message_bytes`)."""

    world_sizes: list[int] = field(default_factory=lambda: [2, 4, 8])
    """Numbers of ranks (N)."""
    dtype: str = "float32"
    repeats: int = 5
    """Timed windows per cell; the median is reported."""
    warmup: int = 2
    window_s: float = 0.1
    """Target length of one timed window; sets the iterations per window."""
    timeout_s: float = 300.0
    """A cell whose ranks have not all finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        check_timed_grid(self)

    def timing(self) -> dict[str, Any]:
        """The CollectiveCell fields every cell of this grid shares."""
        return {
            "dtype": self.dtype,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "window_s": self.window_s,
        }


def check_timed_grid(cfg) -> None:
    """Checks shared by every timed-collective grid: world sizes, dtype, sizes, repeats."""
    check_positive("world_sizes", cfg.world_sizes)
    check_choices("dtype", [cfg.dtype], list(DTYPE_BYTES))
    check_message_bytes(cfg.message_bytes, cfg.dtype)
    check_positive("repeats", [cfg.repeats])
    if cfg.timeout_s <= 0:
        raise ValueError(f"timeout_s={cfg.timeout_s} must be > 0")


def collective_row(cell: Cell, per_rank: list[dict], bus_factor: float, traffic: bool) -> dict:
    """The tidy row of a timed collective: nccl-tests' columns plus traffic counters."""
    first = per_rank[0]
    size = cell.key["message_bytes"]
    algbw = size / first["time_s"] / 1e9 if first["time_s"] > 0 else math.nan
    row = {
        **cell.key,
        "time_s": first["time_s"],
        "iters": first["iters"],
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor,
        "bus_factor": bus_factor,
        "wrong": sum(r["wrong"] for r in per_rank),
        # Side-by-side with torch's collective (alternating windows, same buffers): the
        # busbw ratio equals the inverse time ratio, since both move the same S.
        "torch_time_s": first.get("torch_time_s", math.nan),
        "busbw_vs_torch": first.get("torch_time_s", math.nan) / first["time_s"]
        if first["time_s"] > 0
        else math.nan,
    }
    counted = traffic and any(r["messages_sent"] or r["messages_recv"] for r in per_rank)
    no_traffic = cell.world_size == 1 or size == 0
    for column, value in {
        "rounds": max(r["rounds"] for r in per_rank),
        "max_rank_bytes_sent": max(r["bytes_sent"] for r in per_rank),
        "max_rank_bytes_recv": max(r["bytes_recv"] for r in per_rank),
        "total_bytes_sent": sum(r["bytes_sent"] for r in per_rank),
        "messages": max(r["messages_sent"] for r in per_rank),
    }.items():
        # torch's own collectives are opaque to our counters: NaN, never a made-up zero.
        row[column] = value if counted or (traffic and no_traffic) else math.nan
    return row
