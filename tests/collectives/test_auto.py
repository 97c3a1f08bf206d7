"""`all_reduce(..., algorithm="auto")` and the tuner behind it (issue #14).

A failure here means auto could pick a different algorithm than the α–β model it claims
to follow, fit a cost table that is not the measured one, let ranks build different
tables (they would then run different algorithms and deadlock), leave calibration traffic
in the caller's counters, or return something other than torch's all-reduce."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from bench.experiments.allreduce_scaling import experiment as allreduce_experiment
from bench.experiments.allreduce_scaling.config import AllReduceScalingConfig
from bench.kit.collectives import calibration_sizes
from impls.collectives import ALGORITHMS, AllReduceTuner, all_reduce
from impls.collectives.tuner import GLOO_LOOPBACK, MeasuredCost, fit_two_points
from impls.costmodel.comm import ALLREDUCE_ALGORITHMS, allreduce_seconds, best_allreduce
from impls.costmodel.hardware import Link
from impls.costmodel.presets import hardware
from tests.rank_support import mismatch, pattern, prefix_communicator

LINKS = (GLOO_LOOPBACK, hardware("a100_80gb").intra, Link(name="slow", alpha_s=1e-3, bandwidth=1e8))
SIZES = (1, 4096, 100_000, 1 << 20, 64 << 20, 1 << 30)


@pytest.mark.parametrize("link", LINKS, ids=lambda link: link.name)
def test_choice_from_a_link_is_best_allreduce(link):
    tuner = AllReduceTuner.from_link(link, algorithms=ALLREDUCE_ALGORITHMS)
    for n in range(1, 10):
        for nbytes in SIZES:
            want, seconds = best_allreduce(nbytes, n, link)
            assert tuner.choose(nbytes, n) == want, (link.name, n, nbytes)
            assert tuner.last_choice == want
            for algorithm in ALLREDUCE_ALGORITHMS:
                model = allreduce_seconds(nbytes, n, link, algorithm)
                assert tuner.predict(algorithm, nbytes, n) == pytest.approx(model, rel=1e-9)
            assert tuner.predict(want, nbytes, n) == pytest.approx(seconds, rel=1e-9)


def test_ties_go_to_the_first_listed_algorithm():
    # parameter_server and sequential cost the same on a link: the order decides.
    link = LINKS[0]
    first = AllReduceTuner.from_link(link, algorithms=["sequential", "parameter_server"])
    second = AllReduceTuner.from_link(link, algorithms=["parameter_server", "sequential"])
    assert (first.choose(4096, 4), second.choose(4096, 4)) == ("sequential", "parameter_server")


def test_two_point_fit_recovers_alpha_and_beta():
    alpha, beta = 3.7e-4, 2.5e-10
    sizes = (4096, 64 << 20)
    cost = fit_two_points(sizes, [alpha + beta * m for m in sizes])
    assert cost.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert cost.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    assert cost.seconds(1 << 20) == pytest.approx(alpha + beta * (1 << 20), rel=1e-9)
    falling = fit_two_points(sizes, [2e-3, 1e-3])  # noise, never a negative cost
    assert (falling.alpha_s, falling.beta_s_per_byte) == (2e-3, 0.0)
    steep = fit_two_points(sizes, [1e-6, 1.0])  # the line would cross zero above M = 0
    assert steep.alpha_s == 0.0 and steep.beta_s_per_byte > 0
    with pytest.raises(ValueError, match="two sizes"):
        fit_two_points((4096, 4096), [1.0, 2.0])


def test_measured_cost_is_exact_at_each_size_and_linear_between():
    cost = MeasuredCost((4096, 65536, 1 << 20), (1e-3, 0.8e-3, 4e-3))
    for m, t in zip(cost.sizes, cost.times, strict=True):
        assert cost.seconds(m) == pytest.approx(t, rel=1e-12)
    mid = (65536 + (1 << 20)) / 2
    assert cost.seconds(mid) == pytest.approx((0.8e-3 + 4e-3) / 2, rel=1e-12)
    assert cost.seconds(1024) == 1e-3  # below: the first range falls (noise), so flat
    above = (4e-3 - 0.8e-3) / ((1 << 20) - 65536)
    assert cost.seconds(2 << 20) == pytest.approx(4e-3 + above * (1 << 20), rel=1e-12)
    rising = MeasuredCost((1000, 2000), (1e-6, 1e-3))  # its line would cross zero above M = 0
    assert rising.seconds(0) == 0.0 and rising.seconds(1500) > 0
    # the summary line is the two-point fit through the end sizes
    assert cost.line == fit_two_points((4096, 1 << 20), (1e-3, 4e-3))
    with pytest.raises(ValueError, match="increase"):
        MeasuredCost((4096, 4096), (1.0, 2.0))
    with pytest.raises(ValueError, match="need ≥ 2"):
        MeasuredCost((4096,), (1.0,))


def test_a_calibrated_table_picks_the_fastest_measured_at_each_size():
    fast_small = MeasuredCost((4096, 1 << 20, 64 << 20), (1e-4, 1e-3, 0.2))
    fast_large = MeasuredCost((4096, 1 << 20, 64 << 20), (1e-3, 2e-3, 0.05))
    tuner = AllReduceTuner(
        {("tree", 4): fast_small, ("ring", 4): fast_large}, algorithms=["ring", "tree"]
    )
    assert [tuner.choose(m, 4) for m in (4096, 1 << 20, 64 << 20)] == ["tree", "tree", "ring"]


def test_uncalibrated_tuner_without_a_link_names_what_is_missing():
    with pytest.raises(ValueError, match="calibrate on a group of 4 ranks"):
        AllReduceTuner().choose(4096, 4)


def test_unknown_algorithm_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"algorithm='bogus'.*allowed values: .*tree, auto"):
        all_reduce(torch.zeros(1), comm=None, algorithm="bogus")
    with pytest.raises(ValueError, match="algorithms=.*'bogus'.*allowed values"):
        AllReduceTuner(algorithms=["ring", "bogus"])


def _rank_clock(rank: int):
    """A clock on which every window of rank r lasts (r + 1) ms: ranks disagree on purpose."""
    now = [0.0]

    def clock() -> float:
        now[0] += (rank + 1) * 1e-3  # a window is read at its start and its end
        return now[0]

    return clock


def check_fake_clock_tables(k: int) -> list[str]:
    comm = prefix_communicator(k)
    if comm is None:
        return []
    tuner = AllReduceTuner().calibrate(
        comm, (64, 4096), repeats=2, window_s=0.0, clock=_rank_clock(comm.rank)
    )
    tables = [None] * k
    dist.all_gather_object(tables, tuner.table, group=comm.group)
    errors = [
        f"N={k}: rank {r}'s table differs from rank 0's" for r in range(k) if tables[r] != tables[0]
    ]
    for (name, n), cost in tuner.table.items():
        # The slowest rank's windows (k ms each, one call): α = k ms, β = 0, on every rank.
        if n != k or not math.isclose(cost.alpha_s, k * 1e-3) or cost.beta_s_per_byte != 0:
            errors.append(f"N={k} {name}: {cost} is not the slowest rank's {k} ms")
    return errors


def check_auto_against_torch(k: int) -> list[str]:
    comm = prefix_communicator(k)
    if comm is None:
        return []
    errors, choices = [], []
    for calibrated in (False, True):
        if calibrated:
            calls, counters = comm.calls.copy(), comm.counters.copy()
            comm.tuner = AllReduceTuner().calibrate(comm, (256, 1 << 16), repeats=1, window_s=0)
            if comm.calls != calls or comm.counters != counters:
                errors.append(f"N={k}: calibration left {comm.calls - calls} in the counters")
            tables = [None] * k
            dist.all_gather_object(tables, comm.tuner.table, group=comm.group)
            if any(t != tables[0] for t in tables):
                errors.append(f"N={k}: ranks calibrated different tables")
        for numel in (0, 1, 7, 1003, 1 << 14, 100_003):
            data = pattern(comm.rank, numel, torch.float32)
            want = data.clone()
            dist.all_reduce(want, group=comm.group)
            got = all_reduce(data, comm, algorithm="auto")
            choices.append(comm.tuner.last_choice)
            err = mismatch(
                f"auto N={k} numel={numel} tuned={calibrated}", got, want, rtol=0, atol=0
            )
            errors += [err] if err else []
    gathered = [None] * k
    dist.all_gather_object(gathered, choices, group=comm.group)
    if any(g != gathered[0] for g in gathered):
        errors.append(f"N={k}: ranks chose differently: {gathered}")
    if not set(choices) <= set(ALGORITHMS):
        errors.append(f"N={k}: chose {set(choices)}")
    return errors


@pytest.mark.parametrize("k", range(1, 9))
def test_every_rank_fits_the_slowest_ranks_table(ranks8, k):
    errors = [e for rank_errors in ranks8.run(check_fake_clock_tables, k) for e in rank_errors]
    assert not errors, "\n".join(errors[:20])


def test_auto_equals_torch_all_reduce(ranks8):
    errors = []
    for k in range(1, 9):
        errors += [
            e for rank_errors in ranks8.run(check_auto_against_torch, k) for e in rank_errors
        ]
    assert not errors, "\n".join(errors[:20])


def test_allreduce_scaling_accepts_auto_and_times_it_as_distbench():
    cfg = AllReduceScalingConfig(
        algorithms=["auto", "ring"], world_sizes=[2], message_bytes=[4096, 1 << 20]
    )
    assert "auto" in AllReduceScalingConfig().algorithms
    calls = {c.key["algorithm"]: c.carry for c in allreduce_experiment.cells(cfg)}
    assert (calls["auto"].impl, calls["auto"].algorithm) == ("distbench", "auto")
    with pytest.raises(ValueError, match="allowed values.*auto"):
        AllReduceScalingConfig(algorithms=["automatic"])


def test_calibration_gives_every_algorithm_one_count_of_calls_per_window(monkeypatch):
    """Per size, each algorithm's probe asks for its own count; every window then runs the
    median of them (the fixed costs of a window then weigh alike on every algorithm)."""
    from types import SimpleNamespace

    from impls.collectives import tuner as tuner_module

    asked = {"ring": [2, 9], "tree": [12, 1], "parameter_server": [5, 4]}  # per size
    ran: dict[tuple[str, int], set[int]] = {}

    class SpyTimer:
        def __init__(self, run, comm, buf, clock):
            self.name = next(n for n, f in ALGORITHMS.items() if f.run is run)
            self.size = buf.numel() * buf.element_size()

        def calls_per_window(self, warmup, window_s, max_iters):
            return asked[self.name][0 if self.size == 64 else 1]

        def window(self, iters):
            ran.setdefault((self.name, self.size), set()).add(iters)
            return 1e-3

    monkeypatch.setattr(tuner_module, "_Timer", SpyTimer)
    monkeypatch.setattr(tuner_module, "_slowest_rank", lambda seconds, comm: None)
    comm = SimpleNamespace(counters={}, calls={}, simulated_s=0.0, device="cpu", world_size=3)
    tuner = AllReduceTuner(algorithms=list(asked)).calibrate(comm, (64, 4096), repeats=3)
    assert ran == {(name, size): {want} for name in asked for size, want in ((64, 5), (4096, 4))}
    assert set(tuner.table) == {(name, 3) for name in asked}


def test_calibration_sizes_are_every_size_of_the_grid():
    assert calibration_sizes([262144, 4096, 4194304, 4096]) == (4096, 262144, 4194304)
    assert calibration_sizes([4096]) == (4096, 65536)


def test_choices_are_remembered_until_forgotten():
    cost = MeasuredCost((4096, 1 << 20), (1e-4, 1e-3))
    tuner = AllReduceTuner(
        {("tree", 4): cost, ("ring", 4): MeasuredCost((4096, 1 << 20), (2e-4, 5e-4))},
        algorithms=["ring", "tree"],
    )
    assert tuner.choose(4096, 4) == "tree" and tuner.choose(1 << 20, 4) == "ring"
    tuner.table[("tree", 4)] = MeasuredCost((4096, 1 << 20), (1e-3, 1e-2))
    assert tuner.choose(4096, 4) == "tree"  # remembered
    tuner.forget()
    assert tuner.choose(4096, 4) == "ring" and tuner.last_choice == "ring"
