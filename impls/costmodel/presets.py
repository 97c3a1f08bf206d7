"""Cluster presets for the simulator, each number with where it came from (`sources`).

Peaks and memory are datasheet figures (dense, no sparsity). What a device *achieves* comes
from published microbenchmarks only (GEMM sweeps, FlashAttention's kernel benchmarks,
nccl-tests, device copies; the list is above `_a100`), never from the end-to-end training
throughputs the simulator is asked to predict. Anything not found in a published source
is marked "assumption: …" in `sources`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from impls.costmodel.hardware import Hardware, Link

__all__ = ["HARDWARE", "hardware", "host_hardware"]

GB = 1e9
_MAMF = "stas00/ml-engineering compute/accelerator/README.md, MAMF comparison table"
_SQUARE = "chsasank/device-benchmarks README.md, summary table (best square matmul / copy)"
_WAVES = (
    "NVIDIA Matrix Multiplication Background User's Guide §3.2 wave quantization, "
    "256×128 tiles (§2.3), scaled by the large-GEMM efficiency"
)
_NCCL_LAT = "NCCL src/graph/tuning.cc hwLatencies, ring LL128 (commit 5067397)"
_KERNEL = "assumption: 4 µs launch + tail per kernel (no published figure used)"
_NCCL_SMS = (
    "NVIDIA/nccl issue #689, the NCCL maintainer: 'If you have a PCI system with a single "
    "NIC ... it should just launch 2 SMs. If you are on DGX with 8 NICs ... it would use 16 "
    "SMs', and 'NCCL CTAs won't share an SM with compute kernels': 2 SMs per NIC of the node"
)


def _nccl_share(nics: int, sms: int) -> float:
    """The share of a device's SMs that one NCCL collective holds while it runs: 2 per NIC
    of the node (the NCCL maintainer's two data points, `_NCCL_SMS`)."""
    return 2 * nics / sms


_FA2 = "Dao 2023, FlashAttention-2 (arXiv 2307.08691)"
_FA3 = "Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608)"
_FA2_H100 = (
    (512, 191, 214),
    (1024, 260, 260),
    (2048, 298, 291),
    (4096, 319, 310),
    (8192, 333, 318),
    (16384, 335, 322),
)
"""FlashAttention-2 on H100 SXM5 as the FlashAttention-3 paper measured it (§4.1, BF16,
head dim 128): (s, forward TFLOP/s with causal mask, Fig. 5; backward TFLOP/s, Fig. 6)."""


def _wave_table(sms: int, large_flops: float, large_eff: float) -> tuple[tuple[float, float], ...]:
    """(FLOPs, fraction) for n × n × n GEMMs n = 256 … 4096, then the large-GEMM point."""
    points = []
    for n in (256, 512, 1024, 2048, 4096):
        tiles = math.ceil(n / 256) * math.ceil(n / 128)
        waves = math.ceil(tiles / sms)
        points.append((2.0 * n**3, large_eff * tiles / (waves * sms)))
    return (*points, (large_flops, large_eff))


# Where each achieved figure of a preset comes from:
# - large-GEMM efficiency: the best bf16/fp16 matmul found by a shape search ("Maximum
#   Achievable Matmul FLOPS", MAMF, stas00/ml-engineering `compute/accelerator/README.md`,
#   table "Maximum Achievable Matmul FLOPS comparison table"; derived from Anthony et al.
#   2024, "The Case for Co-Designing Model Architectures with Hardware", arXiv 2401.14489),
#   or a square-matmul sweep (chsasank/device-benchmarks README summary table) where MAMF
#   has no row; fp8 from MAMF's FP8 table where it has a row (H100), refused elsewhere;
# - FlashAttention: the FlashAttention-2 paper (A100) and the FlashAttention-3 paper (H100) kernel
#   benchmarks (`attention_efficiency`);
# - the roll-off for small GEMMs: NVIDIA's "Matrix Multiplication Background User's Guide"
#   §3.2 (wave quantization) — an n × n × n GEMM in 256 × 128 output tiles (the largest
#   cuBLAS tile of §2.3) keeps tiles ÷ (waves × SMs) of the SMs busy; that fraction times
#   the large-GEMM efficiency is the table's value at n = 256 … 4096 (`_wave_table`); the
#   simulator prices each GEMM by its own shape from the plateau and the SM count instead
#   (`Hardware.sms`, `hardware.wave_fraction`: the A100 and V100 SM counts from their
#   whitepapers, as cited for the table; not the H100, see `_h100`);
# - links: `bandwidth` per device and direction from the datasheets, `efficiency` the
#   nccl-tests bus bandwidth over it (busbw is comparable with a link's bandwidth, nccl-tests
#   `doc/PERFORMANCE.md`), α NCCL's own per-step latency for the LL128 protocol
#   (`src/graph/tuning.cc`, `hwLatencies`, ring: NVLink 1.9 µs, network 4.0 µs);
# - element-wise efficiency: a large device-to-device copy over the datasheet bandwidth
#   (chsasank/device-benchmarks).
def _a100(memory_gb: int, bandwidth: float) -> Hardware:
    return Hardware(
        name=f"DGX A100 {memory_gb}GB (8 × A100 SXM4, NVLink3, 8 × HDR 200 Gb/s)",
        devices_per_node=8,
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
        memory_bytes=memory_gb * GB,
        memory_bandwidth=bandwidth,
        # 600 GB/s bidirectional NVLink3 = 300 GB/s per direction; nccl-tests all_reduce on
        # 8 × A100 NVLink: busbw ~208 GB/s (nccl-tests issue #178), ~200 GB/s (#149).
        intra=Link(name="NVLink3", alpha_s=1.9e-6, bandwidth=300 * GB, efficiency=0.69),
        # One HDR HCA (200 Gb/s = 25 GB/s) per GPU; 3 nodes × 8 A100 with 4 HDR per node
        # reached busbw 96 GB/s of 100 GB/s (nccl-tests issue #119, largest message).
        inter=Link(name="HDR InfiniBand", alpha_s=4.0e-6, bandwidth=25 * GB, efficiency=0.96),
        # MAMF: 267.9 of 312 TFLOP/s (85.9 %) at 6912 × 16384 × 2048.
        gemm_efficiency=_wave_table(108, 2.0 * 6912 * 16384 * 2048, 0.859),
        sms=108,
        comm_compute_share=_nccl_share(nics=8, sms=108),
        # A100 80GB: a large copy at 1490 of 2039 GB/s (chsasank/device-benchmarks).
        elementwise_efficiency=0.73,
        kernel_overhead_s=4e-6,
        # FlashAttention-2 on A100: "up to 73 % ... forward, up to 63 % ... backward".
        attention_efficiency=((2048, 0.73, 0.63),),
        sources={
            "peak_flops": "NVIDIA A100 Tensor Core GPU datasheet (dense: FP32 19.5, TF32 156, "
            "BF16/FP16 312 TFLOPS)",
            "memory": f"NVIDIA A100 datasheet: {memory_gb} GB HBM2(e), "
            f"{bandwidth / GB:.0f} GB/s (SXM4)",
            "devices_per_node": "NVIDIA DGX A100 datasheet: 8 A100, 8 single-port HDR "
            "ConnectX-6 for compute",
            "intra.bandwidth": "NVIDIA A100 datasheet: NVLink 600 GB/s (both directions)",
            "intra.efficiency": "nccl-tests issue #178 (busbw 208 GB/s, 8 × A100 NVLink); "
            "#149 (~200 GB/s, HPE Apollo 6500 8 × A100 80GB)",
            "inter.bandwidth": "DGX A100 datasheet: HDR 200 Gb/s per GPU",
            "inter.efficiency": "nccl-tests issue #119: 24 × A100, 4 HDR per node, busbw peak "
            "96 of 100 GB/s (average 84.8 over 8 B–128 MB)",
            "alpha_s": _NCCL_LAT + ": NVLink 1.9 µs, NET 4.0 µs",
            "gemm_efficiency": f"{_MAMF}: A100 SXM 267.9/312 = 85.9 % at 6912×16384×2048; "
            f"small GEMMs: {_WAVES}, 108 SMs (A100 whitepaper)",
            "elementwise_efficiency": f"{_SQUARE}: A100 80GB copy 1490 of 2039 GB/s",
            "kernel_overhead_s": _KERNEL,
            "comm_compute_share": f"{_NCCL_SMS}; 8 HDR HCAs per node, 108 SMs",
            "attention_efficiency": f"{_FA2}, §1: 'reaching up to 73% of the theoretical max "
            "throughput in the forward pass, and up to 63% of the theoretical max throughput "
            "in the backward pass' (A100 80GB SXM4, §4.1); the best of its sweep over "
            "sequence length, head dimension and causal mask (an upper bound: the paper's "
            "per-length figures are plots, not read here), one value at every length",
        },
    )


def _h100() -> Hardware:
    return Hardware(
        name="DGX H100 (8 × H100 SXM5, NVLink4, 8 × NDR 400 Gb/s)",
        devices_per_node=8,
        peak_flops={
            "fp32": 67e12,
            "tf32": 494.5e12,
            "bf16": 989e12,
            "fp16": 989e12,
            "fp8": 1979e12,
        },
        memory_bytes=80 * GB,
        memory_bandwidth=3.35e12,
        # 900 GB/s bidirectional = 450 GB/s per direction; NCCL gets ~370 GB/s after its
        # ~20 % protocol overhead (NCCL maintainer, nccl-tests issue #212).
        intra=Link(name="NVLink4", alpha_s=1.9e-6, bandwidth=450 * GB, efficiency=370 / 450),
        inter=Link(name="NDR InfiniBand", alpha_s=4.0e-6, bandwidth=50 * GB, efficiency=0.96),
        # MAMF: 792.1 of 989 TFLOP/s (80.1 %) at 6144 × 17920 × 2816.
        gemm_efficiency=_wave_table(132, 2.0 * 6144 * 17920 * 2816, 0.801),
        # Not priced per shape (sms = 0): MAMF's best FP8 shape below fills only 87% of its
        # tiles and waves under `hardware.wave_fraction`, yet no better-tiled shape beat it
        # in the search: Hopper's cuBLAS avoids the quantisation that model charges.
        # fp8 MAMF: 1402.6 of 1979 TFLOP/s (70.9 %) at 1024 × 9216 × 14336.
        fp8_gemm_efficiency=_wave_table(132, 2.0 * 1024 * 9216 * 14336, 1402.6 / 1979),
        elementwise_efficiency=0.815,
        kernel_overhead_s=4e-6,
        comm_compute_share=_nccl_share(nics=8, sms=132),
        attention_efficiency=tuple((s, fwd / 989, bwd / 989) for s, fwd, bwd in _FA2_H100),
        sources={
            "peak_flops": "NVIDIA H100 Tensor Core GPU datasheet, SXM5 (dense = half the "
            "sparse figures: TF32 494.5, BF16/FP16 989, FP8 1979; FP32 67 TFLOPS)",
            "memory": "NVIDIA H100 datasheet: 80 GB HBM3, 3.35 TB/s (SXM5)",
            "devices_per_node": "NVIDIA DGX H100 datasheet: 8 H100, 8 × ConnectX-7 400 Gb/s",
            "intra.bandwidth": "NVIDIA H100 datasheet: NVLink 900 GB/s (both directions)",
            "intra.efficiency": "nccl-tests issue #212 (NCCL maintainer): 450 GB/s line rate, "
            "~370 GB/s effective with NCCL_ALGO=RING",
            "inter.bandwidth": "DGX H100 datasheet: NDR 400 Gb/s per GPU",
            "inter.efficiency": "assumption: the HDR fraction of nccl-tests issue #119 (0.96); "
            "no NDR nccl-tests figure used",
            "alpha_s": _NCCL_LAT + ": NVLink 1.9 µs, NET 4.0 µs",
            "gemm_efficiency": f"{_MAMF}: H100 SXM 792.1/989 = 80.1 % at 6144×17920×2816; "
            f"small GEMMs: {_WAVES}, 132 SMs (H100 whitepaper, SXM5)",
            "fp8_gemm_efficiency": f"{_MAMF}, its FP8 (float8_e4m3fn) table: H100 SXM "
            "1402.6/1979 = 70.9 % at 1024×9216×14336 (torch 2.7.0+cu126); small GEMMs: "
            f"{_WAVES}, 132 SMs",
            "comm_compute_share": f"{_NCCL_SMS}; 8 NDR HCAs per node, 132 SMs. A user's "
            "H100 profile shows ncclAllGather on 24 blocks beside an FSDP GEMM (NVIDIA "
            "developer forum, 'Compute-communication overlap causes severe GEMM performance "
            "degradation because of tail effect'): the share may be larger than this",
            "elementwise_efficiency": f"{_SQUARE}: H100 PCIe copy 1630 of 2000 GB/s, "
            "assumption: the same fraction on SXM5",
            "kernel_overhead_s": _KERNEL,
            "attention_efficiency": f"{_FA3}, §4.1 (H100 80GB SXM5, BF16, head dim 128, "
            "batch × length = 16k tokens), its FlashAttention-2 bars, the kernel the "
            "flash-attn 2 / PyTorch SDPA runs of 2023-24 used, TFLOP/s at s = 512 … 16k: "
            "forward with causal mask 191, 260, 298, 319, 333, 335 (Fig. 5); backward 214, "
            "260, 291, 310, 318, 322 (Fig. 6, the paper's backward benchmark, no causal panel: "
            "assumption, the causal backward reaches the same fraction); ÷ 989. "
            "FlashAttention-3 itself: forward 292 … 616, backward 316 … 561 (same figures), "
            "for a run that uses it",
        },
    )


def _v100(
    name: str,
    *,
    memory_gb: int,
    per_node: int,
    intra_bw: float,
    inter_bw: float,
    nics: int,
    notes: dict[str, str],
) -> Hardware:
    return Hardware(
        name=name,
        devices_per_node=per_node,
        peak_flops={"fp32": 15.7e12, "fp16": 125e12},
        memory_bytes=memory_gb * GB,
        memory_bandwidth=900 * GB,
        intra=Link(name="NVLink2", alpha_s=1.9e-6, bandwidth=intra_bw, efficiency=0.69),
        inter=Link(name="EDR InfiniBand", alpha_s=4.0e-6, bandwidth=inter_bw, efficiency=0.96),
        # Best square fp16 matmul 84 of 125 TFLOP/s (sizes up to 6888).
        gemm_efficiency=_wave_table(80, 2.0 * 6888**3, 84 / 125),
        sms=80,
        comm_compute_share=_nccl_share(nics=nics, sms=80),
        elementwise_efficiency=766 / 900,
        kernel_overhead_s=4e-6,
        sources={
            "peak_flops": "NVIDIA V100 datasheet, SXM2: FP16 tensor 125, FP32 15.7 TFLOPS "
            "(no bf16 on Volta)",
            "memory": f"NVIDIA V100 datasheet: {memory_gb} GB HBM2, 900 GB/s",
            "intra.efficiency": "assumption: the A100 NVLink fraction (nccl-tests #178)",
            "inter.efficiency": "assumption: the HDR fraction of nccl-tests issue #119",
            "alpha_s": _NCCL_LAT + ": NVLink 1.9 µs, NET 4.0 µs",
            "gemm_efficiency": f"{_SQUARE}: V100 32GB fp16 84 of 125 TFLOPS (square matmuls "
            f"up to 6888); small GEMMs: {_WAVES}, 80 SMs (V100 whitepaper)",
            "attention_efficiency": "none: FlashAttention-2 needs Ampere or newer and no "
            "V100 benchmark is used; attention='flash' is priced as its GEMMs (assumption)",
            "elementwise_efficiency": f"{_SQUARE}: V100 32GB copy 766 of 900 GB/s",
            "kernel_overhead_s": _KERNEL,
            "comm_compute_share": f"{_NCCL_SMS}; {nics} EDR HCAs per node, 80 SMs",
            **notes,
        },
    )


HARDWARE: dict[str, Hardware] = {
    "a100_40gb": _a100(40, 1555 * GB),
    "a100_80gb": _a100(80, 2039 * GB),
    "h100_sxm": _h100(),
    "v100_32gb": _v100(
        "DGX-1-style V100 32GB node (8 × V100 SXM2, NVLink2, 4 × EDR 100 Gb/s)",
        memory_gb=32,
        per_node=8,
        intra_bw=150 * GB,
        inter_bw=50 * GB / 8,
        nics=4,
        notes={
            "intra.bandwidth": "NVLink 2.0: 25 GB/s per link and direction (Alibaba Cloud ACK "
            "'topology-aware GPU scheduling'), 6 links per V100 = 150 GB/s; assumption: a "
            "ring on the hybrid cube-mesh uses them all",
            "devices_per_node": "assumption: DGX-1 layout, 8 GPUs and 4 EDR HCAs (100 Gb/s) "
            "per node, i.e. 6.25 GB/s per GPU; not re-sourced here",
        },
    ),
    "v100_summit": _v100(
        "OLCF Summit node (6 × V100 SXM2 16GB, NVLink2, dual-rail EDR)",
        memory_gb=16,
        per_node=6,
        intra_bw=50 * GB,
        inter_bw=25 * GB / 6,
        nics=2,
        notes={
            "devices_per_node": "OLCF Summit: 6 V100 16GB per node (as stated in the issue "
            "brief; the OLCF user guide was not re-read here)",
            "intra.bandwidth": "assumption: GPUs of a socket joined by 2 NVLink 2.0 bricks, "
            "2 × 25 GB/s per direction; the X-Bus between sockets is not modelled",
            "inter.bandwidth": "dual-rail EDR InfiniBand, 2 × 100 Gb/s = 25 GB/s per node, "
            "shared by 6 GPUs (issue brief)",
        },
    ),
}


def hardware(name: str, key: str = "hardware") -> Hardware:
    """The preset called `name`, or the preset file at `name` (a path ending in .yaml or
    .yml, or holding a separator: what `device_profile` writes, read by
    `impls.costmodel.hardware_file`). `key` is the config key errors name."""
    from impls.costmodel.hardware_file import is_hardware_file, load_hardware

    if isinstance(name, str) and is_hardware_file(name):
        try:
            return load_hardware(name)
        except ValueError as error:  # it names the file and the key inside it
            raise ValueError(f"{key}: {error}") from None
    if name not in HARDWARE:
        raise ValueError(
            f"{key}={name!r}: unknown; choose one of {', '.join(HARDWARE)}, "
            "or a preset file (path/to/hardware.yaml)"
        )
    return HARDWARE[name]


def host_hardware(
    cal: Mapping[str, Any],
    link: tuple[float, float],
    rate: float = 1.0,
    *,
    overhead_s: float | None = None,
    p2p_blocking: bool = False,
    action_overhead_s: float = 0.0,
    meeting_s: float = 0.0,
) -> Hardware:
    """A CPU host calibrated by microbenchmarks as the simulator's `Hardware`.

    `cal` holds what was measured: `peak_fp32_flops`, `peak_bf16_flops`,
    `memory_bandwidth` (bytes/s), `gemm_table` ((FLOPs, fraction of peak) points) and
    `kernel_overhead_s`; `link` the loopback's fitted (α s, β s/B)
    (`bench.kit.fit.fit_ring`). FLOP/s and bandwidth are scaled by `rate` (a rank's share of
    the host), `overhead_s` replaces the measured per-kernel overhead (None keeps it).
    Every rank sits on this one host, so the intra link serves throughout; collectives
    block the rank's one computing thread (`comm_overlap` False); with `p2p_blocking` a
    pipeline send holds its rank (the wall clock), else it is a latency (a replay);
    `meeting_s` is paid per meeting of the ranks at a collective after compute."""
    alpha, beta = link
    wire = Link(name="loopback (gloo)", alpha_s=alpha, bandwidth=1.0 / beta)
    overhead = cal["kernel_overhead_s"] if overhead_s is None else overhead_s
    return Hardware(
        name=f"this host, rate {rate:.3g} of one thread",
        devices_per_node=1 << 20,
        peak_flops={
            "fp32": cal["peak_fp32_flops"] * rate,
            "bf16": cal["peak_bf16_flops"] * rate,
        },
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        memory_bandwidth=cal["memory_bandwidth"] * rate,
        intra=wire,
        inter=wire,
        gemm_efficiency=tuple(sorted(cal["gemm_table"])),
        elementwise_efficiency=1.0,  # the copy's achieved bandwidth is already the rate
        kernel_overhead_s=overhead,
        action_overhead_s=action_overhead_s,
        collective_meeting_s=meeting_s,
        comm_overlap=False,
        p2p_blocking=p2p_blocking,
        sources={"all": "measured on this host in this run (microbenchmarks of the caller)"},
    )
