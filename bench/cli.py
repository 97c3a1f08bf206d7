"""What `python -m bench` says before Hydra parses the command line: `--help` (the
experiments, the run-level keys, examples), `experiment=NAME --help` (that experiment's
keys) and the one line that refuses a missing or unknown experiment.

Hydra's own answers are a stack trace: its app help composes the config, which has no
`experiment` default. Everything printed here is read from where it is defined, so it
cannot drift: a key's type and default from the schema dataclass (and the experiment's
YAML), its meaning from the docstring under the field (`ast`), its allowed values from the
schema's own checks — `check_choice` / `check_choices` name them in the error they raise,
so the help builds the schema with a value no check accepts and reads that line.

Top-level help reads each experiment's summary from its `experiment.py` source instead of
importing it (importing one pulls in torch and the plotting stack, seconds per `--help`).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import sys
import textwrap
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from bench.config import RunConfig, range_text
from bench.presets import check_groups, experiment_groups, normalize, presets_help

__all__ = [
    "KeyHelp",
    "check_experiment",
    "experiment_help",
    "experiment_names",
    "field_docs",
    "intercept",
    "main_help",
    "normalize_argv",
    "run_keys",
    "schema_keys",
    "summaries",
    "yaml_defaults",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "experiments"
EXPERIMENTS_DIR = Path(__file__).resolve().parent / "experiments"
WIDTH = 88
# A value none of the schemas' choices accept: the check it fails names the allowed values.
PROBE = "\x00not-a-choice"
USAGE = """\
usage: python -m bench experiment=NAME [key=value ...]
       python -m bench -m experiment=NAME key=a,b ...   a sweep (Hydra multirun)
       python -m bench experiment=NAME --help           that experiment's keys"""
# From README.md, "Running experiments".
EXAMPLES = """\
python -m bench experiment=allreduce_scaling                      # full grid -> reports/allreduce_scaling
python -m bench experiment=allreduce_scaling profile=ci           # the shrunk CI grid
python -m bench experiment=allreduce_scaling algorithms=[ring,torch] world_sizes=[2,4] \\
    message_bytes=[1048576] report_dir=/tmp/ar                    # any key can be overridden
python -m bench -m experiment=collectives world_sizes=[2],[4]     # a Hydra multirun sweep
python -m bench experiment=collectives resume=true                # skip cells already done
python -m bench experiment=collectives wandb.mode=online          # offline | online | disabled
python -m bench experiment=auto_parallel model=llama2_70b gpus=[512]  # a model preset (model=, hardware=)
python -m bench experiment=auto_parallel model=llama2_70b model.seq_len=8192 \\
    hardware=h100_sxm gpus=[512]                                  # a preset's fields, by name
python -m bench experiment=auto_parallel \\
    hardware=reports/device_profile/hardware.yaml                 # a preset file device_profile wrote"""
# Options Hydra answers without the app's config, or with another primary config.
HYDRA_OWN = {
    "--hydra-help",
    "--version",
    "--info",
    "-i",
    "--config-name",
    "-cn",
    "--config-path",
    "-cp",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
}
COMPLETION = {"-sc", "--shell-completion"}


