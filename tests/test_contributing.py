"""CONTRIBUTING.md's recipes, walked as written on a copy of the repository.

Each recipe's code blocks are applied to a copy (a variant's new file, then its registry
entry; an experiment's files; a hardware preset's entry in `HARDWARE`, then the generator
the recipe runs), and every consumer is asked about the new thing: the new experiment
runs end to end from the command line, the new preset is priced by the simulator and
planned on from the command line. A failure means the recipe no longer works as written,
or a consumer keeps a list of names of its own (the new thing would need an edit the
recipe does not mention).
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
SECTIONS = {
    "algorithm": "## Add an all-reduce algorithm",
    "schedule": "## Add a pipeline schedule",
    "experiment": "## Add an experiment",
    "hardware": "## Add a hardware preset",
}
VARIANTS = ("algorithm", "schedule")
REGISTRY = {
    "algorithm": "impls/collectives/algorithms.py",
    "schedule": "impls/pipeline/schedules/__init__.py",
}


def section_text(section: str) -> str:
    text = RECIPE.read_text()
    start = text.index(SECTIONS[section])
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def recipe_blocks(section: str) -> tuple[str, str, str]:
    """(path of the new file, its text, the registry entry) of one variant's recipe."""
    blocks = re.findall(r"```python\n(.*?)```", section_text(section), re.S)
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


def apply_experiment(root: Path) -> list[str]:
    """Write every file of the experiment recipe (each block opens with its path); the
    paths written."""
    blocks = re.findall(r"```python\n(.*?)```", section_text("experiment"), re.S)
    paths = []
    for block in blocks:
        first, _, body = block.partition("\n")
        assert first.startswith("# "), "each of the experiment's blocks opens with its path"
        path = root / first[2:].strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        paths.append(first[2:].strip())
    return paths


def apply_preset(root: Path) -> None:
    """Add the hardware recipe's entry as the last of `HARDWARE`."""
    blocks = re.findall(r"```python\n(.*?)```", section_text("hardware"), re.S)
    assert len(blocks) == 1, "hardware: expected the one entry of HARDWARE"
    presets = root / "impls/costmodel/presets.py"
    lines = presets.read_text().splitlines()
    start = lines.index("HARDWARE: dict[str, Hardware] = {")
    close = next(i for i, line in enumerate(lines) if line == "}" and i > start)
    lines[close:close] = blocks[0].rstrip("\n").splitlines()
    presets.write_text("\n".join(lines) + "\n")


def commands(section: str, needle: str = "") -> list[list[str]]:
    """The `python -m ...` commands a recipe's prose tells the reader to run (those
    holding `needle`), as argv."""
    found = re.findall(r"`python (-m [^`]+)`", section_text(section))
    return [c.split() for c in found if needle in c]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The repository's code and tests, the four recipes applied (the preset's generator
    run, as its recipe says)."""
    root = tmp_path_factory.mktemp("recipe")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("impls", "bench", "tests", "experiments"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=ignore)
    for name in ("pyproject.toml", "CONTRIBUTING.md"):
        shutil.copy(REPO_ROOT / name, root / name)
    for section in VARIANTS:
        apply_recipe(root, section)
    assert apply_experiment(root)[-1] == "bench/experiments/ping_pong/experiment.py"
    apply_preset(root)
    assert ["-m", "bench.presets"] in commands("hardware")
    done = run_in(root, "-m", "bench.presets")
    assert done.returncode == 0, done.stderr[-3000:]
    # it writes the new experiment's and the new preset's files, and leaves every other
    written = sorted(done.stderr.split())
    assert written == [
        "experiments/experiment/ping_pong.yaml",
        "experiments/hardware/h100_pcie.yaml",
    ], done.stderr[-3000:]
    return root


def run_in(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=timeout
    )


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


@pytest.mark.parametrize("section", VARIANTS)
def test_every_consumer_picks_up_the_new_variant(copy, section):
    code = ALGORITHM_CONSUMERS if section == "algorithm" else SCHEDULE_CONSUMERS
    done = run_in(copy, "-c", code.format(root=str(copy)))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_registry_tests_and_the_correctness_test_take_the_new_variants(copy):
    """The completeness checks pass for both, and the new algorithm equals torch's
    all-reduce on 1–8 ranks (the test every algorithm runs)."""
    done = run_in(
        copy,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/collectives/test_algorithm_registry.py",
        "tests/pipeline/test_schedule_registry.py",
        "tests/collectives/test_all_reduce.py",
        "-k",
        "split_ring or gpipe_fifo",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\b[4-9] passed|\b\d\d passed", done.stdout), done.stdout[-500:]


EXPERIMENT_CONSUMERS = """
import bench, pickle, subprocess, sys, pytest
assert bench.__file__.startswith({root!r}), bench.__file__
from bench import cli
from bench.experiments import experiments
from bench.make_reports import run_order

experiment = experiments()["ping_pong"]  # found by its folder, its schema registered
assert "ping_pong" in cli.experiment_names() and "round trip" in cli.summaries()["ping_pong"]
assert "ping_pong" in run_order(list(experiments()))  # what `make reports` runs
keys = cli.schema_keys(experiment.schema, overrides=cli.yaml_defaults("ping_pong"))
assert [(k.name, k.type) for k in keys] == [("message_bytes", "list[int]"), ("repeats", "int"),
                                            ("timeout_s", "float")]
assert all(k.meaning for k in keys)  # every key's docstring is its help
with pytest.raises(ValueError, match="repeats"):
    experiment.parse({{"repeats": 0}})
