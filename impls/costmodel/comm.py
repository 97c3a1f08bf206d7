"""Time of a collective on a link, in the α–β model (Hockney), for the algorithms of
`impls.collectives` and NCCL's hierarchical all-reduce.

A link charges α per message and moves bytes at its achieved bandwidth (`Link.seconds`).
The time of a collective is the critical path of its busiest rank: every round costs α
plus that round's bytes ÷ bandwidth; a send and a receive in the same round overlap (links
are full duplex), while the several messages a rank sends (or receives) in one round queue
on its one port, so each pays α. The bus-bandwidth factors match nccl-tests'
`doc/PERFORMANCE.md` (2(N−1)/N for all-reduce, (N−1)/N for reduce-scatter, all-gather and
all-to-all), so `Link.bandwidth` is directly comparable to a measured busbw. Each
algorithm's path is `allreduce_seconds`; groups over nodes are
`hierarchical_allreduce_seconds` and `spanning_link`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from impls.costmodel.hardware import Hardware, Link

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "ALLREDUCE_PATHS",
    "COLLECTIVES",
    "CriticalPath",
    "all_gather_seconds",
    "all_to_all_seconds",
    "allreduce_rounds",
    "allreduce_seconds",
    "best_allreduce",
    "collective_seconds",
    "hierarchical_allreduce_seconds",
    "p2p_seconds",
    "parallel_path",
    "recursive_halving_path",
    "reduce_scatter_seconds",
    "ring_path",
    "server_path",
    "spanning_link",
    "tree_path",
]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "p2p")


def _check(nbytes: float, n: int) -> None:
    if not isinstance(nbytes, int | float) or isinstance(nbytes, bool):
        raise ValueError(f"nbytes={nbytes!r}: must be a number of bytes")
    if not math.isfinite(nbytes) or nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r}: must be a finite number ≥ 0")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r}: must be an integer ≥ 1")


def ring_path(nbytes: float, n: int) -> tuple[int, float]:
    """Ring: a reduce-scatter and an all-gather, 2(N−1) rounds of M/N."""
    return 2 * (n - 1), 2 * (n - 1) / n * nbytes


def recursive_halving_path(nbytes: float, n: int) -> tuple[int, float]:
    """Rabenseifner's recursive halving and doubling over p = 2^⌊log2 N⌋ ranks, plus
    MPICH's fold of the N − p others (two rounds of the whole buffer)."""
    p = 1 << (n.bit_length() - 1)
    messages, volume = 2 * (p.bit_length() - 1), 2 * (p - 1) / p * nbytes
    if n != p:  # MPICH's fold: hand the buffer over, get the result back
        messages, volume = messages + 2, volume + 2 * nbytes
    return messages, volume


def tree_path(nbytes: float, n: int) -> tuple[int, float]:
    """Binomial reduce then broadcast: 2·⌈log2 N⌉ rounds of the whole buffer at the root."""
    depth = (n - 1).bit_length()  # ⌈log2 n⌉
    return 2 * depth, 2 * depth * nbytes


def server_path(nbytes: float, n: int) -> tuple[int, float]:
    """Parameter server and sequential: (N−1)·M through the server each way; the parameter
    server posts the N−1 messages of a round at once, but they still queue on its port."""
    return 2 * (n - 1), 2 * (n - 1) * nbytes


def parallel_path(nbytes: float, n: int) -> tuple[int, float]:
    """Every rank sends its whole buffer to every other: N−1 messages of M."""
    return n - 1, (n - 1) * nbytes


CriticalPath = Callable[[float, int], tuple[int, float]]
"""(bytes per rank, ranks) -> (messages, bytes) on the busiest rank's critical path."""

ALLREDUCE_PATHS: dict[str, CriticalPath] = {
    "ring": ring_path,
    "tree": tree_path,
    "recursive_halving": recursive_halving_path,
    "parameter_server": server_path,
    "sequential": server_path,
    "parallel": parallel_path,
}
"""The table above by name, for callers below `impls.collectives` (the simulator, bench
fits). Each algorithm's spec (`impls.collectives.algorithms`) names its path; a new
algorithm may write its own in its file, and `allreduce_seconds` prices it."""
ALLREDUCE_ALGORITHMS = tuple(ALLREDUCE_PATHS)


