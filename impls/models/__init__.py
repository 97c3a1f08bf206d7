"""The small models every distbench experiment shares, and their pipeline-stage splits.

`GPT` (a GPT-2-style decoder with separate q/k/v/o projections, ready for Megatron tensor
parallelism) and `MLP` (Linear+ReLU stack) are built deterministically from a seed or an
explicit generator, so every rank holds identical weights. `split_into_stages` and
`split_into_virtual_stages` cut either model into contiguous stages that share its
parameters.
"""

from impls.models.classifier import Classifier
from impls.models.gpt import GPT, Block, CausalSelfAttention, FeedForward, GPTConfig, GPTEmbedding
from impls.models.mlp import MLP, DenseLayer, MLPConfig
from impls.models.stages import (
    Stage,
    rank_of_stage,
    split_into_stages,
    split_into_virtual_stages,
    stage_layer_ranges,
    stage_ranges_of_counts,
    stages_of_rank,
)

__all__ = [
    "GPT",
    "MLP",
    "Block",
    "Classifier",
    "CausalSelfAttention",
    "DenseLayer",
    "FeedForward",
    "GPTConfig",
    "GPTEmbedding",
    "MLPConfig",
    "Stage",
    "rank_of_stage",
    "split_into_stages",
    "split_into_virtual_stages",
    "stage_layer_ranges",
    "stage_ranges_of_counts",
    "stages_of_rank",
]
