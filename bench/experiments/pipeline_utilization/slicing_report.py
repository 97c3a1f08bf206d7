"""The pipeline_utilization report's section on stage slicing: Alpa's cut against the equal
split, predicted and measured. Reads results only (never `impls`)."""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Any

import pandas as pd

from bench.experiments.pipeline_utilization.names import slicing_of
from bench.report import Context, format_ratio, format_seconds, markdown_table, prose

__all__ = ["alpa_vs_equal", "eq2", "slicing_pairs"]

PAIR = ["schedule", "stages", "microbatches", "virtual_stages"]
COSTS = ["embedding_s", "block_s", "head_s"]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros


def eq2(costs: dict[str, float], layers: str, microbatches: int) -> float:
    """Alpa's Eq. 2 for the split `layers` ("4/4/4/4", blocks per stage; the first stage
    also runs the embedding, the last the head) on the layer costs `costs`."""
    blocks = [int(b) for b in str(layers).split("/")]
    times = [b * costs["block_s"] for b in blocks]
    times[0] += costs["embedding_s"]
    times[-1] += costs["head_s"]
    return _eq2_of(times, microbatches)


def _eq2_of(times: list[float], microbatches: int) -> float:
    """Alpa's Eq. 2, Σ tᵢ + (B − 1) · max tᵢ, over stage times tᵢ (NaN for none)."""
    return sum(times) + (microbatches - 1) * max(times) if times else math.nan


def stage_seconds(row: pd.Series) -> list[float]:
    """Each stage's compute per micro-batch as the cell profiled it (F + B, or F + I + W):
    the row's `stage_costs`; [] where it has none."""
    try:
        costs = json.loads(row.get("stage_costs") or "{}")
    except (TypeError, ValueError):
        return []
    return [float(sum(costs[stage].values())) for stage in sorted(costs, key=int)]


def _number(row: pd.Series, column: str) -> float:
    value = pd.to_numeric(row.get(column), errors="coerce")
    return float(value) if pd.notna(value) else math.nan


def slicing_pairs(ok: pd.DataFrame) -> list[dict[str, Any]]:
    """Every alpa row beside the equal row of its (schedule, P, M, V): the two splits, Eq. 2
    for each on the alpa row's measured layer costs, and both measured step times."""
    if "slicing" not in ok.columns or ok.empty:
        return []
    rows = ok[~ok["schedule"].astype(str).str.startswith("torch_")]
    cut = rows["slicing"].map(slicing_of)
    equal = {tuple(r[k] for k in PAIR): r for _, r in rows[cut == "equal"].iterrows()}
    out = []
    for _, alpa in rows[cut == "alpa"].iterrows():
        twin = equal.get(tuple(alpa[k] for k in PAIR))
        if twin is None:
            continue
        m = int(alpa["microbatches"])
        costs = {k: _number(alpa, k) for k in COSTS}
        record = {
            "schedule": alpa["schedule"],
            "stages": int(alpa["stages"]),
            "microbatches": m,
            "equal_layers": str(twin["stage_layers"]),
            "alpa_layers": str(alpa["stage_layers"]),
            **costs,
            "predicted_equal_s": eq2(costs, twin["stage_layers"], m),
            "predicted_alpa_s": eq2(costs, alpa["stage_layers"], m),
        }
        for name, column in (("replayed", "replayed_makespan_s"), ("wall", "step_time_s")):
            record[f"{name}_equal_s"] = _number(twin, column)
            record[f"{name}_alpa_s"] = _number(alpa, column)
        record["stages_equal_s"], record["stages_alpa_s"] = stage_seconds(twin), stage_seconds(alpa)
        for name in ("equal", "alpa"):  # Eq. 2 again, on the stage costs the cells profiled
            record[f"profiled_{name}_s"] = _eq2_of(record[f"stages_{name}_s"], m)
        for name in ("predicted", "profiled", "replayed", "wall"):
            alpa_s = record[f"{name}_alpa_s"]
            record[f"{name}_ratio"] = record[f"{name}_equal_s"] / alpa_s if alpa_s > 0 else math.nan
        out.append(record)
    return sorted(out, key=lambda r: (r["stages"], r["schedule"], r["microbatches"]))


def _table(pairs: list[dict[str, Any]]) -> str:
    frame = pd.DataFrame(
        {
            "cell": [f"{p['schedule']}, P={p['stages']}, M={p['microbatches']}" for p in pairs],
            "blocks per stage, equal → alpa": [
                f"{p['equal_layers']} → {p['alpa_layers']}" for p in pairs
            ],
            "embedding / block / head (fwd+bwd, one micro-batch)": [
                " / ".join(format_seconds(p[k]) for k in COSTS) for p in pairs
            ],
            "predicted equal ÷ alpa (Eq. 2)": [format_ratio(p["predicted_ratio"]) for p in pairs],
            "replayed step, equal / alpa": [
                f"{format_seconds(p['replayed_equal_s'])} / {format_seconds(p['replayed_alpa_s'])}"
                for p in pairs
            ],
            "replayed equal ÷ alpa (measured)": [format_ratio(p["replayed_ratio"]) for p in pairs],
            "wall-clock equal ÷ alpa (measured)": [format_ratio(p["wall_ratio"]) for p in pairs],
        }
    )
    return markdown_table(frame, numparse=False)


