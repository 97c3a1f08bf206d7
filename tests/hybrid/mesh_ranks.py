"""What the mesh tests run inside pool ranks (module-level, so ranks can unpickle it)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from impls.collectives import all_reduce
from impls.hybrid import AXES, Mesh

# (world_size, degrees): meshes built one after another on the same 8 processes.
GROUP_SHAPES = [
    (8, dict(dp=2, pp=2, tp=2)),
    (8, dict(pp=2, tp=4)),
    (8, dict(dp=2, tp=2, sp=2)),
    (4, dict(dp=2, tp=2)),
    (4, dict(pp=2, tp=2)),
]


def check_communicators() -> list[str]:
    """Every rank builds every mesh; returns what disagreed with the layout on this rank."""
    errors = []
    for world, degrees in GROUP_SHAPES:
        mesh = Mesh(world, **degrees)
        if mesh.rank is None:
            mesh.create_groups()  # collective: processes outside the mesh take part too
            mesh.close()
            continue
        for axis in AXES:
            comm = mesh.communicator(axis)
            group = mesh.group_of(axis)
            where = f"rank {dist.get_rank()} {degrees} {axis}"
            if comm.world_size != len(group) or comm.rank != mesh.coords()[axis]:
                errors.append(f"{where}: comm {comm.rank}/{comm.world_size}, group {group}")
            if comm is not mesh.communicator(axis):
                errors.append(f"{where}: a second call built a second communicator")
            value = torch.tensor([float(dist.get_rank())])
            if comm.world_size > 1:
                all_reduce(value, comm)
            if value.item() != sum(group):
                errors.append(f"{where}: all-reduce gave {value.item()}, want {sum(group)}")
        mesh.close()
    return errors