def _allreduce_path(nbytes: float, n: int, algorithm: str | CriticalPath) -> tuple[int, float]:
    """(messages, bytes) on the busiest rank's critical path."""
    if callable(algorithm):
        return algorithm(nbytes, n)
    if algorithm not in ALLREDUCE_PATHS:
        allowed = ", ".join(ALLREDUCE_ALGORITHMS)
        raise ValueError(f"algorithm={algorithm!r}: unknown; allowed values: {allowed}")
    return ALLREDUCE_PATHS[algorithm](nbytes, n)


def allreduce_rounds(n: int, algorithm: str | CriticalPath = "ring") -> int:
    """Messages on the busiest rank's critical path of one all-reduce over `n` ranks (ring:
    2(n − 1), the reduce-scatter's n − 1 and the all-gather's n − 1)."""
    _check(0, n)
    return _allreduce_path(0, n, algorithm)[0]


def allreduce_seconds(
    nbytes: float, n: int, link: Link, algorithm: str | CriticalPath = "ring"
) -> float:
    """All-reduce of `nbytes` (each rank's whole buffer) over `n` ranks on `link`;
    `algorithm` a name of `ALLREDUCE_PATHS` or a critical path itself. For M bytes over N
    ranks (Thakur, Rabenseifner & Gropp 2005, IJHPCA 19(1), §4 and Table 1; the byte
    counts are those `impls.collectives` sends):

    | algorithm          | messages on the critical path | bytes on the critical path   |
    |--------------------|-------------------------------|------------------------------|
    | ring               | 2(N−1)                        | 2(N−1)/N · M                 |
    | recursive_halving  | 2·log2 p (+2 if N ≠ p)        | 2(p−1)/p · M (+2M if N ≠ p)  |
    | tree               | 2·⌈log2 N⌉                    | 2·⌈log2 N⌉ · M               |
    | parameter_server   | 2(N−1)  (the server)          | 2(N−1) · M  (the server)     |
    | sequential         | 2(N−1)                        | 2(N−1) · M                   |
    | parallel           | N−1                           | (N−1) · M                    |

    with p the largest power of two ≤ N (MPICH's fold of the N − p extra ranks adds a
    round of the whole buffer before and after)."""
    _check(nbytes, n)
    messages, volume = _allreduce_path(nbytes, n, algorithm)
    if n == 1 or nbytes == 0:
        return 0.0
    return link.seconds(volume, messages)


