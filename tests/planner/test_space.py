"""The plan space: its axes, their rules, `fixed` and the refusals.

A failure means the planner searches plans the simulator or the schedules cannot run,
misses plans it should consider, ignores a pinned axis, or refuses without naming why.
"""

from __future__ import annotations

from collections import Counter

import pytest

from impls.costmodel.compute import TransformerSpec
from impls.planner.space import FIXED_KEYS, plan_space
from impls.simulator import validate_plan
from tests.planner import GPT8, small_cluster

HW = small_cluster()


def space(**kwargs):
    args = {"gpus": 8, "global_batch": 16} | kwargs
    return plan_space(GPT8, HW, **args)


def test_every_plan_is_valid_and_uses_every_gpu():
    plans = space()
    assert len(set(plans)) == len(plans)
    for plan in plans:
        validate_plan(GPT8, plan)
        assert plan.dp * plan.tp * plan.pp == 8
        assert plan.sequences_per_step == 16
        assert plan.tp <= HW.devices_per_node


def test_size_by_hand():
    """Counted by hand: (tp, pp, dp) with tp ≤ 4 | 16 heads, pp | 8/tp: 9 splits."""
    plans = space()
    splits = {(p.tp, p.pp, p.dp) for p in plans}
    assert splits == {
        (1, 1, 8),
        (1, 2, 4),
        (1, 4, 2),
        (1, 8, 1),
        (2, 1, 4),
        (2, 2, 2),
        (2, 4, 1),
        (4, 1, 2),
        (4, 2, 1),
    }
    # tp=1, pp=1, dp=8: b ∈ {1, 2}, one schedule, sp none, ZeRO 0–3, 3 recompute: 24
    assert sum(1 for p in plans if (p.tp, p.pp) == (1, 1)) == 2 * 4 * 3
    # tp=4, pp=2, dp=1: b ∈ {1,2,4,8,16} with M = 16/b; schedules gpipe, 1f1b, zb and
    # interleaved V ∈ {2, 4} (pp·V ≤ 8) when M is even (b ≤ 8); 3 sp; ZeRO 0; 3 recompute
    expected = (5 * 3 + 4 * 2) * 3 * 1 * 3
    assert sum(1 for p in plans if (p.tp, p.pp) == (4, 2)) == expected


def test_axis_rules():
    plans = space()
    assert all(p.schedule == "1f1b" for p in plans if p.pp == 1)
    assert all(p.zero_stage == 0 for p in plans if p.dp == 1)
    assert all(p.sp == "none" for p in plans if p.tp == 1)
    for p in plans:
        if p.schedule == "interleaved_1f1b":
            assert p.num_microbatches % p.pp == 0 and p.pp * p.virtual_stages <= 8
            assert p.virtual_stages in (2, 4)
    counts = Counter(p.schedule for p in plans)
    assert set(counts) == {"1f1b", "gpipe", "zero_bubble_h1", "interleaved_1f1b"}


def test_fixed_axes_are_respected():
    fixed = {
        "tp": 2,
        "pp": 2,
        "sp": "ulysses",
        "zero_stage": 1,
        "recompute": "full",
        "microbatch_size": 2,
        "schedule": "interleaved_1f1b",
        "virtual_stages": 2,
    }
    plans = space(fixed=fixed)
    assert len(plans) == 1
    (plan,) = plans
    for key, value in fixed.items():
        assert getattr(plan, key) == value
    assert plan.dp == 2 and plan.num_microbatches == 4


def test_fixed_virtual_stages_need_not_be_a_power_of_two():
    spec = TransformerSpec(n_layers=12, d_model=256, n_heads=4, vocab_size=1000, seq_len=64)
    plans = plan_space(spec, HW, gpus=2, global_batch=8, fixed={"virtual_stages": 3})
    assert plans and all(p.virtual_stages == 3 and p.pp == 2 for p in plans)


def test_cross_node_tp_only_when_allowed():
    assert max(p.tp for p in space()) == 4
    assert max(p.tp for p in space(allow_cross_node_tp=True)) == 8


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fixed": {"tensor": 2}}, r"fixed\['tensor'\]: unknown axis"),
        ({"fixed": {"tp": 3}}, "gpus=8: not divisible by the fixed tp=3"),
        ({"fixed": {"tp": 2, "pp": 8}}, "gpus=8: not divisible by the fixed tp=2 · pp=8 = 16"),
        ({"gpus": 24, "fixed": {"tp": 3}}, "tp=3: must divide n_heads=16"),
        ({"fixed": {"tp": 8}}, "tp=8: exceeds the 4 GPUs per node"),
        ({"gpus": 16, "fixed": {"pp": 16}}, "pp=16: exceeds n_layers=8"),
        ({"fixed": {"sp": "ring"}}, "sp='ring': allowed values"),
        ({"fixed": {"zero_stage": 4}}, "zero_stage=4: allowed values"),
        ({"fixed": {"microbatch_size": 0}}, "microbatch_size=0: must be an integer"),
        ({"fixed": {"microbatch_size": 32}}, "microbatch_size=32: no plan"),
        ({"fixed": {"virtual_stages": 16}}, "virtual_stages=16: no plan"),
        ({"fixed": {"schedule": "naive"}}, "schedule='naive': allowed values"),
        ({"fixed": {"dp": 8, "schedule": "gpipe"}}, "fixed dp=8, schedule='gpipe': no plan"),
        ({"fixed": {"dp": 3}}, "gpus=8: not divisible by the fixed dp=3"),
        ({"gpus": 0}, "gpus=0: must be an integer"),
    ],
)
def test_refusals_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        space(**kwargs)


def test_refuses_a_model_no_split_fits():
    odd = TransformerSpec(n_layers=2, d_model=96, n_heads=3, vocab_size=100, seq_len=32)
    # 8 GPUs: tp must divide 3 heads (tp = 1), so pp·dp = 8 with pp ≤ 2 → dp ≥ 4 must
    # divide the global batch of 2
    with pytest.raises(ValueError, match="gpus=8: no dp · tp · pp split"):
        plan_space(odd, HW, gpus=8, global_batch=2)


def test_fixed_keys_are_plan_fields():
    plan = space()[0]
    for key in FIXED_KEYS:
        assert hasattr(plan, key)


def test_cp_is_searched_only_when_asked():
    plain = space()
    assert all(plan.cp == 1 for plan in plain)
    with_cp = space(cps=(1, 2))
    assert set(plain) < set(with_cp)
    extra = [plan for plan in with_cp if plan.cp == 2]
    assert extra and all(p.dp * p.cp * p.tp * p.pp == 8 for p in extra)
    for plan in extra:
        validate_plan(GPT8, plan)  # seq_len/cp divisible by tp wherever sp shards it


@pytest.mark.parametrize(
    ("cps", "key"), [((3,), "cp=3 must divide seq_len=1024"), ((), "cps=()"), ((0,), "cp=0")]
)
def test_cps_are_refused_naming_the_key(cps, key):
    with pytest.raises(ValueError, match=key):
        space(cps=cps)
