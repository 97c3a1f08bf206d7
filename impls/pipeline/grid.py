"""The step × rank text grid a dry run prints, with faulty or blocked cells marked `[x]*`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["WAITING", "mark", "render_grid"]

WAITING = "."  # the rank is blocked in a transfer round this step
_CONTEXT = 6  # rows kept either side of a marked row when the grid is long
_MAX_ROWS = 48


def mark(cell: str) -> str:
    """How a faulty or blocked cell is shown: `1B0` -> `[1B0]*`."""
    return f"[{cell}]*"


def render_grid(
    cells: Sequence[Sequence[str]],
    marks: Iterable[tuple[int, int]] = (),
    blocked_row: Sequence[str] | None = None,
    row_label: str = "step",
) -> str:
    """Render `cells[step][rank]`, marking the (step, rank) cells in `marks`.

    `blocked_row`, if given, is appended as a last row labelled `stuck`: what each rank is
    blocked on at a deadlock (its cells arrive already marked). A long grid keeps only the
    rows near marked cells and the last few, eliding the rest with `...`. `row_label`
    heads the first column (`"step"` for a dry run, `"index"` for a plan's own lists).
    """
    marked = set(marks)
    rows = [
        [f"{step}"] + [mark(c) if (step, r) in marked else c for r, c in enumerate(row)]
        for step, row in enumerate(cells)
    ]
    if blocked_row is not None:
        rows.append(["stuck", *blocked_row])
    ranks = max((len(row) - 1 for row in rows), default=0)
    header = [row_label] + [f"rank {r}" for r in range(ranks)]
    widths = [
        max(len(line[c]) for line in [header, *rows] if c < len(line)) for c in range(ranks + 1)
    ]

    def line(cols: Sequence[str]) -> str:
        return " | ".join(text.ljust(widths[c]) for c, text in enumerate(cols)).rstrip()

    out = [line(header), "-+-".join("-" * w for w in widths)]
    keep = _rows_to_keep(len(rows), {step for step, _ in marked})
    for index in range(len(rows)):
        if index in keep:
            out.append(line(rows[index]))
        elif index == 0 or index - 1 in keep:
            out.append("...")
    out.append(f"('{WAITING}' = waiting on a transfer, blank = finished, [x]* = faulty or blocked)")
    return "\n".join(out)


def _rows_to_keep(total: int, marked_rows: set[int]) -> set[int]:
    if total <= _MAX_ROWS:
        return set(range(total))
    keep = set(range(max(0, total - _CONTEXT), total))
    for row in marked_rows:
        keep |= set(range(max(0, row - _CONTEXT), min(total, row + _CONTEXT + 1)))
    return keep
