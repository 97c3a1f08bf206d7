"""The `model=` and `hardware=` config groups (bench/presets.py, experiments/model/,
experiments/hardware/).

A failure here means a preset of `impls.costmodel` has no YAML file (or a file outlives its
preset, or its fields differ from the preset's: run `python -m bench.presets`), or the
command line no longer does what its help says: `model=NAME` not choosing the preset, a
field override (`model.seq_len=8192`) not reaching the simulator's spec, a profile grid's
preset not followed by its fields, or a spelling users relied on before the groups
(`model.preset=NAME`, `+model.n_layers=48`, `hardware=path/to/hardware.yaml`) broken.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hydra import compose, initialize_config_dir

from bench import presets
from bench.app import CONFIG_DIR, build
from bench.experiments.auto_parallel.config import AutoParallelConfig
from impls.costmodel.hardware_file import dump_hardware
from impls.costmodel.models import MODELS
from impls.costmodel.presets import HARDWARE


def test_every_preset_has_its_file_and_every_file_its_preset():
    wanted = presets.expected_files()
    on_disk = {p for g in presets.GROUPS for p in presets.group_dir(g).glob("*.yaml")}
    experiment_dir = presets.CONFIG_DIR / "experiment"
    on_disk |= {p for p in experiment_dir.glob("*.yaml") if p.stem not in presets.HAND_WRITTEN}
    assert on_disk == set(wanted), "run `python -m bench.presets`"
    stale = [p.name for p, text in wanted.items() if p.read_text(encoding="utf-8") != text]
    assert not stale, f"{stale} differ from impls.costmodel: run `python -m bench.presets`"
    assert set(presets.options("model")) == set(MODELS)
    assert set(presets.options("hardware")) == {*HARDWARE, presets.FILE_OPTION}


@pytest.fixture(scope="module")
def plan():
    """The checked auto_parallel config the command line's overrides make."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):

        def make(*overrides: str):
            argv = presets.normalize(["experiment=auto_parallel", *overrides], "auto_parallel")
            assert presets.check_groups(argv, "auto_parallel") is None
            return build(compose("config", argv, return_hydra_config=True), "auto_parallel").cfg

        yield make


def test_every_experiment_has_its_file_and_a_hand_written_one_names_its_schema():
    from bench.experiments import experiments

    experiment_dir = presets.CONFIG_DIR / "experiment"
    assert {p.stem for p in experiment_dir.glob("*.yaml")} == set(experiments())
    for name in presets.HAND_WRITTEN:
        defaults = yaml.safe_load((experiment_dir / f"{name}.yaml").read_text())["defaults"]
        assert defaults[0] == f"/schema/{name}" and defaults[-1] == "_self_", name


def test_each_file_reads_back_as_its_preset():
    for name, spec in MODELS.items():
        assert AutoParallelConfig(model=presets.option_values("model", name)).spec() == spec
    for name, hw in HARDWARE.items():
        values = presets.option_values("hardware", name)
        cfg = AutoParallelConfig(hardware=values, dtype="fp16", gpus=[24])  # whole nodes of 4, 6, 8
        assert cfg.cluster() == hw and cfg.hardware_name() == name


@pytest.mark.parametrize(
    "model, hardware", [("llama2_70b", "h100_sxm"), ("small_gpt", "v100_summit")]
)
def test_a_group_choice_composes_to_its_preset(plan, model, hardware):
    cfg = plan(f"model={model}", f"hardware={hardware}", "dtype=fp16", "gpus=[24]")
    assert cfg.spec() == MODELS[model] and cfg.cluster() == HARDWARE[hardware]


def test_fields_override_without_a_plus(plan):
    cfg = plan(
        "model=llama2_70b",
        "model.seq_len=8192",
        "hardware=h100_sxm",
        "hardware.intra.bandwidth=1e12",
        "gpus=[512]",
    )
    assert cfg.spec() == dataclasses.replace(MODELS["llama2_70b"], seq_len=8192)
    assert cfg.cluster().intra.bandwidth == 1e12
    assert cfg.cluster().inter == HARDWARE["h100_sxm"].inter
    assert cfg.model["preset"] == "llama2_70b" and cfg.gpus == [512]


def test_the_spellings_before_the_groups_still_work(plan, tmp_path):
    # `model.preset=NAME`: the fields follow the preset, an overridden one stays.
    cfg = plan("model.preset=llama2_7b", "model.seq_len=1024")
    assert cfg.spec() == dataclasses.replace(MODELS["llama2_7b"], seq_len=1024)
    assert plan("+model.n_layers=48").spec() == dataclasses.replace(
        MODELS["gpt3_175b"], n_layers=48
    )
    path = dump_hardware(HARDWARE["h100_sxm"], tmp_path / "my_gpu.yaml")
    cfg = plan(f"hardware={path}")
    assert cfg.cluster() == HARDWARE["h100_sxm"] and cfg.hardware_name() == str(path)


def test_a_profile_grid_preset_is_followed_and_the_command_line_wins(plan):
    # experiments/profile_grid/ci_auto_parallel.yaml names gpt3_1_3b after the default
    # option's (gpt3_175b's) fields were merged: they must follow it.
    assert plan("profile=ci").spec() == MODELS["gpt3_1_3b"]
    cfg = plan("profile=ci", "model=llama2_7b", "model.seq_len=1024")
    assert cfg.spec() == dataclasses.replace(MODELS["llama2_7b"], seq_len=1024)
    assert cfg.model["preset"] == "llama2_7b"


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["model=gpt5"], ["model='gpt5' is unknown", "llama2_70b", "tinyllama_1_1b"]),
        (["-m", "model=llama2_7b,gpt5"], ["model='gpt5'", "gpt3_175b"]),
        (["hardware=tpu_v4"], ["hardware='tpu_v4'", "h100_sxm", "preset file"]),
        (["model.width=4"], ["model.width", "model=gpt3_175b", "n_layers, d_model"]),
        (["model=llama2_7b", "model.kv_head=2"], ["model.kv_head", "model=llama2_7b", "kv_heads"]),
        (["hardware.intra.bw=1"], ["hardware.intra.bw", "name, alpha_s, bandwidth"]),
        (["hardware=a.yaml", "hardware.sms=1"], ["hardware.sms", "hardware=file", "path"]),
    ],
)
def test_an_unknown_preset_or_field_is_one_line_naming_it_and_what_exists(argv, needles):
    line = presets.check_groups(presets.normalize(argv, "auto_parallel"), "auto_parallel")
    assert line is not None and line.startswith("bad config: ") and "\n" not in line
    for needle in needles:
        assert needle in line, (needle, line)


def test_experiments_without_the_groups_are_left_alone():
    argv = ["+model.dropout=0.1", "hardware=x.yaml", "model=whatever"]
    assert presets.normalize(argv, "sequence_parallel") == argv
    # Refused by bench in one line (Hydra's own refusal of `model=0` is a traceback).
    assert presets.check_groups(argv, "sequence_parallel").startswith(
        "bad config: hardware=x.yaml: experiment sequence_parallel takes no hardware preset"
    )
    assert presets.experiment_groups("auto_parallel") == {
        "model": "gpt3_175b",
        "hardware": "a100_80gb",
    }
