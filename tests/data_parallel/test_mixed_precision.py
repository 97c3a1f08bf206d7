"""Data parallelism in fp16 (dynamic or static loss scale) and bf16 tracks fp32, and an
overflow on one rank makes every rank skip the step.

A failure means a low-precision DP run trains a different model than fp32 (gradients
not unscaled, all-reduced in the wrong dtype, master weights not copied back), or that
ranks disagree about an overflow — one rank steps while another skips, and the replicas
silently diverge.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.data_parallel.cases import LOW_PRECISION_CASES, OVERFLOW_CASES
from tests.data_parallel.dp_ranks import Case, overflow_agreement
from tests.data_parallel.test_equivalence import check_replicas_identical

# Relative rounding of the dtype the model runs in; 3-4 steps of forward/backward and the
# gradient all-reduce in that dtype accumulate a few of them. The bounds are ~5x what
# was measured (fp16 ≤ 1.1e-3, bf16 ≤ 8e-3 on the parameters, Adam, lr 1e-2).
TOLERANCE = {"fp16": 5e-3, "bf16": 4e-2}


def _check_tracks_fp32(case: Case, outputs: list[dict], skip: int | None = None) -> None:
    want_losses, want_params = case.reference()
    tol = TOLERANCE[case.precision]
    steps = [s for s in range(case.steps) if s != skip]
    mean_losses = torch.tensor([[out["losses"][s] for s in steps] for out in outputs]).mean(0)
    want = torch.tensor([want_losses[s] for s in steps])
    torch.testing.assert_close(mean_losses, want, rtol=tol, atol=0)
    for rank, out in enumerate(outputs):
        for name, value in want_params.items():
            torch.testing.assert_close(
                out["params"][name], value, rtol=0, atol=tol, msg=f"rank {rank} {name}"
            )


@pytest.mark.parametrize("case", LOW_PRECISION_CASES, ids=lambda c: c.name)
def test_low_precision_tracks_fp32(dp_results, case: Case) -> None:
    outputs = dp_results[case]
    assert all(all(out["stepped"]) for out in outputs)
    _check_tracks_fp32(case, outputs)
    check_replicas_identical(outputs)


@pytest.mark.parametrize("case", OVERFLOW_CASES, ids=lambda c: c.name)
def test_an_overflow_on_one_rank_is_skipped_on_every_rank(dp_results, case: Case) -> None:
    outputs = dp_results[case]
    skip = case.overflow_step
    for rank, out in enumerate(outputs):
        assert out["stepped"] == [s != skip for s in range(case.steps)], f"rank {rank}"
        # The default dynamic scale 2^16, halved once by the overflow.
        want = [2.0**16 if s <= skip else 2.0**15 for s in range(case.steps)]
        assert out["scales"] == want, f"rank {rank}"
    assert math.isnan(outputs[-1]["losses"][skip])
    # The reference skips the same step; the others must still track fp32.
    _check_tracks_fp32(case, outputs, skip=skip)
    check_replicas_identical(outputs)


def test_the_parameter_server_tells_workers_the_loss_scale(dp_results) -> None:
    """Under loss scaling the pull carries a 16-byte (scale, applied) message per worker."""
    case = next(c for c in OVERFLOW_CASES if c.variant == "ps")
    server = dp_results[case][0]
    m = server["numel"] * 2  # fp16 gradients and weights
    for traffic in server["traffic"]:
        assert traffic["bytes_recv"] == (case.world_size - 1) * m
        assert traffic["bytes_sent"] == (case.world_size - 1) * (m + 16)


def test_ranks_agree_on_an_overflow_only_one_of_them_saw(ranks8) -> None:
    """The replica optimizer all-reduces the overflow flag: a rank whose own gradients are
    finite still skips when another rank's are not (both scaler kinds, 4 ranks)."""
    outputs = [out for out in ranks8.run(overflow_agreement, 4) if out is not None]
    assert outputs == [[False, False]] * 4
