"""Bad input: `python -m bench` refuses it before any rank starts, in one line naming the key.

A failure here means a typo or an impossible value is not caught up front: the run would
start ranks (a default grid, minutes long, or 100000 processes) before failing, or fail
with a traceback or a message not naming the wrong key and what it may be, or exit 0 as
if it had worked — or that a grid with failed cells exits 0.

`CLI_CASES` go through the command line (two at a time): exit status 2 (refused by bench,
one line `bad config: ...`) or 1 (refused by Hydra, naming the key), no traceback, no
results.csv, no progress bar. `BUILD_CASES`, every experiment's keys and the run-level
ones, compose the same config here and call `bench.app.build` (what the command line runs
between composing and running): each must be refused with the message the CLI prints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

from bench.app import CONFIG_DIR, build, summary
from bench.config import rank_limit
from bench.experiments import experiments
from bench.presets import normalize

REPO_ROOT = Path(__file__).resolve().parents[1]
# Refusing costs one interpreter start (~4 s); generous for a loaded host. A grid that
# slipped through would run for minutes, and would have written results.csv long before.
FAIL_FAST_S = 60
AR, TINY = "experiment=allreduce_scaling", ["profile=ci", "wandb.mode=disabled"]
HUGE_GPT = "{vocab_size:256,seq_len:64,d_model:65536,n_heads:4,n_layers:64}"

# (case id, overrides, exit status, text the output must contain). Each override goes with
# an otherwise valid grid, so only the bad value can stop it.
CLI_CASES = [
    (
        "unknown_algorithm",
        [AR, "algorithms=[ring,butterfly]"],
        2,
        ["algorithms", "butterfly", "allowed values", "ring", "recursive_halving", "auto", "torch"],
    ),
    ("unknown_key_rejected_by_hydra", [AR, "foo=1"], 1, ["Key 'foo' not in", "+foo=1"]),
    (
        "unknown_key_rejected_by_bench",
        ["experiment=collectives", "+foo=1"],
        2,
        ["unknown key(s) foo", "collectives", "allowed keys", "world_sizes", "message_bytes"],
    ),
    (
        "unknown_experiment",
        ["experiment=butterfly"],
        2,
        ["experiment='butterfly' is unknown", "allreduce_scaling", "collectives"],
    ),
    (
        "unknown_wandb_mode",
        [AR, "wandb.mode=bogus"],
        2,
        ["wandb.mode", "bogus", "offline", "online", "disabled"],
    ),
    (
        "unknown_cluster_kind",
        [AR, "cluster.kind=bogus"],
        2,
        ["cluster.kind", "bogus", "local", "torchrun", "slurm"],
    ),
    ("resume_not_a_bool", [AR, "resume=maybe"], 1, ["resume", "maybe", "not a valid bool"]),
    (
        "torchrun_without_torchrun",
        [AR, "cluster=torchrun"],
        2,
        ["cluster=torchrun", "RANK", "WORLD_SIZE", "MASTER_ADDR"],
    ),
    (
        "unknown_model_preset",
        ["experiment=auto_parallel", "model=gpt5"],
        2,
        ["model='gpt5' is unknown", "allowed values", "gpt3_175b", "llama2_70b"],
    ),
    (
        "unknown_model_field",
        ["experiment=auto_parallel", "model=llama2_7b", "model.width=4"],
        2,
        ["model.width", "model=llama2_7b", "allowed keys", "n_layers", "seq_len"],
    ),
    (
        "experiment_given_twice",
        [AR, "experiment=collectives"],
        2,
        ["experiment= is given 2 times", "allreduce_scaling, collectives"],
    ),
    ("report_dir_is_a_file", [AR, *TINY], 2, ["report_dir"]),
    ("report_dir_of_another_experiment", [AR, *TINY], 2, ["collectives"]),
]


def prepare(case: str, report_dir: Path) -> None:
    """What a case finds at its report_dir: a file of the user's, or another's report."""
    if case == "report_dir_is_a_file":
        report_dir.parent.mkdir(parents=True)
        report_dir.write_text("a file of mine\n")
    elif case == "report_dir_of_another_experiment":
        shutil.copytree(REPO_ROOT / "reports" / "collectives", report_dir)


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under `path` (or `path` itself) with its bytes: what a refusal must keep."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []
    return {str(p.relative_to(path)): p.read_bytes() for p in files}


def run_case(root: Path, case: str, overrides: list[str]) -> tuple:
    """(exit code, output, report_dir, files before) of one `python -m bench` call; code
    None: timed out."""
    report_dir = root / case / "report"
    prepare(case, report_dir)
    before = snapshot(report_dir)
    command = [sys.executable, "-m", "bench", *overrides, f"report_dir={report_dir}"]
    command.append(f"hydra.run.dir={root / case / 'hydra'}")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env.update(WANDB_MODE="disabled", HYDRA_FULL_ERROR="0")
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
    return code, output, report_dir, before


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's outcome; two at a time, as the host has two cores."""
    root = tmp_path_factory.mktemp("bad_input")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case: pool.submit(run_case, root, case, o) for case, o, _, _ in CLI_CASES}
        return {case: future.result() for case, future in futures.items()}


