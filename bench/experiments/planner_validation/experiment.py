"""`planner_validation`: the simulator, calibrated on this host, against configurations
distbench ran here for real.

Each cell is one measured row of a source experiment (`parallelism_comparison`,
`zero_memory`, `pipeline_utilization`, read from `<reports_root>/<source>/results.csv`),
predicted on a one-rank world: the rank calibrates the host once (cached per thread count)
and prices the configuration with the simulator (`ranks.py`). The metadata's `world_size`
is that 1; the source's rank count is the `ranks` column, and `source_git_sha` is the commit
that measured the ground truth.

Which time is the ground truth: `ground_truth`; which link a row is priced on:
`ring_links`; what a row takes from its source: `to_row`; the host speed it is scaled to:
`source_host_probe`.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.planner_validation import ranks, report
from bench.experiments.planner_validation.config import PROBE_LINK, PlannerValidationConfig
from bench.kit.profile import fit_ring

__all__ = [
    "CONFIGURATION_COLUMNS",
    "EXPERIMENT",
    "PlannerValidationConfig",
    "cells",
    "ground_truth",
    "measured",
    "ok_rows",
    "source_host_probe",
    "to_row",
]

_ZERO_METHODS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
_MODEL = ("d_model", "n_layers", "n_heads", "seq_len", "vocab_size")
_SHARED = (*_MODEL, "bias", "world_size", "host_cores", "status", "git_sha")
CONFIGURATION_COLUMNS = {
    "parallelism_comparison": (
        *_SHARED,
        "dp",
        "tp",
        "pp",
        "layout",
        "microbatches",
        "schedule",
        "batch_size",
    ),
    "zero_memory": (*_SHARED, "impl", "method", "precision", "batch_size"),
    "pipeline_utilization": (
        *_SHARED,
        "impl",
        "slicing",
        "schedule",
        "stages",
        "microbatches",
        "virtual_stages",
        "microbatch_size",
    ),
}
"""Per source, the columns of a ground-truth row its prediction may read: what the cell
was (and whether it ran), never what it measured."""


_WHERE = "_where"  # a row's (results.csv, line), line 1 the header (set on reading)


def _read(root: Path, name: str) -> list[dict[str, Any]]:
    path = root / name / "results.csv"
    if not path.is_file():
        raise ValueError(
            f"reports_root={str(root)!r}: {name}/results.csv does not exist "
            f"(run `python -m bench experiment={name}` first)"
        )
    return ok_rows(path)


def ok_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a source's results.csv that finished (`status` ok), the ground truth; each
    knows its file and line (`measured`). A failed row may have no measurements."""
    rows = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            if row.get("status") == "ok":
                rows.append({**row, _WHERE: (path, reader.line_num)})
    return rows


def measured(row: dict[str, Any], column: str) -> float:
    """The measurement `column` of a source's finished row, which a prediction is compared
    with (or priced on): a ValueError naming the file, line and column where it is missing
    or is not a finite number > 0 (a source's own error, refused before any cell runs)."""
    path, line = row[_WHERE]
    if column not in row:
        raise ValueError(
            f"{path}:1: the header has no {column} column, which "
            "planner_validation reads as a measurement"
        )
    text = row[column] if row[column] is not None else ""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{path}:{line}: column {column} is {text!r}; a measurement must be a finite number > 0"
        )
    return value


def _model(row: dict[str, str]) -> dict[str, Any]:
    model: dict[str, Any] = {k: int(float(row[k])) for k in _MODEL}
    model["bias"] = row.get("bias", "False") == "True"
    return model


def _label(ranks_: int, cores: int, replayed: bool) -> str:
    if ranks_ <= cores:
        return "wall clock"
    if replayed:
        return "replayed"
    return f"wall clock, {ranks_} ranks on {cores} cores (modelled core sharing)"


_POSITION = "_position"  # a row's place in its source's results.csv (set on reading)


def source_host_probe(probes: Sequence[float], position: int) -> float:
    """The median of a source's host probes (`_host_probe` per finished row, in file
    order) leaving out the row at `position` and its neighbours: the probe timed between
    two cells is recorded on both, so theirs were timed next to the row's cell too. NaN
    where no other probe is finite.

    How fast the host ran while the source measured (`host_probe_s`, `source_host_probe`):
    the source's runner timed `bench.kit.host.host_probe` between its cells, and the row
    takes the median of those probes over the source's other cells — the probes timed
    next to the row's own cell (its two, which its neighbours in the file share) left out.
    It is the host's speed during the source's run, not during the row: with
    `host_scaling`, a calibration made at another time, or on another machine, is scaled to
    it (`ranks.host_slowdown`).
    """
    others = [p for i, p in enumerate(probes) if abs(i - position) > 1 and math.isfinite(p)]
    return statistics.median(others) if others else math.nan


