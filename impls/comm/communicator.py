"""Counted send/receive over one torch.distributed process group.

A *round* is one step in which a rank posts its sends and receives and waits for all of
them; the number of rounds on the critical path is the latency term (α) of the α–β cost
model, and bytes per rank are its bandwidth term (β). Counting both exactly lets us check
every algorithm against its analytic cost independently of the machine it runs on.

Peers are always *group* ranks; the communicator translates them to global ranks, so the
same algorithm runs unchanged on the world group or on any sub-group of a device mesh.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from impls.comm.network import SimulatedNetwork

__all__ = ["Communicator", "Round", "TrafficCounters"]


@dataclass
class TrafficCounters:
    """What one rank moved: bytes and messages each way, and communication rounds."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    messages_recv: int = 0
    rounds: int = 0

    def copy(self) -> TrafficCounters:
        return TrafficCounters(**asdict(self))

    def __sub__(self, other: TrafficCounters) -> TrafficCounters:
        mine, theirs = asdict(self), asdict(other)
        return TrafficCounters(**{k: mine[k] - theirs[k] for k in mine})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Communicator:
    """Point-to-point messaging for one process group, with per-rank traffic counters.

    `rank` and `world_size` are this process's coordinates inside `group`. Use `round()`
    to post a step's sends and receives together; `send`/`recv` are one-message rounds.
    With a `network`, every round is also held for the modelled link's time (see
    `impls.comm.network`), which `simulated_s` adds up.
    """

    def __init__(
        self, group: dist.ProcessGroup | None = None, *, network: SimulatedNetwork | None = None
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Communicator needs torch.distributed.init_process_group first")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self._global = [dist.get_global_rank(self.group, r) for r in range(self.world_size)]
        # NCCL matches sends and receives only inside one group call; gloo posts each op
        # at once, which lets a transfer start before the rest of the round is queued.
        self.deferred_posting = dist.get_backend(self.group) == "nccl"
        # Where this group's buffers live: NCCL moves CUDA tensors, gloo CPU tensors.
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if self.deferred_posting
            else torch.device("cpu")
        )
        self.counters = TrafficCounters()
        self.network = network
        self.simulated_s = 0.0  # seconds the simulated network added to this rank's rounds
        # True: each round sleeps its simulated time (the caller waits, as on the link).
        # False: the time is only added to `simulated_s`; a caller that lets several
        # operations be in flight at once (delayed gradient averaging) waits for it itself.
        self.hold_simulated = True
        # Collective operations started over this group, by name ("all_reduce": 4): the
        # unit in which papers count communication (Megatron: two all-reduces per layer).
        self.calls: Counter[str] = Counter()
        # What `round()` builds: a profiler may substitute a `Round` subclass that clocks
        # each round on this communicator alone (as parallelism_comparison's ranks do).
        self.round_type: Callable[[Communicator], Round] = Round
        # What `all_reduce(..., algorithm="auto")` consults (an
        # `impls.collectives.AllReduceTuner`); None: one priced from a default link.
        self.tuner = None
        self._workspace: dict[tuple[torch.dtype, int], torch.Tensor] = {}  # on self.device

    def scratch(self, numel: int, dtype: torch.dtype, slot: int = 0) -> torch.Tensor:
        """A reusable receive buffer of at least `numel` elements (contents undefined).

        Collectives call this once per operation instead of allocating: a fresh
        multi-MiB buffer costs page faults and kernel zeroing on every call, which
        torch.distributed's backends avoid by keeping their own staging buffers. An
        operation that needs two live buffers at once asks for two different slots.
        """
        buf = self._workspace.get((dtype, slot))
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=self.device)
            self._workspace[(dtype, slot)] = buf
        return buf[:numel]

    def global_rank(self, peer: int) -> int:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"peer {peer} is not another rank of a group of {self.world_size}")
        return self._global[peer]

    def round(self) -> Round:
        """A new round: queue sends/receives on it, then `wait()` (or use it as a `with`)."""
        return self.round_type(self)

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        with self.round() as rnd:
            rnd.send(tensor, dst, tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        with self.round() as rnd:
            rnd.recv(tensor, src, tag)

    def count_call(self, name: str) -> None:
        """Record that collective `name` started (called by `impls.collectives`)."""
        self.calls[name] += 1

    def reset_counters(self) -> TrafficCounters:
        """Zero the counters and return what they held."""
        old, self.counters = self.counters, TrafficCounters()
        return old

    @contextlib.contextmanager
    def measure(self) -> Iterator[TrafficCounters]:
        """Counters of just the enclosed operations: `with comm.measure() as t: ...`."""
        before = self.counters.copy()
        delta = TrafficCounters()
        try:
            yield delta
        finally:
            for key, value in (self.counters - before).as_dict().items():
                setattr(delta, key, value)


class Round:
    """The sends and receives one rank posts in one step, waited on together."""

    def __init__(self, comm: Communicator) -> None:
        self._comm = comm
        self._queued: list[dist.P2POp] = []
        self._works: list[dist.Work | None] = []  # None once waited on
        self._sends: list[bool] = []  # per operation, in posting order: a send?
        self._tensors: list[torch.Tensor | None] = []  # per operation: its buffer, until waited
        self._ops = 0
        self._sent = self._recv = 0  # this round's bytes, for the simulated network
        self._done = False

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self._add(dist.isend, tensor, dst, tag)
        self._sent += _nbytes(tensor)
        self._comm.counters.bytes_sent += _nbytes(tensor)
        self._comm.counters.messages_sent += 1

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self._add(dist.irecv, tensor, src, tag)
        self._recv += _nbytes(tensor)
        self._comm.counters.bytes_recv += _nbytes(tensor)
        self._comm.counters.messages_recv += 1

    def _add(self, fn, tensor: torch.Tensor, peer: int, tag: int) -> None:
        if self._done:
            raise RuntimeError("this round has already been waited on")
        if not tensor.is_contiguous():
            raise ValueError("point-to-point buffers must be contiguous")
        comm, self._ops = self._comm, self._ops + 1
        peer = comm.global_rank(peer)
        self._sends.append(fn is dist.isend)
        self._tensors.append(tensor)
        if comm.deferred_posting:
            self._queued.append(dist.P2POp(fn, tensor, peer, comm.group, tag))
        else:
            self._works.append(fn(tensor, peer, group=comm.group, tag=tag))

    def post(self) -> None:
        """Issue queued operations (NCCL posts a round as one group call)."""
        if self._queued:
            self._works.extend(dist.batch_isend_irecv(self._queued))
            self._queued = []

    def wait(self, *, sends: bool = True, receives: bool = True) -> None:
        """Block until every operation of the round completed; counts the round.

        `sends=False` / `receives=False` leave those operations in flight: the round is
        counted (and held for the simulated link) now, a receive's buffer is read only
        after `wait_received(buffer)`, a send's buffer stays unchanged until a later
        `wait()`. A pipeline rank so goes on computing while its messages move (gloo moves
        a message only once both ends have posted it, and a round waited on as a whole
        makes a rank wait for the slower of its messages, even one its next compute does
        not need)."""
        self.post()
        self._block([i for i, send in enumerate(self._sends) if (sends if send else receives)])
        if self._ops and not self._done:
            self._comm.counters.rounds += 1
            network = self._comm.network
            if network is not None:
                delay = network.round_seconds(self._sent, self._recv)
                if self._comm.hold_simulated:
                    time.sleep(delay)
                self._comm.simulated_s += delay
        self._done = True

    def wait_received(self, buffer: torch.Tensor) -> None:
        """Block until the receive into `buffer`, posted on this round, completed."""
        self.post()
        mine = [i for i, t in enumerate(self._tensors) if t is buffer and not self._sends[i]]
        if not mine:
            raise ValueError("no receive into this buffer was posted on this round")
        self._block(mine)

    def _block(self, indices: list[int]) -> None:
        """Wait for the operations at `indices`, each once (a second wait on a completed
        gloo receive never returns); the round holds each buffer until then."""
        for i in indices:
            work = self._works[i]
            if work is not None:
                work.wait()
                self._works[i] = None
            self._tensors[i] = None

    def __enter__(self) -> Round:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.wait()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
