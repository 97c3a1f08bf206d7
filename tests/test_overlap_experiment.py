"""Experiment `overlap`: its config, its grid, its rows, its report and one small real run.

A failure here means a grid that cannot work (a bucket cap below 1, no overlap flag, a
negative latency) would start ranks instead of being refused naming the key; or a row
whose times, hidden fraction or correctness check are not what the ranks reported; or a
report whose speed-up, ideal or best bucket size is not the one its rows give; or, in the
real run, DDP replicas that drift apart, or overlapped all-reduces that never run during
backward on a link slow enough to show it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.config import ClusterConfig, WandbConfig
from bench.experiments import experiments
from bench.experiments.overlap.config import OverlapConfig, network_label
from bench.experiments.overlap.experiment import EXPERIMENT, cells, to_row
from bench.experiments.overlap.ranks import Plan
from bench.experiments.overlap.report import pairs
from bench.runner import run_experiment

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"vocab_size": 64, "seq_len": 16, "d_model": 32, "n_heads": 4, "n_layers": 2}
LOCAL = ClusterConfig(kind="local", backend="gloo", device="cpu")


def write_report(df: pd.DataFrame, report_dir) -> dict:
    return EXPERIMENT.report_on(df, report_dir, None)


def parse_config(experiment, values: dict):
    return experiment.parse(values)


def test_registered():
    assert experiments()["overlap"] is EXPERIMENT
    assert EXPERIMENT.key_columns == ("network", "bucket_cap_bytes", "overlap")


@pytest.mark.parametrize(
    "values, needles",
    [
        ({"bucket_caps_bytes": [4096, 0]}, ["bucket_caps_bytes", "[4096, 0]", "≥ 1"]),
        ({"bucket_caps_bytes": []}, ["bucket_caps_bytes"]),
        ({"bucket_caps_bytes": [1.5]}, ["bucket_caps_bytes"]),
        ({"bucket_caps_bytes": [4096, 4096]}, ["bucket_caps_bytes", "repeats"]),
        ({"overlap": []}, ["overlap", "non-empty"]),
        ({"overlap": ["yes"]}, ["overlap", "true/false"]),
        ({"networks": [{"latency_ms": -1}]}, ["networks", "latency_ms=-1", "≥ 0"]),
        ({"networks": [{"bandwidth_mbps": 0}]}, ["networks", "bandwidth_mbps=0"]),
        ({"networks": [{"latncy_ms": 1}]}, ["networks", "latncy_ms", "latency_ms"]),
        ({"networks": []}, ["networks"]),
        ({"networks": [None, {}]}, []),  # {} is a 0 ms link: a label of its own
        ({"networks": [None, None]}, ["networks", "repeats"]),
        ({"world_size": 1}, ["world_size", "≥ 2"]),
        ({"model": {**TINY, "n_heads": 3}}, ["model", "n_heads"]),
        ({"batch_size": 0}, ["batch_size", "≥ 1"]),
        ({"repeats": 0}, ["repeats", "≥ 1"]),
        ({"warmup": -1}, ["warmup", "≥ 0"]),
        ({"timeout_s": 0}, ["timeout_s"]),
        ({"paired": "yes"}, ["paired", "true or false"]),
    ],
)
def test_bad_config_is_refused_naming_the_key(values, needles):
    if not needles:
        parse_config(EXPERIMENT, {"model": TINY, **values})
        return
    with pytest.raises(ValueError) as error:
        parse_config(EXPERIMENT, {"model": TINY, **values})
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_cli_refuses_a_negative_latency_before_any_rank_starts(tmp_path):
    out = tmp_path / "report"
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "experiment=overlap",
        f"report_dir={out}",
        "wandb.mode=disabled",
        "networks=[null,{latency_ms:-1}]",
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "latency_ms=-1" in proc.stdout + proc.stderr
    assert not (out / "results.csv").exists()


def test_network_labels():
    assert network_label(None) == "loopback"
    assert network_label({"latency_ms": 0.5, "bandwidth_mbps": 1000}) == "0.5ms-1000Mbps"
    assert network_label({"latency_ms": 2}) == "2ms"
    assert network_label({"bandwidth_mbps": 100}) == "0ms-100Mbps"


def test_grid_pairs_serial_before_overlapped_per_network_and_cap():
    cfg = OverlapConfig(
        bucket_caps_bytes=[8192, 1024],
        overlap=[True, False],
        networks=[None, {"latency_ms": 1}],
        model=TINY,
    )
    keys = [tuple(c.key.values()) for c in cells(cfg)]
    assert keys == [
        (net, cap, flag)
        for net in ("loopback", "1ms")
        for cap in (8192, 1024)
        for flag in (False, True)
    ]
    assert all(c.world_size == 2 for c in cells(cfg))
    grid = cells(cfg)
    assert grid[4].carry == Plan(network={"latency_ms": 1}, sides=(False, True))
    assert grid[3].carry == Plan(network=None, sides=(True, False))  # its twin: serial
    assert grid[3].carry.paired
    single = cells(
        OverlapConfig(
            bucket_caps_bytes=[1024], overlap=True, networks=[None], paired=False, model=TINY
        )
    )
    assert [c.carry for c in single] == [Plan(network=None, sides=(True,))]


def _rank(rank: int) -> dict:
    return {
        "rank": rank,
        "params": 1000,
        "buckets": 3,
        "bucket_bytes": [1600, 1200, 1200],
        "step_times_s": [0.30, 0.10, 0.20],  # the slowest rank's: the same on every rank
        "forward_s": [0.01, 0.02, 0.03],
        "backward_s": [0.05 + rank * 0.01] * 3,
        "rest_s": [0.04] * 3,
        "allreduce_s": [0.04, 0.04, 0.04],
        "hidden_s": [0.01 + 0.02 * rank] * 3,  # 25% on rank 0, 75% on rank 1
        "exposed_sync_s": [0.03, 0.02, 0.01 * (1 + rank)],
        "last_bucket_s": [0.01] * 3,
        "bytes_sent": [4000 + rank] * 3,
        "rounds": [6] * 3,
        "simulated_s": [0.002] * 3,
        "losses": [4.0, 3.9, 3.8 + rank * 0.1],
        "overlapped": [True, True, rank == 0],
        "param_digest": "0123456789abcdef",
        "wrong": 0,
        "twin_step_times_s": [0.5, 0.3, 0.4],  # the serial twin of an overlapped cell
        "twin_backward_s": [0.05] * 3,
        "twin_param_digest": "0123456789abcdef",
    }


def test_row_reduces_the_ranks_as_documented():
    link = {"latency_ms": 0.5, "bandwidth_mbps": 1000}
    cfg = OverlapConfig(bucket_caps_bytes=[2048], overlap=[True], networks=[link], model=TINY)
    (cell,) = cells(cfg)
    row = to_row(cfg, cell, [_rank(0), _rank(1)])
    assert row["network"] == "0.5ms-1000Mbps" and row["overlap"] is True
    assert row["latency_ms"] == 0.5 and row["bandwidth_mbps"] == 1000
    assert row["step_time_s"] == 0.20  # median over steps
    assert row["backward_s"] == pytest.approx(0.06)  # slowest rank
    assert row["hidden_fraction"] == pytest.approx(0.5)  # mean of the ranks' 25% and 75%
    assert row["exposed_sync_s"] == pytest.approx(0.02)  # per-step max, then median
    assert row["bytes_per_step"] == 4001 and row["grad_bytes"] == 4000
    assert row["buckets"] == 3 and row["largest_bucket_bytes"] == 1600
    assert row["overlapped_steps"] == 2  # a step counts when every rank overlapped
    assert row["loss"] == pytest.approx(3.85) and row["wrong"] == 0
    assert row["model_d_model"] == 32
    assert row["twin_step_time_s"] == 0.4 and row["paired_speedup"] == pytest.approx(2.0)
    assert row["twin_same_parameters"] is True


def test_row_of_an_unpaired_serial_cell():
    cfg = OverlapConfig(
        bucket_caps_bytes=[2048], overlap=[False], networks=[None], paired=False, model=TINY
    )
    (cell,) = cells(cfg)
    assert not cell.carry.paired and cell.key["network"] == "loopback"
    ranks = [_rank(0), _rank(1)]
    for r in ranks:
        r.update(twin_step_times_s=[], twin_backward_s=[], twin_param_digest="")
    row = to_row(cfg, cell, ranks)
    assert row["latency_ms"] == 0.0 and row["bandwidth_mbps"] == math.inf
    assert math.isnan(row["twin_step_time_s"]) and math.isnan(row["paired_speedup"])
    assert row["twin_same_parameters"] is None


def _frame() -> pd.DataFrame:
    """Two networks × two caps × both flags. The simulated link's cells ran paired (their
    twins' medians and side-by-side ratios given): 1 MiB overlapped is its fastest. The
    loopback cells did not: speed-up across cells, best at 64 KiB."""
    paired = {  # (cap, overlap): twin's median step, the cell's serial ÷ overlapped
        (65536, False): (0.200, 1.20),
        (65536, True): (0.240, 1.10),
        (1048576, False): (0.130, 1.50),
        (1048576, True): (0.190, 1.60),
    }
    rows = []
    times = {  # (network, cap, overlap): step, backward, all-reduce, last bucket, hidden
        ("loopback", 65536, False): (0.100, 0.050, 0.030, 0.005, 0.0),
        ("loopback", 65536, True): (0.098, 0.055, 0.032, 0.005, 0.5),
        ("loopback", 1048576, False): (0.110, 0.050, 0.025, 0.020, 0.0),
        ("loopback", 1048576, True): (0.112, 0.050, 0.025, 0.020, 0.1),
        ("0.5ms-1000Mbps", 65536, False): (0.250, 0.050, 0.180, 0.010, 0.0),
        ("0.5ms-1000Mbps", 65536, True): (0.210, 0.050, 0.180, 0.010, 0.25),
        ("0.5ms-1000Mbps", 1048576, False): (0.200, 0.050, 0.120, 0.040, 0.0),
        ("0.5ms-1000Mbps", 1048576, True): (0.120, 0.050, 0.110, 0.040, 0.40),
    }
    for (network, cap, overlap), (step, bwd, ar, last, hidden) in times.items():
        simulated = network != "loopback"
        rows.append(
            {
                "network": network,
                "bucket_cap_bytes": cap,
                "overlap": overlap,
                "latency_ms": 0.5 if simulated else 0.0,
                "bandwidth_mbps": 1000.0 if simulated else math.inf,
                "world_size": 2,
                "params": 867072,
                "grad_bytes": 3468288,
                "model_d_model": 128,
                "model_n_layers": 4,
                "batch_size": 8,
                "steps": 15,
                "buckets": 51 if cap == 65536 else 4,
                "largest_bucket_bytes": cap,
                "step_time_s": step,
                "step_time_min_s": step,
                "forward_s": 0.02,
                "backward_s": bwd,
                "rest_s": step - 0.02 - bwd,
                "allreduce_s": ar,
                "exposed_sync_s": ar * (1 - hidden),
                "last_bucket_s": last,
                "hidden_s": ar * hidden,
                "hidden_fraction": hidden,
                "overlapped_steps": 15,
                "bytes_per_step": 3468288,
                "rounds_per_step": 102,
                "simulated_s": 0.03 if simulated else 0.0,
                "loss": 5.5,
                "param_digest": "abc" if cap == 65536 else "def",
                "wrong": 0,
                "status": "ok",
                "error": "",
                "host": "vm",
                "host_cores": 2,
                "twin_step_time_s": paired[(cap, overlap)][0] if simulated else math.nan,
                "paired_speedup": paired[(cap, overlap)][1] if simulated else math.nan,
                "twin_same_parameters": True if simulated else None,
            }
        )
    rows.append(
        {
            "network": "loopback",
            "bucket_cap_bytes": 26214400,
            "overlap": True,
            "status": "failed",
            "error": "rank 1: timed out",
        }
    )
    return pd.DataFrame(rows)


def test_pairs_give_speedup_and_the_ideal_derived_from_the_serial_cell():
    table = pairs(_frame().iloc[:-1]).set_index(["network", "bucket_cap_bytes"])
    sim = table.loc[("0.5ms-1000Mbps", 1048576)]
    assert sim["speedup"] == pytest.approx((1.5 * 1.6) ** 0.5)  # geometric mean, paired
    assert sim["speedup_basis"] == "paired"
    assert sim["separate_speedup"] == pytest.approx(0.200 / 0.120)
    assert sim["serial_step_s"] == pytest.approx((0.200 + 0.190) / 2)  # own and twin
    assert sim["overlap_step_s"] == pytest.approx((0.120 + 0.130) / 2)
    # S = min(backward 0.05, all-reduce 0.12 − last bucket 0.04) = 0.05
    assert sim["ideal_speedup"] == pytest.approx(0.200 / 0.150)  # the serial cell's own
    assert sim["ideal_step_s"] == pytest.approx(0.195 - 0.050)  # beside the pooled step
    assert sim["hideable_fraction"] == pytest.approx(0.05 / 0.12)
    loop = table.loc[("loopback", 1048576)]
    assert loop["speedup_basis"] == "separate cells"
    assert loop["speedup"] == pytest.approx(0.110 / 0.112)
    # S = min(0.05, 0.025 − 0.020) = 0.005
    assert loop["ideal_step_s"] == pytest.approx(0.105)
    assert bool(table["same_parameters"].all())


def test_report_on_a_synthetic_frame(tmp_path):
    headline = write_report(_frame(), tmp_path)
    for name in ("report.md", "headline.json", "step_time_vs_bucket.png", "hidden_fraction.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "headline.json").read_text()) == headline
    best = headline["best_per_network"]
    assert best["0.5ms-1000Mbps"]["bucket_cap_bytes"] == 1048576
    assert best["0.5ms-1000Mbps"]["speedup"] == pytest.approx((1.5 * 1.6) ** 0.5)
    assert best["0.5ms-1000Mbps"]["hidden_fraction"] == pytest.approx(0.40)
    assert best["0.5ms-1000Mbps"]["best_vs_best_speedup"] == pytest.approx(0.195 / 0.125)
    assert best["loopback"]["bucket_cap_bytes"] == 65536
    assert best["loopback"]["speedup"] == pytest.approx(0.100 / 0.098)
    assert headline["wrong_total"] == 0 and headline["failed_cells"] == 1
    assert headline["pairs"] == 4 and headline["pairs_bitwise_equal"] == 4
    figures = {f["figure"]: f for f in headline["figures"]}
    speed = figures["DDP serial ÷ overlapped step time, 0.5ms-1000Mbps, best cap (1 MiB)"]
    # The ideal is Li et al.'s model on the serial cell's times: the model column.
    assert speed["measured"] == "1.55×" and speed["model"].startswith("≤ 1.33×")
    assert speed["theory"] == "—"
    assert "Li et al., VLDB 2020" in speed["source"]
    report = (tmp_path / "report.md").read_text()
    # "0.98×": the loopback 1 MiB pair's speed-up across cells (0.110 / 0.112), from rows.
    for needle in (
        "0.98×",
        "uses no CPU",
        "1.55×",
        "Failed cells (1)",
        "timed out",
        "4 of 4 pairs",
        "cell's own in 4 of 4",
        "separate cells",
    ):
        assert needle in report, needle
    assert "zero_memory" not in report  # another report's figure is not this report's
    # Issue #4's target: every cap with several buckets on the simulated link, both here.
    (target,) = headline["targets"]
    assert target["where"] == {"overlap": True, "link": "simulated", "several_buckets": True}
    assert target["cells"] == target["measured"] == 2 and target["met"]
    assert target["worst"] == pytest.approx((1.2 * 1.1) ** 0.5)
    assert "bucket_cap_bytes=65536" in target["worst_key"]
    assert target["median"] == pytest.approx(((1.2 * 1.1) ** 0.5 + (1.5 * 1.6) ** 0.5) / 2)
    # Loopback is shown, and overlap not paying there (1 MiB: 0.98×) is a finding.
    findings = {f["claim"]: f for f in headline["findings"]}
    loopback = next(f for claim, f in findings.items() if claim.startswith("On loopback"))
    assert not loopback["holds"] and "1 MiB: 0.98×" in loopback["detail"]
    assert all(f["holds"] for f in findings.values() if f is not loopback)


def test_report_of_a_grid_with_one_overlap_setting(tmp_path):
    frame = _frame().iloc[:-1]
    headline = write_report(frame[frame["overlap"]], tmp_path)
    assert headline["pairs"] == 0 and headline["best_per_network"] == {}
    assert (tmp_path / "step_time_vs_bucket.png").stat().st_size > 0


def test_report_with_no_finished_cell(tmp_path):
    headline = write_report(_frame().iloc[-1:], tmp_path)
    assert headline["failed_cells"] == 1 and headline.get("best_per_network", {}) == {}
    assert "nothing measured to show" in (tmp_path / "report.md").read_text()


def test_tiny_grid_end_to_end(tmp_path):
    """2 ranks, 2 caps that each make several buckets, both flags, a 2 ms link; a model
    whose backward lasts long enough (milliseconds) for the communication thread to be
    scheduled while it runs, on a busy host too."""
    model = {**TINY, "d_model": 64, "seq_len": 32}
    cfg = parse_config(
        EXPERIMENT,
        {
            "bucket_caps_bytes": [4096, 65536],
            "networks": [{"latency_ms": 2.0}],
            "model": model,
            "batch_size": 8,
            "warmup": 1,
            "repeats": 2,
            "timeout_s": 120,
        },
    )
    df = run_experiment(
        EXPERIMENT,
        cfg,
        report_dir=tmp_path,
        cluster=LOCAL,
        resume=False,
        wandb_cfg=WandbConfig(mode="disabled"),
    )
    assert len(df) == 4 and (df["status"] == "ok").all(), df.get("error")
    assert (df["wrong"] == 0).all()
    assert df["param_digest"].nunique() == 1  # N = 2: every cell sums the same pairs
    assert (df["update_error"] < 1e-4).all()  # and lands on the single-process run
    assert (df["buckets"] > 1).all() and (df["steps"] == 2).all()
    assert (df["bytes_per_step"] > 0).all() and (df["simulated_s"] > 0).all()
    on = df[df["overlap"]]
    off = df[~df["overlap"]]
    assert (on["hidden_fraction"] > 0).all(), on[["bucket_cap_bytes", "hidden_fraction"]]
    assert (on["overlapped_steps"] >= 1).all()
    assert df["paired_speedup"].gt(0).all() and df["twin_same_parameters"].all()
    assert (off["hidden_fraction"] == 0).all() and (off["overlapped_steps"] == 0).all()
    for name in (
        "results.csv",
        "report.md",
        "headline.json",
        "step_time_vs_bucket.png",
        "hidden_fraction.png",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    headline = json.loads((tmp_path / "headline.json").read_text())
    assert headline["wrong_total"] == 0 and headline["pairs_bitwise_equal"] == 2
    assert set(headline["best_per_network"]) == {"2ms"}
