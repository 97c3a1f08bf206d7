"""A GPT with tied embeddings trains under pipeline parallelism exactly as in one process.

The first stage's token embedding and the last stage's LM head are one matrix; after the
pipeline's backward, `EmbeddingGroup.all_reduce_gradients` sums its two gradient parts over
the ranks holding those stages (Megatron's embedding group). A failure means a tied GPT
under PP trains a different model than one process (a part of the tied gradient missing or
counted twice, a rank outside the pair sending, the two copies drifting apart after an
optimizer step), or that a caller's wrong claim about who holds the tied weight is accepted
instead of refused before any message is sent.
"""

from __future__ import annotations

import pytest
import torch

from tests.pipeline.tied_ranks import (
    TiedCase,
    misuse,
    reference,
    run_tied,
    v_shaped_on_one_rank,
)

TIED = "embedding.tok.weight"  # the one name named_parameters gives the shared Parameter
_CFG = TiedCase("any", 1).config()
TIED_BYTES = _CFG.vocab_size * _CFG.d_model * 4  # the V x h float32 matrix

CASES = [TiedCase(s, p) for s in ("gpipe", "1f1b", "zero_bubble_h1") for p in (2, 4)] + [
    TiedCase("interleaved_1f1b", 2, virtual_stages=2),  # last stage 3 on rank 1
    TiedCase("1f1b", 1),  # one rank holds both: nothing to send
]


def _case_id(case: TiedCase) -> str:
    return f"{case.schedule}-P{case.stages}-V{case.virtual_stages}"


def _outputs(ranks8, case: TiedCase) -> list[dict]:
    outputs = [out for out in ranks8.run(run_tied, case) if out is not None]
    assert len(outputs) == case.stages
    return outputs


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_loss_every_gradient_and_the_step_equal_one_process(ranks8, case: TiedCase) -> None:
    want = reference(case)
    outputs = _outputs(ranks8, case)
    first, last = 0, (case.stages * case.virtual_stages - 1) % case.stages
    assert all(out["pair"] == (first, last) for out in outputs)
    holders = [r for r, out in enumerate(outputs) if out["holds_tied"]]
    assert holders == sorted({first, last})
    # Built from one seed, the two ranks' copies are bit-identical before the step.
    assert torch.equal(outputs[first]["initial"], outputs[last]["initial"])

    # float32, micro-batch sums in another order than the full batch: ~1e-6 relative.
    torch.testing.assert_close(
        torch.tensor(outputs[last]["loss"]), want["loss"], rtol=1e-5, atol=1e-6
    )
    seen: set[str] = set()
    for rank, out in enumerate(outputs):
        for name, grad in out["grads"].items():
            assert name == TIED or name not in seen, f"{name} has a gradient on two ranks"
            seen.add(name)
            torch.testing.assert_close(
                grad, want["grads"][name], rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}"
            )
    assert seen == set(want["grads"])
    # Both ranks hold the same sum, to the bit, so one optimizer step keeps them identical.
    assert torch.equal(outputs[first]["grads"][TIED], outputs[last]["grads"][TIED])
    assert torch.equal(outputs[first]["stepped"], outputs[last]["stepped"])
    torch.testing.assert_close(outputs[first]["stepped"], want["stepped"], rtol=1e-5, atol=1e-6)

    for rank, out in enumerate(outputs):
        traffic, sent = out["traffic"], first != last and rank in (first, last)
        assert traffic.bytes_sent == traffic.bytes_recv == (TIED_BYTES if sent else 0)
        assert traffic.messages_sent == traffic.rounds == int(sent)
        assert out["calls"].get("all_reduce", 0) == int(sent)


def test_without_the_sum_the_copies_drift_apart(ranks8) -> None:
    """The negative control: each rank's tied gradient is only its own part, so the two
    copies differ after one step (the equality above is not vacuous)."""
    case = TiedCase("1f1b", 2, sync=False)
    want = reference(case)
    first, last = _outputs(ranks8, case)
    for out in (first, last):
        assert not torch.allclose(out["grads"][TIED], want["grads"][TIED], atol=1e-6)
    torch.testing.assert_close(
        first["grads"][TIED] + last["grads"][TIED], want["grads"][TIED], rtol=1e-5, atol=1e-6
    )
    assert not torch.equal(first["stepped"], last["stepped"])


def test_one_rank_holding_first_and_last_stage_sends_nothing(ranks8) -> None:
    """The V-shaped placement's rank 0 holds stages 0 and 3 of 4: autograd summed the parts."""
    outputs = [out for out in ranks8.run(v_shaped_on_one_rank) if out is not None]
    want = reference(TiedCase("v", 2))
    assert [out["holds_tied"] for out in outputs] == [True, False]
    torch.testing.assert_close(outputs[0]["grad"], want["grads"][TIED], rtol=1e-5, atol=1e-6)
    assert all(out["traffic"].bytes_sent == out["traffic"].rounds == 0 for out in outputs)


def test_misuse_is_refused_before_any_message(ranks8) -> None:
    rank0, rank1 = (dict(e.split(": ", 1) for e in errors) for errors in ranks8.run(misuse)[:2])
    for by_name in (rank0, rank1):
        assert "tie_embeddings=False" in by_name["untied"]
        assert "not tied" in by_name["mlp"]
        assert "last_rank=2" in by_name["rank out of range"]
        assert "not a Stage" in by_name["not a stage"]
        assert "two different tied Parameters" in by_name["two models on one rank"]
    # Only the rank a claim is about can refute it; the other is outside the pair.
    assert "first_rank=1" in rank1["first on the wrong rank"]
    assert "not the first stage" in rank1["first on the wrong rank"]
    assert rank0["first on the wrong rank"] == "ok"
    assert "last_rank=0" in rank0["last on the wrong rank"]
    assert "not the last stage" in rank0["last on the wrong rank"]
    assert rank1["last on the wrong rank"] == "ok"
