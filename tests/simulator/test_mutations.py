"""The simulator's model checks against deliberate model errors.

A failure of `test_model_passes_every_check` means the model disagrees with a measurement
or physical limit of `model_checks.py`: a link slower or faster than nccl-tests measured,
a layer's kernels or memory miscounted, communication hidden where no compute covers it,
or the published runs priced worse than the ratchet allows. A failure of
`test_mutation_is_caught` means a deliberate error of `mutations.py` left every check
passing: the checks no longer guard that term (or the mutation's patch target moved: see
`mutations.TARGETS`). A failure of `test_readme_lists_what_catches_each_mutation` means
README.md's "Model mutations" table names a check that does not catch its error, or leaves
out a physical check that does; its message gives the rows as they should read.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.simulator import model_checks
from tests.simulator.mutations import MUTATIONS

README = Path(__file__).resolve().parents[2] / "README.md"
BY_NAME = {m.name: m for m in MUTATIONS}


@cache
def _baseline() -> frozenset[str]:
    return frozenset(model_checks.run_checks())


@cache
def caught(name: str) -> frozenset[str]:
    """The checks that fail under mutation `name` and pass without it."""
    with BY_NAME[name].apply():
        failing = frozenset(model_checks.run_checks())
    return failing - _baseline()


def test_model_passes_every_check():
    failures = model_checks.run_checks()
    assert not failures, "\n".join(f"{name}: {why}" for name, why in failures.items())


def test_registries_are_well_formed():
    checks = [c.__name__ for c in model_checks.CHECKS]
    assert len(set(checks)) == len(checks) and len(BY_NAME) == len(MUTATIONS) >= 10
    assert all(m.description and "\n" not in m.description for m in MUTATIONS)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_mutation_is_caught(mutation, record_property):
    checks = caught(mutation.name)
    record_property("caught_by", ", ".join(sorted(checks)))  # in the JUnit report
    assert checks, f"{mutation.name} ({mutation.description}): no check fails"


def test_model_is_restored_after_the_mutations():
    for mutation in MUTATIONS:
        caught(mutation.name)
    assert frozenset(model_checks.run_checks()) == _baseline()


def _readme_table() -> dict[str, tuple[str, set[str]]]:
    """{mutation: (what it breaks, {checks})} from README.md's "Model mutations" table."""
    text = README.read_text()
    section = text.split("## Model mutations", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], set(re.findall(r"`(\w+)`", cells[2])))
    return rows


def _physical(checks: frozenset[str]) -> list[str]:
    """The checks whose verdict does not hinge on a ratchet's margin: the accuracy checks on
    the published runs (`published_*`) may catch a mutation one day and not the next as
    the model moves, so the table need not list them, but may only list them truly."""
    return sorted(c for c in checks if not c.startswith("published_"))


def _row(name: str) -> str:
    checks = ", ".join(f"`{c}`" for c in _physical(caught(name)))
    return f"| `{name}` | {BY_NAME[name].description} | {checks} |"


def test_readme_lists_what_catches_each_mutation():
    table = _readme_table()
    expected = "\n".join(_row(m.name) for m in MUTATIONS)
    assert list(table) == [m.name for m in MUTATIONS], f"README rows should read:\n{expected}"
    for name, (_, listed) in table.items():
        found = caught(name)
        assert set(_physical(found)) <= listed <= found, (
            f"{name}: README lists {sorted(listed)}, caught by {sorted(found)}; rows should "
            f"read:\n{expected}"
        )
