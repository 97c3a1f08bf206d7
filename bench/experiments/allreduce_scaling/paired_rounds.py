"""An auto cell's rounds: auto's time and each alternative's, timed in the same rounds.

What `auto.prepare` reads off them: each side's speed relative to auto's, round by round
(the host's drift between rounds cancels in a paired ratio); a seeded bootstrap interval of
auto ÷ best over the rounds; whether a choice is tied with the best; and how reproducible
the best is when the rounds are split in two halves."""

from __future__ import annotations

import json
import math

import numpy as np

__all__ = ["Rounds", "interval", "read_rounds", "split_agreement", "tied"]

Rounds = tuple[np.ndarray, dict[str, np.ndarray]]
"""auto's time per round and each alternative's (`read_rounds`)."""


def read_rounds(row: dict) -> Rounds | None:
    """auto's time per round and each alternative's, from `round_times_s`; None without."""
    text = row.get("round_times_s")
    if not isinstance(text, str) or not text.strip():
        return None
    rounds = {k: np.asarray(v, dtype=float) for k, v in json.loads(text).items()}
    own = rounds.get("time_s")
    if own is None or not len(own):
        return None
    alts = {
        k[len("alt_") : -len("_s")]: v
        for k, v in rounds.items()
        if k.startswith("alt_") and k.endswith("_s") and len(v) == len(own)
    }
    if not alts:
        return None
    if not all(np.all(v > 0) for v in (own, *alts.values())):
        return None
    return own, alts


def _resampled_medians(ratios: np.ndarray, resamples: int = 1000) -> np.ndarray:
    """The median over rounds (the last axis of `ratios`) in each of `resamples` bootstrap
    resamples of the rounds, seeded (the same rows give the same numbers):
    shape `(*ratios.shape[:-1], resamples)`."""
    count = ratios.shape[-1]
    picks = np.random.default_rng(0).integers(0, count, size=(resamples, count))
    return np.median(ratios[..., picks], axis=-1)


def _two_sided(stats: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return float(low), float(high)


def interval(rounds: Rounds, level: float = 0.9) -> tuple[float, float]:
    """A bootstrap interval of auto ÷ best over the rounds, the best re-chosen in every
    resample."""
    own, alts = rounds
    ratios = np.stack([t / own for t in alts.values()])  # alternative ÷ auto time, per round
    return _two_sided(_resampled_medians(ratios).min(axis=0), level)  # auto ÷ best


def split_agreement(rounds: Rounds, splits: int = 200) -> float:
    """How reproducible the cell's measured best is: over `splits` seeded random splits of
    its rounds into two halves, the share in which both halves name the same best (each
    half's paired median over its rounds, as `auto._paired` picks it). 1: every half names one
    algorithm; near 1/k: k sides the rounds cannot order. NaN with fewer than 2 rounds."""
    own, alts = rounds
    count = len(own)
    if count < 2:
        return math.nan
    speeds = np.stack([own / t for t in alts.values()])  # alternative's speed ÷ auto's
    rng, same = np.random.default_rng(0), 0
    for _ in range(splits):
        order = rng.permutation(count)
        first, second = order[: count // 2], order[count // 2 :]
        same += np.argmax(np.median(speeds[:, first], axis=1)) == np.argmax(
            np.median(speeds[:, second], axis=1)
        )
    return same / splits


def tied(rounds: Rounds, choice: str, best: str, level: float = 0.9) -> bool:
    """Whether the rounds leave `choice` possibly as fast as `best`: the upper end of a
    bootstrap interval of the median over rounds of t_best ÷ t_choice reaches 1."""
    _, alts = rounds
    if choice not in alts or best not in alts:
        return False
    ratio = alts[best] / alts[choice]  # < 1: the best was faster in that round
    return _two_sided(_resampled_medians(ratio), level)[1] >= 1.0