@pytest.mark.parametrize(
    "case, status, needles", [(c, s, n) for c, _, s, n in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_bad_input_fails_fast_naming_key_and_allowed_values(outcomes, case, status, needles):
    code, output, report_dir, before = outcomes[case]
    assert code == status, f"exit code {code}, not {status}:\n{output}"
    for needle in needles:
        assert needle in output, f"{needle!r} missing from:\n{output}"
    assert "Traceback" not in output, output
    if status == 2:  # refused by bench: one line
        assert len([line for line in output.splitlines() if "bad config" in line]) == 1, output
    # Nothing was measured: no rank ran a cell, no results file was started or changed.
    assert snapshot(report_dir) == before
    assert "results.csv" in before or not (report_dir / "results.csv").exists()
    assert "cell/s" not in output  # the grid's progress bar never appeared


# fmt: off
# experiment -> (overrides, text the message must contain). Every value here must be
# refused by Hydra (a wrong type) or by `build` (one line naming the key).
RUN_KEYS = [
    (["cluster=torchrun"], ["cluster=torchrun", "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"]),
    (["cluster.backend=bogus"], ["cluster.backend='bogus'", "auto, gloo"]),
    (["resume=perhaps"], ["resume", "perhaps"]), (["append=sometimes"], ["append", "sometimes"]),
    (["resume=2"], ["resume=2", "true or false"]), (["append=yes"], ["append='yes'"]),
    (["cluster=slurm", "cluster.max_ranks=2"], ["world_sizes=[2, 4, 8]", "at most 2"]),
    (["timeout_s=nan"], ["timeout_s=nan", "finite"]),
    (["timeout_s=1e9"], ["timeout_s=1000000000.0", "≤ 604,800", "a week"]),
    (["profile.name=bogus"], ["profile.name='bogus'", "full, ci"]),
    (["cluster.backend=nccl"], ["cluster.backend='nccl'", "auto, gloo", "cluster=local"]),
    (["cluster.device=cuda"], ["cluster.device='cuda'", "cpu"]),
    (["cluster.max_ranks=0"], ["cluster.max_ranks", "≥ 1"]),
    (["cluster.max_ranks=abc"], ["cluster.max_ranks", "abc"]),
    (["cluster.max_ranks=4", "world_sizes=[2,8]"], ["world_sizes=[2, 8]", "at most 4"]),
    (["cluster.memory_gb=-1"], ["cluster.memory_gb=-1", "> 0"]),
    (["cluster.memory_gb=nan"], ["cluster.memory_gb=nan"]),
    (["cluster.memory_gb=0.5"], ["world_sizes=[2, 4, 8]", "at most 1", "0.5 GB available"]),
    (["cluster.memory_gb=0.5", "cluster.max_ranks=8"],
     ["message_bytes", "0.5 GB available", "cluster.memory_gb"]),
    (["cluster.timeout_min=0"], ["cluster.timeout_min", "≥ 1"]),
    (["cluster.requeues=-1"], ["cluster.requeues", "≥ 0"]),
    (["cluster.partition="], ["cluster.partition"]), (["cluster.foo=1"], ["foo", "ClusterConfig"]),
    (["cluster=bogus"], ["cluster/bogus", "local", "slurm", "torchrun"]),
    (["wandb.mode=live"], ["wandb.mode='live'", "offline"]),
    (["wandb.foo=1"], ["foo", "WandbConfig"]), (["report_dir="], ["report_dir=''"]),
    (["profile=bogus"], ["profile/bogus", "ci", "full"]),
]
TIMED = [
    (["timeout_s=abc"], ["timeout_s", "abc", "Float"]),
    (["world_sizes=4"], ["world_sizes", "ListConfig"]),
    (["message_bytes=[17179869184]"], ["message_bytes=[17179869184]", "GB available"]),
    (["world_sizes=[2,2]"], ["world_sizes=[2, 2]", "repeats 2"]),
    (["world_sizes=[]"], ["world_sizes=[]"]), (["message_bytes=[-4]"], ["message_bytes=[-4]"]),
    (["message_bytes=[4096,4096]"], ["message_bytes", "repeats 4096"]),
    (["timeout_s=nan"], ["timeout_s=nan", "finite"]),
    (["timeout_s=1e9"], ["timeout_s=1000000000.0", "≤ 604,800", "a week"]),
    (["profile.name=bogus"], ["profile.name='bogus'", "full, ci"]),
    (["timeout_s=inf"], ["timeout_s=inf", "finite"]), (["timeout_s=-1"], ["timeout_s=-1"]),
    (["window_s=nan"], ["window_s=nan", "finite"]), (["window_s=abc"], ["window_s", "abc"]),
    (["window_s=-1"], ["window_s=-1"]), (["warmup=-5"], ["warmup=-5", "≥ 0"]),
    (["repeats=0"], ["repeats=0", "≥ 1"]), (["max_iters=0"], ["max_iters=0"]),
    (["paired=maybe"], ["paired", "maybe"]),
    (["dtype=float33"], ["dtype='float33'", "float32", "bfloat16"]),
]
BUILD_CASES = {
    "activation_recompute": [
        (["recompute=[partial]"], ["recompute", "partial", "selective"]),
        (["recompute=[full,full]"], ["recompute", "repeats"]),
        (["tp=[3]"], ["tp=3", "model.n_heads=8"]), (["tp=[0]"], ["tp=[0]"]),
        (["sp=[]"], ["sp=[]"]), (["seq_lens=[0]"], ["seq_lens=[0]"]),
        (["seq_lens=[33]"], ["seq_lens=[33]", "tp=2"]),
        (["dtype=fp8"], ["dtype='fp8'", "bf16"]),
        (["attention=flash"], ["attention='flash'", "materialized"]),
        (["+model.recompute=full"], ["model.recompute=full", "grid keys"]),
        (["budget_bytes=0"], ["budget_bytes=0"]), (["micro_batch=0"], ["micro_batch=0"]),
        (["budget_max_seq_len=0"], ["budget_max_seq_len=0"]),
        (["warmup=-1"], ["warmup=-1"]), (["+model.dropout=1.5"], ["dropout", "1.5"]),
    ],
    "allreduce_scaling": [
        *RUN_KEYS, *TIMED,
        (["algorithms=[]"], ["algorithms=[]"]),
        (["algorithms=[ring,ring]"], ["algorithms", "repeats \"ring\""]),
        (["world_sizes=[2,0]"], ["world_sizes=[2, 0]", "≥ 1"]),
        (["message_bytes=[4096,4097]"], ["message_bytes", "4097", "float32", "4 bytes"]),
        (["world_sizes=[1000]"], ["world_sizes=[1000]", "1000 ranks", "cluster.max_ranks"]),
        (["world_sizes=[100000]"], ["world_sizes=[100000]", "≤ 1,024"]),
    ],
    "collectives": [
        *TIMED[:6],
        (["collectives=[all_gather,bogus]"], ["collectives", "bogus", "all_to_all"]),
        (["impls=[mpi]"], ["impls", "mpi", "distbench, torch"]),
        (["impls=[torch,torch]"], ["impls", "repeats"]),
        (["message_bytes=[6]"], ["message_bytes", "float32"]),
        (["dtype=int64", "message_bytes=[4]"], ["message_bytes", "int64", "8 bytes"]),
        (["world_sizes=[0]"], ["world_sizes=[0]"]),
        (["world_sizes=[64]"], ["world_sizes=[64]", "64 ranks"]),
    ],
    "delayed_averaging": [
        (["latencies_ms=[-1]"], ["latencies_ms=[-1.0]", "≥ 0"]), (["latencies_ms=[nan]"], ["latencies_ms=[nan]"]),
        (["latencies_ms=[]"], ["latencies_ms=[]"]),
        (["latencies_ms=[0,0]"], ["latencies_ms", "repeats"]), (["delays=[0]"], ["delays=[0]"]),
        (["methods=[async]"], ["methods", "async", "sync, dga"]),
        (["target_accuracy=1.5"], ["target_accuracy=1.5", "≤ 1"]),
        (["target_accuracy=nan"], ["target_accuracy=nan"]),
        (["bandwidth_mbps=0"], ["bandwidth_mbps=0"]), (["lr=nan"], ["lr=nan"]),
        (["lr=-0.1"], ["lr=-0.1"]), (["batch_size=30"], ["batch_size=30", "world_size=4"]),
        (["steps=0"], ["steps=0"]), (["eval_every=0"], ["eval_every=0"]),
        (["seed=-1"], ["seed=-1"]), (["task=imagenet"], ["task='imagenet'", "digits"]),
        (["timeout_s=0"], ["timeout_s=0"]),
        (["world_size=1000", "batch_size=1000"], ["world_size=1000", "at most"]),
    ],
    "gradient_compression": [
        (["seeds=[0,0]"], ["seeds=[0, 0]", "repeats 0"]), (["seeds=[-1]"], ["seeds=[-1]"]),
        (["ratios=[nan]"], ["ratios=[nan]"]), (["levels=[200]"], ["levels=[200]", "≤ 127"]),
        (["network={latency_ms:nan}"], ["latency_ms=nan"]),
        (["network={bogus:1}"], ["network.bogus"]), (["lr=inf"], ["lr=inf"]),
        (["draws=1"], ["draws=1", "≥ 2"]), (["dgc_warmup_steps=-1"], ["dgc_warmup_steps=-1"]),
        (["task=bogus"], ["task='bogus'", "chargpt"]),
        (["world_size=1000", "batch_size=1000"], ["world_size=1000", "at most"]),
        (["ratios=[0]"], ["ratio=0", "(0, 1]"]), (["ratios=[0.01,1.5]"], ["ratios=[0.01, 1.5]", "≤ 1"]),
        (["ranks=[0]"], ["ranks=[0]", "≥ 1"]), (["levels=[0]"], ["levels=[0]", "≥ 1"]),
        (["methods=[dp,nope]"], ["methods", "nope", "allowed values", "topk", "powersgd", "torch_fp16"]),
        (["network={latency_ms:-1}"], ["latency_ms=-1", "≥ 0"]),
    ],
    "max_model_size": [
        (["gpu_memory_gb=[0]"], ["gpu_memory_gb", "> 0"]),
        (["gpu_memory_gb=[nan]"], ["gpu_memory_gb", "> 0"]),
        (["gpu_memory_gb=-80"], ["gpu_memory_gb=-80", "≥ 0"]), (["dp=[0]"], ["dp=[0]"]),
        (["dp=[64,64]"], ["dp=[64, 64]", "repeats 64"]), (["mp=0"], ["mp=0"]),
        (["params=nan"], ["params=nan"]), (["params=-1"], ["params=-1"]),
        (["bytes_per_param={weights:0}"], ["bytes_per_param.weights=0"]),
        (["bytes_per_param={bogus:1}"], ["bytes_per_param.bogus"]),
        (["timeout_s=nan"], ["timeout_s=nan"]),
    ],
    "overlap": [
        (["bucket_caps_bytes=[0]"], ["bucket_caps_bytes=[0]"]),
        (["overlap=[maybe]"], ["overlap", "true/false"]),
        (["networks=[{latency_ms:nan}]"], ["networks", "latency_ms=nan"]),
        (["networks=[{latency_ms:1},{latency_ms:1.0}]"], ["networks", "repeats"]),
        (["world_size=1"], ["world_size=1", "≥ 2"]),
        (["world_size=1000"], ["world_size=1000", "at most"]),
        (["paired=maybe"], ["paired='maybe'", "true or false"]), (["warmup=-1"], ["warmup=-1"]),
        ([f"model={HUGE_GPT}"], ["model=", "GB available", "batch_size"]),
    ],
    "at_scale": [
        (["lecture=[gpt4_hours]"], ["lecture", "gpt4_hours", "allowed values", "summit_768"]),
        (["published=[bogus_run]"], ["published", "bogus_run", "megatron_sc21_1t"]),
        (["gpt3_gpus=0"], ["gpt3_gpus=0"]), (["chinchilla_gpus=-8"], ["chinchilla_gpus=-8"]),
        (["chinchilla_flops=1e-30"], ["chinchilla_flops=1e-30", "≥ 1e+18"]),
        (["gpt3_hardware=tpu_v4"], ["gpt3_hardware", "tpu_v4", "a100_80gb"]),
        (["chinchilla_hardware=no/such.yaml"], ["chinchilla_hardware", "no/such.yaml"]),
        (["chinchilla_model=gpt5"], ["chinchilla_model", "gpt5", "llama2_70b"]),
        (["chinchilla_flops=nan"], ["chinchilla_flops=nan"]),
        (["chinchilla_flops=-1"], ["chinchilla_flops=-1"]),
        (["lecture=[summit_6,summit_6]"], ["lecture", "repeats"]),
        (["timeout_s=0"], ["timeout_s=0"]),
    ],
    "auto_parallel": [
        (["gpus=[4]", "tp=8"], ["tp=8", "gpus=4"]),
        (["gpus=[100]"], ["gpus=[100]", "whole nodes", "gpus_per_node=8"]),
        (["gpus=[64]", "dp=8", "tp=2", "pp=2"], ["dp×tp×pp = 32", "gpus=64"]),
        (["tp=16"], ["tp=16", "gpus_per_node=8", "allow_cross_node_tp"]),
        (["model.preset=gpt3_175b", "tp=5", "gpus=[640]"], ["tp=5", "n_heads=96"]),
        (["model.preset=llama2_7b", "pp=64", "gpus=[64]"], ["pp=64", "32 layers"]),
        (["model.preset=gpt5"], ["model", "gpt5", "gpt3_175b"]),
        (["hardware=tpu_v4"], ["hardware", "tpu_v4", "a100_80gb"]),
        (["hardware=/nonexistent/hw.yaml"], ["hardware", "/nonexistent/hw.yaml", "cannot read"]),
        (["gpus=[0]"], ["gpus=[0]"]), (["global_batch=-1"], ["global_batch=-1", "≥ 1"]),
        (["+model.n_layers=0"], ["model", "n_layers"]), (["+model.width=4"], ["model", "width"]),
        (["model=llama2_7b", "pp=64", "gpus=[64]"], ["pp=64", "32 layers"]),
        (["model.seq_len=0"], ["seq_len=0"]), (["model.n_heads=7"], ["n_heads=7"]),
        (["hardware.devices_per_node=0"], ["hardware=a100_80gb", "devices_per_node"]),
        (["hardware=h100_sxm", "hardware.intra.bandwidth=-1"], ["hardware=h100_sxm", "bandwidth"]),
        (["schedule=zero_bubble_v"], ["schedule", "zero_bubble_v", "1f1b"]),
        (["recompute=partial"], ["recompute", "partial", "selective"]),
        (["sp=context"], ["sp", "context", "ulysses"]), (["zero_stage=4"], ["zero_stage=4"]),
        (["gpus=[64,64]"], ["gpus", "repeats"]), (["top_k=0"], ["top_k=0"]),
        (["dtype=fp8"], ["dtype", "fp8", "bf16"]),
        (["cp=[3]"], ["cp=[3]", "seq_len=2048"]), (["cp=[0]"], ["cp=[0]"]),
        (["tp=16"], ["tp=16", "gpus_per_node=8", "allow_cross_node_tp"]),
    ],
    "device_profile": [
        (["device=tpu"], ["device", "tpu", "cuda"]),
        (["gemm_dtypes=[fp8]"], ["gemm_dtypes", "fp8", "bf16"]),
        (["gemm_dtypes=[fp32,fp32]"], ["gemm_dtypes", "repeats"]),
        (["device=cpu", "gemm_dtypes=[tf32]"], ["tf32", "device=cpu"]),
        (["gemm_shapes=[[64,64]]"], ["gemm_shapes", "[m, n, k]"]),
        (["gemm_shapes=[[64,0,64]]"], ["gemm_shapes", "≥ 1"]),
        (["world_sizes=[1]"], ["world_sizes=[1]", "≥ 2"]),
        (["message_bytes=[4096]"], ["message_bytes", "2 distinct"]),
        (["copy_mib=0"], ["copy_mib=0"]), (["threads_per_device=0"], ["threads_per_device"]),
        (["dtype=int64"], ["dtype", "int64", "float32"]),
    ],
    "planner_validation": [
        (["sources=[bogus]"], ["sources", "bogus", "zero_memory"]),
        (["sources=[zero_memory,zero_memory]"], ["sources", "repeats"]),
        (["gemm_sizes=[64]"], ["gemm_sizes=[64]", "at least 2"]),
        (["gemm_sizes=[0,64]"], ["gemm_sizes=[0, 64]"]), (["repeats=0"], ["repeats=0"]),
        (["copy_mib=0"], ["copy_mib=0"]), (["max_rows=0"], ["max_rows=0"]),
        (["reports_root=/nonexistent/reports"], ["reports_root", "results.csv does not exist"]),
        (["timeout_s=nan"], ["timeout_s=nan"]),
        (["reference_window_s=-1"], ["reference_window_s=-1"]),
        (["meeting_segment_s=0"], ["meeting_segment_s=0"]),
        (["meeting_rounds=0"], ["meeting_rounds=0"]),
        (["held_out=[bogus]"], ["held_out", "bogus", "pipeline_utilization"]),
    ],
    "parallelism_comparison": [
        (["world_sizes=[4]", "layouts=[{dp:4},{dp:4}]"], ["layouts", "repeats"]),
        (["layouts=[{xx:4}]"], ["layouts[0]", "xx", "dp"]),
        (["world_sizes=[4]", "layouts=[{dp:4},{dp:4,tp:1}]"], ["layouts", "repeats"]),
        (["schedule=zb"], ["schedule='zb'", "1f1b, gpipe"]),
        (["microbatches=0"], ["microbatches=0"]), (["lr=nan"], ["lr=nan"]),
        (["profile_steps=0"], ["profile_steps=0"]), (["seed=-1"], ["seed=-1"]),
        (["world_sizes=[64]", "layouts=[{dp:64}]", "batch_size=256"], ["world_sizes=[64]"]),
        (["world_sizes=[4]", "layouts=[{dp:2,tp:3}]"], ["layouts[0]", "world_sizes"]),
    ],
    "pipeline_utilization": [
        (["schedules=[bogus]"], ["schedules", "bogus", "gpipe"]),
        (["microbatches=[0]"], ["microbatches=[0]"]),
        (["stages=[2,2]"], ["stages=[2, 2]", "repeats"]),
        (["stages=[2,8]", "n_layers=4"], ["stages=[2, 8]", "n_layers=4"]),
        (["schedules=[interleaved_1f1b]", "virtual_stages=1"], ["virtual_stages=1", "≥ 2"]),
        (["warmup=-5"], ["warmup=-5"]), (["timeout_s=nan"], ["timeout_s=nan"]),
        (["profile_samples=0"], ["profile_samples=0"]),
        (["paired=maybe"], ["paired", "maybe"]), (["n_heads=3"], ["n_heads=3", "d_model=128"]),
        (["seed=-1"], ["seed=-1"]), (["slicings=[bogus]"], ["slicings", "bogus", "alpa"]),
        (["schedules=[gpipe]", "stages=[64]", "n_layers=64", "microbatches=[1]"],
         ["stages=[64]", "64 ranks"]),
        (["schedules=[zero_bubble_v]", "stages=[4]", "n_layers=6"],
         ["stages=[4]", "8 stages", "n_layers=6"]),
        (["schedules=[zero_bubble_h2]", "stages=[4]", "microbatches=[2]"],
         ["microbatches=[2]", "zero_bubble_h2", "microbatches >= stages=4"]),
    ],
    "sequence_parallel": [
        (["methods=[ring_attention]", "sp_degrees=[1000]"], ["sp_degrees=[1000]", "at most"]),
        (["seq_lens=[0]"], ["seq_lens=[0]"]), (["seq_lens=[16,16]"], ["seq_lens", "repeats 16"]),
        (["memory_budget_bytes=0"], ["memory_budget_bytes=0"]),
        (["+model.seq_len=16"], ["model.seq_len=16", "seq_lens"]),
        (["+model.dropout=0.1"], ["model.dropout=0.1"]), (["warmup=-1"], ["warmup=-1"]),
        (["methods=[bogus]"], ["methods", "bogus", "ulysses"]),
        (["sp_degrees=[1,3]"], ["sp_degrees=[3]", "n_heads"]),
    ],
    "tensor_parallel": [
        (["tp_degrees=[1,1]"], ["tp_degrees", "repeats 1"]),
        (["methods=[megatron]"], ["methods", "megatron", "torch_dtensor"]), (["lr=0"], ["lr=0"]),
        (["steps=0"], ["steps=0"]), (["paired=maybe"], ["paired", "maybe"]),
        (["tp_degrees=[64]", "model={d_model:64,n_heads:64,vocab_size:64,seq_len:8,n_layers:1}"],
         ["tp_degrees=[64]", "64 ranks"]),
        (["tp_degrees=[3]"], ["tp_degrees", "n_heads"]),
    ],
    "zero_memory": [
        (["stages=[1,5]"], ["stages=[1, 5]", "one of 0, 1, 2, 3"]),
        (["world_sizes=[3]"], ["world_sizes=[3]", "batch_size=32"]),
        (["precision=[fp8]"], ["precision", "fp8", "bf16"]),
        (["precision=[fp16]", "loss_scale=-1"], ["loss_scale=-1"]),
        (["precision=[fp16]", "loss_scale=nan"], ["loss_scale=nan"]),
        (["bucket_cap_bytes=0"], ["bucket_cap_bytes=0"]),
        (["methods=[bogus]"], ["methods", "bogus"]),
        (["world_sizes=[2,2]"], ["world_sizes", "repeats 2"]),
        (["world_sizes=[64]", "batch_size=64"], ["world_sizes=[64]", "64 ranks"]),
        (["seed=-1"], ["seed=-1"]),
    ],
}
# fmt: on
FLAT = [(name, o, n) for name, cases in BUILD_CASES.items() for o, n in cases]


@pytest.fixture(scope="module")
def composer():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        yield compose


def refusal(composer, experiment: str, overrides: list[str], report_dir: Path) -> tuple:
    """(the exit status the command line gives, its message): 1 for what Hydra refuses while
    composing, 2 for what `build` refuses, 0 if nothing refuses the config."""
    if not any(o.startswith("report_dir=") for o in overrides):
        overrides = [*overrides, f"report_dir={report_dir}"]
    overrides = normalize([f"experiment={experiment}", *overrides], experiment)  # as the CLI
    try:
        cfg = composer("config", overrides=overrides, return_hydra_config=True)
    except HydraException as error:
        return 1, f"{error}\n{error.__cause__ or ''}"
    try:
        plan = build(cfg, experiment)
    except ValueError as error:
        return 2, str(error)
    return 0, f"accepted: {plan.cfg}"


@pytest.mark.parametrize(
    "experiment, overrides, needles", FLAT, ids=[f"{e}:{' '.join(o)}" for e, o, _ in FLAT]
)
def test_every_key_refuses_what_cannot_work(
    composer, tmp_path, monkeypatch, experiment, overrides, needles
):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    code, message = refusal(composer, experiment, overrides, tmp_path / "report")
    assert code in (1, 2), message
    for needle in needles:
        assert needle in message, f"{needle!r} missing from: {message}"
    if code == 2:
        assert "\n" not in message  # bench's refusals are one line
    assert not (tmp_path / "report").exists()


def test_the_tables_cover_every_experiment_with_100_cases():
    assert set(BUILD_CASES) == set(experiments())
    assert len(FLAT) + len(CLI_CASES) >= 100, len(FLAT) + len(CLI_CASES)


@pytest.mark.parametrize("name", sorted(experiments()))
def test_every_shipped_grid_is_accepted(composer, name):
    # The refusals reach no further than they should (memory pinned: the host's may be less).
    for profile in ("full", "ci"):
        cfg = composer(
            "config", [f"experiment={name}", f"profile={profile}", "cluster.memory_gb=32"]
        )
        plan = build(cfg, name)
        assert plan.experiment.cells(plan.cfg), (name, profile)


@pytest.mark.parametrize("value, expected", [("false", False), ("true", True)])
def test_booleans_are_booleans(composer, tmp_path, value, expected):
    cfg = composer(
        "config", overrides=[AR, f"resume={value}", f"append={value}", f"report_dir={tmp_path}"]
    )
    run = build(cfg, "allreduce_scaling").run
    assert run.resume is expected and run.append is expected


def test_max_ranks_and_memory_override_the_host_limit(composer, tmp_path):
    grid = [AR, "world_sizes=[16]", "message_bytes=[4096]", f"report_dir={tmp_path}"]
    assert refusal(composer, "allreduce_scaling", grid, tmp_path)[0] == 2
    allowed = [*grid, "cluster.max_ranks=16", "cluster.memory_gb=1000"]
    plan = build(composer("config", overrides=allowed), "allreduce_scaling")
    assert plan.cfg.world_sizes == [16] and plan.run.cluster.max_ranks == 16


def test_the_rank_limit_follows_cores_and_memory():
    gb = 10**9
    assert rank_limit(cores=2, memory_bytes=24 * gb) == 8  # at least 8, as the suite runs
    assert rank_limit(cores=16, memory_bytes=1000 * gb) == 64  # 4 per core
    assert rank_limit(cores=16, memory_bytes=4 * gb) == 10  # 0.4 GB a rank
    assert rank_limit(cores=1, memory_bytes=0) == 1


def test_the_summary_counts_ok_failed_and_wrong(tmp_path):
    df = pd.DataFrame(
        {
            "status": ["ok", "ok", "failed", "timeout", "wrong", "ok"],
            "wrong": [0, 3, None, None, 2, float("nan")],
        }
    )
    # ok with wrong > 0 is wrong; failed and timeout are failed; a NaN `wrong` is no count.
    assert summary("x", df, tmp_path) == (f"x: 2 ok, 2 failed, 2 wrong -> {tmp_path}", False)
    assert summary("x", df[df["status"] == "ok"].iloc[[0]], tmp_path) == (
        f"x: 1 ok, 0 failed, 0 wrong -> {tmp_path}",
        True,
    )


def test_a_grid_with_a_failed_cell_exits_1_after_its_summary(tmp_path):
    # The cell cannot finish in 0.3 s (one window alone lasts 2 s, max_iters permitting):
    # it fails, the grid still writes its row and its report, and the exit status says so.
    grid = [
        AR,
        "world_sizes=[2]",
        "message_bytes=[4096]",
        "algorithms=[ring]",
        "repeats=1",
        "warmup=0",
        "window_s=2",
        "max_iters=100000",
        "timeout_s=0.3",
        "wandb.mode=disabled",
    ]
    code, output, report_dir, _ = run_case(tmp_path, "failed_cell", grid)
    assert code == 1, output
    assert f"allreduce_scaling: 0 ok, 1 failed, 0 wrong -> {report_dir}" in output
    assert "Traceback" not in output
    assert pd.read_csv(report_dir / "results.csv")["status"].tolist() != ["ok"]
    assert (report_dir / "report.md").exists()  # an all-failed grid still reports
