"""Tests of `impls.simulator`; the hand-built clusters they share live here."""

from __future__ import annotations

from impls.costmodel.compute import TransformerSpec
from impls.costmodel.hardware import Hardware, Link

TINY = TransformerSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=128, seq_len=16)
GPT3 = TransformerSpec(n_layers=96, d_model=12288, n_heads=96, vocab_size=51200, seq_len=2048)


def flat_hardware(
    *, alpha_s: float = 0.0, bandwidth: float = 1e30, per_node: int = 8, memory_bytes: float = 80e9
) -> Hardware:
    """A device with one GEMM efficiency (0.5), no kernel overhead, element-wise work at
    the full 1e12 B/s, and the same link inside and across nodes: numbers a test can redo
    by hand. The defaults make communication free (α = 0, bandwidth 1e30 B/s)."""
    link = Link(name="flat", alpha_s=alpha_s, bandwidth=bandwidth)
    return Hardware(
        name="flat",
        devices_per_node=per_node,
        peak_flops={"bf16": 1e14},
        memory_bytes=memory_bytes,
        memory_bandwidth=1e12,
        intra=link,
        inter=link,
        gemm_efficiency=((1.0, 0.5),),
        elementwise_efficiency=1.0,
    )


def a100_like() -> Hardware:
    """An A100-80GB-like node of 8 with 200 Gb/s-per-GPU InfiniBand (rough public figures:
    312 TFLOP/s bf16, 2 TB/s HBM, NVLink 300 GB/s per direction); not a calibrated preset."""
    return Hardware(
        name="a100_like",
        devices_per_node=8,
        peak_flops={"bf16": 312e12},
        memory_bytes=80e9,
        memory_bandwidth=2.0e12,
        intra=Link(name="nvlink", alpha_s=5e-6, bandwidth=300e9, efficiency=0.8),
        inter=Link(name="ib", alpha_s=1e-5, bandwidth=25e9, efficiency=0.8),
        gemm_efficiency=((1e9, 0.3), (1e11, 0.7), (1e12, 0.8)),
        kernel_overhead_s=3e-6,
    )
