"""Published runs: every row's layout is consistent, its metrics agree with each other and
with our FLOP count, the set covers what the validation needs (sources, FSDP, H100, long
sequences, a scaling series), and malformed rows are refused. A failure means a row was
mistyped, a model preset's shape differs from the run's, or a check lets bad rows in."""

import dataclasses

import pytest

from impls.costmodel.compute import step_flops
from impls.costmodel.models import MODELS, card_params
from impls.costmodel.published import (
    ATTENTION_KINDS,
    FLOPS_CONVENTIONS,
    HARDWARE_NAMES,
    LAYOUTS,
    LECTURE_FIGURES,
    PUBLISHED_RUNS,
    PublishedRun,
    published_plan,
    published_run,
)

RUNS = {run.name: run for run in PUBLISHED_RUNS}
# The 16-bit dense peaks the sources divide by: torchtitan's get_peak_flops and
# llm-foundry's MFU (A100 312 TFLOP/s, H100 SXM 989 TFLOP/s).
SOURCE_PEAK = {"a100_40gb": 312e12, "a100_80gb": 312e12, "h100_sxm": 989e12}


def test_at_least_forty_distinct_rows_from_eight_sources():
    assert len(PUBLISHED_RUNS) >= 40
    assert len(RUNS) == len(PUBLISHED_RUNS)
    assert len({run.origin for run in PUBLISHED_RUNS}) >= 8


def test_the_set_covers_fsdp_h100_long_sequences_and_a_scaling_series():
    assert sum(run.plan.zero_stage == 3 for run in PUBLISHED_RUNS) >= 10
    assert sum(run.hardware == "h100_sxm" for run in PUBLISHED_RUNS) >= 10
    assert sum(run.seq_len >= 8192 for run in PUBLISHED_RUNS) >= 4
    # One model on one GPU type at one micro-batch, at three or more data-parallel sizes.
    series = {}
    for run in PUBLISHED_RUNS:
        key = (
            run.model,
            run.hardware,
            run.seq_len,
            run.plan.microbatch_size,
            run.plan.tp,
            run.plan.pp,
        )
        series.setdefault(key, set()).add(run.plan.dp)
    assert max(len(sizes) for sizes in series.values()) >= 3


@pytest.mark.parametrize("name", sorted(RUNS))
def test_layout_is_consistent(name):
    run = RUNS[name]
    assert run.plan.dp * run.plan.cp * run.plan.tp * run.plan.pp == run.gpus
    assert run.attention in ATTENTION_KINDS and run.layout in LAYOUTS
    assert run.seq_len % run.plan.cp == 0
    assert run.plan.tp <= run.gpus_per_node
    assert run.gpus % run.gpus_per_node == 0 or run.gpus < run.gpus_per_node
    assert run.global_batch % (run.plan.dp * run.plan.microbatch_size) == 0
    assert run.model in MODELS and run.hardware in HARDWARE_NAMES
    assert run.flops_convention in FLOPS_CONVENTIONS
    spec = MODELS[run.model]
    assert spec.n_heads % run.plan.tp == 0
    # Each (virtual) pipeline stage holds at least one layer.
    assert spec.n_layers >= run.plan.pp * run.plan.virtual_stages
    assert (run.plan.virtual_stages > 1) == (run.plan.schedule == "interleaved_1f1b")
    assert run.source and run.notes and run.origin
    # Megatron-LM and NeMo pipelines place L/pp blocks per stage, embedding and head aside.
    if run.origin in ("megatron_sc21", "megatron_readme", "nemo") and run.plan.pp > 1:
        assert run.layout == "megatron"


def test_sc21_tflops_and_percent_of_peak_agree():
    """Narayanan et al. Table 1: TFLOP/s ÷ 312 (A100 16-bit peak) rounds to the stated %."""
    rows = [run for run in PUBLISHED_RUNS if run.name.startswith("megatron_sc21_")]
    assert len(rows) == 10
    for run in rows:
        assert run.tflops_per_gpu / 312 == pytest.approx(run.hfu, abs=0.005)


@pytest.mark.parametrize(
    "name", sorted(n for n, r in RUNS.items() if r.tokens_per_s_per_gpu and r.tflops_per_gpu)
)
def test_model_tflops_equal_tokens_times_our_flops_per_token(name):
    """NeMo's 'model TFLOP/s' = tokens/s × model FLOPs per token; our `step_flops` count
    (GQA, SwiGLU d_ff, s² attention, LM head) reproduces it within 0.2%."""
    run = RUNS[name]
    spec = MODELS[run.model]
    per_token = step_flops(spec, 1, seq_len=run.seq_len).model / run.seq_len
    assert per_token * run.tokens_per_s_per_gpu == pytest.approx(
        run.tflops_per_gpu * 1e12, rel=0.002
    )
    assert run.tokens_per_s == run.tokens_per_s_per_gpu * run.gpus


@pytest.mark.parametrize(
    "name", sorted(n for n, r in RUNS.items() if r.flops_convention == "model_6n" and r.mfu)
)
def test_stated_mfu_equals_tokens_times_six_n_over_the_source_peak(name):
    """Checks the model preset (its N, position table included) against each source's own
    arithmetic; 1% covers the sources' rounding of tokens/s to integers."""
    run = RUNS[name]
    mfu = run.model_6n_flops_per_token * run.tokens_per_s_per_gpu / SOURCE_PEAK[run.hardware]
    assert mfu == pytest.approx(run.mfu, rel=0.01)


