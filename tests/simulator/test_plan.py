"""Bad plans are refused before any pricing, naming the key; stages slice as documented.

A failure means the planner could evaluate (and recommend) a plan that cannot run, or
that the message would not tell a user which setting to change.
"""

from __future__ import annotations

import pytest

from impls.costmodel.compute import TransformerSpec
from impls.simulator import ParallelPlan, megatron_stage_layers, simulate, stage_slices
from tests.simulator import TINY, flat_hardware

GQA = TransformerSpec(n_layers=4, d_model=64, n_heads=8, kv_heads=2, vocab_size=128, seq_len=16)

PLAN_REFUSALS = [
    ({"dp": 0}, "dp=0"),
    ({"tp": 1.5}, "tp=1.5"),
    ({"pp": True}, "pp=True"),
    ({"num_microbatches": 0}, "num_microbatches=0"),
    ({"microbatch_size": -1}, "microbatch_size=-1"),
    ({"sp": "ring"}, "sp='ring'"),
    ({"sp": "megatron_sp"}, "sp='megatron_sp'"),
    ({"sp": "ulysses"}, "sp='ulysses'"),
    ({"zero_stage": 4}, "zero_stage=4"),
    ({"recompute": "some"}, "recompute='some'"),
    ({"schedule": "chimera"}, "schedule='chimera'"),
    ({"schedule": "interleaved_1f1b", "pp": 2, "num_microbatches": 4}, "virtual_stages=1"),
    (
        {"schedule": "interleaved_1f1b", "pp": 2, "num_microbatches": 3, "virtual_stages": 2},
        "num_microbatches=3",
    ),
    ({"virtual_stages": 2}, "virtual_stages=2"),
    ({"schedule": "naive", "num_microbatches": 2}, "num_microbatches=2"),
    ({"pp": 2, "stage_layers": (4,)}, "stage_layers=(4,)"),
    ({"pp": 2, "stage_layers": (4, 0)}, "stage_layers entry=0"),
]


@pytest.mark.parametrize(("changes", "key"), PLAN_REFUSALS)
def test_plan_refusals_name_the_key(changes, key):
    with pytest.raises(ValueError, match=key.replace("(", r"\(").replace(")", r"\)")):
        ParallelPlan(**{"dp": 1, "tp": 1, "pp": 1, **changes})


@pytest.mark.parametrize(
    ("spec", "changes", "key"),
    [
        (TINY, {"tp": 3}, "tp=3: must divide n_heads=4"),
        (GQA, {"tp": 4}, "tp=4: must divide kv_heads=2"),
        (TINY, {"tp": 4, "sp": "megatron_sp", "pp": 5}, "pp=5"),
        (TINY, {"pp": 2, "stage_layers": (2, 1)}, "stage_layers=.*sum to n_layers"),
        (
            TransformerSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=128, seq_len=18),
            {"tp": 4, "sp": "ulysses"},
            "must divide seq_len=18",
        ),
    ],
)
def test_plans_the_model_cannot_take(spec, changes, key):
    with pytest.raises(ValueError, match=key):
        simulate(spec, ParallelPlan(**{"dp": 1, "tp": 1, "pp": 1, **changes}), flat_hardware())


def test_simulate_refuses_unknown_dtype_and_optimizer():
    plan = ParallelPlan(dp=1, tp=1, pp=1)
    with pytest.raises(ValueError, match="dtype='fp8'"):
        simulate(TINY, plan, flat_hardware(), dtype="fp8")
    with pytest.raises(ValueError, match="optimizer='lion'"):
        simulate(TINY, plan, flat_hardware(), optimizer="lion")


def test_equal_slicing_gives_the_first_stages_the_remainder():
    # 2 layers + embedding + head = 4 over 3 stages: 2, 1, 1.
    assert stage_slices(2, ParallelPlan(dp=1, tp=1, pp=3)) == ((0, 2), (2, 3), (3, 4))
    plan = ParallelPlan(dp=1, tp=1, pp=2, stage_layers=[1, 3])
    assert plan.stage_layers == (1, 3)
    assert stage_slices(2, plan) == ((0, 1), (1, 4))


def test_megatron_layout_puts_the_embedding_and_head_on_the_end_stages():
    # GPT-3 175B on pp = 8 (Narayanan et al. 2021): 12 blocks per stage, + embedding, + head.
    counts = megatron_stage_layers(96, 8)
    assert counts == (13,) + (12,) * 6 + (13,)
    assert sum(counts) == 96 + 2
    assert megatron_stage_layers(4, 1) == (6,)
    # pp = 2 × 2 virtual stages of a 4-layer model: one block per chunk.
    plan = ParallelPlan(
        dp=1,
        tp=1,
        pp=2,
        schedule="interleaved_1f1b",
        virtual_stages=2,
        num_microbatches=2,
        stage_layers=megatron_stage_layers(4, 4),
    )
    assert stage_slices(4, plan) == ((0, 2), (2, 3), (3, 4), (4, 6))
    simulate(GQA, plan, flat_hardware())  # a layout the simulator takes as it is
    # Equal slicing of L + 2 puts the extra layers elsewhere: the layouts differ.
    equal = stage_slices(96, ParallelPlan(dp=1, tp=1, pp=8))
    assert tuple(b - a for a, b in equal) != counts


@pytest.mark.parametrize(
    ("layers", "stages", "key"), [(96, 7, "stages=7"), (4, 0, "stages=0"), (0, 1, "n_layers=0")]
)
def test_megatron_layout_refuses_stages_that_do_not_divide_the_layers(layers, stages, key):
    with pytest.raises(ValueError, match=key):
        megatron_stage_layers(layers, stages)
