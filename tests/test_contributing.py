"""CONTRIBUTING.md's recipes, walked as written on a copy of the repository.

Each recipe's code blocks are applied to a copy (the new file, then the registry entry),
and every consumer of the registry is asked about the new variant. A failure means the
recipe no longer works as written, or a consumer keeps a list of names of its own (the
new variant would need an edit the recipe does not mention).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.provenance import REPO_ROOT

RECIPE = REPO_ROOT / "CONTRIBUTING.md"
SECTIONS = {"algorithm": "## Add an all-reduce algorithm", "schedule": "## Add a pipeline schedule"}
REGISTRY = {"algorithm": "impls/collectives/algorithms.py",
            "schedule": "impls/pipeline/schedules/__init__.py"}  # fmt: skip


def recipe_blocks(section: str) -> tuple[str, str, str]:
    """(path of the new file, its text, the registry entry) of one recipe."""
    text = RECIPE.read_text()
    start = text.index(SECTIONS[section])
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], re.S)
    assert len(blocks) == 2, f"{section}: expected the file and the registry entry"
    first, _, body = blocks[0].partition("\n")
    assert first.startswith("# "), "the file's block opens with its path"
    return first[2:].strip(), body, blocks[1]


def apply_recipe(root: Path, section: str) -> None:
    """Write the new file, and add the registry entry: its import after the registry's
    imports, its line at the end of the registry's tuple."""
    path, body, entry = recipe_blocks(section)
    (root / path).write_text(body)
    registry = root / REGISTRY[section]
    lines = registry.read_text().splitlines()
    import_line, item = [line for line in entry.splitlines() if line.strip()]
    last_import = max(i for i, line in enumerate(lines) if line.startswith("from impls."))
    lines.insert(last_import + 1, import_line)
    close = next(i for i, line in enumerate(lines) if line == "    )" and i > last_import)
    lines.insert(close, item)
    registry.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The repository's code and tests, both recipes applied."""
    root = tmp_path_factory.mktemp("recipe")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("impls", "bench", "tests", "experiments"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=ignore)
    for name in ("pyproject.toml", "CONTRIBUTING.md"):
        shutil.copy(REPO_ROOT / name, root / name)
    for section in SECTIONS:
        apply_recipe(root, section)
    return root


def run_in(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


ALGORITHM_CONSUMERS = """
import impls, pytest
assert impls.__file__.startswith({root!r}), impls.__file__
from impls.collectives import ALGORITHM_CHOICES, AllReduceTuner, check_algorithm
from impls.collectives.algorithms import ALGORITHMS
from impls.costmodel.comm import allreduce_seconds
from impls.costmodel.hardware import Link
from bench.experiments.allreduce_scaling import config, report

assert "split_ring" in ALGORITHM_CHOICES and check_algorithm("split_ring") == "split_ring"
link = Link(name="l", alpha_s=1e-3, bandwidth=1e9)
tuner = AllReduceTuner.from_link(link)  # what algorithm=auto builds
want = allreduce_seconds(1e6, 4, link, ALGORITHMS["split_ring"].critical_path)
assert tuner.predict("split_ring", 1e6, 4) == pytest.approx(want)
assert want == pytest.approx(12e-3 + 1.5e6 / 1e9)  # 4(N-1) messages, 2(N-1)/N M bytes
tuner.choose(1e6, 4)
assert "split_ring" in config.ALLOWED
# the report reads the spec through the columns the experiment writes into its rows
import pandas as pd
rows = pd.DataFrame([{{"algorithm": a, **config.declared_columns(a)}} for a in config.ALLOWED])
rows = pd.read_csv(__import__("io").StringIO(rows.to_csv(index=False)))  # as results.csv
assert report.shown_order(rows)[-3:] == ["split_ring", "auto", "torch"]
assert "split_ring" not in report.lecture_orders(rows) and "ring" in report.lecture_orders(rows)
print("ok")
"""

SCHEDULE_CONSUMERS = """
import impls, pytest
assert impls.__file__.startswith({root!r}), impls.__file__
from impls.pipeline.schedules import PLANNER_SCHEDULES, SCHEDULES, utilization_bound
from impls.planner.bounds import inflight
from impls.planner.space import plan_space
from impls.costmodel.compute import TransformerSpec
from impls.costmodel.presets import hardware
from impls.simulator import ParallelPlan, simulate
from bench.experiments.pipeline_utilization import config, schedules_report
from bench.experiments.auto_parallel.config import AutoParallelConfig

assert list(SCHEDULES)[-1] == "gpipe_fifo"
assert utilization_bound("gpipe_fifo", 4, 8) == pytest.approx(8 / 11)  # theory column
assert inflight("gpipe_fifo", 4, 8) == [8, 8, 8, 8]  # the planner's memory bound
# the report reads the spec through the columns the experiment writes into its rows
import io, pandas as pd
from bench.experiments.pipeline_utilization.names import declared
rows = pd.DataFrame([{{"schedule": s, **config.declared_columns(s)}} for s in config.ALLOWED])
rows = pd.read_csv(io.StringIO(rows.to_csv(index=False)))  # as results.csv
assert schedules_report.schedule_order(rows[rows["schedule"].isin(SCHEDULES)])[-1] == "gpipe_fifo"
assert declared(rows, "schedule_label")["gpipe_fifo"] == "GPipe (FIFO backward)"
assert declared(rows, "bound_source")["gpipe_fifo"].startswith("M/(M+P−1)")
assert declared(rows, "marker")["gpipe_fifo"] == "d"  # what plots._panels draws it with
assert "gpipe_fifo" in config.ALLOWED
# opt-in: not searched, and the search refuses it by name, until planner=True
assert PLANNER_SCHEDULES == ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble_h1")
spec = TransformerSpec(n_layers=4, d_model=256, n_heads=4, seq_len=128, vocab_size=1000)
hw = hardware("a100_80gb")
with pytest.raises(ValueError, match="schedule='gpipe_fifo'"):
    plan_space(spec, hw, gpus=4, global_batch=8, fixed={{"schedule": "gpipe_fifo"}})
with pytest.raises(ValueError, match="schedule"):
    AutoParallelConfig(schedule="gpipe_fifo")
# the simulator prices it as GPipe (the same bound, the same memory)
fifo, gpipe = (simulate(spec, ParallelPlan(dp=1, tp=1, pp=2, num_microbatches=4,
                                           schedule=s), hw) for s in ("gpipe_fifo", "gpipe"))
assert fifo.step_time_s == pytest.approx(gpipe.step_time_s)
assert fifo.peak_memory_bytes == pytest.approx(gpipe.peak_memory_bytes)
print("ok")
"""


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_consumer_picks_up_the_new_variant(copy, section):
    code = ALGORITHM_CONSUMERS if section == "algorithm" else SCHEDULE_CONSUMERS
    done = run_in(copy, "-c", code.format(root=str(copy)))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_registry_tests_and_the_correctness_test_take_the_new_variants(copy):
    """The completeness checks pass for both, and the new algorithm equals torch's
    all-reduce on 1–8 ranks (the test every algorithm runs)."""
    done = run_in(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  "tests/collectives/test_algorithm_registry.py",
                  "tests/pipeline/test_schedule_registry.py",
                  "tests/collectives/test_all_reduce.py", "-k", "split_ring or gpipe_fifo")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\b[4-9] passed|\b\d\d passed", done.stdout), done.stdout[-500:]
