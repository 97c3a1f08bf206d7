"""Each variant moves exactly the bytes its communication pattern predicts.

A failure means a variant sends more or other messages than the lecture's analysis says
it should — an extra copy of the gradients, a weight pull that goes through a tree
instead of straight from the server, or bucket all-reduces that are not the ring's
2(N−1)/N per rank — so the traffic figures built on these counters would be wrong.
"""

from __future__ import annotations

import pytest

from impls.collectives.partition import even_splits
from tests.data_parallel.cases import ONE_BUCKET
from tests.data_parallel.dp_ranks import Case

FP32 = 4  # bytes per element


def ring_bytes(numel: int, n: int, rank: int) -> tuple[int, int]:
    """(sent, received) bytes of one ring all-reduce of `numel` fp32 elements on `rank`.

    Reduce-scatter sends every chunk but the rank's own and receives every chunk but its
    left neighbour's; all-gather sends every chunk but its right neighbour's and receives
    every chunk but its own. With chunks of M/N this is 2(N−1)/N·M each way.
    """
    if n == 1:
        return 0, 0
    length = [span[1] for span in even_splits(numel, n)]
    sent = 2 * numel - length[rank] - length[(rank + 1) % n]
    recv = 2 * numel - length[(rank - 1) % n] - length[rank]
    return sent * FP32, recv * FP32


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_all_reduce_dp_moves_one_ring_all_reduce_of_all_gradients(dp_results, n: int) -> None:
    for rank, out in enumerate(dp_results[Case("allreduce", n, "sgd")]):
        sent, recv = ring_bytes(out["numel"], n, rank)
        for traffic in out["traffic"]:
            assert (traffic["bytes_sent"], traffic["bytes_recv"]) == (sent, recv)
            assert traffic["rounds"] == 2 * (n - 1)


@pytest.mark.parametrize("cap", [16, 300, ONE_BUCKET])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_ddp_moves_one_ring_all_reduce_per_bucket(dp_results, n: int, cap: int) -> None:
    for rank, out in enumerate(dp_results[Case("ddp", n, "adam", bucket_cap_bytes=cap)]):
        per_bucket = [ring_bytes(numel, n, rank) for numel in out["bucket_numels"]]
        for traffic in out["traffic"]:
            assert traffic["bytes_sent"] == sum(sent for sent, _ in per_bucket)
            assert traffic["bytes_recv"] == sum(recv for _, recv in per_bucket)


def test_ddp_one_bucket_is_two_n_minus_one_over_n_of_the_gradients(dp_results) -> None:
    """484 parameters on 4 ranks divide evenly: exactly 2·3/4 of 1936 bytes per rank."""
    for out in dp_results[Case("ddp", 4, "adam", bucket_cap_bytes=ONE_BUCKET)]:
        assert out["numel"] == 484
        for traffic in out["traffic"]:
            assert traffic["bytes_sent"] == traffic["bytes_recv"] == 2 * 3 * 484 * FP32 // 4


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_parameter_server_is_o_n_on_the_server_and_o_1_on_workers(dp_results, n: int) -> None:
    server, *workers = dp_results[Case("ps", n, "adam")]
    m = server["numel"] * FP32
    for traffic in server["traffic"]:
        # Push: N−1 gradient messages in, one round; pull: N−1 weight messages out, one round.
        assert traffic == {
            "bytes_sent": (n - 1) * m,
            "bytes_recv": (n - 1) * m,
            "messages_sent": n - 1,
            "messages_recv": n - 1,
            "rounds": 2 if n > 1 else 0,
        }
    for worker in workers:
        for traffic in worker["traffic"]:
            assert traffic == {
                "bytes_sent": m,
                "bytes_recv": m,
                "messages_sent": 1,
                "messages_recv": 1,
                "rounds": 2,
            }
