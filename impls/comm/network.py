"""A simulated network: per-round latency and bandwidth added to real transfers.

On one machine every transfer crosses loopback in microseconds, so the regimes the lecture
warns about — "insufficient bandwidth", "high latency, especially over long distances" —
never show. `SimulatedNetwork` makes a `Communicator` hold each round for the time the
modelled link would take, on top of the real transfer: α + 8·B/bandwidth, where B is the
larger of the bytes this rank sent and received in the round (its messages go out in
parallel, one link each way, as in the α–β model the all-reduce report fits). The time it
added is kept apart (`Communicator.simulated_s`), so a report can show it separately from
compute and from the real transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SimulatedNetwork"]


@dataclass(frozen=True)
class SimulatedNetwork:
    """Latency in seconds per round, bandwidth in bits per second (inf: latency only)."""

    latency_s: float = 0.0
    bandwidth_bps: float = math.inf

    def __post_init__(self) -> None:
        if not (isinstance(self.latency_s, int | float) and 0 <= self.latency_s < math.inf):
            raise ValueError(f"latency_s={self.latency_s!r}: must be a finite number ≥ 0")
        if not (isinstance(self.bandwidth_bps, int | float) and self.bandwidth_bps > 0):
            raise ValueError(f"bandwidth_bps={self.bandwidth_bps!r}: must be a number > 0")

    @classmethod
    def from_units(cls, latency_ms: float = 0.0, bandwidth_mbps: float = math.inf):
        """From the units people quote (100 ms, 100 Mbit/s), naming those keys if bad."""
        if not (isinstance(latency_ms, int | float) and 0 <= latency_ms < math.inf):
            raise ValueError(f"latency_ms={latency_ms!r}: must be a finite number ≥ 0")
        if not (isinstance(bandwidth_mbps, int | float) and bandwidth_mbps > 0):
            raise ValueError(f"bandwidth_mbps={bandwidth_mbps!r}: must be a number > 0")
        return cls(latency_ms / 1e3, bandwidth_mbps * 1e6)

    def round_seconds(self, bytes_sent: int, bytes_recv: int) -> float:
        """What one round moving these bytes takes on the modelled link."""
        return self.latency_s + 8 * max(bytes_sent, bytes_recv) / self.bandwidth_bps
