"""Sequence parallelism: Megatron-SP, DeepSpeed-Ulysses and Ring Attention.

Each splits a (b, s, h) activation along the sequence over P ranks (`shard_sequence`), and
each equals full causal attention (or the full transformer block, for Megatron-SP) in
outputs and gradients. `analytic` gives each method's communication and activation
volumes from its paper, which the tests check against the communicator's counters.
"""

from impls.sequence_parallel.analytic import (
    LayerTraffic,
    activation_bytes_per_rank,
    layer_traffic,
)
from impls.sequence_parallel.common import (
    all_reduce_replicated_grads,
    gather_sequence,
    local_seq_len,
    shard_sequence,
)
from impls.sequence_parallel.megatron_sp import MegatronSPBlock
from impls.sequence_parallel.ring_attention import RingAttention, ring_attention
from impls.sequence_parallel.ulysses import UlyssesAttention, heads_to_seq, seq_to_heads

__all__ = [
    "LayerTraffic",
    "MegatronSPBlock",
    "RingAttention",
    "UlyssesAttention",
    "activation_bytes_per_rank",
    "all_reduce_replicated_grads",
    "gather_sequence",
    "heads_to_seq",
    "layer_traffic",
    "local_seq_len",
    "ring_attention",
    "seq_to_heads",
    "shard_sequence",
]
