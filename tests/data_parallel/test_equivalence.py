"""Data parallelism on N ranks with batch B/N each trains exactly like one process with B.

The lecture's proof, checked on every variant (parameter server, all-reduce DP, DDP),
N = 1, 2, 3, 4 and 8, SGD and Adam, every all-reduce algorithm, bucket caps smaller than
one parameter, uneven, and one bucket for everything, with and without overlap, on the
MLP and the GPT; and DDP against torch.nn.parallel.DistributedDataParallel on the same
ranks. A failure means a variant averages the wrong gradients (a missing or
double-counted shard, a wrong divisor, a bucket copied to the wrong place), lets
replicas drift apart, or steps differently from torch's DDP.
"""

from __future__ import annotations

import pytest
import torch

from tests.data_parallel.cases import BELOW_ONE_PARAM, FP32_CASES, ONE_BUCKET, TORCH_DDP_CASES
from tests.data_parallel.dp_ranks import Case


def check_against_reference(case: Case, outputs: list[dict]) -> None:
    assert len(outputs) == case.world_size
    want_losses, want_params = case.reference()
    mean_losses = torch.tensor([out["losses"] for out in outputs]).mean(dim=0)
    # float32, the batch mean computed as a mean of shard means: ~1e-7 relative.
    torch.testing.assert_close(mean_losses, torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    for rank, out in enumerate(outputs):
        for name, want in want_params.items():
            # Gradients summed in another order (per shard, then over ranks), then at most
            # 3 steps: float32 rounding only. Weights are O(0.1-1): atol 1e-5 is ~100 ulps.
            torch.testing.assert_close(
                out["params"][name], want, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {name}"
            )


def check_replicas_identical(outputs: list[dict]) -> None:
    """Bitwise: every rank applies the same update to the same weights."""
    for rank, out in enumerate(outputs[1:], start=1):
        for name, value in outputs[0]["params"].items():
            assert torch.equal(out["params"][name], value), f"rank {rank} {name} drifted"


@pytest.mark.parametrize("case", FP32_CASES, ids=lambda c: c.name)
def test_n_ranks_train_like_one_process(dp_results, case: Case) -> None:
    outputs = dp_results[case]
    check_against_reference(case, outputs)
    check_replicas_identical(outputs)
    assert all(all(out["stepped"]) for out in outputs)


@pytest.mark.parametrize("torch_case", TORCH_DDP_CASES, ids=lambda c: c.name)
def test_ddp_equals_torch_ddp(dp_results, torch_case: Case) -> None:
    ours = dp_results[Case("ddp", torch_case.world_size, "adam", model=torch_case.model)]
    theirs = dp_results[torch_case]
    check_against_reference(torch_case, theirs)
    for rank, (mine, torchs) in enumerate(zip(ours, theirs, strict=True)):
        # Same float32 math; the sums over ranks differ in order (our ring vs gloo's).
        torch.testing.assert_close(
            torch.tensor(mine["losses"]), torch.tensor(torchs["losses"]), rtol=1e-5, atol=1e-6
        )
        for name, value in torchs["params"].items():
            torch.testing.assert_close(
                mine["params"][name], value, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {name}"
            )


def _names(*layers_and_kinds: tuple[int, str]) -> list[str]:
    return [f"layers.{layer}.linear.{kind}" for layer, kind in layers_and_kinds]


BACKWARD_ORDER = [
    (2, "bias"),
    (2, "weight"),
    (1, "bias"),
    (1, "weight"),
    (0, "bias"),
    (0, "weight"),
]


@pytest.mark.parametrize(
    ("cap", "want"),
    [
        (BELOW_ONE_PARAM, [_names(p) for p in BACKWARD_ORDER]),
        # 16 + 256 bytes fit in 300; each later parameter would overflow its predecessor's.
        (300, [_names(*BACKWARD_ORDER[:2])] + [_names(p) for p in BACKWARD_ORDER[2:]]),
        (ONE_BUCKET, [_names(*BACKWARD_ORDER)]),
    ],
)
def test_buckets_follow_backward_order_and_the_cap(dp_results, cap: int, want) -> None:
    for out in dp_results[Case("ddp", 2, "adam", bucket_cap_bytes=cap)]:
        assert out["buckets"] == want
