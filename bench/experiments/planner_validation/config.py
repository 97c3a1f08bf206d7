"""`planner_validation`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas,
plotting or report code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.config import (
    bounded,
    cell_timeout,
    check_choices,
    check_number,
    check_positive,
    check_unique,
    iterations_key,
    seconds_key,
)
from bench.kit.meeting import MEETING_SEGMENT_S

__all__ = [
    "HELD_OUT",
    "PROBE_LINK",
    "SOURCES",
    "SPLITS",
    "PlannerValidationConfig",
    "repository_reports",
]

SOURCES = ("parallelism_comparison", "zero_memory", "pipeline_utilization")
"""The experiments whose measured rows are the ground truth (DP/TP/PP/hybrids, ZeRO,
pipeline schedules)."""
HELD_OUT = ("pipeline_utilization",)
"""The default held-out half (`held_out`): the pipeline schedules' 57 rows, against the
42 of `parallelism_comparison` and `zero_memory`. Those two exercise every term the
calibration prices — TP call work, the link probe and the ring fits, ZeRO's collectives,
meetings, stragglers, core sharing, both runtimes — so a change to any of them can be
developed on them alone; the held-out half then tests the simulator's schedule model
(GPipe, 1F1B, interleaved, zero-bubble at 2 and 4 stages, 1 to 32 micro-batches) where
the development half has only plain 1F1B at M = 4, on the larger half of the rows."""
REFERENCE_CONFIGURATIONS = 7
"""The configurations of the reference rounds (`rounds.reference_rounds`: fp32 and bf16
at micro-batch 1 and 16, the host probe's step, the two runtimes), each stepping at least
`reference_window_s` a round: the calibration's least time, which `timeout_s` must exceed."""
SPLITS = ("development", "held_out")
"""The `split` column's values."""
PROBE_LINK = "this run's probe (probe_pairs, 2 ranks)"
"""The `link_source` of rows priced on the two-rank link probe of this run's calibration
(`pool_probes.probe_link`)."""


def repository_reports() -> Path:
    """The repository's `reports/` (the committed reports, or those `make reports` wrote)."""
    return Path(__file__).resolve().parents[3] / "reports"


@dataclass(kw_only=True)
class PlannerValidationConfig:
    sources: list[str] = field(default_factory=lambda: list(SOURCES))
    """Experiments whose measured rows are predicted (their `results.csv`)."""
    held_out: list[str] = field(default_factory=lambda: list(HELD_OUT))
    """Source experiments whose rows form the held-out half (`split` = held_out): the
    step-time target is judged on them alone, and the model is developed on the others
    (`split` = development). Default: pipeline_utilization (see `HELD_OUT`)."""
    reports_root: str | None = None
    """Folder holding `<source>/results.csv`; null: the repository's reports/ (where
    `make reports` writes them, and what is committed)."""
    max_rows: int | None = bounded(None, ge=1, le=100_000, why="rows of a source report")
    """At most this many ground-truth rows per source (spread over its rows); null: all."""
    gemm_sizes: list[int] = bounded(
        [16, 32, 64, 128, 256, 512, 1024],
        ge=1,
        le=4096,
        why="the (8n × n) · (n × n) matmul's operands and product in fp32 and bf16 hold"
        " about 100 n² bytes: 1.7 GB at 4096",
    )
    """Square matmul sizes n timed for the GEMM-efficiency table (2n³ FLOPs each)."""
    copy_mib: int = bounded(64, ge=1, le=4096, why="two copies of it in 8 GiB")
    """Size of the tensor copied to measure memory bandwidth (MiB)."""
    repeats: int = iterations_key(28)
    """Timed repeats of each calibration kernel (the fastest counts), and rounds of the
    reference steps (their median and fastest count, see `reference_window_s`). 28 is two
    whole balanced designs of the reference rounds' seven configurations (14 rounds
    each, `impls.pairing.balanced_orders`)."""
    reference_window_s: float = seconds_key(0.25)
    """Seconds each reference configuration (fp32 / bf16 × micro-batch 1 / 16, the host
    probe's step and the two runtimes, `rounds.reference_rounds`) steps per round, the
    configurations taking turns for `repeats` rounds (≈ 7 × repeats × this seconds in
    all); 0: one step each per round."""
    meeting_segment_s: float = seconds_key(MEETING_SEGMENT_S)
    """Seconds of matmuls before each call of the meeting probe (`bench.kit.meeting`):
    about what a ZeRO rank of `zero_memory` computes between two of its collectives."""
    meeting_rounds: int = iterations_key(12)
    """Rounds of the meeting probe (each: its three loops of 20 iterations in turn; six
    rounds make one whole balanced design of the three, `impls.pairing.balanced_orders`)."""
    host_scaling: bool = False
    """Price each row at its source run's host speed (`host_slowdown`: the source's host
    probes ÷ this run's). Off: every row at the calibration's speed, the scaled prediction
    kept beside (`step_error_host_scaled`). Off by default because scaling made the
    predictions worse and more optimistic: on the full report at e70c8c8 it took the
    median |step error| from 12.2% to 14.0% (development) and from 7.6% to 11.9%
    (held-out); on 8 CI-profile runs here the development half came out more optimistic
    with it in all 8, its median |error| larger in 5 and within 0.2 points in 3; the
    held-out half more optimistic in 5 of the 8; the further the calibration's probe was
    from the sources' (0.82×, 0.84×), the more."""
    timeout_s: float = cell_timeout(300.0)
    """A cell not finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        check_choices("sources", self.sources, SOURCES)
        check_unique("sources", self.sources)
        check_choices("held_out", self.held_out, SOURCES)
        check_unique("held_out", self.held_out)
        if self.reports_root is not None and not str(self.reports_root).strip():
            raise ValueError(
                "reports_root='': give a folder, or null for the repository's reports/"
            )
        if self.max_rows is not None:
            check_positive("max_rows", [self.max_rows])
        check_positive("gemm_sizes", self.gemm_sizes)
        check_unique("gemm_sizes", self.gemm_sizes)
        if len(self.gemm_sizes) < 2:
            raise ValueError(f"gemm_sizes={self.gemm_sizes}: give at least 2 sizes (a table)")
        self.gemm_sizes = sorted(self.gemm_sizes)
        check_positive("copy_mib", [self.copy_mib])
        check_positive("repeats", [self.repeats])
        check_number("reference_window_s", self.reference_window_s, inclusive=True)
        check_number("meeting_segment_s", self.meeting_segment_s)
        check_positive("meeting_rounds", [self.meeting_rounds])
        least = REFERENCE_CONFIGURATIONS * self.repeats * self.reference_window_s
        if least >= self.timeout_s:
            raise ValueError(
                f"repeats={self.repeats}, reference_window_s="
                f"{self.reference_window_s}: the reference rounds alone step "
                f"{least:,.0f} s ({REFERENCE_CONFIGURATIONS} configurations × "
                f"repeats × reference_window_s), past timeout_s={self.timeout_s}; "
                "lower them or raise timeout_s"
            )
        check_number("timeout_s", self.timeout_s)
        for name in self.sources:
            if not (self.root() / name / "results.csv").is_file():
                raise ValueError(
                    f"reports_root={str(self.root())!r}: {name}/results.csv does "
                    f"not exist (run `python -m bench experiment={name}` "
                    "first)"
                )

    def split(self, source: str) -> str:
        """Which half (`SPLITS`) a row of `source` belongs to."""
        return "held_out" if source in self.held_out else "development"

    def root(self) -> Path:
        """Where the sources' results.csv are read."""
        return Path(self.reports_root) if self.reports_root else repository_reports()
