"""Serial and overlapped cells of one network and bucket cap, side by side: their step
times, the speed-up (paired where the cells timed twins), and the ideal derived from the
serial cell's measured times (Li et al., VLDB 2020)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["IDEAL_SOURCE", "best_per_network", "flag", "number", "pairs", "whole"]

IDEAL_SOURCE = (
    "Li et al., VLDB 2020 (PyTorch Distributed): ideal overlapped step = forward + "
    "max(backward, all-reduce) + optimizer, less the last bucket, which cannot start before "
    "backward ends; evaluated on the serial cell's measured times"
)


def flag(values: pd.Series) -> pd.Series:
    """The overlap column as bools, whether read back as bools or as text."""
    return values.map(lambda v: v if isinstance(v, bool | np.bool_) else str(v) == "True")


def number(row: pd.Series, column: str) -> float:
    value = pd.to_numeric(row.get(column, math.nan), errors="coerce")
    return float(value) if pd.notna(value) else math.nan


def whole(value: float) -> int | float:
    """An integer count read back as a float (or NaN) as an int, NaN as it is."""
    return int(value) if math.isfinite(value) else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) else math.nan


def _pooled(own: float, twin: float) -> float:
    """A setting's step time: the mean of its cell's median and its twin's median in the
    other cell, where there is one."""
    return (own + twin) / 2 if math.isfinite(twin) else own


def _pair(network: str, cap: Any, s: pd.Series, o: pd.Series) -> dict[str, Any]:
    serial_step, allreduce = number(s, "step_time_s"), number(s, "allreduce_s")
    hideable = allreduce - (number(s, "last_bucket_s") if "last_bucket_s" in s else 0.0)
    saving = max(0.0, min(number(s, "backward_s"), hideable))  # NaN-safe: max(0, nan) = 0
    ideal = serial_step - saving
    pooled_serial = _pooled(serial_step, number(o, "twin_step_time_s"))
    separate = _ratio(serial_step, number(o, "step_time_s"))
    paired = [
        v
        for v in (number(s, "paired_speedup"), number(o, "paired_speedup"))
        if math.isfinite(v) and v > 0
    ]
    return {
        "network": network,
        "bucket_cap_bytes": cap,
        "buckets": whole(number(o, "buckets")),
        "serial_step_s": pooled_serial,
        "overlap_step_s": _pooled(number(o, "step_time_s"), number(s, "twin_step_time_s")),
        # Geometric mean of the two cells' side-by-side ratios.
        "speedup": math.prod(paired) ** (1 / len(paired)) if paired else separate,
        "speedup_basis": "paired" if paired else "separate cells",
        "separate_speedup": separate,
        "ideal_step_s": pooled_serial - saving,  # beside the pooled serial step
        "ideal_speedup": _ratio(serial_step, ideal),
        "serial_backward_s": number(s, "backward_s"),
        "serial_allreduce_s": allreduce,
        "overlap_allreduce_s": number(o, "allreduce_s"),
        "hidden_fraction": number(o, "hidden_fraction"),
        "hideable_fraction": _ratio(saving, allreduce),
        "serial_exposed_s": number(s, "exposed_sync_s"),
        "overlap_exposed_s": number(o, "exposed_sync_s"),
        "same_parameters": str(s.get("param_digest", "")) == str(o.get("param_digest", "-")),
    }


def pairs(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (network, bucket cap) with both a serial and an overlapped cell: their
    step times, the speed-up (serial ÷ overlapped; paired where the cells timed twins,
    else across the two cells) and the ideal derived from the serial cell."""
    ok = ok.assign(overlap=flag(ok["overlap"]))
    serial = ok[~ok["overlap"]].set_index(["network", "bucket_cap_bytes"])
    overlapped = ok[ok["overlap"]].set_index(["network", "bucket_cap_bytes"])
    common = [i for i in serial.index if i in overlapped.index]
    rows = [
        _pair(net, cap, serial.loc[(net, cap)], overlapped.loc[(net, cap)]) for net, cap in common
    ]
    return pd.DataFrame(rows, columns=None if rows else ["network", "bucket_cap_bytes"])


def best_per_network(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per network: the bucket cap where the overlapped step is fastest, and that pair."""
    out = {}
    for network, rows in table.groupby("network", sort=False):
        rows = rows[rows["overlap_step_s"].map(math.isfinite) & (rows["overlap_step_s"] > 0)]
        if rows.empty:
            continue
        best = rows.loc[rows["overlap_step_s"].idxmin()]
        serial = rows[rows["serial_step_s"].map(math.isfinite)]
        fastest_serial = serial.loc[serial["serial_step_s"].idxmin()] if len(serial) else best
        out[str(network)] = {
            "bucket_cap_bytes": int(best["bucket_cap_bytes"]),
            "buckets": whole(float(best["buckets"])),
            "serial_step_s": float(best["serial_step_s"]),
            "overlap_step_s": float(best["overlap_step_s"]),
            "speedup": float(best["speedup"]),
            "speedup_basis": str(best["speedup_basis"]),
            "ideal_speedup": float(best["ideal_speedup"]),
            "hidden_fraction": float(best["hidden_fraction"]),
            "hideable_fraction": float(best["hideable_fraction"]),
            "best_serial_bucket_cap_bytes": int(fastest_serial["bucket_cap_bytes"]),
            "best_vs_best_speedup": _ratio(
                float(fastest_serial["serial_step_s"]), float(best["overlap_step_s"])
            ),
        }
    return out
