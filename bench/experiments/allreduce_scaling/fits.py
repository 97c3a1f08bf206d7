"""Fits that turn measured counters and times into the lecture's vocabulary.

- `fit_growth`: which of O(1), O(log N), O(N), O(N²) describes a counter measured at a few
  world sizes (rounds, or bytes in units of the message size M). This is how a report
  checks the lecture's table ("Compare Different Distributed Aggregation") against the
  counted traffic.
- `fit_alpha_beta`: the α–β (latency–bandwidth) model, time ≈ α·rounds + β·bytes on the
  busiest rank (Hockney's model, as used by Thakur, Rabenseifner & Gropp, "Optimization of
  collective communication operations in MPICH", 2005).
- `extrapolate`: the two combined to predict a world size that was not run. The result is a
  model, never a measurement, and is labelled so.

Pure numpy/pandas: no torch, no `impls`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bench.kit import fit as link_fit

__all__ = [
    "GROWTH_ORDERS",
    "AlphaBetaFit",
    "GrowthFit",
    "extrapolate",
    "fit_alpha_beta",
    "fit_alpha_beta_per_algorithm",
    "fit_growth",
    "fit_traffic_growth",
    "traffic_per_world_size",
]

GROWTH_ORDERS = ("O(1)", "O(log N)", "O(N)", "O(N^2)")
EXTRAPOLATION_BASIS = "α–β model extrapolation (not measured)"

_Basis = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class _Shape:
    """count ≈ a·lead(N) + b·second(N); a shape belongs to one growth order."""

    order: str
    lead: _Basis
    lead_label: str
    second: _Basis
    second_label: str


def _ones(n: np.ndarray) -> np.ndarray:
    return np.ones_like(n)


def _zeros(n: np.ndarray) -> np.ndarray:
    return np.zeros_like(n)


# Each order has one or two shapes: the plain a·f(N) + b, plus a variant that counters
# really take -- 2 − 2/N (ring peak bytes, bounded so O(1)), 2·⌈log2 N⌉ (tree rounds at
# non-powers of two), N² − N (parallel all-reduce's total). Orders are listed simplest first.
_SHAPES = (
    _Shape("O(1)", _zeros, "", _ones, ""),
    _Shape("O(1)", lambda n: 1.0 / n, "/N", _ones, ""),
    _Shape("O(log N)", np.log2, "log2(N)", _ones, ""),
    _Shape("O(log N)", lambda n: np.ceil(np.log2(n) - 1e-9), "⌈log2(N)⌉", _ones, ""),
    _Shape("O(N)", lambda n: n, "N", _ones, ""),
    _Shape("O(N^2)", lambda n: n**2, "N²", _ones, ""),
    _Shape("O(N^2)", lambda n: n**2, "N²", lambda n: n, "N"),
)


def _term(coef: float, label: str, first: bool) -> str:
    sign = "−" if coef < 0 else ("" if first else "+")
    magnitude = f"{abs(coef):.3g}"
    if label == "/N":
        body = f"{magnitude}/N"
    elif label:
        body = label if magnitude == "1" else f"{magnitude}·{label}"
    else:
        body = magnitude
    if first:
        return f"{sign}{body}"
    return f" {sign} {body}"


def _formula(shape: _Shape, a: float, b: float) -> str:
    ordered = [(a, shape.lead_label), (b, shape.second_label)]
    if shape.lead_label in ("", "/N"):
        ordered = [(b, shape.second_label), (a, shape.lead_label)]
    tiny = 1e-9 * max(abs(a), abs(b))  # least-squares dust, not a term
    terms = [(coef, label) for coef, label in ordered if abs(coef) > tiny]
    if not terms:
        return "0"
    return "".join(_term(coef, label, i == 0) for i, (coef, label) in enumerate(terms))


@dataclass(frozen=True)
class GrowthFit:
    """The best of the growth shapes for one counter; `a` is the leading coefficient."""

    order: str
    a: float
    b: float
    formula: str
    max_rel_error: float
    rel_residual: float
    shape: _Shape = field(repr=False)

    def predict(self, n: np.ndarray | float) -> np.ndarray:
        n_arr = np.asarray(n, dtype=float)
        return self.a * self.shape.lead(n_arr) + self.b * self.shape.second(n_arr)


def _fit_shape(
    shape: _Shape, n: np.ndarray, y: np.ndarray, weight: np.ndarray
) -> tuple[float, float, float, float]:
    """(a, b, RMS relative residual, max relative error) of one shape."""
    lead, second = shape.lead(n), shape.second(n)
    columns = [second] if not lead.any() else [lead, second]
    design = np.stack(columns, axis=1) * weight[:, None]
    coef, *_ = np.linalg.lstsq(design, y * weight, rcond=None)
    a, b = (0.0, float(coef[0])) if len(coef) == 1 else (float(coef[0]), float(coef[1]))
    prediction = a * lead + b * second
    rel = np.abs(prediction - y) * weight
    return a, b, float(np.sqrt(np.mean(rel**2))), float(rel.max())


def fit_growth(n: np.ndarray, counts: np.ndarray, tie_tolerance: float = 0.01) -> GrowthFit:
    """Pick the growth order that best explains `counts` measured at world sizes `n`.

    Each shape is fitted by least squares on relative error (so small and large N weigh
    alike); the order with the lowest RMS relative residual wins, except that a simpler
    order within `tie_tolerance` of the best is preferred. Non-constant orders must grow
    (a > 0). Needs at least three distinct world sizes: two points fit any two-parameter
    shape exactly. Byte counters should be divided by the message size first.
    """
    n_arr = np.asarray(n, dtype=float)
    y = np.asarray(counts, dtype=float)
    keep = np.isfinite(n_arr) & np.isfinite(y)
    n_arr, y = n_arr[keep], y[keep]
    if len(np.unique(n_arr)) < 3:
        raise ValueError(f"fit_growth needs >= 3 distinct world sizes, got {sorted(set(n_arr))}")
    scale = float(np.abs(y).max()) or 1.0
    weight = 1.0 / np.maximum(np.abs(y), 1e-9 * scale)
    best: dict[str, tuple] = {}
    span = n_arr.min(), n_arr.max()
    for shape in _SHAPES:
        a, b, residual, max_rel = _fit_shape(shape, n_arr, y, weight)
        growth = a * float(np.ptp(shape.lead(np.asarray(span))))
        if shape.order != "O(1)" and growth <= 1e-6 * scale:
            continue
        if shape.order not in best or residual < best[shape.order][2]:
            best[shape.order] = (a, b, residual, max_rel, shape)
    lowest = min(entry[2] for entry in best.values())
    order = next(o for o in GROWTH_ORDERS if o in best and best[o][2] <= lowest + tie_tolerance)
    a, b, residual, max_rel, shape = best[order]
    return GrowthFit(order, a, b, _formula(shape, a, b), max_rel, residual, shape)


def traffic_per_world_size(df: pd.DataFrame) -> pd.DataFrame:
    """Median over message sizes of rounds, peak-rank bytes/M and total bytes/M per (algorithm, N).

    Peak is the larger of bytes sent and received by the busiest rank. Only ok rows with
    counters (so not torch, whose traffic is not observable) enter.
    """
    rows = df[df["status"] == "ok"] if "status" in df.columns else df
    rows = rows.dropna(subset=["rounds", "max_rank_bytes_sent", "total_bytes_sent"])
    message = rows["message_bytes"].astype(float)
    peak = np.fmax(rows["max_rank_bytes_sent"], rows.get("max_rank_bytes_recv", np.nan))
    rows = rows.assign(
        peak_per_M=peak.astype(float) / message,
        total_per_M=rows["total_bytes_sent"].astype(float) / message,
    )
    grouped = rows.groupby(["algorithm", "world_size"], as_index=False)
    return grouped[["rounds", "peak_per_M", "total_per_M"]].median()


def fit_traffic_growth(traffic: pd.DataFrame) -> dict[str, dict[str, GrowthFit]]:
    """`fit_growth` of rounds, peak/M and total/M per algorithm (keys "rounds", "peak", "total").

    An algorithm measured at fewer than three world sizes gets no entry for that column.
    """
    fits: dict[str, dict[str, GrowthFit]] = {}
    columns = {"rounds": "rounds", "peak": "peak_per_M", "total": "total_per_M"}
    for algorithm, group in traffic.groupby("algorithm"):
        fits[str(algorithm)] = {}
        for key, column in columns.items():
            try:
                fits[str(algorithm)][key] = fit_growth(group["world_size"], group[column])
            except ValueError:
                continue
    return fits


@dataclass(frozen=True)
class AlphaBetaFit:
    """time ≈ alpha_s·rounds + beta_s_per_byte·peak_bytes, fitted over `n_rows` cells."""

    alpha_s: float
    beta_s_per_byte: float
    r2: float
    median_rel_error: float
    n_rows: int
    scope: str

    @property
    def beta_gbps(self) -> float:
        """1/β as GB/s (1e9 bytes/s); infinite when the fit found no per-byte cost."""
        return float("inf") if self.beta_s_per_byte <= 0 else 1e-9 / self.beta_s_per_byte

    def predict(self, rounds: np.ndarray | float, peak_bytes: np.ndarray | float) -> np.ndarray:
        return self.alpha_s * np.asarray(rounds, float) + self.beta_s_per_byte * np.asarray(
            peak_bytes, float
        )


def _alpha_beta_rows(df: pd.DataFrame) -> pd.DataFrame:
    rows = df[df["algorithm"] != "torch"]
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    peak = np.fmax(rows["max_rank_bytes_sent"], rows.get("max_rank_bytes_recv", np.nan))
    rows = rows.assign(peak_bytes=peak.astype(float)).dropna(
        subset=["time_s", "rounds", "peak_bytes"]
    )
    return rows[rows["time_s"] > 0]  # a time of zero was not measured (and has no weight)


def _fit_rows(rows: pd.DataFrame, scope: str) -> AlphaBetaFit:
    if len(rows) < 2:
        raise ValueError(f"α–β fit for {scope} needs >= 2 ok rows, got {len(rows)}")
    time = rows["time_s"].to_numpy(float)
    design = rows[["rounds", "peak_bytes"]].to_numpy(float)
    # On relative error (`bench.kit.fit`): times span 4 KiB to 64 MiB messages.
    alpha, beta = link_fit.fit_alpha_beta(design[:, 0], design[:, 1], time, "least_squares")
    predicted = design @ np.array([alpha, beta])
    total = float(np.sum((time - time.mean()) ** 2))
    r2 = 1.0 - float(np.sum((time - predicted) ** 2)) / total if total > 0 else float("nan")
    median_rel = float(np.median(np.abs(predicted - time) / time))
    return AlphaBetaFit(float(alpha), float(beta), r2, median_rel, len(rows), scope)


def fit_alpha_beta(df: pd.DataFrame) -> AlphaBetaFit:
    """One machine-wide α–β fit over every ok row of the from-scratch algorithms.

    Non-negative least squares on relative error. R² is on the linear time scale.
    """
    return _fit_rows(_alpha_beta_rows(df), scope="all algorithms")


def fit_alpha_beta_per_algorithm(df: pd.DataFrame) -> dict[str, AlphaBetaFit]:
    """`fit_alpha_beta` per algorithm; algorithms with fewer than two ok rows are left out."""
    fits = {}
    for algorithm, rows in _alpha_beta_rows(df).groupby("algorithm"):
        if len(rows) >= 2:
            fits[str(algorithm)] = _fit_rows(rows, scope=str(algorithm))
    return fits


def _predict_or_nan(fits: Mapping[str, GrowthFit], key: str, n: int) -> float:
    return float(fits[key].predict(n)) if key in fits else float("nan")


def extrapolate(
    growth_fits: Mapping[str, Mapping[str, GrowthFit]],
    alpha_beta: AlphaBetaFit | Mapping[str, AlphaBetaFit],
    n: int = 1024,
    message_bytes: int = 64 * 2**20,
) -> pd.DataFrame:
    """Predicted rounds, peak-rank bytes, total bytes and time per algorithm at world size n.

    `growth_fits` is `fit_traffic_growth`'s output (bytes in units of M); `alpha_beta` is
    one fit for all algorithms or a per-algorithm mapping (an algorithm without its own fit
    gets NaN time). Every value is a model prediction, labelled in the `basis` column.
    """
    records = []
    for algorithm, fits in growth_fits.items():
        rounds = _predict_or_nan(fits, "rounds", n)
        peak = _predict_or_nan(fits, "peak", n) * message_bytes
        total = _predict_or_nan(fits, "total", n) * message_bytes
        model = alpha_beta.get(algorithm) if isinstance(alpha_beta, Mapping) else alpha_beta
        time = float(model.predict(rounds, peak)) if model is not None else float("nan")
        records.append(
            {
                "algorithm": algorithm,
                "world_size": n,
                "message_bytes": message_bytes,
                "rounds": rounds,
                "peak_bytes": peak,
                "total_bytes": total,
                "time_s": time,
                "algbw_gbps": message_bytes / time / 1e9 if time > 0 else float("nan"),
                "basis": EXTRAPOLATION_BASIS,
            }
        )
    return pd.DataFrame.from_records(records)
