"""What a rank process imports to run a cell: torch, `impls` and the kit, never pandas,
plotting or Hydra.

Every rank of a pool unpickles each cell it runs (the cell's function, its typed config,
its carry), which imports the modules they are defined in. A failure here means a rank
drags in a report's plotting stack or the config machinery: seconds per rank on a shared
host, paid by every rank of every pool, and enough to push a short cell past its timeout.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from bench.config import RUN_KEYS
from bench.experiments import experiments
from bench.provenance import REPO_ROOT

HEAVY = ("pandas", "matplotlib", "seaborn", "hydra", "omegaconf", "wandb")
FOLDERS = [n for n in sorted(experiments()) if (REPO_ROOT / "bench/experiments" / n).is_dir()]


def ci_cells(name: str) -> tuple[object, list]:
    """The typed config and the cells of `name`'s CI grid, composed as the CLI does."""
    with initialize_config_dir(config_dir=str(REPO_ROOT / "experiments"), version_base=None):
        cfg = compose("config", overrides=[f"experiment={name}", "profile=ci"])
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(cfg, resolve=True)
    for key in RUN_KEYS:
        values.pop(key, None)
    experiment = experiments()[name]
    typed = experiment.parse(values)
    return typed, experiment.cells(typed)


PROBE = (
    "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read()); "
    f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
)


def _probe(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def unpickled(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Each experiment's first CI cell, as its ranks receive it, unpickled in a fresh
    interpreter (two at a time, as the host has two cores)."""
    root = tmp_path_factory.mktemp("cells")
    paths = {}
    for name in FOLDERS:
        cfg, cells = ci_cells(name)
        assert cells, f"{name}'s CI grid has no cell"
        paths[name] = root / f"{name}.pkl"
        paths[name].write_bytes(pickle.dumps(experiments()[name].rank_call(cfg, cells[0])))
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(paths, pool.map(_probe, paths.values()), strict=True))


@pytest.mark.parametrize("name", FOLDERS)
def test_a_rank_unpickles_a_cell_without_heavy_imports(unpickled, name):
    done = unpickled[name]
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"a rank of {name} imports {done.stdout.strip()}"
