"""Which code made a result: the commit, whether the tree had uncommitted changes, and
whether the code a report depends on has moved since.

Only the code that measures counts: `impls/`, `bench/`, `experiments/` and the packaging
files. Tests, docs and `reports/` itself (regenerating reports rewrites committed files)
do not make a measurement "dirty". Untracked files under those paths do: a new module is
new code.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "SOURCE_PATHS",
    "changed_since",
    "experiment_paths",
    "git_sha",
    "uncommitted",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_PATHS = ("impls", "bench", "experiments", "pyproject.toml", "constraints.txt")


def _git(*args: str, repo: Path = REPO_ROOT) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def uncommitted(paths: Sequence[str] = SOURCE_PATHS, repo: Path = REPO_ROOT) -> list[str]:
    """Files under `paths` that differ from HEAD (modified, added, deleted or untracked);
    empty for a clean tree or outside git."""
    status = _git("status", "--porcelain", "--untracked-files=all", "--", *paths, repo=repo)
    return [line[3:] for line in (status or "").splitlines() if line.strip()]


def git_sha(repo: str | Path = REPO_ROOT) -> str:
    """Short SHA of HEAD, ``+dirty`` if the measuring code has uncommitted changes;
    ``unknown`` without git."""
    repo = Path(repo)
    sha = _git("rev-parse", "--short", "HEAD", repo=repo)
    if not sha:
        return "unknown"
    return f"{sha}+dirty" if uncommitted(repo=repo) else sha


def experiment_paths(name: str, others: Iterable[str]) -> list[str]:
    """Git pathspecs of the code experiment `name` depends on: all measuring code except
    the other experiments' folders and YAML files."""
    excluded = []
    for other in others:
        if other == name:
            continue
        excluded += [
            f":(exclude)bench/experiments/{other}",
            f":(exclude)experiments/experiment/{other}.yaml",
            f":(glob,exclude)experiments/profile_grid/*_{other}.yaml",
        ]
    return [*SOURCE_PATHS, *excluded]


def changed_since(
    sha: str | None, paths: Sequence[str], repo: Path = REPO_ROOT
) -> list[str] | None:
    """Files under `paths` that changed between commit `sha` and HEAD; None when `sha` is
    not a clean commit this repository knows (unknown, ``+dirty``, or not fetched)."""
    if (
        not sha
        or sha.endswith("+dirty")
        or _git("cat-file", "-e", f"{sha}^{{commit}}", repo=repo) is None
    ):
        return None
    names = _git("diff", "--name-only", sha, "HEAD", "--", *paths, repo=repo)
    return None if names is None else [n for n in names.splitlines() if n]
