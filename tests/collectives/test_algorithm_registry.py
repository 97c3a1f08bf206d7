"""Every registered all-reduce algorithm declares every piece its consumers read.

A failure means a spec in `impls.collectives.algorithms.ALGORITHMS` lacks a piece (a
function, a critical path the α–β model can price, the lecture's O(·) orders or an
explicit None) or declares one that is malformed: `algorithm="auto"` would raise on it,
or the allreduce_scaling report would compare its traffic with an order it cannot read.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from bench.experiments.allreduce_scaling.fits import GROWTH_ORDERS
from impls.collectives import AllReduceTuner
from impls.collectives.algorithms import ALGORITHMS, ORDER_COLUMNS, AllReduceAlgorithm
from impls.costmodel.comm import ALLREDUCE_PATHS, allreduce_seconds
from impls.costmodel.hardware import Link
from tests.literal_names import literal_name_lists

LINK = Link(name="test", alpha_s=1e-5, bandwidth=1e9)


def missing_pieces(spec: AllReduceAlgorithm) -> list[str]:
    """What `spec` lacks or gets wrong; empty when every consumer can read it."""
    missing = []
    try:
        inspect.signature(spec.run).bind("flat", "comm", "op")
    except (TypeError, ValueError):
        missing.append("run (a function of (flat tensor, communicator, op))")
    if not callable(spec.critical_path):
        return [*missing, "critical_path (not callable)"]
    for n in (2, 3, 4, 8):
        messages, volume = spec.critical_path(1e6, n)
        if isinstance(messages, bool) or not isinstance(messages, int) or messages < 1:
            missing.append(f"critical_path (n={n}: {messages!r} messages)")
        if not volume > 0:
            missing.append(f"critical_path (n={n}: {volume!r} bytes)")
    if spec.name in ALLREDUCE_PATHS and ALLREDUCE_PATHS[spec.name] is not spec.critical_path:
        missing.append("critical_path (differs from the cost model's of the same name)")
    try:
        tuner = AllReduceTuner.from_link(LINK, algorithms=(spec.name,))
        tuner.predict(spec.name, 1e6, 4)
    except (ValueError, KeyError) as error:
        missing.append(f"cost model (the tuner cannot price it: {error})")
    if spec.orders is not None:
        bad = {
            c: o for c, o in spec.orders.items() if c not in ORDER_COLUMNS or o not in GROWTH_ORDERS
        }
        if bad or not spec.orders:
            missing.append(
                f"orders ({bad or 'empty'}: columns {ORDER_COLUMNS}, "
                f"orders {GROWTH_ORDERS}; None when not in the lecture)"
            )
    return missing


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_declares_every_piece(name: str) -> None:
    spec = ALGORITHMS[name]
    assert spec.name == name, f"registered as {name!r}, named {spec.name!r}"
    assert missing_pieces(spec) == []


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_the_tuner_prices_the_declared_critical_path(name: str) -> None:
    """`algorithm="auto"` predicts each algorithm from its own spec's path."""
    tuner = AllReduceTuner.from_link(LINK)
    for n in (2, 5, 8):
        want = allreduce_seconds(1 << 24, n, LINK, ALGORITHMS[name].critical_path)
        assert tuner.predict(name, 1 << 24, n) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(
    ("change", "piece"),
    [
        ({"run": None}, "run"),
        ({"critical_path": None}, "critical_path"),
        ({"critical_path": lambda nbytes, n: (0, 0.0)}, "critical_path"),
        ({"orders": {"rounds": "O(n)"}}, "orders"),
        ({"orders": {}}, "orders"),
    ],
)
def test_a_spec_missing_a_piece_is_caught(change: dict, piece: str) -> None:
    """The check above is not vacuous: break one piece of the ring's spec and it names it."""
    broken = replace(ALGORITHMS["ring"], **change)
    assert any(m.startswith(piece) for m in missing_pieces(broken)), missing_pieces(broken)


# Lists that name algorithms for a reason of their own (the report files are being
# rewritten elsewhere; an entry that disappears is not an error).
NAMED_FOR_A_REASON = {
    # the report's busbw table: the two fastest from-scratch algorithms and auto, beside torch
    ("bench/experiments/allreduce_scaling/report.py", ("ring", "recursive_halving", "auto")),
}


def test_no_literal_list_of_algorithm_names_outside_the_registry() -> None:
    """A list of algorithm names in bench/ or impls/ goes stale when an algorithm is added:
    read it off `ALGORITHMS`."""
    skip = ("impls/collectives/algorithms.py", "impls/collectives/spec.py")
    found = literal_name_lists(ALGORITHMS, skip=skip)
    assert [hit for hit in found if hit not in NAMED_FOR_A_REASON] == []
