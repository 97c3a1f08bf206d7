"""`overlap`'s typed config: every key, its default and its meaning, and the label a
simulated link gets in the `network` column.

Light on purpose: every rank unpickles this config, so it imports no pandas or plotting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.config import (
    batch_key,
    bytes_key,
    cell_timeout,
    check_gpt_model,
    check_positive,
    check_training,
    check_unique,
    gpt_rank_bytes,
    iterations_key,
    ranks_key,
    seed_key,
)
from impls.comm import SimulatedNetwork

__all__ = ["OverlapConfig", "network_label"]

NETWORK_KEYS = ("latency_ms", "bandwidth_mbps")


def network_label(network: dict[str, float] | None) -> str:
    """ "loopback" for no simulated link, else e.g. "0.5ms-1000Mbps" (latency only: "2ms")."""
    if network is None:
        return "loopback"
    latency = network.get("latency_ms", 0.0)
    bandwidth = network.get("bandwidth_mbps", math.inf)
    label = f"{latency:g}ms"
    return label if math.isinf(bandwidth) else f"{label}-{bandwidth:g}Mbps"


def _check_network(network: Any) -> None:
    if network is None:
        return
    if not isinstance(network, dict):
        raise ValueError(f"networks: {network!r} is neither null nor a mapping")
    unknown = sorted(set(network) - set(NETWORK_KEYS))
    if unknown:
        raise ValueError(
            f"networks: unknown key(s) {unknown} in {network}; allowed: {', '.join(NETWORK_KEYS)}"
        )
    try:
        SimulatedNetwork.from_units(**network)
    except ValueError as error:
        raise ValueError(f"networks: {error}") from error


@dataclass(kw_only=True)
class OverlapConfig:
    RANK_KEY: ClassVar[str] = "world_size"
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("model", "batch_size")

    bucket_caps_bytes: list[int] = bytes_key([65536, 262144, 1048576, 26214400])
    """DDP bucket caps in bytes, each ≥ 1 (26214400 = 25 MiB, torch's default)."""
    overlap: Any = field(default_factory=lambda: [False, True])
    """false: all-reduce the buckets after backward; true: during it (a flag or a list).
    Typed Any so that a value that is not true/false ("yes") is refused, not coerced."""
    networks: list[Any] = field(
        default_factory=lambda: [None, {"latency_ms": 0.5, "bandwidth_mbps": 1000.0}]
    )
    """Simulated links under the bucket all-reduces: {latency_ms, bandwidth_mbps}; null:
    loopback only."""
    world_size: int = ranks_key(2, ge=2)
    """Ranks (data-parallel replicas) of every cell."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "vocab_size": 256,
            "seq_len": 64,
            "d_model": 128,
            "n_heads": 4,
            "n_layers": 4,
        }
    )
    """`GPTConfig` keyword arguments."""
    batch_size: int = batch_key(8)
    """Sequences per rank per step."""
    warmup: int = iterations_key(3, ge=0)
    """Untimed steps per cell before the timed ones."""
    repeats: int = iterations_key(15)
    """Timed steps per cell; the median of the slowest rank is reported."""
    paired: Any = True
    """Also time the other overlap setting on a twin replica in alternating steps, so each
    cell measures the speed-up side by side (twice the time per cell). true or false
    (typed Any so that "yes" is refused, not coerced)."""
    seed: int = seed_key(0)
    """Seeds the model's weights and the batches."""
    timeout_s: float = cell_timeout(600.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        check_positive("bucket_caps_bytes", self.bucket_caps_bytes)
        check_unique("bucket_caps_bytes", self.bucket_caps_bytes)
        if not isinstance(self.overlap, list):
            self.overlap = [self.overlap]
        if not self.overlap or any(not isinstance(v, bool) for v in self.overlap):
            raise ValueError(f"overlap={self.overlap}: a non-empty list of true/false")
        check_unique("overlap", self.overlap)
        if not self.networks:
            raise ValueError("networks=[]: give at least one entry (null: loopback)")
        for network in self.networks:
            _check_network(network)
        # Two links with one label ({latency_ms: 1} and {latency_ms: 1.0}) are one cell.
        check_unique("networks", [network_label(n) for n in self.networks])
        check_positive("world_size", [self.world_size], minimum=2)
        check_positive("seed", [self.seed], minimum=0)
        if not isinstance(self.paired, bool):
            raise ValueError(f"paired={self.paired!r}: must be true or false")
        check_training(self, ("batch_size", "repeats"))
        check_gpt_model(self.model)

    def rank_bytes(self) -> int:
        """An upper bound on what one rank holds: the model and its twin, on its batch."""
        return gpt_rank_bytes(check_gpt_model(self.model), self.batch_size)