def _why_equal(pair: dict[str, Any]) -> str:
    e, b, h = (pair[k] for k in COSTS)
    cell = f"{pair['schedule']} P={pair['stages']}"
    if not b > 0:
        return _prose("no_block_cost", cell=cell)
    most = max(int(x) for x in pair["alpa_layers"].split("/"))
    return _prose(
        "why_equal",
        cell=cell,
        embedding=f"{e / b:.2f}",
        head=f"{h / b:.2f}",
        most=most,
        more=most + 1,
    )


def _why_not_faster(pair: dict[str, Any]) -> str:
    """Where Alpa's cut is not measured faster: the slowest stage of each cut as the cells
    profiled it, and Eq. 2 on those stage costs instead of the one-micro-batch probe's."""
    equal, alpa = pair["stages_equal_s"], pair["stages_alpa_s"]
    cell = f"{pair['schedule']} P={pair['stages']}"
    if not equal or not alpa:
        return _prose("no_stage_costs", cell=cell)

    def slowest(times: list[float], layers: str) -> str:
        i = max(range(len(times)), key=times.__getitem__)
        ends = [" + embedding" if i == 0 else "", " + head" if i == len(times) - 1 else ""]
        blocks = str(layers).split("/")[i]
        return f"stage {i} ({blocks} blocks{''.join(ends)}) at {format_seconds(times[i])}"

    return _prose(
        "why_not_faster",
        cell=f"{cell} M={pair['microbatches']}",
        equal=slowest(equal, pair["equal_layers"]),
        alpa=slowest(alpa, pair["alpa_layers"]),
        embedding=f"{pair['embedding_s'] / pair['block_s']:.2f}",
        head=f"{pair['head_s'] / pair['block_s']:.2f}",
        profiled=format_ratio(pair["profiled_ratio"]),
        replayed=format_ratio(pair["replayed_ratio"]),
    )


def _findings(ctx: Context, pairs: list[dict[str, Any]]) -> str:
    differ = [p for p in pairs if p["equal_layers"] != p["alpa_layers"]]
    same = [p for p in pairs if p["equal_layers"] == p["alpa_layers"]]
    lines = []
    if differ:
        faster = all(p["replayed_ratio"] > 1 for p in differ)
        detail = "; ".join(
            f"{p['schedule']} P={p['stages']} M={p['microbatches']}: "
            f"{p['equal_layers']} → {p['alpa_layers']}, replayed equal ÷ alpa "
            f"{format_ratio(p['replayed_ratio'])} (predicted "
            f"{format_ratio(p['predicted_ratio'])})"
            for p in differ
        )
        ctx.finding(_prose("alpa_finding"), faster, detail)
        lines.append(_prose("alpa_differs", faster=faster, detail=detail))
        slower = [p for p in differ if not p["replayed_ratio"] > 1]
        if slower:
            lines.append(_prose("why_not", reasons="; ".join(map(_why_not_faster, slower))))
    if same:
        why = "; ".join(_why_equal(p) for p in same)
        ctx.finding(_prose("equal_finding"), True, why)
        noise = ", ".join(format_ratio(p["replayed_ratio"]) for p in same)
        lines.append(_prose("alpa_same", pairs=len(same), why=why, noise=noise))
    return "\n\n".join(lines)


def alpa_vs_equal(ctx: Context) -> str | None:
    """Alpa-style slicing vs equal slicing

    Each pair runs one cell twice: the model cut into equal block counts (the first stage
    also runs the embedding, the last the final norm, LM head and loss), and Alpa's cut
    (Zheng et al. 2022, §5.1–5.2, Algorithm 1's DP with B = M) decided before the ranks
    start from the embedding's, one block's and the head's forward + backward CPU time on
    one micro-batch, measured on this host. *Predicted* is Alpa's Eq. 2, Σ tᵢ + (B − 1) ·
    max tᵢ, on those costs (transfers left out). *Replayed* is the measured step on the
    plan's dependency graph (each action its own profiled cost, transfers as probed);
    *wall clock* is this host's clock, distorted when ranks outnumber cores. Ratios are
    equal ÷ alpa: above 1 means Alpa's cut is faster. Where a cut is not measured faster,
    Eq. 2 is taken again on the stage costs the two cells profiled (each stage's compute
    per micro-batch), to say whether the probe's layer costs or the schedule missed."""
    pairs = slicing_pairs(ctx.ok)
    if not pairs:
        return None
    ctx.headline["alpa_vs_equal"] = [
        {
            k: p[k]
            for k in (
                "schedule",
                "stages",
                "microbatches",
                "equal_layers",
                "alpa_layers",
                "predicted_ratio",
                "profiled_ratio",
                "replayed_ratio",
                "wall_ratio",
            )
        }
        for p in pairs
    ]
    for p in pairs:
        ctx.figure(
            f"equal ÷ Alpa-sliced step time, {p['schedule']} P={p['stages']} "
            f"M={p['microbatches']} ({p['equal_layers']} → {p['alpa_layers']})",
            source="Alpa (Zheng et al. 2022) Eq. 2 on layer costs measured here",
            model=format_ratio(p["predicted_ratio"]),
            measured=f"{format_ratio(p['replayed_ratio'])} replayed (wall clock "
            f"{format_ratio(p['wall_ratio'])})",
        )
    return f"{_table(pairs)}\n\n{_findings(ctx, pairs)}"
