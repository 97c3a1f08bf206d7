"""The `model=` and `hardware=` config groups: `experiments/model/<name>.yaml` and
`experiments/hardware/<name>.yaml`, one file per preset of `impls.costmodel`.

The presets are defined once, in `impls.costmodel.models.MODELS` and
`impls.costmodel.presets.HARDWARE`; the YAML files are written from them
(`python -m bench.presets`) so that Hydra can choose one by name and override its fields
(`model=llama2_70b model.seq_len=8192`). tests/test_presets.py fails when a file is
missing, left over, or differs from what this module writes.

A model file holds `preset` (its name, what the report shows) and every field of
`TransformerSpec`; a hardware file holds `preset` and every field of `Hardware`, as
`impls.costmodel.hardware_file` writes and reads a preset file. `hardware/file.yaml` is
not a preset: `hardware=path/to/hardware.yaml` (a file `device_profile` writes) is read as
`hardware=file hardware.path=path/to/hardware.yaml` (`bench.cli.normalize`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "FILE_OPTION",
    "GROUPS",
    "expected_files",
    "experiment_groups",
    "follow_preset",
    "group_dir",
    "normalize",
    "check_groups",
    "presets_help",
    "option_values",
    "options",
    "write",
]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "experiments"
GROUPS = ("model", "hardware")
# Config groups every experiment takes (experiments/<group>/): where ranks come from, and
# which grid (profile=ci shrinks it).
RUN_GROUPS = ("cluster", "profile")
FILE_OPTION = "file"
"""The `hardware` option that reads a preset file (`hardware.path`) instead of a preset."""
_FILE_YAML = """\
# A hardware preset file, as device_profile writes it: python -m bench ... hardware=PATH
# (read as hardware=file hardware.path=PATH; the file's fields cannot be overridden here).
path: ???
"""


def group_dir(group: str) -> Path:
    return CONFIG_DIR / group


def options(group: str) -> list[str]:
    """The options of `group` as Hydra finds them (the file names), presets first."""
    names = sorted(p.stem for p in group_dir(group).glob("*.yaml"))
    return sorted(names, key=lambda name: name == FILE_OPTION)


def option_values(group: str, option: str) -> dict | None:
    """What the option's file sets (None: no such option)."""
    path = group_dir(group) / f"{option}.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None


def experiment_groups(experiment: str) -> dict[str, str]:
    """The groups `experiments/experiment/<experiment>.yaml` picks an option of, with the
    option it picks by default (`- /model: gpt3_175b`)."""
    path = CONFIG_DIR / "experiment" / f"{experiment}.yaml"
    entries = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("defaults", [])
    picked = {k.lstrip("/"): v for e in entries if isinstance(e, dict) for k, v in e.items()}
    return {group: str(option) for group, option in picked.items() if group in GROUPS}


def follow_preset(values: dict, choices: Mapping[str, Any], experiment: str) -> dict:
    """`values` (the composed config) with each group's fields following its `preset`.

    Hydra merges a group's option before the configs that come after it, so a later one
    that names another preset (`model: {preset: gpt3_1_3b}` in a profile grid, or
    `model.preset=NAME` on the command line) would leave the option's fields under the new
    name. Here the fields still at the chosen option's value take the named preset's;
    those overridden stay as given. An option chosen on the command line (`model=NAME`,
    not the experiment's default) wins over a profile grid's preset."""
    for group, default in experiment_groups(experiment).items():
        node, chosen = values.get(group), choices.get(group) or default
        if not isinstance(node, dict) or node.get("preset") in (None, chosen):
            continue
        if chosen != default:
            values[group] = {**node, "preset": chosen}
            continue
        option, named = option_values(group, chosen), option_values(group, node["preset"])
        if option is None or named is None:
            continue  # an unknown preset: the schema's check names it
        overridden = {k: v for k, v in node.items() if option.get(k) != v}
        values[group] = {**named, **overridden}
    return values


def _parsed(arg: str) -> tuple[str, str, str] | None:
    """(the `+`/`++` prefix, the key, the value) of a `key=value` override, or None."""
    match = re.fullmatch(r"(\+{0,2})([\w.]+)=(.*)", arg)
    return (match.group(1), match.group(2), match.group(3)) if match else None


