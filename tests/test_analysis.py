"""Growth-order, α–β and extrapolation fits on synthetic data whose answer is known.

A failure here means a report could put the wrong O(·) beside the lecture's (so a ✓/✗
would be wrong), misstate the fitted latency or bandwidth, or extrapolate from the wrong
formula.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.experiments.allreduce_scaling.fits import (
    EXTRAPOLATION_BASIS,
    AlphaBetaFit,
    extrapolate,
    fit_alpha_beta,
    fit_alpha_beta_per_algorithm,
    fit_growth,
    fit_traffic_growth,
    traffic_per_world_size,
)

POWERS_OF_TWO = np.array([2, 4, 8])
TWO_TO_EIGHT = np.arange(2, 9)

# (order, counts as a function of N, formula printed) for every shape the fit knows.
FORMS = [
    ("O(1)", lambda n: np.full(n.shape, 5.0), "5"),
    ("O(1)", lambda n: 2 - 2 / n, "2 − 2/N"),
    ("O(log N)", lambda n: 3 * np.log2(n) + 1, "3·log2(N) + 1"),
    ("O(N)", lambda n: 2 * n - 2, "2·N − 2"),
    ("O(N)", lambda n: 0.5 * n + 3, "0.5·N + 3"),
    ("O(N^2)", lambda n: n**2 + 2, "N² + 2"),
    ("O(N^2)", lambda n: n * (n - 1), "N² − N"),
]


@pytest.mark.parametrize("world_sizes", [POWERS_OF_TWO, TWO_TO_EIGHT], ids=["pow2", "2to8"])
@pytest.mark.parametrize(("order", "counts", "formula"), FORMS, ids=[f[2] for f in FORMS])
def test_growth_fit_recovers_exact_forms(world_sizes, order, counts, formula) -> None:
    n = world_sizes.astype(float)
    fit = fit_growth(n, counts(n))
    assert fit.order == order
    assert fit.formula == formula
    assert fit.max_rel_error < 1e-9
    np.testing.assert_allclose(fit.predict(n), counts(n), rtol=1e-9)
    np.testing.assert_allclose(fit.predict(1024.0), counts(np.array(1024.0)), rtol=1e-6)
    if order != "O(1)":
        assert fit.a > 0


def test_growth_fit_takes_ceiling_log_for_non_power_of_two_rounds() -> None:
    # binomial tree and Rabenseifner on 3, 5, 6, 7 ranks take 2·⌈log2 N⌉ rounds
    fit = fit_growth(TWO_TO_EIGHT, 2 * np.ceil(np.log2(TWO_TO_EIGHT)))
    assert fit.order == "O(log N)"
    assert fit.formula == "2·⌈log2(N)⌉"


def test_growth_fit_prefers_the_simpler_order_on_a_tie() -> None:
    noisy_constant = np.array([2.0, 2.0 * (1 + 1e-4), 2.0 * (1 + 2e-4)])
    assert fit_growth(POWERS_OF_TWO, noisy_constant).order == "O(1)"


def test_growth_fit_needs_three_world_sizes() -> None:
    with pytest.raises(ValueError, match="3 distinct world sizes"):
        fit_growth([2, 4, 4], [1.0, 3.0, 3.0])


def _traffic_rows(alpha: float, beta: float) -> pd.DataFrame:
    rows = []
    for n in (2, 4, 8):
        for m in (4096, 2**20, 2**24):
            for algorithm, rounds, peak, total in (
                ("ring", 2 * (n - 1), 2 * (n - 1) * m / n, 2 * (n - 1) * m),
                ("parallel", 1, (n - 1) * m, n * (n - 1) * m),
            ):
                rows.append(
                    {
                        "algorithm": algorithm,
                        "world_size": n,
                        "message_bytes": m,
                        "rounds": rounds,
                        "max_rank_bytes_sent": peak,
                        "max_rank_bytes_recv": peak,
                        "total_bytes_sent": total,
                        "time_s": alpha * rounds + beta * peak,
                        "status": "ok",
                    }
                )
    torch = {"algorithm": "torch", "world_size": 4, "message_bytes": 4096, "time_s": 1.0}
    failed = {**rows[0], "status": "failed", "time_s": 1e3}
    return pd.DataFrame([*rows, torch, failed])


def test_alpha_beta_recovers_known_latency_and_bandwidth() -> None:
    alpha, beta = 30e-6, 1 / 3e9
    fit = fit_alpha_beta(_traffic_rows(alpha, beta))
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    assert fit.beta_gbps == pytest.approx(3.0, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.median_rel_error < 1e-9
    assert fit.n_rows == 18  # torch and the failed row are left out


def test_alpha_beta_is_non_negative_and_tolerates_noise() -> None:
    df = _traffic_rows(0.0, 1 / 2e9)
    noise = np.random.default_rng(0).normal(1.0, 0.02, len(df))
    df["time_s"] = df["time_s"] * noise
    fit = fit_alpha_beta(df)
    assert fit.alpha_s >= 0
    assert fit.beta_gbps == pytest.approx(2.0, rel=0.05)


def test_alpha_beta_per_algorithm() -> None:
    fits = fit_alpha_beta_per_algorithm(_traffic_rows(10e-6, 1e-9))
    assert set(fits) == {"ring", "parallel"}
    for fit in fits.values():
        assert fit.alpha_s == pytest.approx(10e-6, rel=1e-6)
        assert fit.n_rows == 9


def test_traffic_is_normalised_by_message_size() -> None:
    traffic = traffic_per_world_size(_traffic_rows(1e-6, 1e-9))
    ring8 = traffic[(traffic["algorithm"] == "ring") & (traffic["world_size"] == 8)].iloc[0]
    assert ring8["rounds"] == 14
    assert ring8["peak_per_M"] == pytest.approx(1.75)
    assert ring8["total_per_M"] == pytest.approx(14)


def test_extrapolation_to_1024_ranks() -> None:
    df = _traffic_rows(20e-6, 1e-9)
    fits = fit_traffic_growth(traffic_per_world_size(df))
    model = AlphaBetaFit(20e-6, 1e-9, 1.0, 0.0, 18, "test")
    message = 2**26
    table = extrapolate(fits, model, n=1024, message_bytes=message)
    assert list(table["algorithm"]) == ["parallel", "ring"]
    assert (table["basis"] == EXTRAPOLATION_BASIS).all()
    ring = table.set_index("algorithm").loc["ring"]
    assert ring["rounds"] == pytest.approx(2046)
    assert ring["peak_bytes"] == pytest.approx(2 * 1023 / 1024 * message)
    assert ring["total_bytes"] == pytest.approx(2 * 1023 * message)
    assert ring["time_s"] == pytest.approx(20e-6 * 2046 + 1e-9 * ring["peak_bytes"])
    parallel = table.set_index("algorithm").loc["parallel"]
    assert parallel["total_bytes"] == pytest.approx(1024 * 1023 * message)
    per_algorithm = extrapolate(fits, {"ring": model}, n=1024, message_bytes=message)
    assert np.isnan(per_algorithm.set_index("algorithm").loc["parallel", "time_s"])
