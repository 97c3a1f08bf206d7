"""Delayed gradient averaging (Zhu et al., NeurIPS 2021) does what its update rule says.

- delay=0 is synchronous data parallelism: N ranks train like one process on the whole
  batch, and every replica holds the same bits.
- delay=D with SGD: every rank's weights, before and after `finish()`, equal a
  single-process simulation of w_{t+1} = w_t − lr·g_t − lr·(ḡ_{t−D} − g_{t−D}) written
  here from the formula; the replicas differ during training (the staleness is real)
  and agree after `finish()`.
- Over a simulated 100 ms link with 25 ms of compute per step, D=4 hides the latency
  (wall time well below steps × (compute + latency)) while D=0 pays it every step.

A failure means the correction uses the wrong step's gradients or average, a rank
applies its own gradient twice or not at all, `finish()` leaves corrections out, the
communication thread serializes the simulated link time, or a bad delay is accepted.
"""

from __future__ import annotations

import pytest
import torch

from impls.data_parallel import shard_batch
from impls.models import MLP
from tests.data_parallel.delayed_ranks import (
    COMPUTE_S,
    LATENCY_S,
    LR,
    DelayedCase,
    bad_delays,
    run_delayed,
    timed_runs,
)
from tests.data_parallel.dp_ranks import MLP_CFG

SYNC = [DelayedCase(4, 0, 4), DelayedCase(4, 0, 4, "ring")]
DELAYED = [
    DelayedCase(4, 2, 6),
    DelayedCase(4, 3, 6, "ring"),
    DelayedCase(8, 4, 3, own_group=True),  # D > steps: every average applied by finish()
]
CASES = SYNC + DELAYED


def _name(case: DelayedCase) -> str:
    group = "-own-group" if case.own_group else ""
    return f"N{case.world_size}-D{case.delay}-{case.steps}steps-{case.algorithm}{group}"


@pytest.fixture(scope="module")
def results(ranks8) -> dict[DelayedCase, list[dict]]:
    per_rank = ranks8.run(run_delayed, CASES)
    return {
        case: [out[i] for out in per_rank if out[i] is not None] for i, case in enumerate(CASES)
    }


def dga_reference(case: DelayedCase) -> tuple[list[dict], list[dict]]:
    """Every rank's weights before and after the final corrections, from the formula.

    N model copies in one process; at step t copy r computes g_t^r on its shard at its
    own weights and takes w −= lr·(g_t^r + ḡ_{t−D} − g_{t−D}^r) (just g_t^r for t < D);
    at the end w −= lr·(ḡ_s − g_s^r) for each of the last D steps s.
    """
    n, delay = case.world_size, case.delay
    models = [MLP(MLP_CFG, seed=0) for _ in range(n)]
    local: list[list[torch.Tensor]] = []  # [step][rank] flat gradient
    averages: list[torch.Tensor] = []  # [step] rank average
    for t, (x, y) in enumerate(case.data.batches()):
        grads = []
        for r, model in enumerate(models):
            model.zero_grad(set_to_none=True)
            MLP.loss(model(shard_batch(x, r, n)), shard_batch(y, r, n)).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        local.append(grads)
        averages.append(sum(g / n for g in grads))
        for r, model in enumerate(models):
            step = grads[r]
            if t >= delay:
                step = grads[r] + (averages[t - delay] - local[t - delay][r])
            _sgd(model, step)
    before = [_snapshot(m) for m in models]
    for s in range(max(0, case.steps - delay), case.steps):
        for r, model in enumerate(models):
            _sgd(model, averages[s] - local[s][r])
    return before, [_snapshot(m) for m in models]


