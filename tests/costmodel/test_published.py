"""Published runs: every row's layout is consistent, its metrics agree with each other and
with our FLOP count, and malformed rows are refused."""

import dataclasses

import pytest

from impls.costmodel.compute import step_flops
from impls.costmodel.models import MODELS
from impls.costmodel.published import (
    FLOPS_CONVENTIONS,
    HARDWARE_NAMES,
    LECTURE_FIGURES,
    PUBLISHED_RUNS,
    published_run,
)

RUNS = {run.name: run for run in PUBLISHED_RUNS}


def test_at_least_twelve_distinct_rows():
    assert len(PUBLISHED_RUNS) >= 12
    assert len(RUNS) == len(PUBLISHED_RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_layout_is_consistent(name):
    run = RUNS[name]
    assert run.dp * run.tp * run.pp == run.gpus
    assert run.tp <= run.gpus_per_node
    assert run.gpus % run.gpus_per_node == 0 or run.gpus < run.gpus_per_node
    assert run.global_batch % (run.dp * run.microbatch_size) == 0
    assert run.model in MODELS and run.hardware in HARDWARE_NAMES
    assert run.flops_convention in FLOPS_CONVENTIONS
    spec = MODELS[run.model]
    assert spec.n_heads % run.tp == 0
    # Each (virtual) pipeline stage holds at least one layer.
    assert spec.n_layers >= run.pp * run.virtual_stages
    assert (run.virtual_stages > 1) == (run.schedule == "interleaved_1f1b")
    assert run.source and run.notes


def test_sc21_tflops_and_percent_of_peak_agree():
    """Narayanan et al. Table 1: TFLOP/s ÷ 312 (A100 16-bit peak) rounds to the stated %."""
    rows = [run for run in PUBLISHED_RUNS if run.name.startswith("megatron_sc21_")]
    assert len(rows) == 10
    for run in rows:
        assert run.tflops_per_gpu / 312 == pytest.approx(run.hfu, abs=0.005)


@pytest.mark.parametrize("name", sorted(n for n, r in RUNS.items() if r.tokens_per_s_per_gpu))
def test_model_tflops_equal_tokens_times_our_flops_per_token(name):
    """NeMo's 'model TFLOP/s' = tokens/s × model FLOPs per token; our `step_flops` count
    (GQA, SwiGLU d_ff, s² attention, LM head) reproduces it within 0.2%."""
    run = RUNS[name]
    spec = MODELS[run.model]
    per_token = step_flops(spec, 1, seq_len=run.seq_len).model / run.seq_len
    assert per_token * run.tokens_per_s_per_gpu == pytest.approx(
        run.tflops_per_gpu * 1e12, rel=0.002)  # fmt: skip
    assert run.tokens_per_s == run.tokens_per_s_per_gpu * run.gpus


def test_mfu_never_exceeds_hfu():
    for run in PUBLISHED_RUNS:
        if run.mfu is not None and run.hfu is not None:
            assert run.mfu <= run.hfu


def test_num_microbatches_by_hand():
    run = published_run("bloom_176b")
    assert run.num_microbatches == 2048 // (8 * 2) == 128


def test_unknown_run_is_refused():
    with pytest.raises(ValueError, match=r"run='gpt5': unknown; choose one of .*bloom_176b"):
        published_run("gpt5")


@pytest.mark.parametrize(("change", "message"), [
    ({"dp": 7}, r"dp·tp·pp = 7·4·12 != gpus=384"),
    ({"microbatch_size": 3}, r"not a multiple of dp·microbatch_size=24"),
    ({"model": "gpt5"}, r"model='gpt5': not a key of MODELS"),
    ({"hardware": "tpu_v4"}, r"hardware='tpu_v4': allowed values: a100_40gb"),
    ({"schedule": "zb"}, r"schedule='zb'"),
    ({"assumed": ("nonsense",)}, r"assumed names unknown fields \['nonsense'\]"),
    ({"tflops_per_gpu": None}, r"no published metric"),
])  # fmt: skip
def test_malformed_rows_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(published_run("bloom_176b"), **change)


def test_lecture_figures_agree_with_each_other():
    figures = {figure.name: figure for figure in LECTURE_FIGURES}
    hours = figures["gpt3_gpu_hours"].value
    assert hours / (24 * 365.25) == pytest.approx(figures["gpt3_single_gpu_years"].value, rel=0.01)
    # 3.14e23 FLOP over 3.1e6 GPU-hours: 28 TFLOP/s sustained per GPU.
    assert 3.14e23 / (hours * 3600) / 1e12 == pytest.approx(28.1, abs=0.1)
    one_node, full = figures["tsm_summit_1_node"], figures["tsm_summit_256_nodes"]
    assert one_node.value == 2990 and one_node.gpus == 6 and full.gpus == 1536
    assert one_node.value / full.value == pytest.approx(211, rel=0.02)
    assert 10 * 24 * 60 / figures["ten_gpu_days_on_1024"].gpus == pytest.approx(14, abs=0.1)
    assert all(figure.source and figure.quote for figure in LECTURE_FIGURES)
