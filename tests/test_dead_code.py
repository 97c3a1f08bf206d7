"""No dead code in impls/ and bench/: a failure means a function, class, constant or field
that nothing uses was added (delete it), or something used only in a way no reader of the
source can see (by name, by a framework) was (list it in pyproject's [tool.vulture]
ignore_names, saying why)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("impls", "bench")
READERS = (*SOURCES, "tests", "benchmarks")
WORD = re.compile(r"\w+")
# Exported and dead, in a file another branch is rewriting now: remove it there.
KNOWN_DEAD: set[tuple[str, str]] = set()


def test_vulture_finds_nothing_unused():
    """vulture at the paths, confidence and ignore_names of pyproject's [tool.vulture]."""
    command = [sys.executable, "-m", "vulture"]  # vulture is in the dev extras
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr


def _exports(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def dead_exports(root: Path) -> list[str]:
    """`path: name` for each name in the `__all__` of a module of `root`'s impls/ or bench/
    that its module names only where it defines and exports it and no other file (source,
    test or benchmark) names at all; vulture counts any name in `__all__` as used."""
    words = {
        p: Counter(WORD.findall(p.read_text())) for d in READERS for p in (root / d).rglob("*.py")
    }
    dead = []
    for path, counts in sorted(words.items()):
        rel = path.relative_to(root).as_posix()
        if path.name == "__init__.py" or not rel.startswith(tuple(f"{s}/" for s in SOURCES)):
            continue
        for name in _exports(path):
            # its definition and its `__all__` entry make 2
            if counts[name] <= 2 and not any(name in c for p, c in words.items() if p != path):
                dead.append(f"{rel}: {name}")
    return dead


def test_every_exported_name_is_used_somewhere():
    known = {f"{path}: {name}" for path, name in KNOWN_DEAD}
    dead = [entry for entry in dead_exports(ROOT) if entry not in known]
    assert not dead, "exported, defined and never used:\n" + "\n".join(dead)


def test_the_export_check_tells_a_dead_function_from_a_used_one(tmp_path):
    (tmp_path / "impls").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "impls" / "maths.py").write_text(
        '__all__ = ["lonely", "used", "helper"]\n\n\ndef lonely():\n    return 1\n\n\n'
        "def used():\n    return 2\n\n\ndef helper():\n    return 3\n\n\n"
        "def _private():\n    return helper()\n"
    )
    (tmp_path / "bench" / "caller.py").write_text("from impls.maths import used\n")
    assert dead_exports(tmp_path) == ["impls/maths.py: lonely"]
