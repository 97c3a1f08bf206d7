"""device_profile: its steps, its fit, the preset it writes and where that preset is taken.

A failure here means a microbenchmark whose result is not checked (a GEMM or copy that
computes the wrong thing would still report a rate), a link fit that does not recover the
α and β it was given, a preset whose numbers are not the rows' (a peak that is not the
best rate, a table not ÷ it), a stale preset left beside a report that made none, or a
preset file that `hardware=` refuses — the point of the experiment."""

from __future__ import annotations

import pandas as pd
import pytest
import torch.distributed as dist

from bench.experiments import experiments
from bench.experiments.at_scale.config import AtScaleConfig
from bench.experiments.auto_parallel.config import AutoParallelConfig
from bench.experiments.device_profile.config import DeviceProfileConfig
from bench.experiments.device_profile.experiment import cells
from bench.kit import profile
from impls.costmodel.hardware_file import dump_hardware, load_hardware
from impls.costmodel.presets import HARDWARE, hardware

ALPHA, BETA = 2e-4, 1e-9  # s per round, s per byte
GEMMS = {("fp32", 64): 2e9, ("fp32", 128): 8e9, ("fp32", 256): 10e9, ("bf16", 128): 20e9}


def test_each_step_checks_its_result_and_the_check_can_fail(monkeypatch):
    step, check = profile.copy_step(4096, "cpu")
    assert check() > 0  # before the copy, the target is not the source
    step()
    assert check() == 0
    for dtype in ("fp32", "bf16"):
        step, check = profile.gemm_step(32, 48, 64, dtype, "cpu")
        step()
        assert check() == 0, dtype
    monkeypatch.setitem(profile.TOLERANCE, "bf16", 0.0)  # bf16 rounds: exact is wrong
    assert profile.gemm_step(32, 48, 64, "bf16", "cpu")[1]() > 0
    step, check = profile.launch_step("cpu")
    for _ in range(3):
        step()
    assert check() == 0
    with pytest.raises(ValueError, match="tf32"), profile.gemm_mode("tf32", "cpu"):
        pass


def test_timed_is_per_call_on_a_one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        calls = []
        out = profile.timed(
            lambda: calls.append(1),
            device="cpu",
            warmup=1,
            repeats=3,
            window_s=0.001,
            max_iters=5,
            per_call=4,
        )
    finally:
        dist.destroy_process_group()
    assert out["seconds"] > 0 and out["fastest_s"] <= out["seconds"]
    assert out["iters"] % 4 == 0 and len(calls) >= 4 * (1 + 3)


def test_the_ring_fit_recovers_alpha_and_beta_past_one_outlying_size():
    n, sizes = 4, [4096 << 2 * i for i in range(8)]
    times = [2 * (n - 1) * ALPHA + 2 * (n - 1) / n * m * BETA for m in sizes]
    assert profile.fit_ring(n, sizes, times) == pytest.approx((ALPHA, BETA), rel=1e-6)
    times[2] /= 3  # one size timed in a fast phase of the host
    assert profile.fit_ring(n, sizes, times) == pytest.approx((ALPHA, BETA), rel=1e-6)
    with pytest.raises(ValueError, match="≥ 2 sizes"):
        profile.fit_ring(n, [4096, 4096], [1e-3, 1e-3])


def test_cells_run_the_device_first_then_each_ring_size_n_ascending():
    cfg = DeviceProfileConfig(
        gemm_shapes=[[8, 8, 8]], world_sizes=[3, 2], message_bytes=[4096, 8192], dtype="bfloat16"
    )
    got = [(c.world_size, c.key["measurement"], c.key["dtype"]) for c in cells(cfg)]
    assert got[:4] == [
        (1, "gemm", "fp32"),
        (1, "gemm", "bf16"),
        (1, "copy", "fp32"),
        (1, "launch", "fp32"),
    ]
    assert [w for w, *_ in got[4:]] == [2, 2, 3, 3] and {d for *_, d in got[4:]} == {"bf16"}


