"""The all-reduce registry: one `AllReduceAlgorithm` per name (declared in the algorithm's
own file), in the order reports list them.

A module of its own so that both `all_reduce` (which dispatches on the name) and the
`tuner` (which prices or times each one to choose among them) can import it without
importing each other. Adding an algorithm: write its file (function, critical path and
spec) and add its spec here; CONTRIBUTING.md walks through it.
"""

from __future__ import annotations

from impls.collectives.central import PARAMETER_SERVER, SEQUENTIAL
from impls.collectives.parallel import PARALLEL
from impls.collectives.recursive_halving import RECURSIVE_HALVING
from impls.collectives.ring import RING
from impls.collectives.spec import ORDER_COLUMNS, AllReduceAlgorithm
from impls.collectives.tree import TREE

__all__ = ["ALGORITHMS", "ORDER_COLUMNS", "AllReduceAlgorithm"]

ALGORITHMS: dict[str, AllReduceAlgorithm] = {
    spec.name: spec
    for spec in (
        PARAMETER_SERVER,
        SEQUENTIAL,
        RING,
        PARALLEL,
        RECURSIVE_HALVING,
        TREE,
    )
}