def _chosen(argv: list[str], group: str, default: str) -> str:
    """The option of `group` the command line picks (its last `group=NAME`), or `default`."""
    picked = [p[2] for a in argv if (p := _parsed(a)) and not p[0] and p[1] == group]
    return picked[-1] if picked else default


def _missing_key(values: Any, dotted: list[str]) -> tuple[str, list[str]] | None:
    """The first key of `dotted` not in the nested mapping `values`, with the keys there."""
    for depth, key in enumerate(dotted):
        if not isinstance(values, dict) or key not in values:
            found = list(values) if isinstance(values, dict) else []
            return ".".join(dotted[: depth + 1]), found
        values = values[key]
    return None


def normalize(argv: list[str], experiment: str | None) -> list[str]:
    """The command line as Hydra takes it: `hardware=path/to/file.yaml` (a preset file)
    becomes `hardware=file hardware.path=...`, and `+model.seq_len=...` (needed before
    `model` was a group) `model.seq_len=...` where the field exists."""
    groups = experiment_groups(experiment) if experiment else {}
    if not groups:
        return list(argv)
    from impls.costmodel.hardware_file import is_hardware_file  # imports torch: seconds

    out = []
    for arg in argv:
        parsed = _parsed(arg)
        group = parsed[1].split(".")[0] if parsed else None
        if not parsed or group not in groups:
            out.append(arg)
        elif parsed[1] == "hardware" and not parsed[0] and is_hardware_file(parsed[2]):
            out += [f"hardware={FILE_OPTION}", f"hardware.path={parsed[2]}"]
        elif parsed[0] and "." in parsed[1]:
            values = option_values(group, _chosen(argv, group, groups[group]))
            known = _missing_key(values, parsed[1].split(".")[1:]) is None
            out.append(f"{parsed[1]}={parsed[2]}" if known else arg)
        else:
            out.append(arg)
    return out


def check_groups(argv: list[str], experiment: str) -> str | None:
    """The one line refusing an unknown option of a group (`model=gpt5`) or an unknown
    field of the option picked (`model.width=4`), or None. Takes `normalize`d argv."""
    groups = experiment_groups(experiment)
    for arg in argv:
        parsed = _parsed(arg)
        group = parsed[1].split(".")[0] if parsed else None
        if parsed and parsed[1] in RUN_GROUPS + GROUPS and group not in groups:
            refusal = _other_group(parsed, experiment)
            if refusal:
                return refusal
            continue
        if group not in groups or parsed[0]:
            continue
        if parsed[1] == group:
            allowed = options(group)
            if not re.fullmatch(r"[\w,]+", parsed[2]):
                continue  # sweep syntax (glob, choice): Hydra's to expand
            unknown = [name for name in parsed[2].split(",") if name not in allowed]
            if unknown:
                files = ", or a preset file (path/to/hardware.yaml)" if group == "hardware" else ""
                return (
                    f"bad config: {group}={unknown[0]!r} is unknown; allowed values: "
                    f"{', '.join(o for o in allowed if o != FILE_OPTION)}{files}"
                )
            continue
        option = _chosen(argv, group, groups[group])
        values = option_values(group, option) if option in options(group) else None
        missing = _missing_key(values, parsed[1].split(".")[1:]) if values else None
        if missing:
            key, found = missing
            return (
                f"bad config: {group}.{key} is not a field of {group}={option}; allowed "
                f"keys: {', '.join(found)}"
            )
    return None


def _other_group(parsed: tuple[str, str, str], experiment: str) -> str | None:
    """The one line refusing `group=value` of a run-level group (cluster, profile) that
    names none of its options, or of a preset group the experiment does not take; None for
    what Hydra should parse (an option, a sweep)."""
    prefix, group, value = parsed
    if group in GROUPS:
        return (
            f"bad config: {group}={value}: experiment {experiment} takes no {group} "
            f"preset (where it has a {group} key, set its fields by name: "
            f"{group}.<field>=...; see --help)"
        )
    if value.startswith("["):
        return f"bad config: {group}={value}: give one of {', '.join(options(group))}"
    if prefix or not re.fullmatch(r"[\w,]+", value):
        return None  # sweep syntax (glob, choice): Hydra's to expand
    unknown = [name for name in value.split(",") if name not in options(group)]
    if unknown:
        return (
            f"bad config: {group}={unknown[0]!r} is unknown; allowed values: "
            f"{', '.join(options(group))}"
        )
    return None


