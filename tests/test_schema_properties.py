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
from dataclasses import fields

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from bench.app import CONFIG_DIR, build
from bench.config import RunConfig
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
CASES += [("allreduce_scaling", f"cluster.{key}") for key in ("max_ranks", "memory_gb",
                                                              "timeout_min", "requeues")]  # fmt: skip
CASES += [("auto_parallel", f"model.{key}") for key in ("n_layers", "d_model", "n_heads",
                                                        "seq_len", "d_ff", "kv_heads")]  # fmt: skip
CASES += [("zero_memory", f"model.{key}") for key in ("n_layers", "d_model", "bias")]


@pytest.fixture(scope="module")
def composed():
    """Each experiment's config as the command line composes it, once (composing is most of
    a refusal's cost); an example overrides one key of a copy, as Hydra's override would."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        yield {name: compose("config", overrides=[f"experiment={name}", "cluster.memory_gb=32"],
                             return_hydra_config=True) for name in experiments()}  # fmt: skip


@pytest.mark.parametrize("name, key", CASES, ids=[f"{n}:{k}" for n, k in CASES])
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(value=VALUES)
def test_a_generated_value_is_refused_naming_its_key_or_accepted(composed, tmp_path, name, key,
                                                                 value):  # fmt: skip
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