def _host_probe(row: dict[str, str]) -> float:
    """The host's step time around the row: the faster of the probes its source's runner
    timed before and after its cell. A disturbance only ever slows a probe, and one
    disturbed window would misprice the row by its whole size (one read 68.6 ms against
    29.8 ms after the same cell, around `pipeline_utilization`'s first). The mean
    (`host_probe_s`) where a source recorded only that; NaN for a source run without
    probes."""
    pair = [float(row.get(k) or "nan") for k in ("host_probe_before_s", "host_probe_after_s")]
    if all(math.isfinite(p) for p in pair):
        return min(pair)
    return float(row.get("host_probe_s") or "nan")


def _truth(
    source: str, row: dict[str, str], config: str, *, replay_statistic: str = "median", **plan: Any
) -> dict[str, Any]:
    """One ground-truth configuration; `statistic` is what its measured time is of the
    samples (`calibration.STATISTICS`): the median of timed steps on the wall clock, the
    source's `replay_statistic` of each action's samples when replayed."""
    n, cores = int(float(row["world_size"])), int(float(row["host_cores"]))
    replayed = plan.pop("replayed", None)
    label = _label(n, cores, replayed is not None)
    step = measured(row, "step_time_s") if label != "replayed" else replayed
    statistic = replay_statistic if label == "replayed" else "median"
    return {
        "source": source,
        "config": config,
        "ranks": n,
        "host_cores": cores,
        "ground_truth": label,
        "measured_step_time_s": step,
        "statistic": statistic,
        "source_git_sha": row.get("git_sha", ""),
        "model": _model(row),
        "position": row[_POSITION],
        **plan,
    }


