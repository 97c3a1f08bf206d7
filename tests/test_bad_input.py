"""Bad input on the command line: `python -m bench` refuses it before any rank starts.

A failure here means a typo in an override is not caught up front: the run would start
ranks (or a whole default grid, minutes long) before failing, or fail with a message
that does not say which key was wrong and what it may be, or exit 0 as if it had worked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Refusing costs one interpreter start (~4 s); generous for a loaded host. A grid that
# slipped through would run for minutes, and would have written results.csv long before.
FAIL_FAST_S = 60

# (case id, overrides, text the output must contain). Each override goes with an otherwise
# valid default grid, so only the bad value can stop it.
CASES = [
    (
        "unknown_algorithm",
        ["experiment=allreduce_scaling", "algorithms=[ring,butterfly]"],
        ["algorithms", "butterfly", "allowed values", "ring", "recursive_halving", "torch"],
    ),
    (
        "zero_world_size",
        ["experiment=allreduce_scaling", "world_sizes=[2,0]"],
        ["world_sizes", "[2, 0]", "integer ≥ 1"],
    ),
    (
        "message_not_whole_elements",
        ["experiment=allreduce_scaling", "message_bytes=[4096,4097]"],
        ["message_bytes", "4097", "float32", "4 bytes"],
    ),
    (
        "unknown_key_rejected_by_hydra",
        ["experiment=allreduce_scaling", "foo=1"],
        ["Key 'foo' not in", "+foo=1"],
    ),
    (
        "unknown_key_rejected_by_bench",
        ["experiment=collectives", "+foo=1"],
        ["unknown key(s) foo", "collectives", "allowed keys", "world_sizes", "message_bytes"],
    ),
    (
        "unknown_experiment",
        ["experiment=butterfly"],
        ["experiment/butterfly", "allreduce_scaling", "collectives"],
    ),
    (
        "unknown_wandb_mode",
        ["experiment=allreduce_scaling", "wandb.mode=bogus"],
        ["wandb.mode", "bogus", "offline", "online", "disabled"],
    ),
    (
        "unknown_cluster_kind",
        ["experiment=allreduce_scaling", "cluster.kind=bogus"],
        ["cluster.kind", "bogus", "local", "torchrun", "slurm"],
    ),
    (
        "tp_not_dividing_heads",
        ["experiment=tensor_parallel", "tp_degrees=[3]"],
        ["tp_degrees", "n_heads"],
    ),
    (
        "sp_degree_ulysses_cannot_split",
        ["experiment=sequence_parallel", "sp_degrees=[1,3]"],
        ["sp_degrees=[3]", "n_heads"],
    ),
    (
        "layout_degrees_missing_the_world_size",
        ["experiment=parallelism_comparison", "world_sizes=[4]", "layouts=[{dp:2,tp:3}]"],
        ["layouts[0]", "world_sizes"],
    ),
    (
        "compression_zero_density",
        ["experiment=gradient_compression", "ratios=[0]"],
        ["ratio=0", "(0, 1]"],
    ),
    (
        "compression_density_above_one",
        ["experiment=gradient_compression", "ratios=[0.01,1.5]"],
        ["ratio=1.5", "(0, 1]"],
    ),
    (
        "compression_zero_powersgd_rank",
        ["experiment=gradient_compression", "ranks=[0]"],
        ["ranks=[0]", "rank=0", ">= 1"],
    ),
    (
        "compression_zero_qsgd_levels",
        ["experiment=gradient_compression", "levels=[0]"],
        ["levels=[0]", "[1, 127]"],
    ),
    (
        "compression_unknown_method",
        ["experiment=gradient_compression", "methods=[dp,nope]"],
        ["methods", "nope", "allowed values", "topk", "powersgd", "torch_fp16"],
    ),
    (
        "compression_negative_latency",
        ["experiment=gradient_compression", "network={latency_ms:-1}"],
        ["latency_ms=-1", "≥ 0"],
    ),
]


def run_case(root: Path, case: str, overrides: list[str]) -> tuple:
    """(exit code, output, report_dir) of one `python -m bench` call; code None: timed out."""
    report_dir = root / case / "report"
    command = [sys.executable, "-m", "bench", *overrides, f"report_dir={report_dir}"]
    command.append(f"hydra.run.dir={root / case / 'hydra'}")
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    try:
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=FAIL_FAST_S,
        )
        code, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as expired:
        code, output = None, f"still running after {FAIL_FAST_S} s:\n{expired.output or ''}"
    return code, output, report_dir


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's outcome; two at a time, as the host has two cores."""
    root = tmp_path_factory.mktemp("bad_input")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case: pool.submit(run_case, root, case, o) for case, o, _ in CASES}
        return {case: future.result() for case, future in futures.items()}


@pytest.mark.parametrize("case, needles", [(c, n) for c, _, n in CASES], ids=[c[0] for c in CASES])
def test_bad_input_fails_fast_naming_key_and_allowed_values(outcomes, case, needles):
    code, output, report_dir = outcomes[case]
    assert code not in (0, None), f"exit code {code}:\n{output}"
    for needle in needles:
        assert needle in output, f"{needle!r} missing from:\n{output}"
    # Nothing was measured: no rank ran a cell, no results file was started.
    assert not (report_dir / "results.csv").exists()
    assert "cell/s" not in output  # the grid's progress bar never appeared