@dataclass(frozen=True)
class KeyHelp:
    """One key as the help lists it; `allowed` is empty where any value of the type goes."""

    name: str
    type: str
    default: str
    allowed: str
    meaning: str

    def render(self) -> str:
        head = f"  {self.name}: {self.type} = {self.default}"
        body = [f"allowed: {self.allowed}"] if self.allowed else []
        body += [self.meaning] if self.meaning else []
        wrapped = [
            textwrap.fill(line, WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6)
            for line in body
        ]
        return "\n".join([head, *wrapped])


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` and of its dataclass bases (a
    subclass's own wins), whitespace collapsed: the field's help text."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not is_dataclass(klass) or klass.__module__ == "types":
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # made at run time (make_dataclass): no source
            continue
        body = ast.parse(source).body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _probes(field: Field) -> list[Any]:
    """The values to try on a field that may take strings (the kind `check_choice` and
    `check_choices` guard): a lone string, a list of one, or both for `Any`."""
    kinds = {part.strip() for part in str(field.type).split("|")} - {"None"}
    if kinds == {"Any"}:
        return [[PROBE], PROBE]
    if not kinds or not kinds <= {"str", "list[str]"}:
        return []
    return [[PROBE]] if "list[str]" in kinds else [PROBE]


def _allowed(cls: type, field: Field, key: str) -> str:
    """The allowed values the schema's checks name for `key` (as `check_choice` words
    them, or a preset lookup's "choose one of"), or '' if no check lists them."""
    for value in _probes(field):
        try:
            cls(**{field.name: value})
        except ValueError as error:
            line = str(error)
            if not re.match(rf"({re.escape(key)}: )?{re.escape(key)}=", line):
                continue
            for marker in ("allowed values: ", "choose one of "):
                if marker in line:
                    return line.split(marker, 1)[1]
    return ""


def _default(field: Field) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return "???"


def _show(value: Any) -> str:
    """A value as it is written on the command line (Hydra's override syntax)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    if value == "":
        return "''"
    return str(value)


def schema_keys(cls: type, prefix: str = "", overrides: dict | None = None) -> list[KeyHelp]:
    """Every key of dataclass `cls` (nested dataclasses flattened to `prefix.key`), with its
    type, default (`overrides` — the experiment's YAML — before the schema's), allowed
    values and meaning."""
    docs, overrides = field_docs(cls), overrides or {}
    keys = []
    for field in fields(cls):
        default = overrides.get(field.name, _default(field))
        if is_dataclass(field.default_factory):
            keys += schema_keys(field.default_factory, f"{prefix}{field.name}.")
            continue
        allowed = _allowed(cls, field, prefix + field.name) or range_text(field.metadata)
        keys.append(
            KeyHelp(
                prefix + field.name,
                str(field.type),
                _show(default),
                allowed,
                docs.get(field.name, ""),
            )
        )
    return keys


def run_keys() -> list[KeyHelp]:
    """The run-level keys every experiment takes (`bench.config.RunConfig`)."""
    return schema_keys(RunConfig)


def experiment_names() -> list[str]:
    """The experiments' names, found as `bench.experiments.experiments()` finds them (a
    folder with an `experiment.py`), without importing them."""
    return sorted(p.parent.name for p in EXPERIMENTS_DIR.glob("*/experiment.py"))


def _summary_in_source(name: str) -> str | None:
    """The literal `summary=` of `EXPERIMENT = Experiment(...)` in the experiment's source."""
    tree = ast.parse((EXPERIMENTS_DIR / name / "experiment.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Experiment":
            for keyword in node.keywords:
                if keyword.arg == "summary" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return None


def summaries() -> dict[str, str]:
    """Every experiment's one-line summary, by name; an experiment whose summary is not a
    literal in its source is imported for it."""
    found = {name: _summary_in_source(name) for name in experiment_names()}
    return {
        name: text if text is not None else _experiment(name).summary
        for name, text in found.items()
    }


def _experiment(name: str) -> Any:
    return importlib.import_module(f"bench.experiments.{name}.experiment").EXPERIMENT


def _groups() -> list[tuple[str, str]]:
    """(`group=option`, the first sentence of that option's YAML comment) for the config
    groups a user picks from — those the primary config's defaults list chooses by name
    (cluster, profile; not experiment, which has none, nor the optional profile_grid
    derived from the others); the default is marked."""
    import yaml

    primary = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())
    defaults = {k: v for d in primary["defaults"] if isinstance(d, dict) for k, v in d.items()}
    rows = []
    for group, default in defaults.items():
        if not re.fullmatch(r"\w+", group) or not re.fullmatch(r"\w+", str(default)):
            continue
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            comment = " ".join(
                line.lstrip("# ").strip()
                for line in path.read_text().splitlines()
                if line.startswith("#") and "@package" not in line
            )
            first = re.split(r"(?<=[.:])\s", comment, maxsplit=1)[0].rstrip(":.")
            mark = " (default)" if default == path.stem else ""
            rows.append((f"{group}={path.stem}", first + mark))
    return rows


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(left) for left, _ in rows) + 2
    indent = " " * (2 + width)
    return "\n".join(
        textwrap.fill(right, WIDTH, initial_indent=f"  {left:<{width}}", subsequent_indent=indent)
        for left, right in rows
    )


def main_help() -> str:
    """`python -m bench --help`."""
    return "\n\n".join(
        [
            USAGE,
            "Runs one experiment's grid of cells and writes reports/NAME/ (results.csv, report.md,\n"
            "plots). Keys are Hydra overrides: key=value, lists as [a,b], nested as cluster.kind=...",
            "experiments:\n" + _table(list(summaries().items())),
            "config groups:\n" + _table(_groups()),
            "run-level keys (any experiment):\n" + "\n".join(k.render() for k in run_keys()),
            "examples:\n" + textwrap.indent(EXAMPLES, "  "),
            "Hydra's own options (-m, --cfg job, --shell-completion, ...): "
            "python -m bench --hydra-help",
        ]
    )


def yaml_defaults(name: str) -> dict:
    """The keys `experiments/experiment/<name>.yaml` sets over its schema's defaults."""
    import yaml

    path = CONFIG_DIR / "experiment" / f"{name}.yaml"
    values = yaml.safe_load(path.read_text()) if path.exists() else None
    return {k: v for k, v in (values or {}).items() if k != "defaults"}


def experiment_help(name: str) -> str:
    """`python -m bench experiment=NAME --help`: the experiment's keys."""
    experiment = _experiment(name)
    keys = schema_keys(experiment.schema, overrides=yaml_defaults(name))
    groups = {}
    for choice, _ in _groups():
        group, option = choice.split("=")
        groups[group] = f"{groups[group]}|{option}" if group in groups else choice
    run = ", ".join([f.name for f in fields(RunConfig)] + list(groups.values()))
    return "\n\n".join(
        [
            f"usage: python -m bench experiment={name} [key=value ...]",
            f"{name}: {experiment.summary}",
            f"keys (profile=ci shrinks the grid: experiments/profile_grid/ci_{name}.yaml):\n"
            + "\n".join(k.render() for k in keys),
            *([_wrap_presets(presets_help(name))] if experiment_groups(name) else []),
            textwrap.fill(f"run-level keys ({run}): python -m bench --help", WIDTH),
        ]
    )


def _wrap_presets(text: str) -> str:
    return "presets (config groups):\n" + "\n".join(
        textwrap.fill(line, WIDTH, initial_indent="  ", subsequent_indent="      ")
        for line in text.splitlines()
    )


def _experiment_override(argv: list[str]) -> str | None:
    """The value of the last `experiment=` override on the command line, or None."""
    values = [m.group(1) for a in argv if (m := re.fullmatch(r"\+{0,2}experiment=(.*)", a))]
    return values[-1] if values else None


def check_experiment(argv: list[str]) -> str | None:
    """The one line refusing the command line's experiment (missing, or a name no folder
    has), or None. A sweep's plain list (`a,b`) is checked name by name; other sweep
    syntax (`glob(*)`, `choice(...)`) is left to Hydra."""
    allowed = experiment_names()
    given = {m.group(1) for a in argv if (m := re.fullmatch(r"\+{0,2}experiment=(.*)", a))}
    if len(given) > 1:
        return (
            f"bad config: experiment= is given {len(given)} times ({', '.join(sorted(given))}); "
            "give one (a sweep: experiment=a,b --multirun)"
        )
    value = _experiment_override(argv)
    if not value:
        return (
            f"bad config: experiment is missing (experiment=NAME); allowed values: "
            f"{', '.join(allowed)}"
        )
    if not re.fullmatch(r"[\w,]+", value):
        return None
    unknown = [name for name in value.split(",") if name not in allowed]
    if unknown:
        return (
            f"bad config: experiment={unknown[0]!r} is unknown; allowed values: "
            f"{', '.join(allowed)}"
        )
    return None


def normalize_argv(argv: list[str]) -> list[str]:
    """`argv` as Hydra takes it: the experiment's preset spellings `normalize`d."""
    value = _experiment_override(argv)
    return normalize(argv, value) if value in experiment_names() else argv


def _completion_line(environ: dict[str, str]) -> None:
    """Rewrite `COMP_LINE` so that Hydra's bash completion, which strips `python file.py`
    or `app` from its start, also strips `python -m bench` (else it reads `-m` as
    --multirun and `bench` as an override)."""
    line = environ.get("COMP_LINE", "")
    match = re.match(r"\s*\S*python[\d.]*\s+-m\s+bench(?=\s|$)", line)
    if match:
        environ["COMP_LINE"] = "bench" + line[match.end() :]
        if environ.get("COMP_POINT", "").isdigit():
            shift = match.end() - len("bench")
            environ["COMP_POINT"] = str(max(0, int(environ["COMP_POINT"]) - shift))


def _page(text: str) -> None:
    """Print the help and exit 0, quietly when the reader stops early (`| head`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # stdout's other end is gone: point it at /dev/null so exit's flush cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


def intercept(argv: list[str], environ: Any = os.environ) -> None:
    """Answer `--help` and refuse a missing or unknown experiment, or an unknown preset or
    preset field (exit status 2), before Hydra sees `argv`; return when Hydra should take
    the command line (`normalize`d: bench/presets.py)."""
    if COMPLETION & set(argv):
        _completion_line(environ)
        return
    if HYDRA_OWN & {a.split("=", 1)[0] for a in argv}:
        return
    value, known = _experiment_override(argv), experiment_names()
    if {"--help", "-h"} & set(argv):
        if value is None:
            _page(main_help())
        error = check_experiment(argv)
        if error is None and value in known:
            _page(experiment_help(value))
        error = error or "bad config: --help takes one experiment=NAME, not a sweep"
    else:
        error = check_experiment(argv)
        if error is None:
            error = check_groups(normalize(argv, value), value) if value in known else None
        if error is None:
            return
    print(error, file=sys.stderr)
    sys.exit(2)
