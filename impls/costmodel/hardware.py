"""What a cluster can do: a typed spec of its devices and links, with each number's source
(`Hardware`, which says how its compute and links are priced)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DTYPES", "ELEMENT_BYTES", "Hardware", "Link", "wave_fraction"]

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes of one GEMM operand element (tf32 operands are stored as fp32)."""
TILES = ((256, 128), (128, 256), (128, 128))
"""cuBLAS's largest output tiles (NVIDIA Matrix Multiplication Background §2.3), all
assumed to run at the plateau: the smaller ones' lower per-tile efficiency is not
modelled, so the loss is the least any of them gives (optimistic, not pessimistic)."""


def wave_fraction(m: float, n: float, sms: int) -> float:
    """Useful share of the SM-time a GEMM's m × n output takes, cut in tiles and waves:
    m·n ÷ (waves × SMs × tile area) — tile quantisation (the last row and column of tiles
    partly padding) and wave quantisation (the last wave partly idle), NVIDIA Matrix
    Multiplication Background §3.1–3.2; the best of the tiles in `TILES`."""
    best = 0.0
    for rows, cols in TILES:
        tiles = math.ceil(m / rows) * math.ceil(n / cols)
        best = max(best, m * n / (math.ceil(tiles / sms) * sms * rows * cols))
    return best


def _positive(owner: str, **values: float) -> None:
    for key, value in values.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"{owner}.{key}={value!r}: must be a number")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{owner}.{key}={value!r}: must be a finite number > 0")


