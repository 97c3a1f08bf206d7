"""The 3D (DP x PP x TP) step trains exactly the model single-device training does.

A failure here means the combination loses what each axis proves alone: an activation
sent to the wrong TP rank of the next stage, a gradient averaged over the wrong group (or
not at all), a replicated parameter drifting apart across TP ranks, a loss scaled twice,
or an optimizer stepping parameters of another stage.
"""

from __future__ import annotations

import pytest
import torch

from impls.hybrid import HybridTrainer, Mesh
from impls.models import GPT, GPTConfig
from tests.hybrid.step_ranks import Case, run_cases

CASES = [
    Case(dp=2, pp=2, tp=2),  # the 3D mesh on all 8 ranks
    # AdamW without biases: k_proj's bias has an exactly zero gradient (softmax ignores a
    # shift shared by all keys), so both runs hold rounding noise there, which Adam's
    # normalization turns into full +-lr steps of either sign.
    Case(dp=2, pp=2, tp=2, schedule="gpipe", microbatches=1, optimizer="adamw", bias=False),
    Case(dp=2, pp=1, tp=2),  # 2D: data x tensor
    Case(dp=1, pp=2, tp=2, microbatches=4, n_layers=3),  # 2D: pipeline x tensor, uneven stages
    # GPT-2's tied embedding on both ends of the pipeline, each TP rank a vocabulary shard
    Case(dp=2, pp=2, tp=2, tie=True),
]

# float32 throughout. TP splits every matmul's reduction over ranks and sums the partials
# in another order, micro-batches add gradients in pieces, and the dp average divides a
# sum: each reorders float32 rounding (~1e-7 relative per operation); a few steps of
# SGD with momentum (or AdamW) carry that to at most 4.8e-7 absolute, 1.4e-7 relative in
# these cases. The tolerance is ~10x above that and far below a real error (a lost
# micro-batch or an unaveraged gradient moves weights by >= 1e-3).
TOL = dict(rtol=1e-5, atol=5e-6)


def test_hybrid_training_equals_single_device(ranks8) -> None:
    errors = [e for rank_errors in ranks8.run(run_cases, CASES, TOL) for e in rank_errors]
    assert errors == []


BAD = [
    (dict(dp=2, tp=2), dict(n_heads=3, d_model=24), {}, ["tp=2", "n_heads=3"]),
    (dict(pp=4, tp=2), dict(n_layers=2), {}, ["pp=4", "n_layers=2"]),
    (dict(dp=2, sp=2), {}, {}, ["sp=2"]),
    (dict(dp=2, tp=2), dict(dropout=0.1), {}, ["dropout=0.1"]),
    (dict(dp=2, tp=2), {}, dict(global_batch_size=6), ["global_batch_size=6", "dp=2"]),
    (dict(dp=2, tp=2), {}, dict(microbatches=0), ["microbatches=0"]),
    (dict(dp=2, tp=2), {}, dict(seq_len=9), ["seq_len=9"]),
    (dict(pp=2, tp=2), {}, dict(schedule="2f2b"), ["schedule='2f2b'"]),
    (dict(dp=2, tp=2), {}, dict(algorithm="star"), ["algorithm='star'"]),
]


@pytest.mark.parametrize(("degrees", "model", "options", "names"), BAD)
def test_bad_configurations_are_refused_before_any_message(
    degrees: dict, model: dict, options: dict, names: list[str]
) -> None:
    """No process group exists here: each refusal must come before the mesh's groups."""
    cfg = dict(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2) | model
    world = 1
    for degree in degrees.values():
        world *= degree
    kwargs = dict(global_batch_size=8, microbatches=2) | options
    with pytest.raises(ValueError) as err:
        HybridTrainer(
            GPT(GPTConfig(**cfg)),
            Mesh(world, **degrees, rank=0),
            lambda params: torch.optim.SGD(params, lr=0.1),
            **kwargs,
        )
    for name in names:
        assert name in str(err.value)
