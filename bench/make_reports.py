"""`make reports`: regenerate every experiment's report, then the index reports/README.md.

Each experiment runs as its own `python -m bench experiment=NAME` process (one Hydra app
per process), an experiment whose report reads another's results after that one.
`--profile ci` shrinks the grids; `--out DIR` writes somewhere other than reports/ (the
test suite regenerates everything into a temporary directory this way).

The committed reports must come from committed code: writing into the repository's
`reports/` from a tree with uncommitted changes to `impls/`, `bench/` or `experiments/`
is refused (`--allow-dirty` for drafts), so every report names the one commit that made
it, and the index can say when the code a report depends on has moved since.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.experiments import experiments
from bench.provenance import REPO_ROOT, changed_since, experiment_paths, uncommitted
from bench.report.index import write_index

__all__ = ["main", "run_order"]


def run_order(names: list[str]) -> list[str]:
    """`names` with every experiment after the ones its report reads (when also asked)."""
    known, ordered, seen = experiments(), [], set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for first in known[name].reads:
            if first in names:
                visit(first)
        ordered.append(name)

    for name in names:
        visit(name)
    return ordered


def regenerate(out: Path, profile: str, names: list[str], extra: list[str]) -> list[str]:
    """Run each experiment into out/NAME; returns the names whose run exited non-zero (a
    refused config, or a failed, timed-out or wrong cell: its report is written all the same)."""
    failed = []
    for name in run_order(names):
        cmd = [sys.executable, "-m", "bench", f"experiment={name}", f"profile={profile}"]
        cmd += [f"report_dir={out / name}", *extra]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0:
            failed.append(name)
    write_index(out, staleness=staleness)
    return failed


def staleness(name: str, sha: str | None) -> list[str] | None:
    """Files the experiment's code changed since `sha` (None: not a clean known commit)."""
    return changed_since(sha, experiment_paths(name, experiments()))


def main(argv: list[str] | None = None) -> int:
    names = list(experiments())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="full", choices=["full", "ci"])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports")
    parser.add_argument("--only", nargs="*", default=names, choices=names)
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write into the repository's reports/ from uncommitted code (drafts only)",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    committed = args.out.resolve() == (REPO_ROOT / "reports").resolve()
    dirty = uncommitted()
    if committed and dirty and not args.allow_dirty:
        shown = ", ".join(dirty[:5]) + (" …" if len(dirty) > 5 else "")
        print(
            f"refusing to write the committed reports from uncommitted code ({shown}): "
            "commit first, or pass --allow-dirty for a draft",
            file=sys.stderr,
        )
        return 2
    failed = regenerate(args.out, args.profile, args.only, args.overrides)
    print(f"index: {args.out / 'README.md'}")
    if failed:
        print(
            f"experiments with a refused config or a failed or wrong cell (see their "
            f"reports): {', '.join(failed)}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
