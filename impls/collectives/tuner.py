"""Choosing an all-reduce algorithm per call from a per-algorithm cost table.

NCCL's tuner and MPICH's selection both pick, per call, the algorithm they predict fastest
for the group size and message size. NCCL prices every algorithm × protocol as a latency
plus the size over a bandwidth, with constants tabulated per platform (`src/graph/tuning.cc`,
`ncclTopoTuneModel` and `ncclTopoGetAlgoTime`); MPICH switches between algorithms at
message-size and process-count thresholds derived from the α–β model (Thakur, Rabenseifner
& Gropp 2005, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1),
§4). Here the prediction for algorithm a on n ranks is, as in NCCL,

    t_a(n, M) = α_a(n) + β_a(n) · M     (α: seconds of a zero-byte call, β: seconds per byte)

one line per algorithm from the link model, or one line per range between measured sizes
when calibrated (`AllReduceTuner`).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from impls.collectives.algorithms import ALGORITHMS
from impls.collectives.primitives import barrier
from impls.comm import Communicator
from impls.costmodel.comm import allreduce_seconds
from impls.costmodel.hardware import Link
from impls.costmodel.presets import hardware
from impls.pairing import calls_per_window, common_count, paired_times, turns

__all__ = [
    "DEFAULT_CALIBRATION_SIZES",
    "GLOO_LOOPBACK",
    "AlgorithmCost",
    "AllReduceTuner",
    "MeasuredCost",
    "default_link",
    "fit_two_points",
]

# Used when nobody calibrated: this repo's own measurement of its gloo ranks, the
# machine-wide α–β fit of reports/allreduce_scaling (2 cores, loopback TCP). On NCCL: the
# A100 preset's NVLink3 link.
GLOO_LOOPBACK = Link(
    name="gloo loopback (allreduce_scaling's fit)", alpha_s=161e-6, bandwidth=1.36e9
)
DEFAULT_CALIBRATION_SIZES = (4 << 10, 64 << 20)


@dataclass(frozen=True)
class AlgorithmCost:
    """t(M) = alpha_s + beta_s_per_byte · M for one algorithm on one group size."""

    alpha_s: float
    beta_s_per_byte: float

    def seconds(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes


def fit_two_points(sizes: Sequence[float], seconds: Sequence[float]) -> AlgorithmCost:
    """The line through (M0, t0) and (M1, t1), clamped to α ≥ 0 and β ≥ 0 (a time that
    falls with size, or a negative intercept, is noise: a cost never is)."""
    (m0, m1), (t0, t1) = sizes, seconds
    if not m1 > m0 >= 0:
        raise ValueError(f"sizes={tuple(sizes)}: need two sizes 0 ≤ M0 < M1")
    beta = max(0.0, (t1 - t0) / (m1 - m0))
    return AlgorithmCost(alpha_s=max(0.0, t0 - beta * m0), beta_s_per_byte=beta)


@dataclass(frozen=True)
class MeasuredCost:
    """Times measured at sizes M₀ < … < M_k (k ≥ 1), linear between neighbours; below M₀
    and above M_k the first and last range's slope (never negative: a time that falls
    with size is noise), never below zero. Exact at every measured size."""

    sizes: tuple[float, ...]
    times: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or len(self.sizes) != len(self.times):
            raise ValueError(f"sizes={self.sizes}, times={self.times}: need ≥ 2 of each")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError(f"sizes={self.sizes}: must increase")

    def _slope(self, i: int) -> float:
        (m0, m1), (t0, t1) = self.sizes[i : i + 2], self.times[i : i + 2]
        return (t1 - t0) / (m1 - m0)

    def seconds(self, nbytes: float) -> float:
        sizes, times = self.sizes, self.times
        if nbytes <= sizes[0]:
            return max(0.0, times[0] - max(0.0, self._slope(0)) * (sizes[0] - nbytes))
        if nbytes >= sizes[-1]:
            return times[-1] + max(0.0, self._slope(len(sizes) - 2)) * (nbytes - sizes[-1])
        i = bisect.bisect_right(sizes, nbytes) - 1
        return times[i] + self._slope(i) * (nbytes - sizes[i])

    @property
    def line(self) -> AlgorithmCost:
        """The two-point line through the smallest and the largest size (a summary)."""
        return fit_two_points((self.sizes[0], self.sizes[-1]), (self.times[0], self.times[-1]))

    @property
    def alpha_s(self) -> float:
        return self.line.alpha_s

    @property
    def beta_s_per_byte(self) -> float:
        return self.line.beta_s_per_byte


def default_link(comm: Communicator) -> Link:
    """The link `all_reduce(..., algorithm="auto")` assumes when the communicator carries
    no tuner: NVLink3 of the A100 preset under NCCL, else this repo's gloo loopback fit."""
    return hardware("a100_80gb").intra if comm.deferred_posting else GLOO_LOOPBACK


