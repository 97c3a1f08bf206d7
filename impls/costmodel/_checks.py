"""Argument checks shared by the memory cost models: errors name the key and the rule."""

from __future__ import annotations

import math
import numbers

__all__ = ["check_count", "is_int", "is_number"]


def is_number(value: object) -> bool:
    """A finite real number (numpy scalars included, bools not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_count(key: str, value: int) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{key}={value!r}: must be an integer ≥ 1")
