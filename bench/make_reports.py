"""`make reports`: regenerate every experiment's report, then the index reports/README.md.

Each experiment runs as its own `python -m bench experiment=NAME` process (one Hydra app
per process). `--profile ci` shrinks the grids; `--out DIR` writes somewhere other than
reports/ (the test suite regenerates everything into a temporary directory this way).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.experiments import EXPERIMENTS
from bench.reports.index import write_index

REPO_ROOT = Path(__file__).resolve().parent.parent


def regenerate(out: Path, profile: str, names: list[str], extra: list[str]) -> list[str]:
    """Run each experiment into out/NAME; returns the names that failed to run."""
    failed = []
    for name in names:
        cmd = [sys.executable, "-m", "bench", f"experiment={name}", f"profile={profile}"]
        cmd += [f"report_dir={out / name}", *extra]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0:
            failed.append(name)
    write_index(out)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="full", choices=["full", "ci"])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports")
    parser.add_argument("--only", nargs="*", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    failed = regenerate(args.out, args.profile, args.only, args.overrides)
    print(f"index: {args.out / 'README.md'}")
    if failed:
        print(f"experiments that failed to run: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
