"""Pipeline stages of the GPT and MLP compose to exactly the full model.

For every stage count (and for Megatron virtual stages), running the stages in order gives
the full model's outputs, and backward of the same loss gives every parameter the full
model's gradient, both with the autograd graph intact and with the graph cut at each stage
boundary as a pipeline executor does (detach, receive the gradient, backward).

A failure means the pipeline executor (issue 3) would train a different model than the
single-process reference: a layer skipped or repeated, parameters copied instead of shared,
or the embeddings / LM head on the wrong stage.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from impls.models import (
    GPT,
    MLP,
    GPTConfig,
    MLPConfig,
    Stage,
    rank_of_stage,
    split_into_stages,
    split_into_virtual_stages,
    stage_layer_ranges,
    stages_of_rank,
)

# 5 layers, so most stage counts split unevenly.
GPT_CFG = GPTConfig(vocab_size=40, seq_len=10, d_model=16, n_heads=2, n_layers=5)
MLP_CFG = MLPConfig(in_dim=6, hidden_dim=12, out_dim=3, n_layers=5)


def gpt_case(tie: bool = False) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    cfg = GPTConfig(**{**vars(GPT_CFG), "tie_embeddings": tie})
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len + 1), generator=g)
    return GPT(cfg, seed=0), idx[:, :-1], idx[:, 1:]


def mlp_case() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, MLP_CFG.in_dim, generator=g), torch.randn(4, MLP_CFG.out_dim, generator=g)
    return MLP(MLP_CFG, seed=0), x, y


CASES: dict[str, Callable[[], tuple[nn.Module, torch.Tensor, torch.Tensor]]] = {
    "gpt": gpt_case,
    "gpt_tied": lambda: gpt_case(tie=True),
    "mlp": mlp_case,
}


def reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    model.loss(out, y).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def run_connected(stages: list[Stage], model: nn.Module, x, y) -> torch.Tensor:
    for stage in stages:
        x = stage(x)
    model.loss(x, y).backward()
    return x.detach()


def run_cut(stages: list[Stage], model: nn.Module, x, y) -> torch.Tensor:
    """As a pipeline runs them: each stage sees a detached input and gets its output's
    gradient from the next stage."""
    inputs, outputs = [], []
    for stage in stages:
        x = x.detach().requires_grad_(x.is_floating_point())
        inputs.append(x)
        outputs.append(stage(x))
        x = outputs[-1]
    model.loss(x, y).backward()
    for i in range(len(stages) - 1, 0, -1):
        outputs[i - 1].backward(inputs[i].grad)
    return x.detach()


def assert_matches(model, x, y, stages: list[Stage], run: Callable, tol: dict) -> None:
    want_out, want_grads = reference(model, x, y)
    torch.testing.assert_close(run(stages, model, x, y), want_out, **tol)
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient through the stages"
        torch.testing.assert_close(p.grad, want_grads[name], **tol, msg=name)


# Connected: the very same autograd graph as the full model, so bitwise equal. Cut: the same
# ops too (bitwise equal on this CPU build), but the two gradient paths into a boundary
# activation (residual and LayerNorm) are summed by a separate backward call whose order
# autograd does not promise, so allow float32 rounding, ~1e-6.
EXACT = {"rtol": 0, "atol": 0}
CUT_TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n_stages", range(1, 6))
def test_stages_compose_to_the_full_model(case: str, n_stages: int) -> None:
    model, x, y = CASES[case]()
    stages = split_into_stages(model, n_stages)
    assert len(stages) == n_stages
    assert_matches(model, x, y, stages, run_connected, EXACT)
    assert_matches(model, x, y, stages, run_cut, CUT_TOL)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("n_ranks", "n_virtual"), [(2, 2), (1, 3), (2, 1)])
def test_virtual_stages_compose_to_the_full_model(case: str, n_ranks: int, n_virtual: int) -> None:
    model, x, y = CASES[case]()
    stages = split_into_virtual_stages(model, n_ranks, n_virtual)
    assert [s.index for s in stages] == list(range(n_ranks * n_virtual))
    assert_matches(model, x, y, stages, run_cut, CUT_TOL)


def test_stages_share_parameters_and_cover_the_model_once() -> None:
    model, _, _ = gpt_case()
    stages = split_into_stages(model, 3)
    owned = [id(p) for s in stages for p in s.parameters()]
    assert len(owned) == len(set(owned)), "a parameter sits on two stages"
    assert set(owned) == {id(p) for p in model.parameters()}, "stages copy or miss parameters"
    assert [s.layer_ids for s in stages] == [range(0, 2), range(2, 4), range(4, 5)]
    assert stages[1].block2 is model.blocks[2]


def test_gpt_stage_ownership_of_embedding_and_head() -> None:
    model, _, _ = gpt_case()
    first, middle, last = split_into_stages(model, 3)
    assert first.is_first and not first.is_last and last.is_last
    assert first.embedding is model.embedding and "ln_f" not in dict(first.named_children())
    assert not {"embedding", "ln_f", "lm_head"} & set(dict(middle.named_children()))
    assert last.ln_f is model.ln_f and last.lm_head is model.lm_head
    assert "embedding" not in dict(last.named_children())
    (whole,) = split_into_stages(model, 1)
    assert list(dict(whole.named_children())) == [
        "embedding",
        *(f"block{i}" for i in range(5)),
        "ln_f",
        "lm_head",
    ]


def test_tied_embedding_is_one_parameter_on_first_and_last_stage() -> None:
    model, _, _ = gpt_case(tie=True)
    first, last = split_into_stages(model, 2)
    assert first.embedding.tok.weight is last.lm_head.weight
    assert first.tied_weight is last.tied_weight is model.embedding.tok.weight
    # Named once by the model, and not again by the stage that names it `tied_weight`.
    assert [n for n, _ in first.named_parameters()].count("embedding.tok.weight") == 1
    assert "lm_head.weight" not in dict(model.named_parameters())


def test_tied_weight_is_named_on_the_end_stages_only() -> None:
    """What a pipeline's embedding group reads: the end stages of a tied GPT name the
    shared matrix, built bit-identically by two ranks from one seed; nothing else does."""
    tied_a, _, _ = gpt_case(tie=True)
    tied_b, _, _ = gpt_case(tie=True)  # as another rank builds it
    stages_a, stages_b = split_into_stages(tied_a, 4), split_into_stages(tied_b, 4)
    assert [s.tied_weight is not None for s in stages_a] == [True, False, False, True]
    assert torch.equal(stages_a[0].tied_weight, stages_b[-1].tied_weight)
    (whole,) = split_into_stages(tied_a, 1)
    assert whole.tied_weight is tied_a.lm_head.weight
    untied, _, _ = gpt_case()
    mlp, _, _ = mlp_case()
    assert all(s.tied_weight is None for s in split_into_stages(untied, 2))
    assert all(s.tied_weight is None for s in split_into_stages(mlp, 2))


def test_split_refuses_a_broken_tie() -> None:
    model, _, _ = gpt_case(tie=True)
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    with pytest.raises(ValueError, match="tie_embeddings=True"):
        split_into_stages(model, 2)


def test_balanced_contiguous_ranges() -> None:
    assert stage_layer_ranges(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert stage_layer_ranges(4, 4) == [range(i, i + 1) for i in range(4)]
    for n_layers in range(1, 9):
        for n_stages in range(1, n_layers + 1):
            ranges = stage_layer_ranges(n_layers, n_stages)
            assert [i for r in ranges for i in r] == list(range(n_layers))
            assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_interleaved_rank_assignment() -> None:
    assert stages_of_rank(0, 4, 2) == [0, 4]
    assert stages_of_rank(3, 4, 2) == [3, 7]
    assert stages_of_rank(1, 2, 1) == [1]
    for stage in range(8):
        assert stage in stages_of_rank(rank_of_stage(stage, 4), 4, 2)
    with pytest.raises(ValueError, match="rank=4"):
        stages_of_rank(4, 4, 2)
    with pytest.raises(ValueError, match="n_virtual"):
        stages_of_rank(0, 4, 0)


@pytest.mark.parametrize("case", ["gpt", "mlp"])
@pytest.mark.parametrize("n_stages", [0, 6, -1])
def test_split_refuses_bad_stage_counts(case: str, n_stages: int) -> None:
    model, _, _ = CASES[case]()
    with pytest.raises(ValueError, match="stages=") as err:
        split_into_stages(model, n_stages)
    if n_stages > 0:
        assert "5 blocks" in str(err.value) or "5 Linear layers" in str(err.value)


def test_virtual_split_refuses_too_many_stages_and_bad_degrees() -> None:
    model, _, _ = gpt_case()
    with pytest.raises(ValueError, match=r"stages=6 \(n_ranks=3 x n_virtual=2\).*5 blocks"):
        split_into_virtual_stages(model, 3, 2)
    with pytest.raises(ValueError, match="n_ranks"):
        split_into_virtual_stages(model, 0, 2)


def test_split_refuses_other_models() -> None:
    with pytest.raises(TypeError, match="GPT or MLP"):
        split_into_stages(nn.Linear(2, 2), 1)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("counts", [(1, 3, 1), (0, 2, 3), (3, 1, 1), (2, 3, 0), (0, 5), (5,)])
def test_stages_of_given_counts_compose_to_the_full_model(case: str, counts: tuple) -> None:
    """Unequal counts, as a planner picks them; a GPT's end stage may hold only the embedding
    or the LM head (an MLP has no such layer, so its stages each need one)."""
    model, x, y = CASES[case]()
    if case == "mlp" and 0 in counts:
        with pytest.raises(ValueError, match="layer_counts="):
            split_into_stages(model, len(counts), layer_counts=counts)
        return
    stages = split_into_stages(model, len(counts), layer_counts=counts)
    assert [len(s.layer_ids) for s in stages] == list(counts)
    assert_matches(model, x, y, stages, run_connected, EXACT)
    assert_matches(model, x, y, stages, run_cut, CUT_TOL)


def test_equal_counts_are_the_default_split() -> None:
    model, _, _ = gpt_case()
    counts = [len(r) for r in stage_layer_ranges(5, 3)]
    given = split_into_stages(model, 3, layer_counts=counts)
    default = split_into_stages(model, 3)
    assert [list(s.named_children()) for s in given] == [list(s.named_children()) for s in default]


@pytest.mark.parametrize(
    ("counts", "needle"),
    [
        ((2, 2, 2), "sum to 6, not the model's 5 blocks"),
        ((2, 0, 3), "a middle stage with no blocks"),
        ((2, -1, 4), "int ≥ 0"),
        ((2, 3), "2 counts for stages=3"),
    ],
)
def test_split_refuses_counts_it_cannot_run(counts: tuple, needle: str) -> None:
    model, _, _ = gpt_case()
    with pytest.raises(ValueError, match="layer_counts=") as err:
        split_into_stages(model, 3, layer_counts=counts)
    assert needle in str(err.value)
