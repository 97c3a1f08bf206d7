"""Misconfigured data parallelism is refused before any message is sent, naming the key.

A failure means a configuration that cannot work (fp16 without a loss scale, an unknown
precision or algorithm, a bucket cap that is not positive, a communication group that
would interleave with the training thread's or has other ranks, a batch that does not
split evenly, a parameter outside the loss) is accepted and fails later, or hangs.
"""

from __future__ import annotations

import pytest
import torch

from impls.data_parallel import assign_buckets, shard_batch
from tests.data_parallel.dp_ranks import bad_inputs


def test_misuse_is_refused(ranks8) -> None:
    errors = ranks8.run(bad_inputs)[0]
    assert all("accepted" not in e for e in errors), errors
    by_name = dict(e.split(": ", 1) for e in errors)
    assert "loss_scale=None" in by_name["fp16 without scale"]
    assert "precision='fp64'" in by_name["bad precision"]
    assert "algorithm='butterfly'" in by_name["bad algorithm"]
    assert "bucket_cap_bytes=0" in by_name["zero cap"]
    assert "sync_group must be a different process group" in by_name["same group"]
    assert "rank 0 of 4" in by_name["wrong group size"]
    assert "world_size=2" in by_name["indivisible batch"]
    assert "torch.optim.Optimizer" in by_name["not an optimizer"]
    for variant in ("DDP", "AllReduceDP"):
        assert "spare.weight, spare.bias" in by_name[f"unused parameter {variant}"]


def test_shard_batch_splits_along_dim_zero() -> None:
    batch = torch.arange(12).view(6, 2)
    assert torch.equal(shard_batch(batch, 1, 3), batch[2:4])
    with pytest.raises(ValueError, match="batch size 6 is not divisible by world_size=4"):
        shard_batch(batch, 0, 4)


def test_buckets_close_on_the_cap_and_on_a_dtype_change() -> None:
    f32, f16 = torch.float32, torch.float16
    # Parameters visited last to first: 40 + 60 = 100 fits the cap exactly; 10 does not.
    assert assign_buckets([10, 60, 40], [f32] * 3, 100) == [[2, 1], [0]]
    # A parameter bigger than the cap gets its own bucket.
    assert assign_buckets([8, 500, 8], [f32] * 3, 100) == [[2], [1], [0]]
    # One buffer holds one dtype.
    assert assign_buckets([4, 4, 4], [f32, f16, f16], 100) == [[2, 1], [0]]


@pytest.mark.parametrize("cap", [0, -1, 2.5, True])
def test_bucket_cap_must_be_a_positive_integer(cap) -> None:
    with pytest.raises(ValueError, match="bucket_cap_bytes"):
        assign_buckets([4], [torch.float32], cap)