def _rows(host: str = "testhost") -> pd.DataFrame:
    """A profile's ok rows, as results.csv holds them, with known numbers."""
    meta = {
        "status": "ok",
        "host": host,
        "timestamp": "2026-11-28T12:00:00+00:00",
        "profiled_device": "cpu: test",
        "device_kind": "cpu",
        "threads": 1,
        "devices_per_node": 2,
        "device_memory_bytes": 8e9,
        "wrong": 0,
    }
    out = []
    for (dtype, n), rate in GEMMS.items():
        out.append(
            {
                "measurement": "gemm",
                "dtype": dtype,
                "m": n,
                "n": n,
                "k": n,
                "world_size": 1,
                "message_bytes": 0,
                "flops": 2.0 * n**3,
                "flop_rate": rate,
                "time_s": 2.0 * n**3 / rate,
                **meta,
            }
        )
    out.append(
        {
            "measurement": "copy",
            "dtype": "fp32",
            "world_size": 1,
            "message_bytes": 2**20,
            "bandwidth": 5e9,
            "time_s": 2**21 / 5e9,
            **meta,
        }
    )
    out.append(
        {
            "measurement": "launch",
            "dtype": "fp32",
            "world_size": 1,
            "message_bytes": 0,
            "time_s": 3e-6,
            **meta,
        }
    )
    for size in (4096, 65536, 2**20, 2**24):
        out.append(
            {
                "measurement": "all_reduce",
                "dtype": "fp32",
                "world_size": 2,
                "message_bytes": size,
                "time_s": 2 * ALPHA + size * BETA,
                **meta,
            }
        )
    return pd.DataFrame(out).fillna({"m": 0, "n": 0, "k": 0})


def test_the_report_writes_a_preset_of_the_measured_numbers(tmp_path):
    headline = experiments()["device_profile"].report_on(_rows(), tmp_path, None)
    path = tmp_path / "hardware.yaml"
    assert headline["preset_file"] == str(path.resolve())
    hw = hardware(str(path))
    assert hw == load_hardware(path)
    assert hw.peak_flops == {"fp32": 10e9, "bf16": 20e9}  # each dtype's best rate
    flops, fractions = zip(*hw.gemm_efficiency, strict=True)
    assert flops == (2 * 64.0**3, 2 * 128.0**3, 2 * 256.0**3)  # fp32's, the first dtype
    assert fractions == pytest.approx((0.2, 0.8, 1.0))  # each rate ÷ fp32's best
    assert (hw.memory_bandwidth, hw.kernel_overhead_s) == (5e9, 3e-6)
    assert (hw.intra.alpha_s, 1 / hw.intra.bandwidth) == pytest.approx((ALPHA, BETA), rel=1e-6)
    assert hw.inter == hw.intra and hw.devices_per_node == 2 and not hw.comm_overlap
    assert "measured here, 2026-11-28, cpu: test, testhost" in hw.sources["peak_flops"]
    assert "assumption" in hw.sources["inter"]


def test_rows_that_make_no_preset_leave_none_behind(tmp_path):
    experiment = experiments()["device_profile"]
    experiment.report_on(_rows(), tmp_path, None)
    rows = _rows()
    headline = experiment.report_on(rows[rows["measurement"] != "copy"], tmp_path, None)
    assert headline["preset_file"] is None and not (tmp_path / "hardware.yaml").exists()
    assert "no copy row" in (tmp_path / "report.md").read_text()
    experiment.report_on(_rows(), tmp_path, None)
    failed = _rows().assign(status="failed", error="RuntimeError: no rank started")
    experiment.report_on(failed, tmp_path, None)  # no cell ran: no preset, the old one gone
    assert not (tmp_path / "hardware.yaml").exists()


def test_a_preset_file_goes_wherever_a_preset_name_goes(tmp_path):
    """`hardware=<file>` in auto_parallel's and at_scale's configs (config level only):
    the preset the profile writes, and any preset written to a file, is the same cluster."""
    experiments()["device_profile"].report_on(_rows(), tmp_path, None)
    host = str(tmp_path / "hardware.yaml")
    cfg = AutoParallelConfig(model={"preset": "small_gpt"}, hardware=host, gpus=[2], global_batch=8)
    assert cfg.cluster() == load_hardware(host) and cfg.cluster().peak("bf16") == 20e9
    a100 = str(dump_hardware(HARDWARE["a100_80gb"], tmp_path / "a100.yaml"))
    assert AutoParallelConfig(hardware=a100).cluster() == HARDWARE["a100_80gb"]
    at_scale = AtScaleConfig(gpt3_hardware=a100, chinchilla_hardware=host)
    assert hardware(at_scale.chinchilla_hardware) == load_hardware(host)
    with pytest.raises(ValueError, match="^hardware: hardware file .*missing.yaml"):
        AutoParallelConfig(hardware=str(tmp_path / "missing.yaml"))
