"""Experiment `parallelism_comparison`: its config, its grid, its rows and one real cell.

A failure here means a layout that cannot work (degrees that do not multiply to a world
size, a tp that does not divide the heads, d_ff or vocabulary, more stages than blocks, a
batch the replicas' micro-batches cannot split) would start ranks instead of being refused
naming the key; that the papers' traffic counts or the replay behind the utilization
columns are computed wrongly (the replay must give the GPipe bound M/(M+P−1) back for equal
stages and free communication); or that a real 3D cell (dp 2 × pp 2 × tp 2 on 8 ranks)
disagrees with single-device training or with the counts. The CI run is checked against
the lecture in tests/ci_checks/parallelism_comparison.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.experiments import experiments
from bench.experiments.parallelism_comparison.experiment import (
    EXPERIMENT,
    ParallelismComparisonConfig,
    cells,
    predicted_traffic,
    to_row,
)
from bench.experiments.parallelism_comparison.ranks import run

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 32, "n_layers": 4, "n_heads": 4, "seq_len": 16, "vocab_size": 64, "bias": False}
FOUR = [{"dp": 4}, {"tp": 4}, {"pp": 4}, {"dp": 2, "tp": 2}]


def config(**values) -> ParallelismComparisonConfig:
    base = {"world_sizes": [4], "layouts": FOUR, "model": TINY, "batch_size": 16}
    return EXPERIMENT.parse(base | values)


def test_registered_under_its_name():
    assert experiments()["parallelism_comparison"] is EXPERIMENT


def test_schema_defaults_are_the_full_grid():
    """The YAML lists nothing: the schema's defaults are what users ran (4 and 8 ranks, the
    lecture's 4 × 4 pipeline on an 8-block GPT)."""
    cfg = EXPERIMENT.parse({})
    assert cfg.world_sizes == [4, 8] and len(cfg.layouts) == 10
    assert cfg.layouts[-1] == {"dp": 2, "pp": 2, "tp": 2}
    assert cfg.model["n_layers"] == 8 and cfg.model["bias"] is False
    assert (cfg.batch_size, cfg.microbatches, cfg.schedule) == (32, 4, "1f1b")
    assert (cfg.steps, cfg.warmup, cfg.repeats, cfg.profile_steps) == (3, 1, 5, 2)
    assert (cfg.lr, cfg.timeout_s, cfg.seed) == (1e-3, 900.0, 0)
    text = (REPO_ROOT / "experiments/experiment/parallelism_comparison.yaml").read_text()
    keys = [line for line in text.splitlines() if line and line[0] not in "# -"]
    assert keys == ["defaults:"], keys