@pytest.mark.parametrize(
    ("seq", "num_params"), [(2048, 6_658_859_008), (8192, 6_684_024_832), (65536, 6_918_905_856)]
)
def test_params_grow_with_the_position_table_as_llm_foundry_counts(seq, num_params):
    """llm-foundry's NumParams for MPT-7B at three SeqLens: the learned table is s·h."""
    run = published_run(f"llm_foundry_mpt_7b_s{seq}_8")
    assert run.params == num_params
    spec = MODELS[run.model]
    assert run.model_6n_flops_per_token == 6 * num_params + 12 * 32 * 4096 * seq
    assert spec.n_layers == 32 and spec.d_model == 4096


def test_llm_foundry_hfu_counts_one_more_forward_exactly_when_checkpointing():
    rows = [run for run in PUBLISHED_RUNS if run.origin == "llm_foundry"]
    assert len(rows) == 14
    for run in rows:
        ratio = 4 / 3 if run.plan.recompute == "full" else 1.0
        assert run.hfu / run.mfu == pytest.approx(ratio, rel=0.002)


@pytest.mark.parametrize(
    ("name", "stated", "rel"),
    [
        ("llm_foundry_mpt_7b", 6_658_859_008, 0),  # NumParams at SeqLen 2048, exactly
        ("llm_foundry_mpt_70b", 64_862_437_376, 0),
        ("llama3_8b", 8e9, 0.01),  # "8B"; 8,030,261,248 counted
        ("llama3_70b", 70e9, 0.01),  # "70B"; 70,553,706,496 counted
        ("llama2_34b", 34e9, 0.01),  # fms-fsdp's "34b"; 33.74B counted
        ("tinyllama_1_1b", 1.1e9, 0.001),  # "1.1B"; 1,100,048,384 counted
    ],
)
def test_new_presets_match_the_size_their_source_states(name, stated, rel):
    assert card_params(name) == pytest.approx(stated, rel=rel)


def test_every_row_names_a_preset_model():
    assert {run.model for run in PUBLISHED_RUNS} <= set(MODELS)


def test_mfu_never_exceeds_hfu():
    for run in PUBLISHED_RUNS:
        if run.mfu is not None and run.hfu is not None:
            assert run.mfu <= run.hfu


def test_num_microbatches_by_hand():
    run = published_run("bloom_176b")
    assert run.plan.num_microbatches == 2048 // (8 * 2) == 128


def test_unknown_run_is_refused():
    with pytest.raises(ValueError, match=r"run='gpt5': unknown; choose one of .*bloom_176b"):
        published_run("gpt5")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention": "sparse"}, r"attention='sparse': allowed values: materialized, flash"),
        ({"layout": "balanced"}, r"layout='balanced': allowed values: equal, megatron"),
        ({"origin": ""}, r"origin must name the source family"),
        ({"flops_convention": "6n"}, r"flops_convention='6n': allowed values: model, model_6n"),
        ({"model": "gpt5"}, r"model='gpt5': not a key of MODELS"),
        ({"hardware": "tpu_v4"}, r"hardware='tpu_v4': allowed values: a100_40gb"),
        (
            {"seq_len": 2047, "plan": dataclasses.replace(published_run("bloom_176b").plan, cp=2)},
            r"bloom_176b: cp=2 does not divide seq_len=2047",
        ),
        ({"plan": {"tp": 4}}, r"plan=\{'tp': 4\}: must be a ParallelPlan"),
        ({"assumed": ("nonsense",)}, r"assumed names unknown fields \['nonsense'\]"),
        ({"tflops_per_gpu": None}, r"no published metric"),
    ],
)
def test_malformed_rows_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(published_run("bloom_176b"), **change)


BLOOM = {
    "gpus": 384,
    "dp": 8,
    "tp": 4,
    "pp": 12,
    "zero_stage": 1,
    "microbatch_size": 2,
    "global_batch": 2048,
    "schedule": "1f1b",
    "recompute": "full",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dp": 7}, r"dp·cp·tp·pp = 7·1·4·12 != gpus=384"),
        ({"cp": 2}, r"dp·cp·tp·pp = 8·2·4·12 != gpus=384"),
        ({"cp": 0}, r"dp·cp·tp·pp = 8·0·4·12 != gpus=384"),
        ({"cp": 0, "gpus": None}, r"cp=0: must be an integer ≥ 1"),
        ({"microbatch_size": 3}, r"global_batch=2048 is not a multiple of dp·microbatch_size=24"),
        ({"schedule": "zb"}, r"schedule='zb': unknown; choose one of .*1f1b"),
        ({"recompute": "most"}, r"recompute='most'"),
    ],
)
def test_malformed_plans_are_refused_naming_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        published_plan(**{**BLOOM, **change})


def test_the_bloom_plan_is_what_published_plan_builds():
    assert published_run("bloom_176b").plan == published_plan(**BLOOM)


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


def test_a_published_run_holds_its_plan_and_no_copy_of_its_fields():
    """Every parallelism field lives in `PublishedRun.plan`: a field of the run named like
    one of `ParallelPlan` (or what a plan derives: gpus, the global batch) is a copy that
    can disagree with the plan the simulator prices."""
    from impls.simulator.plan import ParallelPlan

    plan_names = {f.name for f in dataclasses.fields(ParallelPlan)}
    plan_names |= {n for n, v in vars(ParallelPlan).items() if isinstance(v, property)}
    plan_names |= {"global_batch"}
    run_fields = {f.name for f in dataclasses.fields(PublishedRun)}
    assert run_fields & plan_names == set()
    assert {"plan", "source", "origin", "node_network_gbps", "assumed"} <= run_fields
    for run in PUBLISHED_RUNS:
        assert isinstance(run.plan, ParallelPlan)
        assert (run.gpus, run.global_batch) == (run.plan.gpus, run.plan.sequences_per_step)
