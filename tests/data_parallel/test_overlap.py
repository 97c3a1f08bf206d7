"""DDP all-reduces buckets during backward with overlap=True, and after it without.

The model's backward sleeps 50 ms between its last layers and its first (a stand-in for
an expensive early layer), so the first bucket is complete long before backward ends.
A failure means the communication thread does not start work until backward returns
(no overlap at all), the baseline overlaps when it should not, or buckets run out of
order.
"""

from __future__ import annotations

import pytest

from tests.data_parallel.dp_ranks import overlap_timelines


@pytest.fixture(scope="module")
def timelines(ranks8) -> list[dict]:
    return [out for out in ranks8.run(overlap_timelines, 2) if out is not None]


def test_with_overlap_the_first_bucket_starts_before_backward_ends(timelines) -> None:
    for per_rank in timelines:
        for timeline in per_rank[True]:
            first = timeline.buckets[0]
            assert first.ready < first.started < timeline.backward_end
            assert timeline.overlapped
            _check_in_order(timeline)


def test_without_overlap_every_bucket_starts_after_backward(timelines) -> None:
    for per_rank in timelines:
        for timeline in per_rank[False]:
            assert not timeline.overlapped
            assert all(b.ready < timeline.backward_end <= b.started for b in timeline.buckets)
            _check_in_order(timeline)


def _check_in_order(timeline) -> None:
    """Buckets become ready in backward order and are all-reduced one after the other."""
    buckets = timeline.buckets
    assert len(buckets) > 1
    assert [b.index for b in buckets] == list(range(len(buckets)))
    for before, after in zip(buckets, buckets[1:], strict=False):
        assert before.ready <= after.ready
        assert before.finished <= after.started
    assert all(b.started <= b.finished for b in buckets)
