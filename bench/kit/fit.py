"""The one α–β fit: a link's latency per round and time per byte from timed collectives.

A collective that runs `rounds` rounds and moves `nbytes` bytes through its busiest rank
takes t ≈ α·rounds + β·nbytes (the α–β model, Hockney 1994; Thakur et al. 2005 for the
collectives' counts). Times from 4 KiB to hundreds of MiB span five orders of magnitude,
so the fit is on relative error (each row weighted by 1/t): the small messages that set α
count as much as the large ones that set β. Both coefficients are kept ≥ 0.

Two estimators, one design:
- `median` minimises the sum of absolute relative errors (a median regression, a linear
  program for `scipy.optimize.linprog`): on a shared host, a size timed while another
  phase loaded it is an outlier that moves least squares and not the median;
- `least_squares` minimises the sum of squared relative errors with α, β ≥ 0
  (`scipy.optimize.nnls`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["FIT_METHODS", "fit_alpha_beta", "fit_ring"]

FIT_METHODS = ("median", "least_squares")


def fit_alpha_beta(
    rounds: Sequence[float], nbytes: Sequence[float], times: Sequence[float], method: str = "median"
) -> tuple[float, float]:
    """(α s per round, β s per byte) ≥ 0 of t ≈ α·rounds + β·nbytes, on relative error.

    Raises ValueError on fewer than two rows, a time that is not finite and positive, or
    an unknown `method`; a coefficient the data does not support comes back as 0."""
    if method not in FIT_METHODS:
        raise ValueError(f"method={method!r}; allowed: {', '.join(FIT_METHODS)}")
    r, m, t = (np.asarray(v, dtype=float) for v in (rounds, nbytes, times))
    if not (r.shape == m.shape == t.shape) or t.size < 2:
        raise ValueError(
            f"an α–β fit needs ≥ 2 rows of rounds, bytes and times; got "
            f"{r.size}, {m.size} and {t.size}"
        )
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError(f"an α–β fit needs finite positive times; got {list(t)}")
    design = np.stack([r, m], axis=1) / t[:, None]
    scale = np.where(design.max(axis=0) > 0, design.max(axis=0), 1.0)  # unknowns of order 1
    design = design / scale
    if method == "least_squares":
        from scipy.optimize import nnls

        solution, _ = nnls(design, np.ones_like(t))
    else:
        from scipy.optimize import linprog

        k = len(t)
        # minimise Σ eᵢ over (x, e) ≥ 0 with −eᵢ ≤ (design · x)ᵢ − 1 ≤ eᵢ
        a_ub = np.block([[design, -np.eye(k)], [-design, -np.eye(k)]])
        b_ub = np.concatenate([np.ones(k), -np.ones(k)])
        cost = np.concatenate([np.zeros(2), np.ones(k)])
        solved = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
        if not solved.success:
            raise RuntimeError(f"the α–β fit did not solve: {solved.message}")
        solution = solved.x[:2]
    alpha, beta = solution / scale
    return float(alpha), float(beta)


def fit_ring(
    n: int, sizes: Sequence[float], times: Sequence[float], *, robust: bool = True
) -> tuple[float, float]:
    """(α, β) of a ring all-reduce on `n` ranks timed at ≥ 2 message sizes: 2(n − 1) rounds
    carrying 2(n − 1)/n · M bytes per rank (as `impls.costmodel.comm` prices it). `robust`: the median
    regression, else least squares. Floors α at 1 ns and β at 1e-15 s/B, so the link a
    preset builds from them has a finite bandwidth."""
    m = np.asarray(sizes, dtype=float)
    if n < 2 or len(set(m.tolist())) < 2:
        raise ValueError(
            f"a ring fit needs N ≥ 2 and positive times at ≥ 2 sizes; got N={n}, "
            f"sizes={list(m)}, times={list(times)}"
        )
    rounds = np.full_like(m, 2.0 * (n - 1))
    alpha, beta = fit_alpha_beta(
        rounds, 2.0 * (n - 1) / n * m, times, "median" if robust else "least_squares"
    )
    return max(alpha, 1e-9), max(beta, 1e-15)
