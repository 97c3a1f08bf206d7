"""Tests of `impls.planner`; the small model and cluster they share live here."""

from __future__ import annotations

from impls.costmodel.compute import TransformerSpec
from impls.costmodel.hardware import Hardware, Link

GPT8 = TransformerSpec(n_layers=8, d_model=1024, n_heads=16, vocab_size=32000, seq_len=1024)
"""An 8-layer GPT (≈ 0.17 B parameters with its embedding and head)."""


def small_cluster(memory_bytes: float = 16e9) -> Hardware:
    """Two nodes of 4 A100-like GPUs with little memory (rough public figures, not a preset):
    NVLink inside a node, a 25 GB/s link between nodes, memory small enough to matter."""
    return Hardware(
        name="small_cluster",
        devices_per_node=4,
        peak_flops={"bf16": 312e12},
        memory_bytes=memory_bytes,
        memory_bandwidth=2.0e12,
        intra=Link(name="nvlink", alpha_s=5e-6, bandwidth=300e9, efficiency=0.8),
        inter=Link(name="ib", alpha_s=1e-5, bandwidth=25e9, efficiency=0.8),
        gemm_efficiency=((1e9, 0.3), (1e11, 0.7), (1e12, 0.8)),
        kernel_overhead_s=3e-6,
    )
