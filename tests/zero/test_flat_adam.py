"""FlatAdam is torch's Adam/AdamW, and units are laid out and padded as ZeRO needs.

A failure here means the from-scratch optimizer that ZeRO shards does not compute what
torch.optim.Adam/AdamW computes (so every ZeRO comparison would test the wrong thing), or
that a unit's flat layout loses, duplicates or misplaces a parameter, or leaves shards of
unequal size.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from impls.models import GPT, MLP, GPTConfig, MLPConfig
from impls.zero import FlatAdam, default_unit_modules, plan_units


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_flat_adam_equals_torch(optimizer: str, weight_decay: float) -> None:
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (11,)]
    theirs = [nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    ours = [p.detach().clone().reshape(-1) for p in theirs]
    kwargs = {"lr": 3e-2, "betas": (0.8, 0.99), "eps": 1e-7, "weight_decay": weight_decay}
    torch_class = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    reference = torch_class(theirs, **kwargs)
    flat = FlatAdam([p.numel() for p in ours], optimizer=optimizer, **kwargs)
    for _ in range(5):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, grad in zip(theirs, grads, strict=True):
            p.grad = grad.clone()
        reference.step()
        flat.step(ours, [grad.reshape(-1) for grad in grads])
    for mine, want in zip(ours, theirs, strict=True):
        # The same elementwise operations in the same order as torch's single-tensor
        # Adam: equal to the last bit in practice; one ulp of slack for kernel changes.
        torch.testing.assert_close(mine, want.detach().reshape(-1), rtol=1.2e-7, atol=1e-8)
    assert flat.steps == 5


def test_flat_adam_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="optimizer='sgd'.*adam, adamw"):
        FlatAdam([3], optimizer="sgd")
    with pytest.raises(ValueError, match="lr=0"):
        FlatAdam([3], lr=0)
    with pytest.raises(ValueError, match="betas"):
        FlatAdam([3], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="segments of sizes"):
        FlatAdam([3]).step([torch.zeros(4)], [torch.zeros(4)])


def test_gpt_units_are_its_blocks_plus_a_root_unit() -> None:
    model = GPT(GPTConfig(vocab_size=29, seq_len=6, d_model=10, n_heads=2, n_layers=3))
    assert default_unit_modules(model) == list(model.blocks)
    units = plan_units(model, None, world_size=8)
    assert [u.name for u in units] == ["<root>", "blocks.0", "blocks.1", "blocks.2"]
    root_names = {s.name for s in units[0].slots}
    assert root_names == {
        "embedding.tok.weight",
        "embedding.pos.weight",
        "ln_f.weight",
        "ln_f.bias",
        "lm_head.weight",
    }
    _check_layout(model, units, world_size=8)


@pytest.mark.parametrize("world_size", [1, 3, 7, 8])
def test_every_parameter_once_padded_to_equal_shards(world_size: int) -> None:
    model = MLP(MLPConfig(in_dim=5, hidden_dim=7, out_dim=3, n_layers=3))
    units = plan_units(model, None, world_size)
    assert [u.numel for u in units] == [42, 56, 24]
    _check_layout(model, units, world_size)


def test_tied_embeddings_stay_one_parameter() -> None:
    cfg = GPTConfig(vocab_size=29, seq_len=6, d_model=10, n_heads=2, n_layers=1)
    model = GPT(GPTConfig(**{**cfg.__dict__, "tie_embeddings": True}))
    units = plan_units(model, None, world_size=2)
    names = [s.name for u in units for s in u.slots]
    assert "lm_head.weight" not in names and "embedding.tok.weight" in names
    _check_layout(model, units, world_size=2)


def test_units_that_nest_or_are_foreign_are_refused() -> None:
    model = GPT(GPTConfig(vocab_size=29, seq_len=6, d_model=10, n_heads=2, n_layers=2))
    with pytest.raises(ValueError, match="must not nest"):
        plan_units(model, [model.blocks[0], model.blocks[0].mlp], world_size=2)
    with pytest.raises(ValueError, match="submodules of the module"):
        plan_units(model, [nn.Linear(2, 2)], world_size=2)
    with pytest.raises(ValueError, match="world_size=0"):
        plan_units(model, None, world_size=0)


def _check_layout(model: nn.Module, units, world_size: int) -> None:
    """Slots tile each unit without gaps or overlaps; units and shards tile their
    concatenations; every distinct parameter appears exactly once."""
    params = [s.param for u in units for s in u.slots]
    assert len(params) == len(set(params)) == len(list(model.parameters()))
    start = shard_start = 0
    for unit in units:
        offset = 0
        for slot in unit.slots:
            assert slot.offset == offset and slot.shape == slot.param.shape
            offset += slot.numel
        assert unit.numel == offset
        assert unit.padded % world_size == 0 and 0 <= unit.padded - unit.numel < world_size
        assert (unit.start, unit.shard_start) == (start, shard_start)
        assert unit.shard_range(world_size - 1)[1] == unit.padded
        start, shard_start = start + unit.padded, shard_start + unit.shard_numel
