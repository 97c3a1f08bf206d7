"""Report prose templates (bench/report/prose.py): strict names, paragraphs unwrapped, and
no macro that no report calls."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest

from bench.report.prose import _unwrap, prose

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_an_unknown_macro_or_a_missing_field_is_an_error():
    with pytest.raises(KeyError, match="no macro 'nope'"):
        prose("bench.experiments.delayed_averaging", "nope")
    with pytest.raises(jinja2.UndefinedError):
        prose("bench.experiments.delayed_averaging", "setup", task="t")


def test_plain_paragraphs_join_and_markdown_blocks_keep_their_lines():
    text = "one\ntwo\n\n| a |\n|---|\n\n- x\n- y\n\nthree\n  four"
    assert _unwrap(text) == "one two\n\n| a |\n|---|\n\n- x\n- y\n\nthree four"


def test_every_macro_is_called_by_its_experiment():
    for template in BENCH.glob("experiments/*/prose.md.j2"):
        macros = re.findall(r"{%-?\s*macro\s+(\w+)", template.read_text())
        code = "\n".join(p.read_text() for p in template.parent.glob("*.py"))
        unused = [m for m in macros if f'"{m}"' not in code]
        assert not unused, f"{template}: macros no report calls: {unused}"
