"""The GitHub Actions workflow users copy to regenerate reports in CI (.github/workflows/ci.yml).

A failure means the recipe the README promises would not run as described: GitHub would
refuse the file, CI would test in another environment than `.ci/run` or run other commands,
install a torch other than constraints.txt's (or PyPI's CUDA wheels), use a Python that
pyproject's `requires-python` refuses, upload a directory the report step did not write,
or follow an action's moving branch. Each check also runs on a broken copy of the workflow,
which it must reject: a check that passes everything proves nothing."""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"
CPU_INDEX = "download.pytorch.org/whl/cpu"
PINNED_USES = re.compile(r"^[\w.-]+/[\w./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})$")


def load(text: str) -> dict:
    workflow = yaml.safe_load(text)
    if True in workflow:  # YAML 1.1 reads the key `on` as a boolean
        workflow["on"] = workflow.pop(True)
    return workflow


def the_job(workflow: dict) -> dict:
    (job,) = workflow["jobs"].values()
    return job


def steps(workflow: dict) -> list[dict]:
    return the_job(workflow)["steps"]


def ci_run() -> tuple[dict[str, str], list[str]]:
    """.ci/run's exported environment, and the commands it runs in it."""
    env, commands = {}, []
    for line in (REPO / ".ci" / "run").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.split()[0] in {"set", "cd"}:
            continue
        if line.startswith("export "):
            env.update(word.split("=", 1) for word in shlex.split(line)[1:])
        else:
            commands.append(line)
    return env, commands


def torch_pin() -> str:
    text = (REPO / "constraints.txt").read_text()
    (pin,) = re.findall(r"^torch==(\S+)$", text, flags=re.MULTILINE)
    return pin


def strings(node) -> list[str]:
    """Every string in a parsed YAML document."""
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in strings(key) + strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in strings(item)]
    return [node] if isinstance(node, str) else []


def step_running(workflow: dict, command: str) -> dict | None:
    return next((s for s in steps(workflow) if command in s.get("run", "")), None)


# Each check returns what is wrong with a workflow (nothing, for the committed one).


def env_problems(workflow: dict) -> list[str]:
    env, commands = ci_run()
    problems = []
    for command in commands:
        step = step_running(workflow, command) or {}
        seen = {**the_job(workflow).get("env", {}), **step.get("env", {})}
        problems += [
            f"{command!r} runs with {key}={seen.get(key)!r}, .ci/run exports {value!r}"
            for key, value in env.items()
            if str(seen.get(key)) != value
        ]
    return problems


def command_problems(workflow: dict) -> list[str]:
    runs = {s.get("run", "").strip() for s in steps(workflow)}
    return [f"no step runs {c!r} as .ci/run does" for c in ci_run()[1] if c not in runs]