@pytest.mark.parametrize(
    "values, needles",
    [
        ({"layouts": [{"dp": 2, "tp": 3}]}, ["layouts[0]", "dp × pp × tp = 6", "world_sizes=[4]"]),
        ({"world_sizes": [3], "layouts": [{"tp": 3}]}, ["layouts[0]", "n_heads=4", "tp=3"]),
        ({"model": {**TINY, "d_ff": 30}, "layouts": [{"tp": 4}]}, ["layouts[0]", "d_ff=30"]),
        ({"model": {**TINY, "vocab_size": 30}, "layouts": [{"tp": 4}]}, ["vocab_size=30"]),
        ({"model": {**TINY, "n_layers": 2}, "layouts": [{"pp": 4}]}, ["pp=4", "n_layers=2"]),
        (
            {"batch_size": 8, "layouts": [{"dp": 4}]},
            ["layouts[0]", "batch_size=8", "dp × microbatches = 4 × 4 = 16"],
        ),
        ({"layouts": [{"sp": 4}]}, ["layouts[0]", "sp", "dp, pp, tp"]),
        ({"layouts": [{"dp": 4, "tp": 0}]}, ["layouts[0]", "tp=0"]),
        ({"layouts": []}, ["layouts"]),
        ({"world_sizes": [4, 8]}, ["world_sizes=[4, 8]", "[8]"]),
        ({"schedule": "naive"}, ["schedule", "1f1b", "gpipe"]),
        ({"model": {**TINY, "dropout": 0.1}}, ["dropout=0.1"]),
        ({"model": {**TINY, "n_heads": 3}}, ["model", "n_heads"]),
        ({"microbatches": 0}, ["microbatches", "≥ 1"]),
        ({"lr": -1.0}, ["lr"]),
    ],
)
def test_bad_config_is_refused_naming_the_key(values, needles):
    with pytest.raises(ValueError) as error:
        config(**values)
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_grid_fills_in_every_axis_and_runs_each_world_size_together():
    cfg = config(world_sizes=[8, 4], layouts=[{"dp": 2, "pp": 2, "tp": 2}, *FOUR])
    grid = cells(cfg)
    assert [c.world_size for c in grid] == [4, 4, 4, 4, 8]
    assert grid[1].key == {"world_size": 4, "dp": 1, "pp": 1, "tp": 4}
    assert grid[-1].key == {"world_size": 8, "dp": 2, "pp": 2, "tp": 2}
    layout = grid[-1].carry
    assert (layout.dp, layout.pp, layout.tp, layout.micro_batch) == (2, 2, 2, 2)
    assert layout.gpt.d_model == TINY["d_model"] and grid[-1].fn is run
    # The pipeline plan is built once per cell: two stages, each F and B of 4 micro-batches.
    assert [len(layout.plan[s]) for s in range(2)] == [8, 8]
    assert grid[1].carry.plan[0][0].kind == "F" and len(grid[1].carry.plan) == 1


def test_predicted_traffic_is_the_papers_count():
    """TINY, 16 sequences, 4 micro-batches: one (b, s, h) activation is 4·16·32 elements."""
    act = 4 * 16 * 32
    ring4 = 2 * 3 / 4 * 4  # bytes sent per element of a ring all-reduce on 4 ranks
    cfg = config(layouts=[{"tp": 4}, {"pp": 4}, {"dp": 4}])
    tensor, pipe, data = (c.carry for c in cells(cfg))
    # forward: 2 per block + the embedding's g + the loss's max (b·s) and pair (2·b·s);
    # backward: 2 per block + the LM head's f.
    forward = (2 * 4 + 1) * act + 4 * 16 + 2 * 4 * 16
    assert predicted_traffic(cfg, tensor, 0, 0)["tp"] == 4 * (forward + 9 * act) * ring4
    assert [predicted_traffic(cfg, pipe, s, 0)["pp"] for s in range(4)] == [
        4 * act * 4,
        8 * act * 4,
        8 * act * 4,
        4 * act * 4,
    ]
    assert predicted_traffic(cfg, data, 0, 999) == {"dp": 1000 * ring4, "pp": 0.0, "tp": 0.0}


def _action(name: str, cpu: float, tp_rounds: int = 0, round_cpu: float = 0.0) -> dict:
    return {
        "action": name,
        "cpu_s": cpu,
        "round_cpu_s": round_cpu,
        "tp_bytes": 0,
        "tp_rounds": tp_rounds,
    }


def _traffic(dp=(0, 0), pp=(0, 0), tp=(0, 0)) -> dict:
    return {
        axis: {
            "bytes_sent": b,
            "rounds": r,
            "bytes_recv": b,
            "messages_sent": r,
            "messages_recv": r,
        }
        for axis, (b, r) in {"dp": dp, "pp": pp, "tp": tp}.items()
    }


