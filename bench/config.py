"""Typed experiment configs: one schema per experiment is the single source of defaults.

Each experiment's schema is a `@dataclass(kw_only=True)` whose fields are its keys (a
docstring under each says what it means) and whose `__post_init__` refuses what cannot
work, naming the key and the allowed values. `register` puts the schema in Hydra's
ConfigStore as `schema/<name>`; `experiments/experiment/<name>.yaml` starts from it
(`defaults: [/schema/<name>, _self_]`) and lists only what differs, so Hydra itself
refuses a value of the wrong type, naming the key. `parse_config` turns the composed
values into the schema object (refusing keys the experiment does not have) — the typed
config the runner hands to every rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from impls.models import GPTConfig

__all__ = [
    "check_batch_split",
    "check_choices",
    "check_gpt_model",
    "check_number",
    "check_positive",
    "check_training",
    "parse_config",
    "register",
]


def register(name: str, schema: type) -> None:
    """Make `schema` the base of `experiment/<name>.yaml` (as `/schema/<name>`)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="schema", name=name, node=schema, package="_global_")


def parse_config(name: str, schema: type, values: Mapping[str, Any]) -> Any:
    """The schema object for `values`, refusing unknown keys and values of the wrong type;
    the schema's own checks (`__post_init__`) run as it is built."""
    from omegaconf import OmegaConf  # the parent's job: rank processes never parse
    from omegaconf.errors import OmegaConfBaseException

    allowed = [f.name for f in fields(schema)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} for experiment {name}; "
            f"allowed keys: {', '.join(allowed)}"
        )
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), dict(values))
        # Validate types through OmegaConf, then build the dataclass ourselves: its
        # __post_init__ checks run once, on plain Python values.
        plain = OmegaConf.to_container(typed, resolve=True)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "?"
        message = str(error).splitlines()[0]
        raise ValueError(f"{key}: {message}") from None
    return schema(**plain)


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


def check_number(key: str, value: Any, *, minimum: float = 0.0, inclusive: bool = False) -> None:
    """A finite real number above `minimum` (or at it, when `inclusive`)."""
    real = isinstance(value, int | float) and not isinstance(value, bool)
    if not (real and math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
        sign = "≥" if inclusive else ">"
        raise ValueError(f"{key}={value}: must be a finite number {sign} {minimum:g}")


def check_training(cfg: Any, counts: Sequence[str]) -> None:
    """Checks every training grid shares: each key of `counts` an integer ≥ 1, `warmup`
    ≥ 0 and `lr` a finite number > 0 (where the config has them), `timeout_s` > 0."""
    for key in counts:
        check_positive(key, [getattr(cfg, key)])
    if hasattr(cfg, "warmup"):
        check_positive("warmup", [cfg.warmup], minimum=0)
    if getattr(cfg, "lr", None) is not None:
        check_number("lr", cfg.lr)
    check_number("timeout_s", cfg.timeout_s)


def check_batch_split(batch_size: int, world_size: int) -> None:
    """A global batch every rank gets an equal shard of (`shard_batch`'s rule)."""
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} is not divisible by world_size={world_size}")


def check_gpt_model(model: Mapping[str, Any], **extra: Any) -> GPTConfig:
    """The `GPTConfig` a grid's `model` key describes, or a ValueError naming the key."""
    from impls.models import GPTConfig

    try:
        return GPTConfig(**model, **extra)
    except (TypeError, ValueError) as error:
        raise ValueError(f"model={dict(model)}: {error}") from error
