"""A validated device mesh: ranks laid out on a DP x PP x SP x TP grid, with its groups.

Hybrid ("3D") parallelism (Narayanan et al., 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", arXiv 2104.04473, section 3) gives every rank a
coordinate on each axis. Ranks that differ only in their tensor-parallel coordinate form a
TP group, and so on for every axis. The layout is row-major over `order`, innermost axis
first: with Megatron's default `"tp,sp,pp,dp"`, TP ranks are adjacent (their all-reduces,
one per layer and direction, stay inside a node), and DP ranks are farthest apart (their
one all-reduce per step tolerates the slowest links).
Groups are made on first use (`Mesh.communicator`).
"""

from __future__ import annotations

import itertools
import math

import torch.distributed as dist

from impls.comm import Communicator
from impls.models._checks import divisors

__all__ = ["AXES", "Mesh"]

AXES = ("dp", "pp", "tp", "sp")
"""The mesh axes: data, pipeline, tensor and sequence (context) parallelism."""

DEFAULT_ORDER = "tp,sp,pp,dp"


class Mesh:
    """The rank grid of `world_size` ranks with degrees `dp`, `pp`, `tp`, `sp`.

    `order` lists the axes innermost first (stride 1 for the first). `rank` is this
    process's mesh rank: None means the process's global rank when torch.distributed is
    initialized and that rank lies inside the mesh, and no rank otherwise (the pure-Python
    queries still work; `communicator` then refuses). Every bad value raises ValueError
    naming its key.

    The layout, the groups and the validation are pure Python. `communicator(axis)` needs
    torch.distributed: the first call creates every group of every axis with `dist.new_group`
    in one fixed order (a collective call on every process of the default group), and the mesh
    keeps them — no module-level process groups. The mesh occupies global ranks
    0..world_size-1; a process beyond them (a larger default group) must still join the
    creation through `create_groups()`.
    """

    def __init__(
        self,
        world_size: int,
        *,
        dp: int = 1,
        pp: int = 1,
        tp: int = 1,
        sp: int = 1,
        rank: int | None = None,
        order: str = DEFAULT_ORDER,
    ) -> None:
        degrees = {"dp": dp, "pp": pp, "tp": tp, "sp": sp}
        for key, value in {"world_size": world_size, **degrees}.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Mesh: {key}={value!r} is not allowed: it must be an int >= 1")
        product = math.prod(degrees.values())
        if product != world_size:
            shape = " x ".join(f"{k}={v}" for k, v in degrees.items())
            raise ValueError(
                f"Mesh: {shape} = {product} ranks, but world_size={world_size}: "
                "the degrees must multiply to the world size"
            )
        self.world_size = world_size
        self.degrees = degrees
        self.order = _parse_order(order)
        self._strides: dict[str, int] = {}
        stride = 1
        for axis in self.order:
            self._strides[axis] = stride
            stride *= degrees[axis]
        self.rank = self._resolve_rank(rank)
        self._process_groups: dict[str, list[dist.ProcessGroup | None]] | None = None
        self._communicators: dict[str, Communicator] = {}

    def __repr__(self) -> str:
        shape = ", ".join(f"{axis}={self.degrees[axis]}" for axis in AXES)
        return f"Mesh({self.world_size}, {shape}, rank={self.rank}, order={','.join(self.order)!r})"

    # ---- pure layout ------------------------------------------------------------------

    def size(self, axis: str) -> int:
        """The degree of `axis` (the number of ranks in each of its groups)."""
        return self.degrees[_check_axis(axis)]

    def coords(self, rank: int | None = None) -> dict[str, int]:
        """`rank`'s coordinate on every axis (default: this process's rank)."""
        rank = self._check_rank(self.rank if rank is None else rank)
        return {axis: (rank // self._strides[axis]) % self.degrees[axis] for axis in AXES}

    def rank_at(self, **coords: int) -> int:
        """The rank at the given coordinates; axes left out are at coordinate 0."""
        rank = 0
        for axis, value in coords.items():
            degree = self.size(axis)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < degree:
                raise ValueError(
                    f"Mesh.rank_at: {axis}={value!r} must be an int in 0..{degree - 1}"
                )
            rank += value * self._strides[axis]
        return rank

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of `axis`: ranks that differ only in their `axis` coordinate.

        Each group lists its ranks by `axis` coordinate (so a group rank is that
        coordinate); groups come in order of their first rank. Together they hold every
        rank exactly once.
        """
        axis = _check_axis(axis)
        others = [a for a in self.order if a != axis]
        found = []
        for fixed in itertools.product(*(range(self.degrees[a]) for a in others)):
            base = sum(c * self._strides[a] for a, c in zip(others, fixed, strict=True))
            found.append([base + i * self._strides[axis] for i in range(self.degrees[axis])])
        return sorted(found)

    def group_of(self, axis: str, rank: int | None = None) -> list[int]:
        """The ranks of `rank`'s group on `axis` (default: this process's rank)."""
        coords = self.coords(rank)
        coords.pop(_check_axis(axis))
        return [self.rank_at(**coords, **{axis: i}) for i in range(self.degrees[axis])]

    def check_model(self, *, n_heads: int, d_model: int, vocab: int, n_layers: int) -> None:
        """Refuse a model this mesh cannot split, naming the key and the allowed values.

        Megatron TP splits attention by heads, the MLP and the residual width into equal
        column/row blocks and the vocabulary into equal ranges, so `tp` must divide
        `n_heads`, `d_model` and `vocab`; each pipeline stage needs at least one block, so
        `pp` <= `n_layers`.
        """
        tp, pp = self.degrees["tp"], self.degrees["pp"]
        for key, value in {"n_heads": n_heads, "d_model": d_model, "vocab": vocab}.items():
            if value % tp:
                allowed = divisors(value)
                raise ValueError(
                    f"Mesh: tp={tp} must divide {key}={value}; allowed tp for it: {allowed}"
                )
        if pp > n_layers:
            raise ValueError(
                f"Mesh: pp={pp} exceeds n_layers={n_layers}: each pipeline stage needs at "
                f"least one block, so pp must be in 1..{n_layers}"
            )

    # ---- process groups ---------------------------------------------------------------

    def create_groups(self) -> None:
        """Create every group of every axis once (collective over the default group).

        Every process of the default group calls `dist.new_group` for every group in the
        same order — axes in `AXES` order, groups by first rank — as torch requires; each
        process keeps the groups it belongs to. Later calls do nothing.
        """
        if self._process_groups is not None:
            return
        if not dist.is_initialized():
            raise RuntimeError("Mesh.create_groups needs torch.distributed.init_process_group")
        if dist.get_world_size() < self.world_size:
            raise ValueError(
                f"Mesh: world_size={self.world_size} exceeds the default group's "
                f"{dist.get_world_size()} processes"
            )
        self._process_groups = {}
        for axis in AXES:
            self._process_groups[axis] = [dist.new_group(ranks) for ranks in self.groups(axis)]

    def close(self) -> None:
        """Destroy the groups `create_groups` made (collective over the default group).

        Each gloo group keeps its own transport threads, which wake up even while idle: a
        long-lived process that builds mesh after mesh (a rank pool serving many cells)
        would otherwise accumulate them until they load the host. A barrier first, so no
        rank tears down a group a peer is still using. The mesh can build them again.
        """
        if self._process_groups is None:
            return
        dist.barrier()
        for groups in self._process_groups.values():
            for group in groups:
                if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                    dist.destroy_process_group(group)
        self._process_groups = None
        self._communicators = {}

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def communicator(self, axis: str) -> Communicator:
        """A counting `Communicator` over this rank's group on `axis` (one per axis, kept).

        The first call on any axis creates all the mesh's groups (see `create_groups`), so
        every process must make its first call at the same point of the program.
        """
        axis = _check_axis(axis)
        self.create_groups()
        if self.rank is None:
            raise RuntimeError(f"this process (global rank {dist.get_rank()}) is not in {self}")
        if self.rank != dist.get_rank():
            raise ValueError(
                f"Mesh: rank={self.rank} but this process is global rank {dist.get_rank()}: "
                "the mesh occupies global ranks 0..world_size-1, so they must agree"
            )
        if axis not in self._communicators:
            mine = self.group_of(axis)
            index = next(i for i, g in enumerate(self.groups(axis)) if g == mine)
            self._communicators[axis] = Communicator(self._process_groups[axis][index])
        return self._communicators[axis]

    # ---- checks -------------------------------------------------------------------------

    def _resolve_rank(self, rank: int | None) -> int | None:
        if rank is not None:
            return self._check_rank(rank)
        if dist.is_initialized() and dist.get_rank() < self.world_size:
            return dist.get_rank()
        return None

    def _check_rank(self, rank: int | None) -> int:
        if rank is None:
            raise ValueError("Mesh: rank=None: this process has no mesh rank; pass one")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"Mesh: rank={rank!r} must be an int in 0..{self.world_size - 1}")
        return rank


def _check_axis(axis: str) -> str:
    if axis not in AXES:
        raise ValueError(f"axis={axis!r}: unknown; choose one of {', '.join(AXES)}")
    return axis


def _parse_order(order: str) -> tuple[str, ...]:
    """The axes named in `order`, innermost first; each of `AXES` exactly once."""
    names = tuple(name.strip() for name in order.split(",")) if isinstance(order, str) else ()
    if sorted(names) != sorted(AXES):
        raise ValueError(
            f"Mesh: order={order!r} must name each of {', '.join(AXES)} exactly once, "
            f"comma-separated, innermost first (e.g. {DEFAULT_ORDER!r})"
        )
    return names