class AllReduceTuner:
    """A cost table over (algorithm, group size), and the argmin over it.

    `table` holds measured (or given) costs; a (algorithm, n) it lacks is priced from
    `link` when there is one. Ties go to the algorithm listed first in `algorithms`.
    The table comes from one of two places:

    - `AllReduceTuner.from_link`: the α–β link model of `impls.costmodel.comm` (rounds on the
      busiest rank × the link's α, its bytes ÷ the bandwidth) — MPICH's model, no measurement;
    - `AllReduceTuner.calibrate`: measured on the communicator at two or more message sizes
      per algorithm: linear between the measured sizes (α and β per size range, as NCCL's
      tables are per protocol and MPICH's switch points per size range), the end ranges'
      lines beyond them. NCCL's constants are measured offline per platform; here they are
      measured at run time because the link model can misrank the algorithms: on this repo's
      2-core host, where ranks share cores, the parameter server (two rounds of N−1 messages
      posted at once) is fastest in most cells of `allreduce_scaling`, not the ring the link
      model prefers for large messages.

    Every rank must choose the same algorithm for the same call, or the ranks post messages
    that do not match and deadlock. `calibrate` therefore replaces every time by the slowest
    rank's (one MAX all-reduce of the whole table), so that every rank fits the same numbers.
    """

    def __init__(
        self,
        table: Mapping[tuple[str, int], AlgorithmCost | MeasuredCost] | None = None,
        *,
        link: Link | None = None,
        algorithms: Iterable[str] = tuple(ALGORITHMS),
    ) -> None:
        self.algorithms = tuple(algorithms)
        unknown = [a for a in self.algorithms if a not in ALGORITHMS]
        if unknown or not self.algorithms:
            allowed = ", ".join(ALGORITHMS)
            raise ValueError(f"algorithms={list(self.algorithms)}: allowed values: {allowed}")
        self.table: dict[tuple[str, int], AlgorithmCost | MeasuredCost] = dict(table or {})
        self.link = link
        self._link_costs: dict[tuple[str, int], AlgorithmCost] = {}  # derived from `link` once
        self.last_choice: str | None = None
        """The algorithm `choose` returned last (what the last auto all-reduce ran)."""
        # Choices made, by (bytes, n): an auto call then costs one dict lookup. On a host
        # where a rank that waits sleeps, even the ~3 µs of pricing six algorithms in
        # Python before each call measured 8% slower at 4 KiB (2 ranks): it moves the
        # next receive from "already arrived" to "sleep, then wake". `calibrate` clears it.
        self._choices: dict[tuple[float, int], str] = {}

    @classmethod
    def from_link(cls, link: Link, algorithms: Iterable[str] = tuple(ALGORITHMS)) -> AllReduceTuner:
        """Prices from the α–β model on `link` alone (`impls.costmodel.comm`)."""
        return cls(link=link, algorithms=algorithms)

    def cost(self, algorithm: str, n: int) -> AlgorithmCost | MeasuredCost:
        if (algorithm, n) in self.table:
            return self.table[(algorithm, n)]
        if self.link is None:
            raise ValueError(
                f"no cost for algorithm={algorithm!r} on n={n} ranks: calibrate on a group of "
                f"{n} ranks, or give the tuner a link"
            )
        if (algorithm, n) not in self._link_costs:  # `choose` asks on every auto call
            # The model is linear in M for M > 0 (it returns 0 for M = 0): read α and β off
            # two large sizes, where the subtraction loses nothing to rounding.
            small, large = float(1 << 20), float(1 << 30)
            path = ALGORITHMS[algorithm].critical_path
            t_small = allreduce_seconds(small, n, self.link, path)
            t_large = allreduce_seconds(large, n, self.link, path)
            beta = (t_large - t_small) / (large - small)
            self._link_costs[(algorithm, n)] = AlgorithmCost(
                alpha_s=t_small - beta * small, beta_s_per_byte=beta
            )
        return self._link_costs[(algorithm, n)]

    def predict(self, algorithm: str, nbytes: float, n: int) -> float:
        """Predicted seconds of one all-reduce of `nbytes` over `n` ranks."""
        if n == 1 or nbytes == 0:
            return 0.0  # every algorithm returns at once
        return self.cost(algorithm, n).seconds(nbytes)

    def choose(self, nbytes: float, n: int) -> str:
        """The algorithm predicted fastest (the first listed among equals); remembered per
        (nbytes, n), so edit `table` before the first choice, or call `forget`."""
        choice = self._choices.get((nbytes, n))
        if choice is None:
            times = [self.predict(a, nbytes, n) for a in self.algorithms]
            best = min(range(len(times)), key=lambda i: (times[i], i))
            choice = self._choices[(nbytes, n)] = self.algorithms[best]
        self.last_choice = choice
        return choice

    def forget(self) -> None:
        """Drop the remembered choices (after editing `table` by hand)."""
        self._choices.clear()

    def calibrate(
        self,
        comm: Communicator,
        sizes: Sequence[int] = DEFAULT_CALIBRATION_SIZES,
        *,
        dtype: torch.dtype = torch.float32,
        warmup: int = 1,
        repeats: int = 3,
        window_s: float = 0.02,
        max_iters: int = 32,
        clock: Callable[[], float] = time.perf_counter,
    ) -> AllReduceTuner:
        """Time every algorithm on `comm` at each of `sizes` (bytes, ≥ 2 of them): its table
        entry is the `MeasuredCost` through those times.

        Collective: every rank of `comm` calls it with the same arguments. Per size, as
        the benchmark harness times a cell: `warmup` calls of each algorithm, one count of
        calls per window for every algorithm (`impls.pairing.common_count` of each one's
        probe call, the slowest rank's, so every rank runs as many), then `repeats` rounds
        in which each algorithm takes one barrier-started window in turn, in the orders of
        `balanced_orders` (`bench.kit.timing.alternate`'s pattern: where ranks share cores,
        a host drifts between fast and slow phases lasting seconds, and taking turns lets a
        phase hit every algorithm alike). Each window's time becomes the slowest rank's;
        an algorithm's time at a size is `paired_times` over the rounds, and its times
        through the sizes are the table entry for (algorithm, comm.world_size). The
        calibration's own traffic, calls and simulated time are taken back out of
        `comm`'s counters.
        """
        itemsize = torch.empty(0, dtype=dtype).element_size()
        points = sorted({int(s) for s in sizes})
        if len(points) < 2 or points[0] <= 0 or any(s % itemsize for s in points):
            raise ValueError(
                f"sizes={tuple(sizes)}: need two or more distinct sizes > 0, multiples of "
                f"{itemsize} bytes ({dtype})"
            )
        if repeats < 1 or warmup < 0 or max_iters < 1:
            raise ValueError(f"repeats={repeats}, warmup={warmup}, max_iters={max_iters}")
        counters, calls, simulated = comm.counters.copy(), comm.calls.copy(), comm.simulated_s
        try:
            windows = torch.zeros(len(self.algorithms), len(points), repeats, dtype=torch.float64)
            for j, nbytes in enumerate(points):
                buf = torch.zeros(nbytes // itemsize, dtype=dtype, device=comm.device)
                timers = [_Timer(ALGORITHMS[a].run, comm, buf, clock) for a in self.algorithms]
                iters = common_count(
                    [t.calls_per_window(warmup, window_s, max_iters) for t in timers]
                )
                for r, i in turns(len(timers), repeats):
                    windows[i, j, r] = timers[i].window(iters)
            _slowest_rank(windows, comm)
        finally:
            comm.counters, comm.simulated_s = counters, simulated
            comm.calls.clear()
            comm.calls.update(calls)
        seconds = torch.stack(
            [paired_times(windows[:, j].clamp_min(1e-12)) for j in range(len(points))], dim=1
        ).tolist()
        n = comm.world_size
        for name, times in zip(self.algorithms, seconds, strict=True):
            self.table[(name, n)] = MeasuredCost(tuple(map(float, points)), tuple(times))
        self.forget()
        return self


@dataclass
class _Timer:
    """Times one algorithm on one buffer of zeros (sums of zeros stay zero)."""

    run: Callable[[torch.Tensor, Communicator, str], None]
    comm: Communicator
    buf: torch.Tensor
    clock: Callable[[], float]

    def window(self, iters: int) -> float:
        """Seconds per call of `iters` back-to-back calls after a barrier (this rank's)."""
        barrier(self.comm)
        start = self.clock()
        for _ in range(iters):
            self.run(self.buf, self.comm, "sum")
        return (self.clock() - start) / iters

    def calls_per_window(self, warmup: int, window_s: float, max_iters: int) -> int:
        """After `warmup` calls, as many calls as fill `window_s` by one probe call."""
        for _ in range(warmup):
            self.run(self.buf, self.comm, "sum")
        probe = torch.tensor([self.window(1)], dtype=torch.float64)
        _slowest_rank(probe, self.comm)
        return calls_per_window(float(probe), window_s, max_iters)


def _slowest_rank(seconds: torch.Tensor, comm: Communicator) -> None:
    """Every element becomes its maximum over the ranks, in place (our own all-reduce;
    the parameter server's two rounds are the fewest of any algorithm here)."""
    on_device = seconds.to(comm.device).view(-1)  # NCCL reduces CUDA tensors only
    ALGORITHMS["parameter_server"].run(on_device, comm, "max")
    seconds.view(-1).copy_(on_device.cpu())
