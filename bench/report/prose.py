"""Report prose kept apart from report logic: each experiment's sentences live in a Jinja2
template beside its code, `bench/experiments/<name>/prose.md.j2`, one macro per sentence
or paragraph, and a report section calls `prose(__package__, "macro", **numbers)`.

A macro receives the numbers already computed and formatted by the section (the template
decides wording, never arithmetic); an undefined name is an error, not an empty string.
`{% macro %}` bodies are rendered with `trim_blocks` and `lstrip_blocks`, stripped, and
each paragraph of plain text joined onto one line (blocks that are tables, lists, headings,
quotes or images keep their lines), so a template can be wrapped for reading while the
report's markdown stays one paragraph to a line.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files
from typing import Any

import jinja2

__all__ = ["prose"]

TEMPLATE = "prose.md.j2"
# A line that starts markdown structure: its block keeps its line breaks.
_STRUCTURE = re.compile(r"\s*(\||[-*+] |#|>|!\[|\d+\. |```)")


@functools.cache
def _module(package: str) -> Any:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda _: files(package).joinpath(TEMPLATE).read_text()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )
    return env.get_template(TEMPLATE).module


def prose(package: str, macro: str, /, **fields: Any) -> str:
    """The text of `macro` in `package`'s prose template, given `fields`."""
    try:
        render = getattr(_module(package), macro)
    except AttributeError:
        raise KeyError(f"{package}/{TEMPLATE} has no macro {macro!r}") from None
    return _unwrap(str(render(**fields)).strip())


def _unwrap(text: str) -> str:
    blocks = re.split(r"\n\s*\n", text)
    joined = [
        block
        if any(_STRUCTURE.match(line) for line in block.splitlines())
        else " ".join(line.strip() for line in block.splitlines())
        for block in blocks
    ]
    return "\n\n".join(joined)
