"""Generated bad input (issue 35): every key of every experiment, and the run-level keys,
given values of the wrong type, out of range, NaN, ±inf, huge, empty lists. The config is
composed as the command line composes it and checked by `bench.app.build` (what runs
between composing and the first rank); the property: it is refused in one line naming the
key, or accepted — never another exception (a TypeError, a KeyError, an OverflowError),
which the command line would print as a traceback.

What an accepted value then costs is bounded by the schema's declared ranges (`--help`
shows them); `tests/test_bad_input.py` runs a few of these end to end.
"""

from __future__ import annotations

import math
import os
import typing
from dataclasses import MISSING, fields, is_dataclass

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from bench.app import CONFIG_DIR, build
from bench.config import RunConfig, range_text
from bench.experiments import experiments

# Keys whose value is a path or a nested group: their own tests cover them.
SKIP = {"report_dir", "wandb", "cluster", "profile", "reports_root", "trace_dir", "hardware"}

# Examples per key: enough to meet each kind of bad value in CI (derandomized, so the same
# ones every run); DISTBENCH_EXAMPLES=200 searches wider by hand.
EXAMPLES = int(os.environ.get("DISTBENCH_EXAMPLES", "6"))
SCALARS = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15),
    st.sampled_from([0, -1, 1, 2**31, 10**12, 2**62]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e-30, 1e30, -0.5]),
    st.booleans(),
    st.sampled_from(["abc", "maybe", "", "2", "true", "-8192", "nan"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.just([]))


def hydra_text(value) -> str:
    """`value` as a Hydra override writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return "'" + value + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_text(v) for v in value) + "]"
    return repr(value)


def keys_of(schema: type) -> list[str]:
    return [f.name for f in fields(schema) if f.name not in SKIP]


CASES = [(name, key) for name, exp in experiments().items() for key in keys_of(exp.schema)]
CASES += [("allreduce_scaling", key) for key in keys_of(RunConfig)]
CASES += [
    ("allreduce_scaling", f"cluster.{key}")
    for key in ("max_ranks", "memory_gb", "timeout_min", "requeues")
]
CASES += [
    ("auto_parallel", f"model.{key}")
    for key in ("n_layers", "d_model", "n_heads", "seq_len", "d_ff", "kv_heads")
]
CASES += [("zero_memory", f"model.{key}") for key in ("n_layers", "d_model", "bias")]


@pytest.fixture(scope="module")
def composed():
    """Each experiment's config as the command line composes it, once (composing is most of
    a refusal's cost); an example overrides one key of a copy, as Hydra's override would."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        yield {
            name: compose(
                "config",
                overrides=[f"experiment={name}", "cluster.memory_gb=32"],
                return_hydra_config=True,
            )
            for name in experiments()
        }


# A validator that walks a huge value (a 15-digit d_model once took 285 s in `divisors`)
# ends the run here with every thread's stack, instead of quietly eating CI's time: a case
# takes ~0.3 s. The thread method: a signal's failure is caught by hypothesis, which then
# replays the slow example to shrink it (tried: 200 s and still running).
@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("name, key", CASES, ids=[f"{n}:{k}" for n, k in CASES])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=VALUES)
def test_a_generated_value_is_refused_naming_its_key_or_accepted(
    composed, tmp_path, name, key, value
):
    cfg = composed[name].copy()
    override = f"{key}={hydra_text(value)}"
    try:  # what Hydra does with the override: its type checked against the schema
        OmegaConf.update(cfg, key, value, merge=True)
        OmegaConf.update(cfg, "report_dir", str(tmp_path / "r"))
    except OmegaConfBaseException:  # the command line: exit 1, Hydra naming the override
        return
    with open_dict(cfg):
        cfg.hydra.overrides.task = [override]
    try:
        build(cfg, name)
    except ValueError as error:  # the command line: `bad config: ...`, exit 2
        message = str(error)
        assert key.split(".")[-1] in message, (override, message)
        assert "\n" not in message.strip(), (override, message)


