"""The executor runs every schedule to the same loss and gradients as one process.

A failure here means a pipeline step trains a different model than the single-process
reference (a micro-batch lost, a gradient sent to the wrong stage, a loss scaled wrong, a
split backward that misses a weight), that a step does not execute exactly the plan it
was given (an action skipped or repeated, more micro-batches in flight than the plan
holds, messages the plan does not contain), or that misuse is accepted instead of refused
before any message is sent.
"""

from __future__ import annotations

import pytest
import torch

from impls.models import GPT
from impls.pipeline import build_plan, max_inflight_microbatches
from impls.pipeline.dataflow import rank_of
from impls.pipeline.schedules import stage_ranks
from tests.pipeline.executor_ranks import Case, bad_inputs, run_steps


def _cases() -> list[Case]:
    cases = [Case("naive", p, 1) for p in (2, 4)]
    for name in ("gpipe", "1f1b", "zero_bubble_h1"):
        cases += [Case(name, p, m) for p in (2, 4) for m in (1, 4, 8)]
    # Interleaving needs M % P == 0 and P·V layers; at P = 1 every hand-off is local.
    # ZB-H2 and ZB-V need M >= P; ZB-V runs 2P stages in a V (rank 0 holds the loss).
    cases += [Case("zero_bubble_h2", p, m) for p in (2, 4) for m in (4, 8)]
    cases += [Case("zero_bubble_v", p, m, 2, n_layers=2 * p) for p in (2, 4) for m in (4, 8)]
    cases += [
        Case("interleaved_1f1b", p, m, 2, n_layers=max(4, 2 * p))
        for p in (1, 2, 4)
        for m in (4, 8)
        if m % p == 0 and not (p == 1 and m == 8)
    ]
    # Two cases learn the activation shapes by messages instead of being told.
    inferred = {("1f1b", 4, 4), ("interleaved_1f1b", 2, 4), ("zero_bubble_v", 2, 4)}
    return [
        Case(**{**c.__dict__, "infer_shapes": True})
        if (c.schedule, c.stages, c.microbatches) in inferred
        else c
        for c in cases
    ]


CASES = _cases()


def _case_id(case: Case) -> str:
    shapes = "-inferred" if case.infer_shapes else ""
    return f"{case.schedule}-P{case.stages}-M{case.microbatches}-V{case.virtual_stages}{shapes}"


def _reference(case: Case) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The whole model on the whole batch in one process: mean loss and its gradients."""
    model = GPT(case.config(), seed=0)
    inputs, targets = case.batch()
    loss = GPT.loss(model(inputs), targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _gathered(outputs: list[dict]) -> dict[str, torch.Tensor]:
    """Every rank's gradients by parameter name; a name owned by two ranks is an error."""
    grads: dict[str, torch.Tensor] = {}
    for out in outputs:
        assert set(out["grads"]) == set(out["owned"]), "a held parameter got no gradient"
        for name, grad in out["grads"].items():
            assert name not in grads, f"{name} has a gradient on two ranks"
            grads[name] = grad
    return grads


def _check_against_reference(outputs: list[dict], case: Case, scale: float = 1.0) -> None:
    want_loss, want_grads = _reference(case)
    losses = [out["results"][-1].loss for out in outputs]
    placed = stage_ranks(case.schedule, case.stages, case.virtual_stages)
    last_rank = rank_of(case.stages * case.virtual_stages - 1, case.stages, placed)
    assert [r for r, loss in enumerate(losses) if loss is not None] == [last_rank]
    # float32, micro-batch sums in a different order than the full batch: ~1e-6 relative.
    torch.testing.assert_close(torch.tensor(losses[last_rank]), want_loss, rtol=1e-5, atol=1e-6)
    grads = _gathered(outputs)
    assert set(grads) == set(want_grads)
    for name, want in want_grads.items():
        # Same float32 reordering; gradients are O(1e-2), so atol 1e-6 is a few ulps of them.
        torch.testing.assert_close(grads[name], want * scale, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_loss_and_every_gradient_equal_one_process(ranks8, case: Case) -> None:
    outputs = [out for out in ranks8.run(run_steps, case) if out is not None]
    assert len(outputs) == case.stages
    _check_against_reference(outputs, case)

    plan = build_plan(case.schedule, case.stages, case.microbatches, case.virtual_stages)
    inflight = max_inflight_microbatches(plan)
    mb_bytes = (8 // case.microbatches) * case.seq_len * case.d_model * 4
    for rank, out in enumerate(outputs):
        result = out["results"][0]
        # Every action of this rank's plan (transfers included) ran exactly once, in order.
        assert [r.action for r in result.records] == out["actions"]
        assert result.max_inflight == inflight[rank]
        assert result.traffic.messages_sent == sum("SEND" in a for a in out["actions"])
        assert result.traffic.bytes_sent == result.traffic.messages_sent * mb_bytes
        assert result.peak_activation_bytes > 0


def test_gradients_accumulate_over_steps(ranks8) -> None:
    """Two steps without zeroing leave twice the gradients: the caller owns zero_grad."""
    case = Case("zero_bubble_h1", 2, 4)
    outputs = [out for out in ranks8.run(run_steps, case, steps=2) if out is not None]
    _check_against_reference(outputs, case, scale=2.0)


def test_misuse_is_refused_before_any_message(ranks8) -> None:
    errors = ranks8.run(bad_inputs)[0]
    assert all("accepted" not in e for e in errors), errors
    by_name = dict(e.split(": ", 1) for e in errors)
    assert "stage_modules" in by_name["wrong stages"]
    assert "stages=4" in by_name["wrong ranks"]
    assert "forwards never run: 0F4" in by_name["missing micro-batch"]
    assert "stage_ranks=(0,)" in by_name["short placement"]
    # ZB-V's stages 0 and 3 on rank 0, without its placement: refused, not misrouted.
    assert "stage_modules has stages [0, 3]; rank 0 holds [0, 2]" in by_name["V plan round-robin"]
    assert "inputs is required" in by_name["no inputs"]
    assert "microbatches=4" in by_name["indivisible"]