# a rank unpickles a cell without pandas, plotting or Hydra (tests/test_rank_imports.py)
cfg = experiment.parse({{}})
blob = pickle.dumps(experiment.rank_call(cfg, experiment.cells(cfg)[0]))
probe = ("import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print(' '.join(m for m in "
         "('pandas', 'matplotlib', 'seaborn', 'hydra', 'omegaconf', 'wandb') if m in sys.modules))")
heavy = subprocess.run([sys.executable, "-c", probe], input=blob, capture_output=True, check=True)
assert heavy.stdout.strip() == b"", heavy.stdout
print("ok")
"""


def test_the_new_experiment_is_found_listed_and_light_on_its_ranks(copy):
    done = run_in(copy, "-c", EXPERIMENT_CONSUMERS.format(root=str(copy)))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_new_experiment_runs_end_to_end_as_the_recipe_says(copy, tmp_path):
    run, help_ = commands("experiment", "experiment=ping_pong")
    assert run[:3] == ["-m", "bench", "experiment=ping_pong"] and help_[-1] == "--help"
    shown = run_in(copy, *help_, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    for key in (
        "message_bytes: list[int] = [4096,1048576]",
        "repeats: int = 20",
        "timeout_s: float = 60.0",
        "round trip between two ranks",
    ):
        assert key in shown.stdout, shown.stdout
    report_dir = tmp_path / "ping_pong"
    argv = [a if not a.startswith("report_dir=") else f"report_dir={report_dir}" for a in run]
    done = run_in(copy, *argv, "wandb.mode=disabled", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ping_pong: 2 ok, 0 failed, 0 wrong" in done.stdout, done.stdout[-2000:]
    import pandas as pd

    rows = pd.read_csv(report_dir / "results.csv")
    assert sorted(rows["message_bytes"]) == [4096, 1 << 20]
    assert (rows["status"] == "ok").all() and (rows["wrong"] == 0).all()
    assert (rows["time_s"] > 0).all() and (rows["gbps"] > 0).all()
    report = (report_dir / "report.md").read_text()
    assert "## Results" in report and "| 1 MiB |" in report and "0 wrong" in report


HARDWARE_CONSUMERS = """
import impls, pytest
assert impls.__file__.startswith({root!r}), impls.__file__
from hydra import compose, initialize_config_dir
from bench import cli, presets
from bench.app import CONFIG_DIR, build
from bench.experiments.auto_parallel.config import AutoParallelConfig
from impls.costmodel.compute import TransformerSpec
from impls.costmodel.presets import HARDWARE, hardware
from impls.simulator import ParallelPlan, simulate

hw = hardware("h100_pcie")
assert list(HARDWARE)[-1] == "h100_pcie" and hw.peak("bf16") == 756.5e12 and hw.sms == 114
assert hw.efficiency(1e13) == pytest.approx(449 / 756.5)  # the large-GEMM plateau
# the generated option reads back as the preset
values = presets.option_values("hardware", "h100_pcie")
cfg = AutoParallelConfig(hardware=values, gpus=[8])
assert cfg.cluster() == hw and cfg.hardware_name() == "h100_pcie"
# the simulator prices a plan on it, within a node and across nodes
spec = TransformerSpec(n_layers=4, d_model=256, n_heads=4, seq_len=128, vocab_size=1000)
for dp in (2, 4):
    plan = ParallelPlan(dp=dp, tp=2, pp=2, num_microbatches=4, schedule="1f1b")
    pcie, sxm = (simulate(spec, plan, hardware(n)) for n in ("h100_pcie", "h100_sxm"))
    assert 0 < sxm.step_time_s < pcie.step_time_s  # slower GEMMs and links than SXM5's
# the command line: the option is accepted, composes to the preset, and is listed
argv = presets.normalize(["experiment=auto_parallel", "hardware=h100_pcie",
                          "hardware.devices_per_node=4", "gpus=[16]"], "auto_parallel")
assert presets.check_groups(argv, "auto_parallel") is None
with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
    planned = build(compose("config", argv, return_hydra_config=True), "auto_parallel").cfg
assert planned.cluster().devices_per_node == 4 and planned.cluster().sms == 114
assert "h100_pcie" in cli.experiment_help("auto_parallel")
print("ok")
"""


def test_every_consumer_picks_up_the_new_preset(copy):
    done = run_in(copy, "-c", HARDWARE_CONSUMERS.format(root=str(copy)))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_preset_tests_pass_and_auto_parallel_plans_on_the_new_preset(copy, tmp_path):
    """The recipe's own check (every number's source, the group file fresh and read back),
    then a CI-sized auto_parallel grid on the preset from the command line."""
    done = run_in(
        copy,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/costmodel/test_presets.py",
        "tests/test_presets.py",
        "-k",
        "h100_pcie or every_preset_has_its_file or each_file_reads_back",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    (plan,) = commands("hardware", "experiment=auto_parallel")
    assert plan == ["-m", "bench", "experiment=auto_parallel", "hardware=h100_pcie"]
    done = run_in(
        copy, *plan, "profile=ci", f"report_dir={tmp_path}", "wandb.mode=disabled", timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    import pandas as pd

    rows = pd.read_csv(tmp_path / "results.csv")
    assert set(rows["hardware"]) == {"h100_pcie"} and (rows["status"] == "ok").all()
    assert (rows.loc[rows["fits"], "predicted_step_time_s"] > 0).all()
