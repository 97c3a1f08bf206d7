"""Context parallelism: each of the cp ranks of a group holds seq_len/cp tokens of every
sequence, and attention runs as ring attention over the group (Liu et al. 2023, arXiv
2310.01889; Megatron-core's context parallelism sends the same blocks). `local_spec` is
what a rank computes and keeps; `ring_exposed_seconds` what its ring traffic exposes.
"""

from __future__ import annotations

from dataclasses import replace

from impls.costmodel.comm import p2p_seconds
from impls.costmodel.compute import TransformerSpec
from impls.costmodel.hardware import Hardware

__all__ = ["local_spec", "ring_exposed_seconds"]


def local_spec(spec: TransformerSpec, cp: int) -> TransformerSpec:
    """The spec one cp rank sees for its token-wise work: seq_len/cp tokens a sequence.

    The work on a rank is balanced under causal masking: Megatron-core gives each rank two of
    2·cp sequence chunks (i and 2cp − 1 − i) so every rank computes the same share of the
    visible blocks (Megatron-core API guide, "context parallelism"); the attention core is
    priced on s/cp queries against all s keys, its causal half (`costs._attention_core`).

    Memory: a rank keeps its layer's activations for s/cp tokens (`local_spec` into
    `activation_bytes_per_layer`); a materialized core then keeps one (s/cp)² block of scores
    per head, as `impls.sequence_parallel.analytic.activation_bytes_per_rank` counts ring
    attention, and a flash core only its output and log-sum-exp.
    """
    return spec if cp == 1 else replace(spec, seq_len=spec.seq_len // cp)


def ring_exposed_seconds(
    spec: TransformerSpec,
    microbatch: int,
    tp: int,
    cp: int,
    hw: Hardware,
    element_bytes: float,
    core_forward_s: float,
    core_backward_s: float,
) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's ring traffic that the attention core does
    not hide: per hop max(0, transfer − one step's compute), the compute split evenly over
    the cp steps; the backward's last dK/dV hop is never hidden.

    Ring attention (Liu et al. 2023, arXiv 2310.01889, §3; Megatron-core's context parallelism
    sends the same blocks): a rank's s/cp queries meet every rank's keys and values. In step
    i it attends to the K/V block of rank r − i while that block's successor travels one hop
    round the ring, so each of the cp − 1 transfers overlaps one step's attention compute and
    only what that compute does not cover is exposed. The counts are those of this repo's
    implementation (`impls.sequence_parallel.ring_attention`, whose traffic
    `impls.sequence_parallel.analytic.layer_traffic` counts): forward cp − 1 hops of a K and
    a V block; backward cp − 1 hops of K/V with the dK/dV accumulator one hop behind, and a
    last dK/dV hop home that nothing overlaps.

    A K or V block is what a rank holds of them: b · s/cp tokens × h·k/a/t (its tp share of
    the key/value heads) × B bytes. The ring's link is the cp group's: NVLink when the group
    (cp ranks tp apart in the tp-innermost layout) sits inside a node, else the inter-node
    link (`Hardware.group_link`); each hop is one point-to-point message (`p2p_seconds`).
    """
    if cp == 1:
        return 0.0, 0.0
    block = microbatch * spec.seq_len / cp * spec.d_model * spec.kv_fraction / tp
    block *= element_bytes
    link = hw.group_link(cp, stride=tp)
    kv = p2p_seconds(2 * block, link)  # a K and a V block
    kv_and_grads = p2p_seconds(4 * block, link)  # K, V and the dK, dV accumulator
    forward = (cp - 1) * max(0.0, kv - core_forward_s / cp)
    backward = (cp - 1) * max(0.0, kv_and_grads - core_backward_s / cp)
    return forward, backward + p2p_seconds(2 * block, link)
