"""Loss scalers take torch.amp.GradScaler's decisions, and bad configurations are refused.

A failure here means a scaler grows, backs off or skips on a different step than
GradScaler would (so fp16 training silently diverges or wastes steps), unscales gradients
wrongly, loses its state across a checkpoint, or that a precision / loss-scale pair that
cannot train is accepted.
"""

from __future__ import annotations

import math

import pytest
import torch

from impls.precision import (
    DynamicLossScaler,
    StaticLossScaler,
    check_precision,
    compute_dtype,
    make_loss_scaler,
)

# Which steps overflow: a clean run that grows, isolated and back-to-back overflows, a NaN.
PATTERN = ["ok", "ok", "ok", "inf", "ok", "inf", "inf", "ok", "ok", "ok", "nan", "ok", "ok", "ok"]
INPUT = {"ok": 1.0, "inf": math.inf, "nan": math.nan}


def _gradscaler_run() -> list[tuple[float, bool]]:
    """(scale after the update, whether the step was applied) for each step of PATTERN."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    out = []
    for kind in PATTERN:
        before = param.detach().clone()
        optimizer.zero_grad()
        scaler.scale((param * INPUT[kind]).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        out.append((scaler.get_scale(), not torch.equal(param.detach(), before)))
    return out


def _our_run(scaler: DynamicLossScaler | StaticLossScaler) -> list[tuple[float, bool]]:
    param = torch.nn.Parameter(torch.ones(3))
    out = []
    for kind in PATTERN:
        param.grad = None
        scaler.scale_loss((param * INPUT[kind]).sum()).backward()
        stepped = scaler.update(scaler.unscale_([param.grad]))
        out.append((scaler.scale, stepped))
    return out


def test_dynamic_scaler_takes_gradscalers_decisions() -> None:
    ours = _our_run(DynamicLossScaler(init_scale=2.0**10, growth_interval=3))
    assert ours == _gradscaler_run()
    # The pattern exercises every rule: growth after 3 clean steps, backoff, repeated backoff.
    scales = [scale for scale, _ in ours]
    assert scales[:4] == [2.0**10, 2.0**10, 2.0**11, 2.0**10]
    assert scales[6] == 2.0**8
    assert [stepped for _, stepped in ours].count(False) == 4


def test_static_scaler_skips_overflows_and_keeps_its_scale() -> None:
    scaler = StaticLossScaler(128.0)
    out = _our_run(scaler)
    assert {scale for scale, _ in out} == {128.0}
    assert [stepped for _, stepped in out] == [kind == "ok" for kind in PATTERN]
    assert scaler.skipped_steps == 4


def test_unscale_divides_in_place_and_flags_non_finite_values() -> None:
    scaler = DynamicLossScaler(init_scale=8.0)
    grads = [torch.tensor([8.0, -24.0]), torch.tensor([[4.0]])]
    assert scaler.unscale_(grads) is False
    # Division by a power of two is exact.
    torch.testing.assert_close(grads[0], torch.tensor([1.0, -3.0]), rtol=0, atol=0)
    torch.testing.assert_close(grads[1], torch.tensor([[0.5]]), rtol=0, atol=0)
    assert scaler.unscale_([torch.tensor([1.0]), torch.tensor([math.inf])]) is True
    assert scaler.unscale_([torch.tensor([math.nan])]) is True


def test_backoff_stops_at_min_scale() -> None:
    scaler = DynamicLossScaler(init_scale=4.0, min_scale=1.0)
    scales = []
    for _ in range(4):
        assert scaler.update(True) is False
        scales.append(scaler.scale)
    assert scales == [2.0, 1.0, 1.0, 1.0]
    assert scaler.skipped_steps == 4


def test_state_dict_round_trip_continues_identically() -> None:
    first = DynamicLossScaler(init_scale=2.0**10, growth_interval=3)
    for found_inf in (False, False, True, False, False):
        first.update(found_inf)
    second = DynamicLossScaler()
    second.load_state_dict(first.state_dict())
    pattern = [False, True, False, False, False, False]
    assert [(first.update(f), first.scale) for f in pattern] == [
        (second.update(f), second.scale) for f in pattern
    ]
    assert second.skipped_steps == first.skipped_steps == 2


def test_scale_loss_is_float32() -> None:
    # A loss of 4 in fp16 times 2^16 would overflow fp16's 65504: the product is fp32.
    scaled = DynamicLossScaler().scale_loss(torch.tensor(4.0, dtype=torch.float16))
    assert scaled.dtype == torch.float32 and scaled.item() == 4.0 * 2**16


def test_compute_dtypes() -> None:
    assert [compute_dtype(p) for p in ("fp32", "fp16", "bf16")] == [
        torch.float32,
        torch.float16,
        torch.bfloat16,
    ]


def test_make_loss_scaler_builds_what_the_config_names() -> None:
    assert isinstance(make_loss_scaler("fp16", "dynamic"), DynamicLossScaler)
    static = make_loss_scaler("fp16", 1024)
    assert isinstance(static, StaticLossScaler) and static.scale == 1024.0
    assert make_loss_scaler("bf16", None) is None
    assert make_loss_scaler("fp32", "none") is None


@pytest.mark.parametrize(
    ("precision", "loss_scale", "names"),
    [
        ("fp8", None, ["precision='fp8'", "fp32, fp16, bf16"]),
        ("fp16", None, ["loss_scale=None", "'dynamic'"]),
        ("fp16", "none", ["loss_scale='none'", "flush to zero"]),
        ("fp16", 0, ["loss_scale=0", "positive"]),
        ("bf16", -2.0, ["loss_scale=-2.0", "positive"]),
        ("fp16", math.inf, ["loss_scale=inf", "finite"]),
        ("fp16", math.nan, ["loss_scale=nan"]),
        ("fp16", 2.0**16, ["loss_scale=65536.0", "65504"]),
        ("fp32", "auto", ["loss_scale='auto'", "'dynamic'"]),
        ("fp16", True, ["loss_scale=True"]),
    ],
)
def test_configurations_that_cannot_train_are_refused(precision, loss_scale, names) -> None:
    with pytest.raises(ValueError) as err:
        check_precision(precision, loss_scale)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"init_scale": 0.0}, "init_scale"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
        ({"min_scale": 2.0**17}, "min_scale"),
    ],
)
def test_scaler_arguments_are_validated(kwargs, key) -> None:
    with pytest.raises(ValueError, match=key):
        DynamicLossScaler(**kwargs)
