"""Every `python -m bench ...` example in README.md (its fenced blocks) and in `--help`.

A failure here means an example a user copies fails: a key renamed, a preset gone, an
override the command line no longer takes. Examples that only read (`--help`,
`--cfg job`) run as commands; the others go through what the command line does before
any rank starts (the refusals of bench/cli.py, Hydra's composition, `bench.app.build`),
a sweep (`-m`) once per job. The headline of issue 34 runs in full (a few seconds of
planning, no ranks but one).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from bench import cli
from bench.app import CONFIG_DIR, build
from bench.presets import check_groups, normalize

REPO = Path(__file__).resolve().parent.parent
# Words after `python -m bench`, one space apart (two or more start a description).
COMMAND = re.compile(r"python -m bench((?: [^\s#`)]+)*)")
USAGE = ("NAME", "...")
"""What marks a usage line (`experiment=NAME [key=value ...]`) rather than an example."""


def _commands(text: str) -> list[str]:
    """The `python -m bench` commands in `text` (continued lines joined), as argv strings."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    found = [m.group(1).strip() for m in COMMAND.finditer(joined)]
    return [c for c in found if not any(mark in c for mark in USAGE)]


def _readme_blocks() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return "\n".join(re.findall(r"^```\w*\n(.*?)^```", readme, flags=re.M | re.S))


def examples() -> dict[str, list[str]]:
    """Every example, deduplicated, with where it is shown."""
    found: dict[str, list[str]] = {}
    sources = {
        "README.md": _readme_blocks(),
        "--help": cli.main_help(),
        "auto_parallel --help": cli.experiment_help("auto_parallel"),
    }
    for where, text in sources.items():
        for command in _commands(text):
            found.setdefault(command, []).append(where)
    return found


EXAMPLES = examples()
READ_ONLY = [c for c in EXAMPLES if {"--help", "-h", "--cfg", "--hydra-help"} & set(shlex.split(c))]
RUNS = [c for c in EXAMPLES if c not in READ_ONLY]


def test_the_examples_are_found():
    assert len(RUNS) >= 9 and len(READ_ONLY) >= 3, EXAMPLES
    assert "experiment=auto_parallel model=llama2_70b gpus=[512]" in RUNS
    assert all(len(where) >= 1 for where in EXAMPLES.values())


def _jobs(argv: list[str]) -> list[list[str]]:
    """The overrides of each job: one, or (after -m) the sweep's product."""
    if "-m" not in argv and "--multirun" not in argv:
        return [argv]
    overrides = [a for a in argv if a not in ("-m", "--multirun")]
    values = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        if override.is_sweep_override():
            values.append([f"{key}={v}" for v in override.sweep_string_iterator()])
        else:
            values.append([override.input_line])
    return [list(job) for job in itertools.product(*values)]


@pytest.fixture(scope="module")
def composer():
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        yield compose


@pytest.mark.parametrize("command", RUNS)
def test_each_example_is_accepted_as_the_command_line_would(composer, command, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(REPO)  # a relative path in an example is the repository's
    argv = shlex.split(command)
    assert cli.check_experiment(argv) is None
    name = cli._experiment_override(argv)
    argv = normalize(argv, name)
    assert check_groups(argv, name) is None
    for job in _jobs(argv):
        plan = build(composer("config", job, return_hydra_config=True), name)
        assert plan.experiment.cells(plan.cfg), job


def _bench(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "bench", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("command", READ_ONLY)
def test_each_reading_example_runs(command):
    done = _bench(shlex.split(command), timeout=60)  # writes nothing: no run directory
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "Traceback" not in done.stderr


def test_the_headline_example_runs(tmp_path):
    argv = [
        "experiment=auto_parallel",
        "model=llama2_70b",
        "model.seq_len=8192",
        "gpus=[512]",
        "top_k=1",
        "rejected_k=0",
        f"report_dir={tmp_path}",
        f"hydra.run.dir={tmp_path}/h",
    ]
    done = _bench(argv, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"auto_parallel: 4 ok, 0 failed, 0 wrong -> {tmp_path}" in done.stdout
    rows = pd.read_csv(tmp_path / "results.csv")
    assert set(rows["model"]) == {"llama2_70b"} and set(rows["hardware"]) == {"a100_80gb"}
    assert rows.loc[rows["list"] == "best", "gpus"].tolist() == [512]
