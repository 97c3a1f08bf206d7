"""The counted point-to-point layer: the one place in `impls` that calls torch.distributed.

Every collective in `impls.collectives` is written as rounds of sends and receives over a
`Communicator`, which counts what each rank moves so that algorithms can be compared on
exact traffic (bytes, messages, rounds) before anyone looks at a clock.
"""

from impls.comm.communicator import Communicator, Round, TrafficCounters
from impls.comm.network import SimulatedNetwork

__all__ = ["Communicator", "Round", "SimulatedNetwork", "TrafficCounters"]
