"""`python -m bench --help` and `experiment=NAME --help` (bench/cli.py).

A failure here means a user asking for help gets a stack trace, a key without its type,
default or meaning, allowed values that are not the ones the checks enforce, or a missing
or unknown experiment answered by something other than one line and exit status 2; or
that tab completion (Hydra's, behind the same entry point) no longer answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from bench import cli
from bench.config import ClusterConfig, RunConfig
from bench.experiments import experiments

REPO = Path(__file__).resolve().parent.parent


def _flat(text: str) -> str:
    return " ".join(text.split())


def _defined_in(schema: type, name: str) -> str:
    return next(c.__name__ for c in schema.__mro__ if name in c.__dict__.get("__annotations__", {}))


@pytest.mark.parametrize("name", list(experiments()))
def test_every_key_of_every_experiment_is_listed_with_type_default_and_meaning(name):
    schema = experiments()[name].schema
    keys = cli.schema_keys(schema, overrides=cli.yaml_defaults(name))
    assert [k.name for k in keys] == [f.name for f in fields(schema)]
    for key in keys:
        assert key.type and key.default, key
        where = _defined_in(schema, key.name)
        assert key.meaning, f"{name}.{key.name} has no docstring (in {where})"
    text = cli.experiment_help(name)
    for key in keys:
        assert f"\n  {key.name}: {key.type} = {key.default}\n" in text + "\n"
    assert "python -m bench --help" in text  # where the run-level keys are


def test_allowed_values_are_the_ones_the_checks_enforce():
    from bench.experiments.allreduce_scaling.config import ALLOWED

    keys = {k.name: k for k in cli.schema_keys(experiments()["allreduce_scaling"].schema)}
    assert keys["algorithms"].allowed == ", ".join(ALLOWED)
    assert keys["dtype"].allowed.startswith("float32")
    assert keys["world_sizes"].allowed == "≥ 1, ≤ 1,024 (the ranks one cell starts)"
    assert keys["message_bytes"].allowed == "≥ 1, ≤ 17,179,869,184 (16 GiB in one buffer)"
    run = {k.name: k for k in cli.run_keys()}
    assert run["cluster.kind"].allowed == "local, torchrun, slurm"
    assert run["wandb.mode"].allowed == "offline, online, disabled"
    assert run["report_dir"].allowed == ""
    # the list of a Hydra-typed key shown as it is typed on the command line
    assert keys["world_sizes"].default == "[2,4,8]"
    assert ClusterConfig(kind=run["cluster.kind"].allowed.split(", ")[-1]).kind == "slurm"


def test_experiment_yaml_values_override_the_schema_defaults():
    keys = {
        k.name: k
        for k in cli.schema_keys(
            experiments()["pipeline_utilization"].schema,
            overrides=cli.yaml_defaults("pipeline_utilization"),
        )
    }
    assert keys["slicing_pairs"].default.startswith("[{schedule: gpipe, stages: 4")


def test_top_level_help_lists_every_experiment_with_its_summary_and_the_run_keys():
    known = experiments()
    assert cli.experiment_names() == list(known)
    assert cli.summaries() == {name: e.summary for name, e in known.items()}
    text = _flat(cli.main_help())
    for name, experiment in known.items():
        assert _flat(f"{name} {experiment.summary}") in text
    for key in cli.run_keys():
        assert f"{key.name}: {key.type}" in text
        assert key.meaning, f"run-level key {key.name} has no docstring in bench/config.py"
    assert {f.name for f in fields(RunConfig)} <= {k.name.split(".")[0] for k in cli.run_keys()}
    assert "cluster=torchrun" in text and "profile=ci" in text and "--hydra-help" in text
    assert "profile_grid=" not in text and "schema/" not in text


def test_a_missing_or_unknown_experiment_is_one_line():
    names = ", ".join(cli.experiment_names())
    assert cli.check_experiment(["resume=true"]) == (
        f"bad config: experiment is missing (experiment=NAME); allowed values: {names}"
    )
    assert cli.check_experiment(["experiment=nope"]).startswith(
        "bad config: experiment='nope' is unknown; allowed values: activation_recompute"
    )
    assert cli.check_experiment(["-m", "experiment=collectives,nope"]).startswith(
        "bad config: experiment='nope'"
    )
    assert cli.check_experiment(["-m", "experiment=collectives,overlap"]) is None
    assert cli.check_experiment(["-m", "experiment=glob(*)"]) is None  # Hydra's to expand


def test_hydra_keeps_its_own_options_and_completion_lines_lose_python_dash_m():
    for argv in (["--hydra-help"], ["--cfg", "job", "--config-name=other"], ["--version"]):
        assert cli.intercept(argv, environ={}) is None
    env = {"COMP_LINE": ".venv/bin/python -m bench experiment=all", "COMP_POINT": "40"}
    assert cli.intercept(["-sc", "query=bash"], environ=env) is None
    assert env == {"COMP_LINE": "bench experiment=all", "COMP_POINT": "20"}


@pytest.fixture(scope="module")
def commands() -> dict[str, subprocess.CompletedProcess]:
    """The real commands, started together (each imports what it needs: the experiment's
    help and the completions import torch; run one after another they would take twice as
    long on two cores)."""
    query = dict(os.environ, COMP_LINE="python -m bench experiment=allreduce_sc", COMP_POINT="40")
    argvs = {
        "help": (["--help"], None),
        "experiment_help": (["experiment=allreduce_scaling", "--help"], None),
        "missing": ([], None),
        "unknown": (["experiment=nope", "resume=true"], None),
        "install": (["--shell-completion", "install=bash"], None),
        "query": (["-sc", "query=bash"], query),
    }
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "bench", *argv],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (argv, env) in argvs.items()
    }
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=120)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


def test_help_commands_exit_0_without_a_traceback(commands):
    top = commands["help"]
    assert top.returncode == 0, top.stderr
    assert top.stdout == cli.main_help() + "\n"
    assert "experiments:" in top.stdout and "wandb.mode: str = offline" in top.stdout
    for text in ("Traceback", "Powered by Hydra", "== Config groups ==", "hydra.cc"):
        assert text not in top.stdout + top.stderr
    one = commands["experiment_help"]
    assert one.returncode == 0, one.stderr
    assert one.stdout == cli.experiment_help("allreduce_scaling") + "\n"
    assert "algorithms: list[str] = [" in one.stdout and "allowed: parameter_server" in one.stdout
    assert "Traceback" not in one.stdout + one.stderr


def test_dash_h_is_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.intercept(["-h", "resume=true"], environ={})
    assert exit_.value.code == 0
    assert capsys.readouterr().out == cli.main_help() + "\n"


@pytest.mark.parametrize(
    ("command", "line"),
    [
        ("missing", "bad config: experiment is missing (experiment=NAME); allowed values: "),
        ("unknown", "bad config: experiment='nope' is unknown; allowed values: "),
    ],
)
def test_missing_or_unknown_experiment_exits_2_with_one_line(commands, command, line):
    done = commands[command]
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.startswith(line)
    assert done.stderr.count("\n") == 1


def test_tab_completion_installs_and_answers_for_python_dash_m_bench(commands):
    install, query = commands["install"], commands["query"]
    assert install.returncode == 0 and "hydra_bash_completion()" in install.stdout
    assert query.returncode == 0, query.stderr
    assert query.stdout.split() == ["experiment=allreduce_scaling"]


def test_help_piped_into_head_ends_quietly():
    """`python -m bench --help | head -1`: the reader leaves early; exit 0, no traceback.
    The reader here is gone before the help is written (the help fits a pipe's buffer,
    so a real `head` only sometimes closes it in time)."""
    script = (
        "import os; from bench.cli import _page, main_help; read, write = os.pipe(); "
        "os.close(read); os.dup2(write, 1); _page(main_help())"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr


def test_an_experiment_with_presets_lists_them(capsys):
    from impls.costmodel.models import MODELS
    from impls.costmodel.presets import HARDWARE

    text = _flat(cli.experiment_help("auto_parallel"))
    model_line = text.split("model= (default gpt3_175b): ", 1)[1].split(" hardware=", 1)[0]
    assert model_line.split(", ") == sorted(MODELS)
    hardware_line = text.split("hardware= (default a100_80gb): ", 1)[1].split(";", 1)[0]
    assert hardware_line.split(", ") == sorted(HARDWARE)
    assert "hardware=path/to/hardware.yaml" in text and "model.seq_len=8192" in text
    assert "presets" not in _flat(cli.experiment_help("collectives"))
    with pytest.raises(SystemExit) as exit_:  # an unknown preset: one line, status 2
        cli.intercept(["experiment=auto_parallel", "hardware=h200"], environ={})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hardware='h200' is unknown" in err and "h100_sxm" in err
