"""Hardware preset files (`impls.costmodel.hardware_file`, `hardware(path)`).

A failure here means a preset does not survive being written and read back (a field lost,
a table's order or a number's last digit changed, `sources` dropped), so a plan made on a
file differs from the same plan on the preset; or a bad file is taken silently, or refused
without naming the file and the key a user must fix."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from impls.costmodel.hardware import Hardware
from impls.costmodel.hardware_file import dump_hardware, is_hardware_file, load_hardware
from impls.costmodel.presets import HARDWARE, hardware


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_every_preset_round_trips_through_a_file(name, tmp_path):
    preset = HARDWARE[name]
    path = dump_hardware(preset, tmp_path / f"{name}.yaml")
    back = load_hardware(path)
    assert back == preset
    for field in dataclasses.fields(Hardware):  # every field, sources and links included
        assert getattr(back, field.name) == getattr(preset, field.name), field.name
    assert hardware(str(path)) == preset  # the path goes where a preset name goes
    written = yaml.safe_load(path.read_text())
    assert written["sources"] == dict(preset.sources)
    required = [
        f.name
        for f in dataclasses.fields(Hardware)
        if f.default is f.default_factory is dataclasses.MISSING
    ]
    assert set(required) <= set(written)  # the rest, left out at its default, reads back


def test_a_file_is_told_from_a_name():
    assert is_hardware_file("my.yaml") and is_hardware_file("x.yml")
    assert is_hardware_file("reports/device_profile/hw") and not is_hardware_file("a100_80gb")


def _written(tmp_path, edit) -> str:
    """The a100_80gb preset as a file, its mapping changed by `edit`; the file's path."""
    data = yaml.safe_load(dump_hardware(HARDWARE["a100_80gb"], tmp_path / "a.yaml").read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _set(key, value):
    def edit(data):
        *parents, last = key.split(".")
        for part in parents:
            data = data[part]
        data[last] = value

    return edit


BAD = [
    ("missing_field", lambda d: d.pop("memory_bytes"), ["memory_bytes", "missing"]),
    ("missing_link_field", lambda d: d["intra"].pop("bandwidth"), ["intra.bandwidth", "missing"]),
    ("unknown_field", _set("hbm_gb", 80), ["hbm_gb", "unknown field", "memory_bytes"]),
    ("unknown_link_field", _set("inter.latency", 1), ["inter.latency", "unknown field"]),
    ("wrong_type_number", _set("memory_bytes", "lots"), ["memory_bytes", "expected a number"]),
    ("wrong_type_int", _set("devices_per_node", 8.5), ["devices_per_node", "integer"]),
    ("wrong_type_bool", _set("comm_overlap", "yes"), ["comm_overlap", "true or false"]),
    ("wrong_type_table", _set("gemm_efficiency", 0.8), ["gemm_efficiency", "a list"]),
    ("wrong_point", _set("gemm_efficiency", [[1e9, 0.5, 3]]), ["gemm_efficiency[0]", "2"]),
    ("wrong_type_link", _set("intra", 300), ["intra", "mapping of Link"]),
    ("non_positive", _set("memory_bandwidth", -1.0), ["memory_bandwidth=-1.0", "> 0"]),
    ("zero_peak", _set("peak_flops.bf16", 0), ["peak_flops[bf16]=0", "> 0"]),
    ("negative_alpha", _set("intra.alpha_s", -1e-6), ["intra", "alpha_s", "≥ 0"]),
    ("nan", _set("memory_bytes", float("nan")), ["memory_bytes", "nan"]),
    ("unknown_dtype", _set("peak_flops.fp64", 1e12), ["peak_flops", "fp64"]),
]


@pytest.mark.parametrize("edit, needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, edit, needles):
    path = _written(tmp_path, edit)
    with pytest.raises(ValueError) as caught:
        load_hardware(path)
    message = str(caught.value)
    assert "\n" not in message and path in message
    for needle in needles:
        assert needle in message, (needle, message)
    with pytest.raises(ValueError, match="^gpt3_hardware: hardware file"):  # as a config key
        hardware(path, key="gpt3_hardware")


@pytest.mark.parametrize(
    "text, needle",
    [
        (None, "cannot read it"),
        ("peak: [1, 2", "not YAML"),
        ("- 1\n- 2\n", "mapping of Hardware"),
        ("", "mapping of Hardware"),
    ],
)
def test_a_missing_or_malformed_file_is_one_line(tmp_path, text, needle):
    path = tmp_path / "h.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=needle) as caught:
        hardware(str(path))
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_optional_fields_take_their_defaults_and_yaml_exponents_are_numbers(tmp_path):
    def edit(data):
        for key in ("kernel_overhead_s", "fp8_gemm_efficiency", "attention_efficiency", "sources"):
            data.pop(key, None)
        data["memory_bytes"] = "80e9"  # YAML 1.1 reads an exponent without a dot as text

    hw = load_hardware(_written(tmp_path, edit))
    assert hw.memory_bytes == 80e9 and hw.kernel_overhead_s == 0.0 and hw.sources == {}
    assert hw.fp8_gemm_efficiency is None and hw.attention_efficiency is None
