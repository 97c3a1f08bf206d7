"""Experiment `sequence_parallel`: its config, its grid, its rows and one small real run.

A failure here means a grid that cannot work (an unknown method, a degree below 1, a
sequence length below 1, a P that does not divide the heads Ulysses or Megatron-SP split)
would start ranks instead of being refused naming the key, or a length every method can
split would be refused; or a row whose communication, activation or correctness columns
are not what the ranks reported; or, in the real run, a layer whose counted bytes per link
differ from the papers' formula, whose saved activations differ from the implementation
model the longest-sequence figure extrapolates, or whose output or gradients leave the
single-device block. The CI profile's report is checked in tests/ci_checks/sequence_parallel.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.experiments import experiments
from bench.experiments.sequence_parallel.config import SequenceParallelConfig
from bench.experiments.sequence_parallel.experiment import (
    EXPERIMENT,
    cells,
    to_row,
)
from bench.experiments.sequence_parallel.ranks import measure
from bench.experiments.sequence_parallel.theory import (
    implementation_activation_bytes,
    longest_seq_len,
)
from tests.rank_support import prefix_communicator

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 16, "n_heads": 4, "n_layers": 2, "vocab_size": 8}


def test_registered():
    assert experiments()["sequence_parallel"] is EXPERIMENT
    assert EXPERIMENT.key_columns == ("method", "sp", "seq_len")


@pytest.mark.parametrize(
    "values, needles",
    [
        ({"methods": ["zigzag"]}, ["methods", "zigzag", "megatron_sp", "ulysses"]),
        ({"sp_degrees": [0, 2]}, ["sp_degrees", "≥ 1"]),
        ({"seq_lens": [16, 0]}, ["seq_lens", "≥ 1"]),
        ({"seq_lens": [True]}, ["seq_lens"]),
        (
            {"methods": ["ulysses"], "sp_degrees": [1, 3]},
            ["sp_degrees=[3]", "model.n_heads=4", "ulysses", "allowed sp_degrees: [1, 2, 4]"],
        ),
        (
            {"methods": ["megatron_sp"], "model": {**TINY, "n_heads": 2}, "sp_degrees": [4]},
            ["sp_degrees=[4]", "model.n_heads=2", "megatron_sp"],
        ),
        (
            {"methods": ["megatron_sp"], "model": {**TINY, "d_ff": 30}, "sp_degrees": [4]},
            ["sp_degrees=[4]", "model.d_ff=30", "megatron_sp"],
        ),
        ({"model": {**TINY, "seq_len": 64}}, ["model.seq_len", "seq_lens"]),
        ({"model": {**TINY, "dropout": 0.1}}, ["model.dropout", "0.0"]),
        ({"model": {**TINY, "n_heads": 3}}, ["model", "n_heads"]),
        ({"memory_budget_bytes": 0}, ["memory_budget_bytes", "≥ 1"]),
        ({"batch_size": 0}, ["batch_size"]),
        ({"timeout_s": 0}, ["timeout_s"]),
        ({"tp_degrees": [2]}, ["tp_degrees", "sp_degrees"]),
    ],
)
def test_bad_config_is_refused_naming_the_key(values, needles):
    with pytest.raises(ValueError) as error:
        EXPERIMENT.parse({"model": TINY, **values})
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_lengths_p_does_not_divide_and_any_ring_degree_are_accepted():
    """Every method end-pads uneven chunks; Ring Attention splits no heads, so any P."""
    cfg = SequenceParallelConfig(seq_lens=[7, 3], sp_degrees=[4], model=TINY)
    assert {c.key["seq_len"] for c in cells(cfg)} == {3, 7}
    ring = SequenceParallelConfig(methods=["ring_attention"], sp_degrees=[3], model=TINY)
    assert [c.world_size for c in cells(ring)] == [3] * len(ring.seq_lens)


def test_grid_is_every_method_degree_and_length_by_ascending_degree():
    cfg = SequenceParallelConfig(
        sp_degrees=[4, 1, 2], seq_lens=[9, 8], model=TINY, memory_budget_bytes=1 << 20
    )
    grid = cells(cfg)
    assert len(grid) == 3 * 3 * 2
    sizes = [c.world_size for c in grid]
    assert sizes == sorted(sizes)  # the runner keeps one pool per world size
    assert all(c.world_size == c.key["sp"] for c in grid)
    for c in grid:  # each cell's block and predictions, built once: the budget is the config's
        assert c.carry.block.seq_len == c.key["seq_len"] and c.carry.block.n_layers == 1
        assert c.carry.layers == TINY["n_layers"]

        def modelled(s, c=c):
            return implementation_activation_bytes(
                c.key["method"],
                sp=c.key["sp"],
                batch=cfg.batch_size,
                seq_len=s,
                d_model=16,
                n_heads=4,
                d_ff=64,
            )

        assert c.carry.longest == longest_seq_len(modelled, 1 << 20, TINY["n_layers"]) > 0
    assert {(c.key["method"], c.key["seq_len"]) for c in grid if c.world_size == 2} == {
        (m, s) for m in ("megatron_sp", "ulysses", "ring_attention") for s in (8, 9)
    }


def test_longest_seq_len_is_the_last_length_that_fits():
    assert longest_seq_len(lambda s: 10 * s, budget_bytes=1000, layers=2) == 50
    assert longest_seq_len(lambda s: 10 * s * s, budget_bytes=1000, layers=1) == 10
    assert longest_seq_len(lambda s: 10 * s, budget_bytes=5, layers=1) == 0


def test_implementation_model_keeps_megatron_sp_gathered_inputs_whole():
    """Per rank, Ulysses and Ring Attention shrink as 1/P; Megatron-SP keeps 2·b·s·h of
    all-gathered inputs at every P (a floor of 2·b·s·h·4 bytes)."""
    shape = {"batch": 1, "seq_len": 1024, "d_model": 64, "n_heads": 4, "d_ff": 256}
    per_rank = {
        m: [implementation_activation_bytes(m, sp=p, **shape) for p in (1, 2, 4, 8)]
        for m in ("megatron_sp", "ulysses", "ring_attention")
    }
    assert per_rank["ulysses"][1] == 2 * per_rank["ulysses"][2]
    assert per_rank["ring_attention"][1:] == per_rank["ulysses"][1:]
    floor = 2 * 1024 * 64 * 4
    assert all(m > floor for m in per_rank["megatron_sp"])
    assert per_rank["megatron_sp"][3] - floor < per_rank["ulysses"][3]


def _rank(rank: int, sent: tuple[int, int], wrong: int = 0) -> dict:
    traffic = {
        "bytes_sent": 0,
        "bytes_recv": 0,
        "messages_sent": 0,
        "messages_recv": 0,
        "rounds": 4,
    }
    return {
        "rank": rank,
        "fwd": {**traffic, "bytes_sent": sent[0], "bytes_recv": sent[0]},
        "bwd": {**traffic, "bytes_sent": sent[1], "bytes_recv": sent[1]},
        "grad_sync": {**traffic, "bytes_sent": 999},
        "activation_bytes": 1000 + rank,
        "param_bytes": 500,
        "grad_bytes": 500,
        "peak_bytes": 2000 + rank,
        "errors": {"output": 1e-7, "input grad": 2e-7 * (1 + 1e4 * wrong)},
        "wrong": wrong,
        "step_times_s": [0.3, 0.1, 0.2],
    }


def _cell(method: str, sp: int, seq_len: int):
    cfg = SequenceParallelConfig(
        methods=[method],
        sp_degrees=[sp],
        seq_lens=[seq_len],
        model=TINY,
        batch_size=1,
        warmup=0,
        repeats=1,
    )
    (cell,) = cells(cfg)
    return cfg, cell


def test_row_holds_what_the_ranks_measured_beside_the_formulas():
    """Ulysses, P = 2, s = 7 (chunks of 4, one padded position): 4 all-to-alls each way of
    (P − 1)/P · b·L·h·4 bytes = 128 bytes."""
    cfg, cell = _cell("ulysses", 2, 7)
    row = to_row(cfg, cell, [_rank(0, (512, 512)), _rank(1, (512, 500))])
    assert row["local_seq_len"] == 4 and row["padded_positions"] == 1
    assert row["comm_bytes_per_link_per_layer"] == 1024  # the busiest rank's
    assert row["predicted_comm_bytes_per_link_per_layer"] == 4 * 2 * 128
    assert row["comm_vs_predicted"] == 1
    assert row["comm_rounds"] == 8 and row["predicted_comm_rounds"] == 8
    assert row["grad_sync_bytes_per_step"] == 999
    assert row["activation_bytes_per_rank"] == 1001 and row["peak_bytes"] == 2001
    assert row["model_activation_bytes_per_rank"] == implementation_activation_bytes(
        "ulysses", sp=2, batch=1, seq_len=7, d_model=16, n_heads=4, d_ff=64
    )
    assert row["predicted_activation_bytes_per_rank"] > 0
    assert row["budget_layers"] == 2 and row["max_seq_len_in_budget"] > 0
    assert row["step_time_s"] == 0.2 and row["wrong"] == 0
    assert row["max_error"] == pytest.approx(2e-7)


def test_row_counts_wrong_tensors_and_shows_traffic_off_the_formula():
    cfg, cell = _cell("megatron_sp", 2, 8)
    row = to_row(cfg, cell, [_rank(0, (100, 100), wrong=1), _rank(1, (100, 100))])
    assert row["wrong"] == 1 and row["max_error"] > 1e-4
    assert row["comm_vs_predicted"] < 1
    single = to_row(*_cell("ring_attention", 1, 8), [_rank(0, (0, 0))])
    assert single["predicted_comm_bytes_per_link_per_layer"] == 0
    assert math.isnan(single["comm_vs_predicted"])


def measure_on_prefix(cfg: SequenceParallelConfig, cell) -> dict | None:
    """Run inside pool ranks: the cell on the first P ranks (the others sit it out)."""
    comm = prefix_communicator(cell.key["sp"])
    return None if comm is None else measure(cfg, cell, comm)


@pytest.mark.timeout(180)
def test_small_real_run_equals_formula_model_and_reference(ranks8):
    """Every method on P = 2 and 4 with s = 7 (uneven both times): the counters equal the
    formula, the saved bytes equal the implementation model, nothing is wrong."""
    for sp in (2, 4):
        for method in ("megatron_sp", "ulysses", "ring_attention"):
            cfg, cell = _cell(method, sp, 7)
            per_rank = ranks8.run(measure_on_prefix, cfg, cell)[:sp]
            row = to_row(cfg, cell, per_rank)
            where = (method, sp)
            assert row["wrong"] == 0 and row["max_error"] < 1e-5, (*where, row["max_error"])
            per_link = row["comm_bytes_per_link_per_layer"]
            assert per_link == row["predicted_comm_bytes_per_link_per_layer"], where
            assert row["comm_bytes_recv_per_link_per_layer"] == per_link, where
            saved = row["activation_bytes_per_rank"]
            assert saved == row["model_activation_bytes_per_rank"], where
            assert row["peak_bytes"] >= row["param_bytes"] + row["activation_bytes_per_rank"]
            assert row["step_time_s"] > 0
