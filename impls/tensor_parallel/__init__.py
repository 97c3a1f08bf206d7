"""Megatron tensor parallelism (Shoeybi et al., arXiv 1909.08053) on `impls.collectives`.

`ops` holds the communication operators (`f`, `g`, gather/scatter, and the sequence-parallel
all-gather / reduce-scatter pair); `layers` the column- and row-parallel linears; `mlp`,
`attention` and `embedding` the parallel GPT pieces; `model` the whole GPT and its
analytic communication count.
"""

from impls.tensor_parallel.attention import ParallelSelfAttention
from impls.tensor_parallel.embedding import (
    VocabParallelEmbedding,
    parallel_lm_head,
    vocab_parallel_cross_entropy,
)
from impls.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from impls.tensor_parallel.mlp import ParallelFeedForward
from impls.tensor_parallel.model import (
    LAYERS,
    TPComm,
    analytic_comm,
    analytic_gpt_comm,
    check_tp_config,
    parallelize_gpt,
    sharded_dims,
    tp_loss,
)
from impls.tensor_parallel.ops import (
    all_gather_seq,
    copy_to_tp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_seq,
    scatter_to_tp,
)

__all__ = [
    "LAYERS",
    "ColumnParallelLinear",
    "ParallelFeedForward",
    "ParallelSelfAttention",
    "RowParallelLinear",
    "TPComm",
    "VocabParallelEmbedding",
    "all_gather_seq",
    "analytic_comm",
    "analytic_gpt_comm",
    "check_tp_config",
    "copy_to_tp",
    "gather_from_tp",
    "parallel_lm_head",
    "parallelize_gpt",
    "reduce_from_tp",
    "reduce_scatter_seq",
    "scatter_to_tp",
    "sharded_dims",
    "tp_loss",
    "vocab_parallel_cross_entropy",
]
