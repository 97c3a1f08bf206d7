"""Module docstrings say what a module is and why, in at most {MAX_LINES} lines (issue 34,
part 4): details belong beside the code they explain, history in commit messages and
reports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 15
HISTORY = re.compile(r"\b(this|last|previous) session\b|\bwas measured .* this hour\b", re.I)


def _modules() -> list[Path]:
    return sorted(p for top in ("bench", "impls") for p in (ROOT / top).rglob("*.py"))


def docstring_lines(path: Path) -> int:
    tree = ast.parse(path.read_text())
    if ast.get_docstring(tree, clean=False) is None:
        return 0
    return tree.body[0].end_lineno - tree.body[0].lineno + 1


def test_module_docstrings_are_at_most_the_bound_long():
    long = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := docstring_lines(p)) > MAX_LINES
    }
    assert not long, f"module docstrings over {MAX_LINES} lines: {long}"


def test_no_docstring_tells_run_history():
    told = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                if HISTORY.search(doc):
                    told.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}")
    assert not told, f"docstrings telling run history: {told}"


def test_the_check_counts_a_long_docstring(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""' + "line\n" * MAX_LINES + '"""\n\nx = 1\n')
    assert docstring_lines(module) == MAX_LINES + 1


# Tables kept aligned by hand (between ruff's off and on markers): clearer read as rows.
TABLES = {"tests/test_bad_input.py"}


def test_the_formatter_owns_the_layout():
    """Issue 34, part 4: `ruff format` lays out every statement; a statement's layout kept
    from it (ruff's skip marker) drifts from the house style. The last of 1,131 such
    markers went at once (a layout-only change); only the tables of `TABLES` keep theirs."""
    marker = re.compile(r"#\s*fmt:\s*(skip|off)\b")
    kept = []
    for top in ("bench", "impls", "tests", "benchmarks"):
        for path in (ROOT / top).rglob("*.py"):
            name = str(path.relative_to(ROOT))
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found = marker.search(line)
                if found and not (found.group(1) == "off" and name in TABLES):
                    kept.append(f"{name}:{number}")
    assert not kept, f"layout kept from the formatter: {kept[:10]}"
