"""Pipeline plans as data: an `Action` is one unit of work, a `Plan` maps rank -> actions.

An action is written `<stage><KIND><microbatch>`: `1F0` is stage 1's forward of
micro-batch 0. Compute kinds are `F` (forward), `B` (full backward), `I` (backward with
respect to the stage's input only) and `W` (backward with respect to its weights only;
the split that zero-bubble schedules rely on). After `insert_communication` a plan also
holds transfer actions, spelled with their full kind so that the text stays unambiguous:
`0SEND_F0` (stage 0 sends micro-batch 0's activation to stage 1), `1RECV_F0` (stage 1
receives it), `1SEND_B0` (stage 1 sends the input gradient back to stage 0) and
`0RECV_B0` (stage 0 receives it). This is the spelling torch.distributed.pipelining uses.

`plan_to_csv` / `plan_from_csv` store a plan the way torch.distributed.pipelining's
`_load_csv` and torchtitan's custom-schedule option read it: row r is rank r's actions,
comma-separated.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "KINDS",
    "Action",
    "Plan",
    "plan_from_csv",
    "plan_to_csv",
]

COMPUTE_KINDS: tuple[str, ...] = ("F", "B", "I", "W")
COMM_KINDS: tuple[str, ...] = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS: tuple[str, ...] = COMPUTE_KINDS + COMM_KINDS

# Longest kinds first so that e.g. "SEND_F" is never read as something shorter.
_PATTERN = re.compile(
    r"(\d+)(" + "|".join(sorted(KINDS, key=len, reverse=True)) + r")(\d+)",
)


@dataclass(frozen=True, order=True)
class Action:
    """One step of one stage on one micro-batch, e.g. `Action(1, "F", 0)` == `1F0`."""

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"action kind {self.kind!r} is not one of {', '.join(KINDS)}")
        for name in ("stage", "microbatch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"action {name} must be an integer >= 0, got {value!r}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    @classmethod
    def parse(cls, text: str) -> Action:
        """The inverse of `str`: `Action.parse("1SEND_B3") == Action(1, "SEND_B", 3)`."""
        match = _PATTERN.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                f"cannot parse action {text!r}: expected <stage><kind><microbatch> "
                f"with kind one of {', '.join(KINDS)}, e.g. '1F0' or '0SEND_F2'"
            )
        stage, kind, microbatch = match.groups()
        return cls(int(stage), kind, int(microbatch))


Plan = dict[int, list[Action]]
"""rank -> the actions that rank performs, in order."""


def plan_to_csv(plan: Plan, path: str | Path) -> None:
    """Write one row per rank (ranks 0..P-1 in order), each a comma-separated action list."""
    ranks = sorted(plan)
    if ranks != list(range(len(ranks))):
        raise ValueError(f"plan ranks must be 0..{len(ranks) - 1}, got {ranks}")
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        for rank in ranks:
            writer.writerow([str(action) for action in plan[rank]])


def plan_from_csv(path: str | Path) -> Plan:
    """Read a plan written by `plan_to_csv` (or by torch.distributed.pipelining's `_dump_csv`).

    Row r is rank r. Empty cells carry no action and are skipped (torch writes an idle
    slot, `None`, as an empty cell).
    """
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    return {
        rank: [Action.parse(cell) for cell in row if cell.strip()] for rank, row in enumerate(rows)
    }
