"""The memory cost model against the lecture, the ZeRO paper and what torch actually does.

A failure here means the theory side of issue #4 is wrong where it is checkable: the
lecture's 5B / 19B / 36B / 320B for 80 GB at N = 64 not reproduced, the ZeRO paper's
Figure 1 memory for its 7.5B model misstated, `max_trainable_params` not the largest model
that fits, padding that disagrees with how a flat buffer is really cut into N shards, a
traffic formula that disagrees with distbench's own collectives' byte counters — or that
bad input is accepted. The activation model is tested in `test_activations.py`.
"""

from __future__ import annotations

import math

import pytest
import torch

from impls.costmodel import (
    MIXED_PRECISION_ADAM,
    PRESETS,
    STAGES,
    BytesPerParam,
    bytes_per_param_for,
    comm_bytes_per_step,
    comm_psi_multiple,
    floor_billions,
    max_trainable_params,
    model_state_bytes,
)
from tests.costmodel.comm_ranks import steps_traffic

GB = 1e9  # the lecture's GB: 80 GB / 16 bytes = 5.0B needs 1e9, not 2**30


def test_lecture_largest_models_at_80gb_n64() -> None:
    """Lecture slides "ZeRO-1 / 2 / 3 and FSDP": 5.0B, 19B, 36B, 320B (floored billions)."""
    fits = [max_trainable_params(80 * GB, stage, 64) for stage in STAGES]
    assert [floor_billions(f) for f in fits] == [5, 19, 36, 320]
    # The exact counts behind them: 80e9 / 16, 80e9 / (4 + 12/64), 80e9 / (2 + 14/64),
    # 80e9 / (16/64), floored to whole parameters.
    assert fits == [5_000_000_000, 19_104_477_611, 36_056_338_028, 320_000_000_000]


def test_zero_paper_figure_1_per_device_memory() -> None:
    """ZeRO paper Fig. 1: Ψ = 7.5B, N = 64, K = 12 → 120, 31.4, 16.6, 1.9 GB per device."""
    got = [model_state_bytes(7.5e9, stage, 64).total / GB for stage in STAGES]
    # The figure prints one decimal place: 31.40625 → 31.4, 16.640625 → 16.6, 1.875 → 1.9.
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]
    parts = model_state_bytes(7.5e9, 2, 64)
    assert (parts.weights, parts.gradients, parts.optimizer) == (15e9, 15e9 / 64, 90e9 / 64)


@pytest.mark.parametrize("precision", list(PRESETS))
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("dp, mp", [(1, 1), (3, 1), (64, 1), (7, 4), (1024, 2)])
def test_max_trainable_params_is_the_largest_that_fits(precision, stage, dp, mp) -> None:
    """Brute-force reference: Ψ fits, Ψ + 1 does not (model states of Ψ/mp per device)."""
    b = bytes_per_param_for(precision)
    memory = 3_000_000_007  # odd, so that no formula lands on a whole number by luck
    fit = max_trainable_params(memory, stage, dp, mp, b)

    def fits(psi: int) -> bool:
        # Integers throughout, so the reference has no rounding of its own: compare
        # N·mp·bytes with N·mp·memory (every stage's bytes × N are whole numbers here).
        whole = [b.weights, b.gradients, b.optimizer]
        sharded = [stage >= 3, stage >= 2, stage >= 1]
        scaled = sum(int(w) * (psi if s else psi * dp) for w, s in zip(whole, sharded, strict=True))
        return scaled <= memory * mp * dp

    assert fits(fit) and not fits(fit + 1)


def test_model_parallel_degree_multiplies_the_model() -> None:
    assert max_trainable_params(80 * GB, 0, 1, mp=8) == 8 * 5_000_000_000
    # The given model split over mp devices costs each of them its 1/mp share.
    assert model_state_bytes(7.5e9 / 8, 0, 1).total == pytest.approx(120 * GB / 8, rel=1e-15)


def test_presets_and_default() -> None:
    assert MIXED_PRECISION_ADAM.total == 16  # 2 + 2 + 12: the lecture's 16 bytes
    assert PRESETS["fp32"].total == 16  # 4 + 4 + 8: no master copy, same total
    assert (PRESETS["fp32"].weights, PRESETS["fp32"].optimizer) == (4, 8)
    assert PRESETS["bf16"] == PRESETS["fp16"] == MIXED_PRECISION_ADAM


