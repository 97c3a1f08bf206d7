"""Config checks shared by the model configs: each failure names the key and the rule."""

from __future__ import annotations

import math


def require_positive_ints(owner: str, **values: object) -> None:
    """Raise ValueError unless every value is a positive int (bools are refused too)."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{key}={value!r} is not allowed: it must be an int >= 1")


def require_probability(owner: str, key: str, value: float) -> None:
    """Raise ValueError unless 0 <= value < 1 (a drop probability of 1 would zero everything)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ValueError(f"{owner}.{key}={value!r} is not allowed: it must be a float in [0, 1)")


def divisors(n: int) -> list[int]:
    """The positive divisors of n, ascending: pairs (d, n // d) for d up to √n, so a
    mistyped 15-digit width is answered at once (a walk to n took minutes)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