def _rank(rank: int, stage: int, actions: list[dict], cpu: float, traffic: dict, **extra) -> dict:
    """A rank's result: one profiled step, probes giving α = `alpha` and β = 0."""
    alpha = extra.pop("alpha", 0.0)
    profile = {
        "actions": actions,
        "cpu_s": cpu,
        "round_cpu_s": extra.pop("round_cpu", 0.0),
        "traffic": traffic,
        "pipeline_traffic": {"bytes_sent": 0, "rounds": 0},
    }
    return {
        "rank": rank,
        "coords": {"dp": 0, "pp": stage, "tp": 0},
        "params": 1000,
        "rank_params": 250,
        "losses": [4.0, 3.9],
        "reference_losses": [4.0, 3.9],
        "max_param_diff": 1e-7,
        "update_error": 1e-6,
        "grad_error": 1e-7,
        "held": {"params": 1000 + rank, "grads": 1000, "optim": 2000},
        "traffic": traffic,
        "peak_activation_bytes": 500 * (4 - stage),
        "step_times_s": [1.0],
        "own_s": [1.0],
        "round_s": [0.25],
        "median_step_s": 1.0,
        "tp_call_cpu_s": 0.0,
        "profile": [profile],
        "probe_s": [alpha, alpha],
        **extra,
    }


def _pipeline_cell() -> tuple:
    cfg = config(layouts=[{"pp": 4}])
    (cell,) = cells(cfg)
    per_rank = []
    for stage in range(4):
        actions = [
            _action(f"{stage}{k}{m}", c) for m in range(4) for k, c in (("F", 1.0), ("B", 2.0))
        ]
        per_rank.append(_rank(stage, stage, actions, 12.0, _traffic()))
    return cfg, cell, per_rank


def test_replay_of_equal_stages_and_free_transfers_meets_the_gpipe_bound():
    cfg, cell, per_rank = _pipeline_cell()
    row = to_row(cfg, cell, per_rank)
    assert row["util_theory"] == pytest.approx(4 / 7)
    assert row["util_replayed"] == pytest.approx(4 / 7)  # makespan (M + P − 1)·(F + B) = 21
    assert row["replayed_step_time_s"] == pytest.approx(21.0)
    assert row["comm_fraction_replayed"] == 0.0
    assert row["util_wall"] == pytest.approx(0.75)  # every rank 1 s of which 0.25 s in rounds
    assert row["strategy"] == "PP" and row["layout"] == "pp4" and row["wrong"] == 0


def test_memory_columns_take_the_fullest_rank_and_the_mean():
    cfg, cell, per_rank = _pipeline_cell()
    row = to_row(cfg, cell, per_rank)
    # Rank r holds 4000 + r bytes of model states and stage r's 500·(4 − r) of activations:
    # rank 0 is the fullest, rank 3 has the most model states.
    assert row["memory_per_rank_bytes"] == 4000 + 2000
    assert row["param_bytes"] == 1000 and row["activation_peak_bytes"] == 2000
    assert row["model_state_bytes"] == 4003
    assert row["model_state_bytes_mean"] == pytest.approx(4001.5)
    assert row["theory_model_state_bytes"] == 16 * 1000 / 4


def test_data_parallel_replay_prices_the_all_reduce_at_alpha_per_round():
    """DP, 2 micro-batches of F = 1 s, B = 2 s, 1 s of optimizer; the all-reduce's 6 rounds
    at α = 0.5 s: 6 s of pipeline + 1 s + 3 s, of which 7 s compute. Every rank of a stage
    does the same work, so one rank's slow profile does not set the stage's cost."""
    cfg = config(layouts=[{"dp": 4}], microbatches=2)
    (cell,) = cells(cfg)
    actions = [_action(f"0{k}{m}", c) for m in range(2) for k, c in (("F", 1.0), ("B", 2.0))]
    per_rank = [_rank(r, 0, actions, 7.0, _traffic(dp=(0, 6)), alpha=0.5) for r in range(4)]
    # One rank descheduled mid-profile: the stage's median over its ranks ignores it.
    per_rank[3]["profile"][0]["actions"] = [{**a, "cpu_s": 3 * a["cpu_s"]} for a in actions]
    row = to_row(cfg, cell, per_rank)
    assert row["replayed_step_time_s"] == pytest.approx(10.0)
    assert row["util_replayed"] == pytest.approx(0.7)
    assert row["comm_fraction_replayed"] == pytest.approx(0.3)
    assert row["util_theory"] == 1.0 and row["link_alpha_s"] == 0.5