def _sgd(model: MLP, flat: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(flat[offset : offset + p.numel()].view_as(p), alpha=-LR)
            offset += p.numel()


def _snapshot(model: MLP) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


@pytest.mark.parametrize("case", SYNC, ids=_name)
def test_delay_zero_is_synchronous_data_parallelism(results, case) -> None:
    outputs = results[case]
    assert len(outputs) == case.world_size
    want_losses, want_params = case.data.reference()  # one process, the whole batch
    mean_losses = torch.tensor([out["losses"] for out in outputs]).mean(dim=0)
    torch.testing.assert_close(mean_losses, torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    for rank, out in enumerate(outputs):
        assert out["applied"] == list(range(case.steps))  # every step its own average
        assert out["in_flight"] == [0] * case.steps
        for name, want in want_params.items():
            got = out["after_finish"][name]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {name}")
            assert torch.equal(got, out["before_finish"][name])  # nothing left for finish
            assert torch.equal(got, outputs[0]["after_finish"][name]), f"rank {rank} {name}"


@pytest.mark.parametrize("case", DELAYED, ids=_name)
def test_delayed_averaging_follows_the_update_rule(results, case) -> None:
    outputs = results[case]
    assert len(outputs) == case.world_size
    want_before, want_after = dga_reference(case)
    d, steps = case.delay, case.steps
    for rank, out in enumerate(outputs):
        assert out["applied"] == [None] * min(d, steps) + list(range(steps - d))
        assert out["in_flight"] == [min(t + 1, d) for t in range(steps)]
        for name in want_before[rank]:
            for when, want in (("before_finish", want_before), ("after_finish", want_after)):
                torch.testing.assert_close(
                    out[when][name],
                    want[rank][name],
                    rtol=1e-5,
                    atol=1e-5,
                    msg=f"rank {rank} {name} {when}",
                )


@pytest.mark.parametrize("case", DELAYED, ids=_name)
def test_replicas_differ_while_training_and_agree_after_finish(results, case) -> None:
    outputs = results[case]
    first = outputs[0]
    for rank, out in enumerate(outputs[1:], start=1):
        # Before finish: up to D steps of local gradients apart, O(lr·|g|) = O(1e-2).
        assert _max_diff(out["before_finish"], first["before_finish"]) > 1e-3, rank
        # After: the same sum of averages, added in a different order: float32 rounding.
        assert _max_diff(out["after_finish"], first["after_finish"]) < 1e-6, rank


def test_an_owned_sync_group_is_created_and_destroyed(results) -> None:
    for case in CASES:
        for out in results[case]:
            assert out["owned_group"] == case.own_group
            assert out["closed_owned_group"]


STEPS, DELAY, REPEATS = 12, 4, 2


@pytest.fixture(scope="module")
def timings(ranks8) -> list[dict]:
    outputs = ranks8.run(timed_runs, 4, [DELAY, 0], STEPS, REPEATS)
    return [out for out in outputs if out is not None]


def test_delay_hides_the_link_latency(timings) -> None:
    serial_bound = STEPS * (COMPUTE_S + LATENCY_S)
    for per_rank in timings:
        for delay, runs in per_rank.items():
            # "parallel" all-reduce: one round per average, charged one latency (reported
            # by the step that applies it: none for the first D steps).
            for run in runs:
                assert run["rounds"] == [0] * delay + [1] * (STEPS - delay)
                assert run["simulated_s"] == pytest.approx(
                    [0.0] * delay + [LATENCY_S] * (STEPS - delay)
                )
        # The best of the repeats: other work on the machine only ever adds time.
        sync = {key: min(run[key] for run in per_rank[0]) for key in ("wall_s", "waited_s")}
        delayed = {key: min(run[key] for run in per_rank[DELAY]) for key in ("wall_s", "waited_s")}
        # Synchronous: every step waits for its own average over the link.
        assert sync["waited_s"] >= STEPS * LATENCY_S * 0.99
        assert sync["wall_s"] >= serial_bound * 0.99
        # D=4 steps of 25 ms outlast one 100 ms round: the link is hidden but for the
        # last average, which finish() waits for (ideally 12·25 + 100 = 400 ms of 1.5 s).
        assert delayed["wall_s"] < 0.6 * serial_bound, (delayed, sync)
        assert delayed["waited_s"] < 0.3 * sync["waited_s"], (delayed, sync)


def test_bad_delay_is_refused(ranks8) -> None:
    errors = ranks8.run(bad_delays)[0]
    assert all("accepted" not in e for e in errors), errors
    by_name = dict(e.split(": ", 1) for e in errors)
    for name in ("negative", "float", "bool", "string"):
        assert "delay=" in by_name[name], by_name[name]
    assert "sync_group must be a different process group" in by_name["same group"]
    assert "algorithm='butterfly'" in by_name["bad algorithm"]