def torch_problems(workflow: dict) -> list[str]:
    pin = torch_pin()
    pinned = [v for s in strings(workflow) for v in re.findall(r"torch==([\w.+]+)", s)]
    problems = [
        f"torch=={v} in the workflow, constraints.txt pins {pin}" for v in pinned if v != pin
    ]
    env = the_job(workflow).get("env", {})
    if not any(CPU_INDEX in str(env.get(k, "")) for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")):
        problems.append(f"the job's pip does not look in {CPU_INDEX}: PyPI's torch is the CUDA one")
    check = step_running(workflow, "constraints.txt")
    if check is None or "+cpu" not in check["run"]:
        problems.append("no step checks the installed torch against constraints.txt's CPU pin")
    return problems


def python_problems(workflow: dict) -> list[str]:
    pyproject = (REPO / "pyproject.toml").read_text()  # tomllib is 3.11+, this suite 3.10+
    allowed = SpecifierSet(re.search(r'^requires-python = "(.+)"$', pyproject, re.M).group(1))
    setup = [s for s in steps(workflow) if s.get("uses", "").startswith("actions/setup-python@")]
    versions = [str(s.get("with", {}).get("python-version")) for s in setup]
    if not versions:
        return ["no actions/setup-python step"]
    return [
        f"Python {v} is outside requires-python {allowed}"
        for v in versions
        if not allowed.contains(v + ".0")
    ]


def reports_dir(workflow: dict) -> str | None:
    """The directory the report step writes: its CI_REPORTS=, else the Makefile's default."""
    step = step_running(workflow, "make reports-ci")
    if step is None:
        return None
    given = re.search(r"CI_REPORTS=(\S+)", step["run"])
    default = re.search(r"^CI_REPORTS \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    return (given or default).group(1)


def artifact_problems(workflow: dict) -> list[str]:
    written = reports_dir(workflow)
    if written is None:
        return ["no step runs `make reports-ci`"]
    uploads = [
        s for s in steps(workflow) if s.get("uses", "").startswith("actions/upload-artifact@")
    ]
    if not uploads:
        return ["no actions/upload-artifact step"]
    problems = []
    for step in uploads:
        path = str(step.get("with", {}).get("path", ""))
        if path.rstrip("/") != written.rstrip("/"):
            problems.append(f"the upload takes {path!r}, the report step writes {written!r}")
        if "always()" not in str(step.get("if", "")):
            problems.append("the upload is skipped when a step fails: `if: always()`")
    return problems


def pin_problems(workflow: dict) -> list[str]:
    uses = [s["uses"] for s in steps(workflow) if "uses" in s]
    return [
        f"{u!r} is not pinned to a version tag or commit" for u in uses if not PINNED_USES.match(u)
    ]


def timeout_problems(workflow: dict) -> list[str]:
    """The suite takes ~13 min on 2 cores: a shorter limit kills a healthy run."""
    step = step_running(workflow, "make test") or {}
    limit, job_limit = step.get("timeout-minutes", 0), the_job(workflow).get("timeout-minutes", 360)
    if not 15 <= limit <= job_limit:
        return [f"`make test` has {limit} min (job {job_limit}): give it 15 min or more"]
    return []


CHECKS = [
    env_problems,
    command_problems,
    torch_problems,
    python_problems,
    artifact_problems,
    pin_problems,
    timeout_problems,
]


def schema_errors(path: Path) -> str:
    """check-jsonschema's verdict against the GitHub-workflow schema vendored in its wheel
    (no network): '' when valid."""
    cmd = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
    proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60)
    assert "No module named check_jsonschema" not in proc.stderr, "pip install -e '.[dev]'"
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def workflow() -> dict:
    return load(WORKFLOW.read_text())


def test_workflow_matches_githubs_schema():
    assert schema_errors(WORKFLOW) == ""


def test_schema_check_rejects_a_job_without_a_runner(tmp_path, workflow):
    broken = copy.deepcopy(workflow)
    del the_job(broken)["runs-on"]
    (tmp_path / "ci.yml").write_text(yaml.safe_dump(broken))
    assert "runs-on" in schema_errors(tmp_path / "ci.yml")


def test_runs_on_push_pull_request_and_by_hand(workflow):
    assert {"push", "pull_request", "workflow_dispatch"} <= set(workflow["on"])


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_workflow_passes(check, workflow):
    assert check(workflow) == []


def test_install_goes_through_constraints_txt():
    """`make venv` is the workflow's install: it must apply constraints.txt's pin."""
    assert (
        "-m pip install --quiet -c constraints.txt -e '.[dev]'" in (REPO / "Makefile").read_text()
    )


def _setting(key: str, value) -> Callable[[dict], None]:
    def mutate(workflow: dict) -> None:
        the_job(workflow)["env"][key] = value

    return mutate


def _replace_run(old: str, new: str) -> Callable[[dict], None]:
    def mutate(workflow: dict) -> None:
        for step in steps(workflow):
            if "run" in step:
                step["run"] = step["run"].replace(old, new)

    return mutate


def _upload(key: str, value) -> Callable[[dict], None]:
    def mutate(workflow: dict) -> None:
        step = next(s for s in steps(workflow) if "upload-artifact" in s.get("uses", ""))
        (step if key == "if" else step["with"])[key] = value

    return mutate


def _add_step(step: dict) -> Callable[[dict], None]:
    return lambda workflow: steps(workflow).insert(2, step)


def _setup(key: str, value) -> Callable[[dict], None]:
    def mutate(workflow: dict) -> None:
        step = next(s for s in steps(workflow) if "setup-python" in s.get("uses", ""))
        step["with"][key] = value

    return mutate


def _test_step_timeout(minutes: int) -> Callable[[dict], None]:
    return lambda workflow: step_running(workflow, "make test").update({"timeout-minutes": minutes})


BROKEN = {
    "wandb online": (env_problems, _setting("WANDB_MODE", "online")),
    "no MPLBACKEND": (env_problems, lambda w: the_job(w)["env"].pop("MPLBACKEND")),
    "pytest instead of make test": (command_problems, _replace_run("make test", "pytest")),
    "another torch": (torch_problems, _add_step({"run": "pip install torch==2.0.0"})),
    "PyPI's torch": (torch_problems, lambda w: the_job(w)["env"].pop("PIP_EXTRA_INDEX_URL")),
    "no torch check": (torch_problems, _replace_run("$pin+cpu", "$pin")),
    "Python 3.9": (python_problems, _setup("python-version", "3.9")),
    "upload reports/": (artifact_problems, _upload("path", "reports/")),
    "upload only on success": (artifact_problems, _upload("if", "success()")),
    "reports elsewhere": (
        artifact_problems,
        _replace_run("CI_REPORTS=reports-ci", "CI_REPORTS=out"),
    ),
    "checkout@main": (pin_problems, _add_step({"uses": "actions/checkout@main"})),
    "unpinned action": (pin_problems, _add_step({"uses": "actions/cache"})),
    "5 min for make test": (timeout_problems, _test_step_timeout(5)),
}


@pytest.mark.parametrize("name", BROKEN)
def test_check_rejects_broken_workflow(name, workflow):
    check, mutate = BROKEN[name]
    broken = copy.deepcopy(workflow)
    mutate(broken)
    assert check(broken) != []


def test_readme_describes_this_workflow(workflow):
    """README's "CI for your repository" quotes the workflow's artifact, limits and env."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## CI for your repository", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())
    upload = next(s for s in steps(workflow) if "upload-artifact" in s.get("uses", ""))
    env = the_job(workflow)["env"]
    quoted = [
        f"as the artifact `{upload['with']['name']}`",
        f"kept {upload['with']['retention-days']} days",
        f"into `{reports_dir(workflow)}/`",
        f"within {step_running(workflow, 'make test')['timeout-minutes']} minutes",
        f"`PIP_EXTRA_INDEX_URL={env['PIP_EXTRA_INDEX_URL']}`",
        " ".join(f"{key}={value}" for key, value in ci_run()[0].items()),
    ]
    assert [q for q in quoted if q not in section] == []
