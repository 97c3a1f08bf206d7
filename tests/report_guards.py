"""Shared guards for report writers, which read results only (DESIGN: they never import
`impls`): what their source imports, and what importing them loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def assert_source_imports_none(
    folder: Path, names: Iterable[str], roots: tuple[str, ...], suffixes: tuple[str, ...]
) -> None:
    """No module of `names` in `folder` imports a package of `roots` or a module ending in
    one of `suffixes`."""
    for name in names:
        tree = ast.parse((folder / name).read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m and m.split(".")[0] in roots], name
        assert not [m for m in imported if m and m.endswith(suffixes)], name


def assert_import_loads_none(
    module: str, roots: tuple[str, ...], absent: tuple[str, ...] = ()
) -> None:
    """Importing `module` in a fresh interpreter loads no module of `roots` beyond what
    `bench.experiments` already does, and leaves every module of `absent` unloaded."""
    code = (
        "import sys, bench.experiments\n"
        f"def loaded(): return {{m for m in sys.modules if m.split('.')[0] in {roots!r}}}\n"
        "before = loaded()\n"
        f"import {module}\n"
        "bad = sorted(loaded() - before)\n"
        "assert not bad, bad\n"
        + "".join(f"assert {name!r} not in sys.modules\n" for name in absent)
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