def _log_interpolate(points, x: float) -> float:
    """y at x over (x, y) points sorted by x: linear in log x between them, clamped."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return points[-1][1]


@dataclass(frozen=True, kw_only=True)
class Link:
    """One kind of link: latency α (s per message), bandwidth (bytes/s per device and
    direction) and the fraction of it large transfers achieve."""

    name: str
    alpha_s: float
    bandwidth: float
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        _positive(f"Link({self.name})", bandwidth=self.bandwidth, efficiency=self.efficiency)
        if not math.isfinite(self.alpha_s) or self.alpha_s < 0:
            raise ValueError(f"Link({self.name}).alpha_s={self.alpha_s!r}: must be ≥ 0")
        if self.efficiency > 1:
            raise ValueError(f"Link({self.name}).efficiency={self.efficiency}: must be ≤ 1")

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        """α per message plus the bytes at the achieved bandwidth."""
        return messages * self.alpha_s + nbytes / self.effective_bandwidth


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """A cluster's device and links; `sources` names where each number came from.

    A `Hardware` is one kind of device, `devices_per_node` of them to a node, joined inside a
    node by `intra` and across nodes by `inter`. Compute is priced in two ways, because a
    training step has two kinds of kernels:

    - matrix multiplications run at `peak_flops[dtype]` × an achieved efficiency that depends
      on the GEMM's size (`gemm_efficiency`: a table of (FLOPs of one GEMM, fraction of peak),
      interpolated in log FLOPs and clamped at both ends: small GEMMs cannot fill the device;
      fp8 GEMMs have their own cited table, `fp8_gemm_efficiency`, or are refused). Where the
      device's SM count is given (`sms`, the GPU presets), a GEMM is priced by its own shape
      instead: the table's large-GEMM plateau × the useful share of its tiles and waves (NVIDIA,
      "Matrix Multiplication Background User's Guide" §3.1–3.2: an m × n output cut into
      tiles, the edge tiles partly padding, runs in ⌈tiles ÷ SMs⌉ waves, the last partly
      idle; the best of cuBLAS's large tiles) — the plateau is the best rate a search over
      shapes found (MAMF), so no shape is priced above it — and never faster than reading A
      and B and writing C at the achieved memory bandwidth (the roofline: a thin GEMM is
      memory-bound);
    - element-wise work (norms, activations, softmax, residual adds, the optimizer) is bound
      by memory bandwidth: bytes moved ÷ (`memory_bandwidth` × `elementwise_efficiency`).

    Every kernel also pays `kernel_overhead_s` (launch and tail). A link moves n bytes in
    α + n ÷ (bandwidth × efficiency) (Hockney's α–β model); `bandwidth` is per device and per
    direction, the figure NCCL's bus bandwidth is compared with.
    """

    name: str
    devices_per_node: int
    peak_flops: Mapping[str, float]
    """Dense FLOP/s of one device per dtype (no sparsity)."""
    memory_bytes: float
    """Memory of one device (bytes)."""
    memory_bandwidth: float
    """Device memory bandwidth (bytes/s)."""
    intra: Link
    inter: Link
    gemm_efficiency: tuple[tuple[float, float], ...]
    """(FLOPs of one GEMM, achieved fraction of peak), FLOPs ascending."""
    elementwise_efficiency: float = 0.7
    kernel_overhead_s: float = 0.0
    action_overhead_s: float = 0.0
    """Seconds a pipeline runtime spends on each compute action (F, B, I, W) beyond its
    kernels: its bookkeeping, the saved-activation accounting, autograd's entry. It adds
    to the step where the host waits for each action (a CPU); 0 where the host runs ahead
    of asynchronous kernels (the GPU presets)."""
    collective_meeting_s: float = 0.0
    """Seconds a blocking collective costs beyond its α–β where the ranks computed before
    it (`comm_overlap` False): the ranks meet there, the first to arrive waits for the
    others, and a rank that waited long enough to leave its core idle wakes slowly. Paid
    once per meeting: calls issued back to back meet once. Measured on this repo's host
    (`bench.kit.meeting`); 0 on the GPU presets, whose collectives run beside
    compute."""
    comm_overlap: bool = True
    """Whether data-parallel collectives run beside compute (a GPU's communication
    stream, NCCL) and hide under the backward; False: each collective blocks the thread
    that computes (gloo's calls on one CPU thread, as this repo's ranks make them)."""
    p2p_blocking: bool = False
    """Whether a pipeline send occupies the sending rank until it is delivered (a round
    that blocks the rank's one computing thread, as `impls.pipeline`'s executor waits out
    its rounds on a CPU); False: a send is a latency between the two ranks' actions (a
    GPU's copy engine beside compute)."""
    fp8_gemm_efficiency: tuple[tuple[float, float], ...] | None = None
    """As `gemm_efficiency`, for fp8 GEMMs (against `peak_flops["fp8"]`), from a cited fp8
    benchmark. None: no cited fp8 figure, and fp8 GEMMs are refused rather than guessed
    from the 16-bit table."""
    attention_efficiency: tuple[tuple[float, float, float], ...] | None = None
    """FlashAttention on this device: (sequence length, forward, backward) fractions of
    peak, sequence length ascending, interpolated in log length and clamped at both ends.
    The fractions are of the FLOPs the kernel computes, as FlashAttention's benchmarks count
    them (FlashAttention-2, arXiv 2307.08691, §4.1): the causal half of 4·s²·d per head
    forward, 2.5 × that backward (5 matrix products against 2: the scores are recomputed).
    None: no published benchmark for the device; the fused core is then priced as the
    equivalent GEMMs (`gemm_efficiency`), an assumption."""
    sms: int = 0
    """Streaming multiprocessors per device; > 0 prices each GEMM by its shape (wave
    quantisation and the roofline, the class docstring); 0 uses the FLOPs table alone (a CPU
    host, whose table is measured)."""
    comm_compute_share: float = 0.0
    """Share of the device's compute a running data-parallel collective holds: NCCL's
    thread blocks each take a whole SM and share it with no compute kernel (NCCL
    maintainer, NVIDIA/nccl issue #689), so compute that a collective hides under runs on
    the SMs left. 0: collectives take no compute from the kernels they overlap (a CPU
    host, whose collectives do not overlap at all)."""
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = f"Hardware({self.name})"
        share = self.comm_compute_share
        if not isinstance(share, int | float) or isinstance(share, bool) or not 0 <= share < 1:
            raise ValueError(f"{owner}.comm_compute_share={share!r}: must be in [0, 1)")
        if not isinstance(self.sms, int) or isinstance(self.sms, bool) or self.sms < 0:
            raise ValueError(f"{owner}.sms={self.sms!r}: must be an integer ≥ 0")
        if not isinstance(self.devices_per_node, int) or self.devices_per_node < 1:
            raise ValueError(f"{owner}.devices_per_node={self.devices_per_node!r}: must be ≥ 1")
        _positive(
            owner,
            memory_bytes=self.memory_bytes,
            memory_bandwidth=self.memory_bandwidth,
            elementwise_efficiency=self.elementwise_efficiency,
        )
        if not self.peak_flops:
            raise ValueError(f"{owner}.peak_flops: give at least one dtype")
        for dtype, flops in self.peak_flops.items():
            if dtype not in DTYPES:
                raise ValueError(
                    f"{owner}.peak_flops: unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}"
                )
            _positive(owner, **{f"peak_flops[{dtype}]": flops})
        for key in ("gemm_efficiency", "fp8_gemm_efficiency"):
            points = getattr(self, key)
            if points is None and key == "fp8_gemm_efficiency":
                continue
            if not points or any(not 0 < eff <= 1 or size <= 0 for size, eff in points):
                raise ValueError(f"{owner}.{key}: need (FLOPs > 0, 0 < fraction ≤ 1) points")
            if list(points) != sorted(points):
                raise ValueError(f"{owner}.{key}: points must be sorted by FLOPs")
        self._check_attention(owner)
        for key in ("kernel_overhead_s", "action_overhead_s", "collective_meeting_s"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{owner}.{key}={value!r}: must be a finite number ≥ 0")

    def _check_attention(self, owner: str) -> None:
        points = self.attention_efficiency
        if points is None:
            return
        if not points or any(
            len(p) != 3 or p[0] <= 0 or not all(0 < f <= 1 for f in p[1:]) for p in points
        ):
            raise ValueError(
                f"{owner}.attention_efficiency: need (sequence length > 0, "
                "0 < forward ≤ 1, 0 < backward ≤ 1) points"
            )
        if [p[0] for p in points] != sorted(p[0] for p in points):
            raise ValueError(f"{owner}.attention_efficiency: points must be sorted by length")

    def attention_seconds(
        self, flops: float, seq_len: int, dtype: str, backward: bool, kernels: int = 1
    ) -> float:
        """Time of a FlashAttention kernel computing `flops` (as its benchmarks count them)
        over sequences of `seq_len`, forward or backward, plus `kernels` launches."""
        if flops <= 0:
            return 0.0
        points = self.attention_efficiency
        if points is None:
            fraction = self.efficiency(flops, dtype)
        else:
            column = 2 if backward else 1
            fraction = _log_interpolate([(p[0], p[column]) for p in points], seq_len)
        return flops / (self.peak(dtype) * fraction) + kernels * self.kernel_overhead_s

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ValueError(f"dtype={dtype!r}: {self.name} lists {', '.join(self.peak_flops)}")
        return self.peak_flops[dtype]

    def efficiency(self, flops: float, dtype: str = "bf16") -> float:
        """Achieved fraction of peak for one GEMM of `flops`, log-linear between points;
        fp8 only from its own cited table (ValueError naming dtype otherwise)."""
        if dtype != "fp8":
            return _log_interpolate(self.gemm_efficiency, flops)
        if self.fp8_gemm_efficiency is None:
            raise ValueError(
                f"dtype='fp8': {self.name} has no cited fp8 GEMM efficiency "
                "(Hardware.fp8_gemm_efficiency); fp8 is refused rather than "
                "priced with the 16-bit one"
            )
        return _log_interpolate(self.fp8_gemm_efficiency, flops)

    def gemm_seconds(self, m: int, n: int, k: int, dtype: str = "bf16", count: int = 1) -> float:
        """Time of `count` (m × k)·(k × n) products: 2mnk FLOPs each."""
        flops = 2.0 * m * n * k
        if flops <= 0:
            return 0.0
        if not self.sms:
            fraction = self.efficiency(flops, dtype)
            return count * (flops / (self.peak(dtype) * fraction) + self.kernel_overhead_s)
        fraction = self.efficiency(math.inf, dtype) * wave_fraction(m, n, self.sms)
        compute = flops / (self.peak(dtype) * fraction)
        operands = ELEMENT_BYTES[dtype] * (m * k + k * n + m * n)
        memory = operands / (self.memory_bandwidth * self.elementwise_efficiency)
        return count * (max(compute, memory) + self.kernel_overhead_s)

    def elementwise_seconds(self, nbytes: float, kernels: int = 1) -> float:
        """Memory-bound work moving `nbytes` through device memory in `kernels` kernels."""
        return nbytes / (self.memory_bandwidth * self.elementwise_efficiency) + (
            kernels * self.kernel_overhead_s
        )

    def link(self, spans_nodes: bool) -> Link:
        return self.inter if spans_nodes else self.intra

    def group_link(self, group_size: int, stride: int = 1) -> Link:
        """The link a group of `group_size` devices `stride` apart uses: intra-node when
        they all fit in one node, otherwise the slower inter-node link."""
        return self.link(group_size * stride > self.devices_per_node and group_size > 1)
