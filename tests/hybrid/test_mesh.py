"""The mesh lays every rank out once per axis, Megatron-style, and refuses impossible shapes.

A failure here means a rank would land in two groups of one axis (or in none), that TP
ranks are not adjacent (their per-layer all-reduces would cross the slowest links), that
coordinates and groups disagree (a rank would talk to the wrong peers), that a
configuration that cannot work is accepted, or that the process groups handed out do not
connect the ranks the layout says they connect.
"""

from __future__ import annotations

import pytest
import torch

from impls.hybrid import AXES, Mesh
from tests.hybrid.mesh_ranks import check_communicators

SHAPES = [
    dict(dp=2, pp=2, tp=2),
    dict(dp=8),
    dict(pp=2, tp=4),
    dict(tp=8),
    dict(dp=2, tp=2, sp=2),
    dict(dp=3, pp=2, tp=2, sp=1),
    dict(dp=1, pp=1, tp=1),
]


def _id(shape: dict) -> str:
    return "x".join(f"{k}{v}" for k, v in shape.items())


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_each_axis_partitions_the_ranks(shape: dict) -> None:
    world = 1
    for degree in shape.values():
        world *= degree
    mesh = Mesh(world, **shape, rank=0)
    for axis in AXES:
        groups = mesh.groups(axis)
        assert len(groups) == world // mesh.size(axis)
        assert all(len(g) == mesh.size(axis) for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(world))
        for group in groups:
            for position, rank in enumerate(group):
                # a rank's place in its group is its coordinate; the other axes agree
                coords = mesh.coords(rank)
                assert coords[axis] == position
                assert {a: c for a, c in coords.items() if a != axis} == {
                    a: c for a, c in mesh.coords(group[0]).items() if a != axis
                }
                assert mesh.group_of(axis, rank) == group
                assert mesh.rank_at(**coords) == rank


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_tp_groups_are_contiguous_and_dp_outermost(shape: dict) -> None:
    world = 1
    for degree in shape.values():
        world *= degree
    mesh = Mesh(world, **shape)
    tp = mesh.size("tp")
    assert mesh.groups("tp") == [list(range(s, s + tp)) for s in range(0, world, tp)]
    dp_stride = world // mesh.size("dp")
    assert mesh.groups("dp")[0] == list(range(0, world, dp_stride))


def test_coordinates_of_the_2x2x2_mesh() -> None:
    """Megatron's layout written out: rank = tp + 2 sp + 2 pp + 4 dp (sp = 1)."""
    mesh = Mesh(8, dp=2, pp=2, tp=2)
    got = [tuple(mesh.coords(r)[a] for a in ("dp", "pp", "tp")) for r in range(8)]
    assert got == [(d, p, t) for d in range(2) for p in range(2) for t in range(2)]
    assert mesh.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.groups("sp") == [[r] for r in range(8)]


def test_order_moves_the_innermost_axis() -> None:
    mesh = Mesh(8, dp=2, pp=2, tp=2, order="dp,pp,tp,sp")
    assert mesh.groups("dp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("tp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.coords(5) == {"dp": 1, "pp": 0, "tp": 1, "sp": 0}


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        (dict(world_size=8, dp=2, pp=2, tp=3), ["dp=2", "pp=2", "tp=3", "= 12", "world_size=8"]),
        (dict(world_size=4, dp=2, pp=1, tp=1), ["dp=2", "= 2", "world_size=4"]),
        (dict(world_size=8, tp=0), ["tp=0"]),
        (dict(world_size=8, dp=8, sp=2.0), ["sp=2.0"]),
        (dict(world_size=8, dp=8, pp=True), ["pp=True"]),
        (dict(world_size=-1), ["world_size=-1"]),
        (dict(world_size=8, dp=8, rank=8), ["rank=8", "0..7"]),
        (dict(world_size=8, dp=8, order="tp,pp,dp"), ["order=", "sp"]),
        (dict(world_size=8, dp=8, order="tp,tp,pp,dp"), ["order="]),
    ],
)
def test_bad_shapes_are_refused_naming_the_key(kwargs: dict, names: list[str]) -> None:
    world = kwargs.pop("world_size")
    with pytest.raises(ValueError) as err:
        Mesh(world, **kwargs)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("model", "names"),
    [
        (dict(n_heads=6, d_model=48, vocab=64, n_layers=4), ["tp=4", "n_heads=6", "[1, 2, 3, 6]"]),
        (dict(n_heads=4, d_model=34, vocab=64, n_layers=4), ["tp=4", "d_model=34"]),
        (dict(n_heads=4, d_model=64, vocab=50, n_layers=4), ["tp=4", "vocab=50"]),
        (dict(n_heads=4, d_model=64, vocab=64, n_layers=1), ["pp=2", "n_layers=1"]),
    ],
)
def test_models_the_mesh_cannot_split_are_refused(model: dict, names: list[str]) -> None:
    mesh = Mesh(8, pp=2, tp=4)
    with pytest.raises(ValueError) as err:
        mesh.check_model(**model)
    for name in names:
        assert name in str(err.value)


def test_a_model_that_fits_is_accepted() -> None:
    Mesh(8, pp=2, tp=4).check_model(n_heads=4, d_model=64, vocab=64, n_layers=2)


def test_unknown_axis_and_missing_rank_are_refused() -> None:
    mesh = Mesh(4, dp=2, tp=2)
    with pytest.raises(ValueError, match="axis='cp'"):
        mesh.groups("cp")
    with pytest.raises(ValueError, match="rank=None"):
        mesh.coords()  # no process group, no rank given
    with pytest.raises(ValueError, match="tp=2"):
        mesh.rank_at(tp=2)


def test_communicators_connect_the_groups_the_layout_names(ranks8) -> None:
    """On real process groups: each axis's communicator has the group's ranks, in order,
    and an all-reduce over it sums exactly those ranks (4-rank meshes leave ranks 4-7 out,
    which must still join the group creation)."""
    errors = [e for rank_errors in ranks8.run(check_communicators) for e in rank_errors]
    assert errors == []


def test_communicator_needs_process_groups() -> None:
    if torch.distributed.is_initialized():
        pytest.skip("this process already runs torch.distributed")
    with pytest.raises(RuntimeError, match="init_process_group"):
        Mesh(2, dp=2, rank=0).communicator("dp")