def reduce_scatter_seconds(nbytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of a `nbytes` buffer (unsharded): (n−1) rounds of nbytes/n."""
    _check(nbytes, n)
    if n == 1 or nbytes == 0:
        return 0.0
    return link.seconds((n - 1) / n * nbytes, n - 1)


def all_gather_seconds(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather into a `nbytes` buffer (the gathered size): (n−1) rounds of nbytes/n."""
    return reduce_scatter_seconds(nbytes, n, link)


def all_to_all_seconds(nbytes: float, n: int, link: Link) -> float:
    """All-to-all where each rank holds `nbytes` (the share it keeps included): n−1 pairwise
    exchanges of nbytes/n (nccl-tests' alltoall busbw factor (n−1)/n)."""
    _check(nbytes, n)
    if n == 1 or nbytes == 0:
        return 0.0
    return link.seconds((n - 1) / n * nbytes, n - 1)


def p2p_seconds(nbytes: float, link: Link) -> float:
    """One message of `nbytes` from one device to another."""
    _check(nbytes, 1)
    return 0.0 if nbytes == 0 else link.seconds(nbytes, 1)


def hierarchical_allreduce_seconds(
    nbytes: float, n: int, per_node: int, intra: Link, inter: Link
) -> float:
    """All-reduce over `n` ranks, `per_node` to a node: intra-node reduce-scatter, a ring
    all-reduce of each rank's nbytes/per_node share among the n/per_node nodes (the
    per_node shares cross the nodes' per-device links in parallel), intra-node all-gather.

    Bytes crossing nodes per device: 2(nodes−1)/nodes · M/per_node, the inter-node
    traffic of NCCL's ring over nodes with every device on its own NIC.
    """
    _check(nbytes, n)
    if not isinstance(per_node, int) or isinstance(per_node, bool) or per_node < 1:
        raise ValueError(f"per_node={per_node!r}: must be an integer ≥ 1")
    if n % per_node:
        raise ValueError(f"per_node={per_node}: must divide n={n}")
    nodes = n // per_node
    if nodes == 1:
        return allreduce_seconds(nbytes, n, intra)
    if per_node == 1:
        return allreduce_seconds(nbytes, n, inter)
    return (
        reduce_scatter_seconds(nbytes, per_node, intra)
        + allreduce_seconds(nbytes / per_node, nodes, inter)
        + all_gather_seconds(nbytes, per_node, intra)
    )


def _per_node(group_size: int, stride: int, devices_per_node: int) -> int:
    """Members of a group of `group_size` ranks `stride` apart that share a node (the group
    starting at a node boundary)."""
    return max(1, min(group_size, devices_per_node // stride))


def spanning_link(hw: Hardware, per_node: int) -> Link:
    """The link a ring over nodes sees with `per_node` group members in each node.

    NCCL runs one ring per channel and spreads its channels over the node's NICs (one per
    GPU on DGX A100 / H100, rail-optimised). Each ring enters a node once, so every node
    receives (n−1)/n · M through the NICs of its k members, while each member also forwards
    (n−1)/n · M inside the node: the bus bandwidth is min(k × a NIC's, one device's
    NVLink), the node's aggregate only when the group holds every GPU of the node, one
    NIC's when it holds one (a data-parallel group of stride 8). An all-to-all gains
    nothing from the sharing and runs at one NIC's rate."""
    bandwidth = min(per_node * hw.inter.effective_bandwidth, hw.intra.effective_bandwidth)
    return Link(
        name=f"{hw.inter.name} × {per_node} NICs",
        alpha_s=hw.inter.alpha_s,
        bandwidth=max(bandwidth, hw.inter.effective_bandwidth),
    )


def collective_seconds(
    kind: str,
    nbytes: float,
    group_size: int,
    hw: Hardware,
    *,
    stride: int = 1,
    algorithm: str = "ring",
) -> float:
    """One collective of `kind` over a group of `group_size` devices `stride` ranks apart.

    `nbytes` is the full buffer: the all-reduced tensor, the unsharded tensor a
    reduce-scatter splits or an all-gather assembles, each rank's all-to-all buffer, the
    message of a p2p. A group inside one node uses `hw.intra`; a group spanning nodes uses
    `hw.inter`, and with more than one member per node its ring all-reduce is hierarchical.
    Other all-reduce algorithms (the lecture's) run flat on the group's link.
    """
    if kind not in COLLECTIVES:
        raise ValueError(f"kind={kind!r}: unknown; allowed values: {', '.join(COLLECTIVES)}")
    _check(nbytes, group_size)
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
        raise ValueError(f"stride={stride!r}: must be an integer ≥ 1")
    if algorithm not in ALLREDUCE_ALGORITHMS:
        allowed = ", ".join(ALLREDUCE_ALGORITHMS)
        raise ValueError(f"algorithm={algorithm!r}: unknown; allowed values: {allowed}")
    if group_size == 1:
        return 0.0
    link = hw.group_link(group_size, stride)
    per_node = _per_node(group_size, stride, hw.devices_per_node)
    spans = group_size * stride > hw.devices_per_node
    if kind == "p2p":
        return p2p_seconds(nbytes, link)
    if kind == "all_to_all":
        return all_to_all_seconds(nbytes, group_size, link)
    ring = spanning_link(hw, per_node) if spans and per_node > 1 else link
    if kind == "reduce_scatter":
        return reduce_scatter_seconds(nbytes, group_size, ring)
    if kind == "all_gather":
        return all_gather_seconds(nbytes, group_size, ring)
    if algorithm == "ring" and spans and per_node > 1 and group_size % per_node == 0:
        return hierarchical_allreduce_seconds(nbytes, group_size, per_node, hw.intra, hw.inter)
    return allreduce_seconds(nbytes, group_size, link, algorithm)


def best_allreduce(nbytes: float, n: int, link: Link) -> tuple[str, float]:
    """The fastest algorithm of `ALLREDUCE_ALGORITHMS` and its time (ties: the first listed).

    MPICH's choice in miniature (Thakur et al. 2005 §4.4): latency-bound small messages
    favour the logarithmic algorithms, large ones the bandwidth-optimal ring — for N not a
    power of two, where recursive halving pays the fold's two whole-buffer rounds.
    """
    times = [(allreduce_seconds(nbytes, n, link, name), name) for name in ALLREDUCE_ALGORITHMS]
    seconds, name = min(times, key=lambda pair: pair[0])
    return name, seconds
