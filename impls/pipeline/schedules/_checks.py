"""Argument checks shared by the schedule builders: errors name the key and the rule."""

from __future__ import annotations

__all__ = ["ONE_CHUNK", "require_count"]

# Why interleaving needs two chunks per rank: with one it is plain 1F1B.
ONE_CHUNK = " for schedule 'interleaved_1f1b' (with 1 chunk per rank it is '1f1b')"


def require_count(key: str, value: object, minimum: int = 1, why: str = "") -> int:
    """Return `value` if it is an integer >= `minimum`, else raise ValueError naming `key`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}={value!r}: must be an integer >= {minimum}{why}")
    return value