@pytest.mark.parametrize("dp", [1, 2, 3, 4, 7, 8])
@pytest.mark.parametrize("units", [[17], [10, 7, 1], [64, 33]])
def test_padding_matches_chunking_a_padded_flat_buffer(dp, units) -> None:
    """pad=True holds exactly the elements every rank's chunk of each N-padded unit has."""
    for rank in range(dp):
        shard = sum(torch.zeros(math.ceil(u / dp) * dp).chunk(dp)[rank].numel() for u in units)
        for stage in STAGES:
            got = model_state_bytes(units, stage, dp, PRESETS["fp32"], pad=True)
            full = sum(units)
            assert got.weights == 4 * (shard if stage == 3 else full)
            assert got.gradients == 4 * (shard if stage >= 2 else full)
            assert got.optimizer == 8 * (shard if stage >= 1 else full)
            # A padded shard holds less than one element per unit more than Ψ_u / N, so
            # padding adds under 16 bytes (P + G + O) per unit: an exact bound.
            extra = got.total - model_state_bytes(units, stage, dp, PRESETS["fp32"]).total
            assert 0 <= extra < 16 * len(units)


def test_comm_psi_multiples() -> None:
    """ZeRO paper §7: DP, ZeRO-1 and ZeRO-2 move 2Ψ per step, ZeRO-3 3Ψ (ring: ×(N−1)/N)."""
    assert [comm_psi_multiple(s, 8) for s in STAGES] == [1.75, 1.75, 1.75, 2.625]
    assert [round(comm_psi_multiple(s, 10**9), 6) for s in STAGES] == [2, 2, 2, 3]
    assert comm_bytes_per_step(1000, 3, 1, 2) == 0  # one rank talks to no one
    assert comm_bytes_per_step(1000, 1, 4, 2) == 2 * 1000 * 3 / 4 * 2


def test_comm_bytes_match_distbench_collectives(ranks8) -> None:
    """The counters of distbench's own ring collectives, one ZeRO step's worth, on N ranks.

    Stages 1–3 shard padded units, so pad=True must match every rank exactly. Stage 0's
    ring all-reduce cuts an unpadded buffer into uneven chunks: ranks differ by a chunk
    element or so, but the mean over ranks is exactly 2Ψ(N−1)/N, and no rank exceeds the
    padded count.
    """
    units = [37, 20, 8]
    cases = [(n, stage) for n in (1, 2, 3, 4, 8) for stage in STAGES]
    per_rank = ranks8.run(steps_traffic, cases, units)
    errors = []
    for i, (n, stage) in enumerate(cases):
        sent = [rank[i] for rank in per_rank[:n]]
        padded = comm_bytes_per_step(units, stage, n, 4, pad=True)
        where = f"N={n} stage={stage}"
        if stage == 0:
            mean = sum(sent) / n
            if mean != comm_bytes_per_step(units, 0, n, 4):
                errors.append(f"{where}: mean sent {mean}")
            if max(sent) > padded:
                errors.append(f"{where}: max sent {max(sent)} > padded {padded}")
        elif set(sent) != {padded}:
            errors.append(f"{where}: sent {sent}, predicted {padded}")
    assert errors == []


@pytest.mark.parametrize(
    "call, needles",
    [
        (lambda: model_state_bytes(1e9, 4, 8), ["stage=4", "0, 1, 2, 3"]),
        (lambda: model_state_bytes(1e9, True, 8), ["stage=True"]),
        (lambda: model_state_bytes(1e9, 1, 0), ["dp=0", "≥ 1"]),
        (lambda: model_state_bytes(-5, 1, 2), ["params=-5", "≥ 0"]),
        (lambda: model_state_bytes(10.5, 1, 2, pad=True), ["params=10.5", "whole"]),
        (lambda: max_trainable_params(-1, 0, 1), ["gpu_memory_bytes=-1"]),
        (lambda: max_trainable_params(80e9, 0, 1, mp=0), ["mp=0"]),
        (lambda: BytesPerParam(optimizer=0), ["bytes_per_param.optimizer=0", "> 0"]),
        (lambda: BytesPerParam(weights=-2), ["bytes_per_param.weights=-2"]),
        (lambda: bytes_per_param_for("fp8"), ["precision='fp8'", "fp32, fp16, bf16"]),
    ],
)
def test_bad_input_names_the_key(call, needles) -> None:
    with pytest.raises(ValueError) as error:
        call()
    for needle in needles:
        assert needle in str(error.value)