def presets_help(experiment: str) -> str:
    """The experiment help's lines on its groups: each group's options, its default, and
    how fields override."""
    lines = []
    for group, default in experiment_groups(experiment).items():
        names = [n for n in options(group) if n != FILE_OPTION]
        files = "; or a preset file: hardware=path/to/hardware.yaml" if group == "hardware" else ""
        lines.append(f"{group}= (default {default}): {', '.join(names)}{files}")
    example = {"model": "model.seq_len=8192", "hardware": "hardware.devices_per_node=4"}
    fields = " ".join(example[g] for g in experiment_groups(experiment))
    if lines:
        lines.append(
            f"A preset's fields override by name, as {fields} (every field: "
            f"python -m bench experiment={experiment} --cfg job)."
        )
    return "\n".join(lines)


def _dump(values: dict) -> str:
    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True, width=88)


def _model_yaml(name: str) -> str:
    from impls.costmodel.models import CARDS

    card = CARDS[name]
    header = f"# {name}: {card.source}\n# Generated by `python -m bench.presets` from impls/costmodel/models.py.\n"
    return header + _dump({"preset": name, **dataclasses.asdict(card.spec)})


def _hardware_yaml(name: str) -> str:
    from impls.costmodel.hardware_file import to_plain
    from impls.costmodel.presets import HARDWARE

    hw = HARDWARE[name]
    header = f"# {name}: {hw.name}\n# Generated by `python -m bench.presets` from impls/costmodel/presets.py.\n"
    # Every field written, those at their default too: each one can then be overridden.
    fields = {f.name: to_plain(getattr(hw, f.name)) for f in dataclasses.fields(hw)}
    return header + _dump({"preset": name, **fields})


# Experiment files that hold settings of their own (a preset group's default, values that
# differ from the schema's), written by hand; every other experiment's file is generated.
HAND_WRITTEN = ("auto_parallel", "pipeline_utilization")


def experiment_yaml(name: str) -> str:
    """`experiments/experiment/<name>.yaml`: the experiment's summary and its schema."""
    from bench.experiments import experiments

    summary = experiments()[name].summary
    lines = [
        "# @package _global_",
        f"# {name}: {summary}.",
        f"# Every key, its default and its meaning: bench/experiments/{name}/config.py.",
        "# Generated by `python -m bench.presets` from the experiment's declaration.",
        "defaults:",
        f"  - /schema/{name}",
        "  - _self_",
    ]
    return "\n".join(lines) + "\n"


def expected_files() -> dict[Path, str]:
    """Every generated file (the two preset groups, the experiments without settings of
    their own), by path, with the text it must hold."""
    from bench.experiments import experiments
    from impls.costmodel.models import MODELS
    from impls.costmodel.presets import HARDWARE

    files = {group_dir("model") / f"{name}.yaml": _model_yaml(name) for name in MODELS}
    files |= {group_dir("hardware") / f"{name}.yaml": _hardware_yaml(name) for name in HARDWARE}
    files[group_dir("hardware") / f"{FILE_OPTION}.yaml"] = _FILE_YAML
    files |= {
        CONFIG_DIR / "experiment" / f"{name}.yaml": experiment_yaml(name)
        for name in experiments()
        if name not in HAND_WRITTEN
    }
    return files


def write() -> list[Path]:
    """Write the groups' files from the presets, removing any without a preset; the paths
    changed."""
    wanted = expected_files()
    changed = []
    for group in GROUPS:
        group_dir(group).mkdir(exist_ok=True)
        for path in group_dir(group).glob("*.yaml"):
            if path not in wanted:
                path.unlink()
                changed.append(path)
    for path, text in wanted.items():
        path.parent.mkdir(exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":
    for path in write():
        print(path.relative_to(CONFIG_DIR.parent), file=sys.stderr)