def test_tp_collectives_own_work_counts_as_communication():
    """One TP all-reduce (6 rounds on 4 ranks) per action: its 0.2 s of work between rounds
    and 0.1 s inside them are not compute; it costs 0.2 s + 6 α instead."""
    cfg = config(layouts=[{"tp": 4}], microbatches=1)
    (cell,) = cells(cfg)
    actions = [_action("0F0", 1.3, 6, 0.1), _action("0B0", 2.3, 6, 0.1)]
    traffic = _traffic(tp=(0, 12))
    per_rank = [
        _rank(r, 0, actions, 3.6, traffic, alpha=0.05, round_cpu=0.2, tp_call_cpu_s=0.2)
        for r in range(4)
    ]
    row = to_row(cfg, cell, per_rank)
    # compute 1 + 2 = 3 s; two all-reduces at 0.2 + 6 × 0.05 = 0.5 s each.
    assert row["replayed_step_time_s"] == pytest.approx(4.0)
    assert row["util_replayed"] == pytest.approx(0.75)
    assert row["comm_fraction_replayed"] == pytest.approx(0.25)
    assert row["util_wall"] == pytest.approx(0.75 - 2 * 0.2)  # 0.25 s in rounds, 0.4 s between


def test_a_parameter_gradient_or_loss_off_the_reference_marks_the_row_wrong():
    cfg, cell, per_rank = _pipeline_cell()
    per_rank[2]["update_error"] = 2e-3
    assert to_row(cfg, cell, per_rank)["wrong"] == 1
    cfg, cell, per_rank = _pipeline_cell()
    per_rank[0]["losses"] = [4.0, 3.95]
    assert to_row(cfg, cell, per_rank)["wrong"] == 1
    cfg, cell, per_rank = _pipeline_cell()
    per_rank[3]["grad_error"] = 1.0  # e.g. gradients summed over 2 replicas, not averaged
    assert to_row(cfg, cell, per_rank)["wrong"] == 1


@pytest.mark.slow
def test_a_3d_cell_trains_like_one_device_and_counts_what_the_papers_count(ranks8):
    """dp 2 × pp 2 × tp 2 on the 8 pool ranks, a tiny GPT, one step of each kind."""
    model = {
        "d_model": 16,
        "n_layers": 2,
        "n_heads": 2,
        "seq_len": 8,
        "vocab_size": 32,
        "bias": False,
    }
    cfg = config(
        world_sizes=[8],
        layouts=[{"dp": 2, "pp": 2, "tp": 2}],
        model=model,
        batch_size=8,
        microbatches=2,
        steps=2,
        warmup=0,
        repeats=1,
        profile_steps=1,
    )
    (cell,) = cells(cfg)
    row = to_row(cfg, cell, ranks8.run(run, cfg, cell))
    assert row["wrong"] == 0 and row["update_error"] < 1e-4, row["update_error"]
    assert row["strategy"] == "3D" and row["layout"] == "dp2×pp2×tp2"
    assert row["comm_bytes_tp"] == pytest.approx(row["predicted_comm_bytes_tp"])
    assert 0 <= row["comm_bytes_pp"] - row["predicted_comm_bytes_pp"] <= 64  # barrier, loss
    assert row["comm_bytes_dp"] == pytest.approx(row["predicted_comm_bytes_dp"], abs=8)
    assert 0 < row["util_replayed"] <= row["util_theory"] + 0.05  # the optimizer has no bubble
    assert 0 < row["util_wall"] <= 1 and row["step_time_s"] > 0
    assert row["model_state_bytes_mean"] >= row["theory_model_state_bytes"]  # replicated LNs