def numeric_keys(schema: type, prefix: str = "") -> list[tuple[str, type, typing.Any]]:
    """(key, int or float, field) for every number or list of numbers of `schema`, its
    nested configs walked."""
    out, hints = [], typing.get_type_hints(schema)
    for f in fields(schema):
        kinds = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
        kind = kinds[0] if kinds else hints[f.name]
        if typing.get_origin(kind) is list:
            kind = typing.get_args(kind)[0]
        if is_dataclass(kind):
            out += numeric_keys(kind, f"{prefix}{f.name}.")
        elif kind in (int, float) and len(kinds) <= 1:
            out.append((prefix + f.name, kind, f))
        elif kind is typing.Any and (number := _number_default(f)) is not None:
            out.append((prefix + f.name, number, f))  # a lone value or a list of them
    return out


def _number_default(f) -> type | None:
    """int or float when an `Any` key's default is a number or a list of them."""
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    items = default if isinstance(default, list) else [default]
    kinds = {type(x) for x in items}
    return kinds.pop() if len(kinds) == 1 and kinds <= {int, float} else None


NUMERIC = [(name, *key) for name, exp in experiments().items() for key in numeric_keys(exp.schema)]


def test_every_numeric_key_declares_its_range():
    """Issue 35: bounds live in the schema. Every number an experiment takes declares both
    ends (`bench.config.bounded` and its kin), so `--help` shows them and `check_types`
    refuses a value past them before any rank starts, naming the key."""
    assert len(NUMERIC) > 100, len(NUMERIC)
    missing = [
        f"{name}:{key}"
        for name, key, _, f in NUMERIC
        if f.metadata.get("ge") is None or f.metadata.get("le") is None
    ]
    assert not missing, f"numeric keys without a declared range: {missing}"
    # a narrow integer range reads as its values (`one of 0, 1, 2, 3`); a number's never
    listed = [
        f"{name}:{key}"
        for name, key, kind, f in NUMERIC
        if kind is float and range_text(f.metadata).startswith("one of")
    ]
    assert not listed, f"number keys worded as a list of integers: {listed}"


@pytest.mark.parametrize("side", ["above", "below"])
@pytest.mark.parametrize("name, key, kind, f", NUMERIC, ids=[f"{n}:{k}" for n, k, _, _ in NUMERIC])
def test_a_value_past_its_declared_bound_is_refused_naming_the_key(
    composed, tmp_path, name, key, kind, f, side
):
    """Just past either end of the declared range: refused in one line naming the key and
    the range (what `--help` shows), before any rank or file."""
    bound = f.metadata["le"] if side == "above" else f.metadata["ge"]
    step = 1 if kind is int else max(abs(bound) * 1e-6, 1e-9)
    value = kind(bound + step if side == "above" else bound - step)
    listed = typing.get_origin(typing.get_type_hints(type_of(name, key))[key.split(".")[-1]])
    cfg = composed[name].copy()
    OmegaConf.update(cfg, key, [value] if listed is list else value, merge=True)
    OmegaConf.update(cfg, "report_dir", str(tmp_path / "r"))
    with pytest.raises(ValueError) as refused:
        build(cfg, name)
    message = str(refused.value)
    assert key.split(".")[-1] in message and "\n" not in message.strip(), message
    assert not (tmp_path / "r").exists()


def type_of(name: str, key: str) -> type:
    """The dataclass that declares `key` in experiment `name`'s schema."""
    schema = experiments()[name].schema
    for part in key.split(".")[:-1]:
        schema = typing.get_type_hints(schema)[part]
    return schema


def test_planner_validation_refuses_rounds_longer_than_its_timeout(composed, tmp_path):
    """The reference rounds step each configuration at least `reference_window_s` a round:
    a calibration that cannot finish within `timeout_s` is refused before the grid (it was
    a failed cell for each of the 99 rows)."""
    from bench.experiments.planner_validation import config, rounds

    assert (
        2 * len(rounds.REFERENCE_MICRO) + 1 + len(rounds.RUNTIMES)
        == config.REFERENCE_CONFIGURATIONS
    )
    cfg = composed["planner_validation"].copy()
    OmegaConf.update(cfg, "repeats", 1000)
    OmegaConf.update(cfg, "report_dir", str(tmp_path / "r"))
    with pytest.raises(ValueError, match="repeats=1000, reference_window_s=0.25.*timeout_s"):
        build(cfg, "planner_validation")
