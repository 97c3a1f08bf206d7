"""Find literal lists of registered names in the source: a registry's names belong in its
registry, and every other list of them should be read off it."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def literal_name_lists(
    names: Iterable[str], *, skip: Iterable[str] = (), roots: Iterable[str] = ("bench", "impls")
) -> list[tuple[str, tuple]]:
    """(path, names) for every tuple, list or set literal under `roots` whose elements are
    all strings, two or more of them in `names`; files under a `skip` prefix are left out."""
    wanted, skipped = set(names), tuple(skip)
    found = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(skipped):
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if not isinstance(node, ast.Tuple | ast.List | ast.Set):
                    continue
                values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if len(values) != len(node.elts) or not all(isinstance(v, str) for v in values):
                    continue
                if len(wanted.intersection(values)) >= 2:
                    found.append((rel, tuple(values)))
    return found