def _parallelism(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        dp, tp, pp, m = (int(float(r[k])) for k in ("dp", "tp", "pp", "microbatches"))
        micro, model = int(float(r["batch_size"])) // (dp * m), _model(r)
        out.append(
            _truth(
                "parallelism_comparison",
                r,
                f"{r['layout']}, M={m}",
                dp=dp,
                tp=tp,
                pp=pp,
                zero_stage=0,
                precision="fp32",
                schedule=r["schedule"] if pp > 1 else "1f1b",
                microbatches=m,
                virtual_stages=1,
                optimizer=True,
                microbatch_size=micro,
                measured_peak_bytes=measured(r, "memory_per_rank_bytes"),
                memory_includes_states=True,
                replayed=measured(r, "replayed_step_time_s"),
                # a TP all-reduce carries one micro-batch's activation (b, s, h) in fp32; its
                # own work per call is measured by this run's calibration at that size
                tp_call_numel=micro * model["seq_len"] * model["d_model"] if tp > 1 else 0,
                runtime="executor",  # HybridTrainer runs impls.pipeline's executor
            )
        )
    return out


def _zero(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if r.get("impl") != "distbench" or r["method"] not in _ZERO_METHODS:
            continue
        n = int(float(r["world_size"]))
        out.append(
            _truth(
                "zero_memory",
                r,
                f"{r['method']}, N={n}, {r['precision']}",
                dp=n,
                tp=1,
                pp=1,
                zero_stage=_ZERO_METHODS[r["method"]],
                precision=r["precision"],
                schedule="1f1b",
                microbatches=1,
                virtual_stages=1,
                optimizer=True,
                microbatch_size=int(float(r["batch_size"])) // n,
                measured_peak_bytes=measured(r, "peak_bytes"),
                memory_includes_states=True,
                # impls.zero gathers / reduce-scatters unit by unit: the GPT's blocks and
                # the root unit (embeddings, final norm, head), one call each
                dp_collectives=int(float(r["n_layers"])) + 1,
                runtime="ledger",  # ZeroDataParallel counts each forward's saved activations
            )
        )
    return out


# ZB-V puts two chunks on each rank in a V (stages r and 2P − 1 − r); the simulator's
# ParallelPlan places one stage per rank, or interleaved chunks r, r + P, so it does not
# predict ZB-V's rows (pipeline_utilization's own report replays them).
UNPLACED = frozenset({"zero_bubble_v"})


def _pipeline(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        # Equal cuts only: an Alpa-sliced row repeats its equal twin's key here (the report
        # shows those pairs from the source's own columns, `alpa_slicing`).
        if r.get("impl") != "distbench" or r.get("slicing", "equal") not in ("", "equal"):
            continue
        if r["schedule"] in UNPLACED:
            continue
        p, m, v = (int(float(r[k])) for k in ("stages", "microbatches", "virtual_stages"))
        out.append(
            _truth(
                "pipeline_utilization",
                r,
                f"{r['schedule']}, P={p}, M={m}, V={v}",
                dp=1,
                tp=1,
                pp=p,
                zero_stage=0,
                precision="fp32",
                schedule=r["schedule"],
                microbatches=m,
                virtual_stages=v,
                optimizer=False,
                microbatch_size=int(float(r["microbatch_size"])),
                measured_peak_bytes=measured(r, "peak_activation_bytes"),
                memory_includes_states=False,
                replayed=measured(r, "replayed_makespan_s"),
                replay_statistic="fastest",  # its replay prices each action at its fastest
                runtime="executor",
            )
        )
    return out


_PARSERS = {
    "parallelism_comparison": _parallelism,
    "zero_memory": _zero,
    "pipeline_utilization": _pipeline,
}


def ring_links(root: Path, *, robust: bool = True) -> dict[int, tuple[float, float]]:
    """{N: (α s per round, β s per byte)}: `fit_ring` on `allreduce_scaling`'s ring rows
    at each N ≥ 2 with ≥ 2 message sizes; {} when that experiment has not run.

    Which link a row is priced on (`link_source`): a wall-clock row of N ≥ 2 ranks uses the
    α–β fitted (`fit_ring`, a median regression on relative error) to `allreduce_scaling`'s
    ring all-reduce at the same N, run on this host (N ranks sharing its cores: a round waits
    for a descheduled rank, so α grows with N/cores, which a two-rank probe cannot see); a
    replayed row, or an N that run lacks, uses the two-rank probe this run's calibration makes
    (`pool_probes.probe_link`).
    """
    return {n: fit_ring(n, *points, robust=robust) for n, points in _ring_points(root).items()}


def _ring_points(root: Path) -> dict[int, tuple[list[float], list[float]]]:
    """{N: (message sizes, times)} of `allreduce_scaling`'s ring rows, for each N ≥ 2 with
    ≥ 2 distinct sizes; {} when that experiment has not run."""
    if not (root / "allreduce_scaling" / "results.csv").is_file():
        return {}
    by_n: dict[int, tuple[list[float], list[float]]] = {}
    for r in _read(root, "allreduce_scaling"):
        if r.get("algorithm") == "ring":
            sizes, times = by_n.setdefault(int(float(r["world_size"])), ([], []))
            sizes.append(float(r["message_bytes"]))
            times.append(measured(r, "time_s"))
    return {n: p for n, p in sorted(by_n.items()) if n >= 2 and len(set(p[0])) >= 2}


def _spread(items: list, k: int | None) -> list:
    if k is None or len(items) <= k:
        return items
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)] if k > 1 else items[:1]


def ground_truth(cfg: PlannerValidationConfig) -> list[dict[str, Any]]:
    """Every ground-truth configuration of `cfg.sources`, with its half (`split`) and the
    link it is priced on (None: this run's own probe, measured by the rank).

    Which measured time is the ground truth (`ground_truth`): the wall clock where the source
    ran no more ranks than the host has cores; otherwise the source's replayed timeline (each
    rank's compute timed with the host to itself, transfers α–β) where it has one; otherwise
    the wall clock with modelled core sharing (each rank gets cores/N of the host). Which
    statistic of its samples that time is (`statistic`) picks the reference fit it is
    predicted on (`calibration`): the median, but the fastest for `pipeline_utilization`'s
    replay, which prices each action at the fastest of its stage's.
    """
    root = cfg.root()
    rings = ring_links(root)
    squares = ring_links(root, robust=False)  # for context
    out = []
    for source in cfg.sources:
        rows = _read(root, source)
        for position, row in enumerate(rows):
            row[_POSITION] = position
        probes = [_host_probe(row) for row in rows]
        for t in _spread(_PARSERS[source](rows), cfg.max_rows):
            t["host_probe_s"] = source_host_probe(probes, t.pop("position"))
            n, split = t["ranks"], cfg.split(source)
            if t["ground_truth"] != "replayed" and n in rings:
                out.append(
                    {
                        **t,
                        "split": split,
                        "link": rings[n],
                        "link_least_squares": squares[n],
                        "link_source": f"allreduce_scaling ring, N={n}",
                    }
                )
            else:
                out.append({**t, "split": split, "link": None, "link_source": PROBE_LINK})
    return out


def cells(cfg: PlannerValidationConfig) -> list[Cell]:
    return [
        Cell(
            world_size=1, key={"source": t["source"], "config": t["config"]}, fn=ranks.run, carry=t
        )
        for t in ground_truth(cfg)
    ]


def _error(predicted: float, measured: float) -> float:
    """predicted ÷ measured − 1 (NaN for a measurement that is not positive)."""
    return predicted / measured - 1 if measured > 0 else math.nan


def to_row(cfg: PlannerValidationConfig, cell: Cell, per_rank: list[dict]) -> dict:
    """What a row takes from its source's results.csv: its configuration (layout, degrees,
    sizes, dtype, schedule, rank and core counts, the model) and its measured time and
    memory, which are compared with the prediction and never enter it. The other numbers the
    source measured in that cell — its link probe, its TP call work, the host probes around
    it — do not price the row: the calibration measures its own (`CONFIGURATION_COLUMNS`
    lists what a prediction may read; `tests/test_planner_validation_held_out.py` perturbs
    every other column of a row and finds its prediction unchanged).

    Which half a row is in (`split`): `held_out` for a source of `cfg.held_out`, else
    `development` (see `config.HELD_OUT`).
    """
    t, p = cell.carry, per_rank[0]
    measured_step, measured_peak = t["measured_step_time_s"], t["measured_peak_bytes"]
    return {
        **cell.key,
        "split": t["split"],
        "ranks": t["ranks"],
        "source_host_cores": t["host_cores"],
        "dp": t["dp"],
        "tp": t["tp"],
        "pp": t["pp"],
        "zero_stage": t["zero_stage"],
        "precision": t["precision"],
        "schedule": t["schedule"],
        "microbatches": t["microbatches"],
        "virtual_stages": t["virtual_stages"],
        "microbatch_size": t["microbatch_size"],
        "ground_truth": t["ground_truth"],
        "statistic": t.get("statistic", "median"),
        "source_git_sha": t["source_git_sha"],
        "link_source": t.get("link_source", PROBE_LINK),
        # the same ring rows fitted by least squares: context beside the robust fit used
        **dict(
            zip(
                ("link_lsq_alpha_s", "link_lsq_beta_s_per_byte"),
                t.get("link_least_squares", (math.nan, math.nan)),
                strict=True,
            )
        ),
        "dp_collectives": t.get("dp_collectives", 1),
        "measured_step_time_s": measured_step,
        "predicted_step_time_s": p["predicted_step_time_s"],
        "step_error": _error(p["predicted_step_time_s"], measured_step),
        "step_error_unscaled": _error(p["predicted_unscaled_step_time_s"], measured_step),
        "step_error_host_scaled": _error(p["predicted_host_scaled_step_time_s"], measured_step),
        "step_error_without_straggler": _error(
            p["predicted_without_straggler_step_time_s"], measured_step
        ),
        "memory_measure": "model states + activations"
        if t["memory_includes_states"]
        else "activations",
        "measured_peak_bytes": measured_peak,
        "predicted_peak_bytes": p["predicted_peak_bytes"],
        "memory_error": _error(p["predicted_peak_bytes"], measured_peak),
        **{
            k: v for k, v in p.items() if k not in ("predicted_step_time_s", "predicted_peak_bytes")
        },
    }


EXPERIMENT = Experiment(
    name="planner_validation",
    summary="the simulator, calibrated on this host, against DP/TP/PP/ZeRO/schedule runs "
    "measured here",
    schema=PlannerValidationConfig,
    key_columns=("source", "config"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Predicted against measured step time",
            x="measured_step_time_s",
            y="predicted_step_time_s",
            group="source",
            kind="scatter",
            log_x=True,
            log_y=True,
        ),
        Chart(
            title="Predicted against measured peak memory",
            x="measured_peak_bytes",
            y="predicted_peak_bytes",
            group="source",
            kind="scatter",
            log_x=True,
            log_y=True,
        ),
    ),
    reads=("parallelism_comparison", "zero_memory", "pipeline_utilization", "allreduce_scaling"),
)
