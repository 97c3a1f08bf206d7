"""Data parallelism with compressed gradients, and the exchange that moves the payloads.

`CompressedDP` on 4 ranks: without a compressor it must train exactly like one process
on the whole batch; with an fp16 cast, closely, on half the bytes; with Top-K every
replica must step with the mean over ranks of what each rank's own payload decodes to,
stay bitwise identical to the others, and send exactly what the ring all-gather of its
payload bytes sends. The exchange's byte buffer must give every tensor back bit for bit,
whatever dtypes sit next to each other in it.

A failure means a compressed run's accuracy or bytes per step (the figures of the
`gradient_compression` report) would not be those of the method it names: a payload
misread at an odd offset, a rank's gradient counted twice or lost, replicas drifting
apart, or a byte count that is not what went over the wire.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from impls.collectives.partition import even_splits
from impls.compression import Payload, TopK
from impls.compression.exchange import all_reduce_average, pack_payloads, unpack_payloads
from tests.data_parallel.compressed_ranks import (
    EXCHANGE_COMPRESSORS,
    TOPK_DENSITY,
    compressed_training,
    exchange_grads,
    exchanges,
    integer_grads,
)
from tests.data_parallel.dp_ranks import Case

N = 4
CASE = Case("allreduce", N)


# --- the byte buffer, on one process -------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so NaN payloads and −0.0 compare too."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _mixed_payloads() -> list[Payload]:
    g = torch.Generator().manual_seed(3)
    special = torch.tensor([float("nan"), float("inf"), -0.0, -1.5, 3.25e-39])
    return [
        Payload(
            {
                "u8": torch.tensor([1, 200, 255], dtype=torch.uint8),  # 3 bytes: odd
                "f32": torch.randn(2, 3, generator=g),  # starts at byte 3
                "i32": torch.tensor([-(2**31), 2**31 - 1, 7], dtype=torch.int32),
                "f16": torch.randn(5, generator=g).half(),  # 10 bytes
                "i8": torch.tensor([-128, -1, 0, 127, 5, 9], dtype=torch.int8),
                "special": special,  # starts at byte 3 + 24 + 12 + 10 + 6 = 55
            },
            torch.Size([4, 4]),
            {"k": 3, "scale": 0.5},
        ),
        Payload(
            {
                "scalar": torch.tensor(2.5),  # 0-dim
                "odd": torch.tensor([1, 2, 3], dtype=torch.int8),
                "transposed": torch.randn(3, 4, generator=g).t(),  # not contiguous
                "bf16": torch.randn(3, generator=g).bfloat16(),
                "empty": torch.zeros(0, dtype=torch.float32),
                "last": torch.tensor([7.0]),
            },
            torch.Size([9]),
        ),
    ]


def _assert_same_payloads(got: list[Payload], want: list[Payload]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert list(a.tensors) == list(b.tensors)
        assert a.shape == b.shape and a.meta == b.meta
        for name, t in b.tensors.items():
            u = a.tensors[name]
            assert (u.dtype, u.shape) == (t.dtype, t.shape), name
            assert torch.equal(_bits(u), _bits(t)), name


def test_pack_then_unpack_gives_every_tensor_back_bit_for_bit():
    payloads = _mixed_payloads()
    buffer, layout = pack_payloads(payloads)
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1
    assert buffer.numel() == sum(p.nbytes for p in payloads)
    # The odd-sized uint8/int8 tensors put later fp32/int32/fp16 tensors off alignment.
    assert [name for name, _, _ in layout][:2] == ["u8", "f32"]
    _assert_same_payloads(unpack_payloads(buffer, payloads, layout), payloads)


@pytest.mark.parametrize("offset", [1, 3, 6])
def test_unpack_reads_a_chunk_at_an_odd_offset_of_a_larger_buffer(offset):
    """What the all-gather hands `unpack_payloads`: row `peer` of the gathered buffer."""
    payloads = _mixed_payloads()
    buffer, layout = pack_payloads(payloads)
    big = torch.zeros(offset + buffer.numel() + 5, dtype=torch.uint8)
    big[offset : offset + buffer.numel()] = buffer
    chunk = big[offset : offset + buffer.numel()]
    assert chunk.storage_offset() == offset
    _assert_same_payloads(unpack_payloads(chunk, payloads, layout), payloads)


def test_unpack_follows_the_layout_not_the_tensors_of_like():
    """The receiver holds its own payloads as `like`: values must come from the buffer."""
    theirs = [
        Payload(
            {"v": torch.tensor([1.0, 2.0]), "i": torch.tensor([1], dtype=torch.int8)},
            torch.Size([2]),
        )
    ]
    mine = [
        Payload(
            {"v": torch.tensor([9.0, 9.0]), "i": torch.tensor([0], dtype=torch.int8)},
            torch.Size([2]),
        )
    ]
    buffer, layout = pack_payloads(theirs)
    _assert_same_payloads(unpack_payloads(buffer, mine, layout), theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_all_reduce_average_on_one_rank_is_the_gradients_in_float32(dtype):
    grads = [torch.tensor([[1.5, -2.0]]), torch.tensor([3.0, 0.25, 5.0])]
    out = all_reduce_average(grads, SimpleNamespace(world_size=1), dtype)
    for got, want in zip(out, grads, strict=True):
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.equal(got, want)


# --- the exchange on 4 ranks ----------------------------------------------------------


@pytest.fixture(scope="module")
def exchanged(ranks8):
    return ranks8.run(exchanges, N)[:N]


def _expected_gather(name: str) -> tuple[list[list[torch.Tensor]], list[int]]:
    """Per step: the mean over ranks of each rank's decoded payload, each rank's
    compressor replayed here on its own; and the payload bytes one rank packs."""
    compressors = [EXCHANGE_COMPRESSORS[name](rank) for rank in range(N)]
    averages, nbytes = [], []
    for step in range(2):
        decoded, sizes = [], set()
        for rank, compressor in enumerate(compressors):
            grads = exchange_grads(rank, step)
            payloads = [compressor.compress(g, f"t{i}") for i, g in enumerate(grads)]
            sizes.add(pack_payloads(payloads)[0].numel())
            decoded.append([compressor.decompress(p) for p in payloads])
        assert len(sizes) == 1, "every rank must pack the same number of bytes"
        nbytes.append(sizes.pop())
        averages.append([sum(d[i] for d in decoded) / N for i in range(len(decoded[0]))])
    return averages, nbytes


@pytest.mark.parametrize("name", list(EXCHANGE_COMPRESSORS))
def test_all_gather_average_is_the_mean_of_every_ranks_decoded_payload(exchanged, name):
    want, nbytes = _expected_gather(name)
    for out in exchanged:
        for step, record in enumerate(out["gathered"][name]):
            for i, (got, expected) in enumerate(zip(record["averaged"], want[step], strict=True)):
                assert got.dtype == torch.float32 and got.shape == expected.shape
                torch.testing.assert_close(
                    got, expected, rtol=1e-6, atol=1e-7, msg=f"rank {out['rank']} step {step} t{i}"
                )
            # Ring all-gather of one packed buffer: N − 1 rounds, one payload each way.
            traffic = record["traffic"]
            assert traffic["bytes_sent"] == traffic["bytes_recv"] == (N - 1) * nbytes[step]
            assert traffic["rounds"] == N - 1
    for step in range(2):  # every rank decodes the same N payloads: the same average
        for other in exchanged[1:]:
            for a, b in zip(
                exchanged[0]["gathered"][name][step]["averaged"],
                other["gathered"][name][step]["averaged"],
                strict=True,
            ):
                assert torch.equal(a, b)


def _ring_bytes(numel: int, element_size: int, rank: int) -> int:
    """Bytes one ring all-reduce of `numel` elements sends from `rank` (every chunk but its
    own in the reduce-scatter, every chunk but its right neighbour's in the all-gather)."""
    length = [span[1] for span in even_splits(numel, N)]
    return element_size * (2 * numel - length[rank] - length[(rank + 1) % N])


def test_all_reduce_average_is_the_exact_mean_in_fp32_and_fp16(exchanged):
    grads = [integer_grads(rank) for rank in range(N)]
    want = [sum(g[i] for g in grads) / N for i in range(len(grads[0]))]
    numel = sum(g.numel() for g in grads[0])
    for out in exchanged:
        for label, size in (("fp32", 4), ("fp16", 2)):
            record = out["reduced"][label]
            for got, expected in zip(record["averaged"], want, strict=True):
                # Multiples of 4 divided by 4 and summed: exact in both dtypes.
                assert got.dtype == torch.float32 and got.shape == expected.shape
                assert torch.equal(got, expected), label
            assert record["traffic"]["bytes_sent"] == _ring_bytes(numel, size, out["rank"])
        fp32, fp16 = (out["reduced"][k]["traffic"]["bytes_sent"] for k in ("fp32", "fp16"))
        assert 2 * fp16 == fp32


# --- CompressedDP on 4 ranks ----------------------------------------------------------


@pytest.fixture(scope="module")
def trained(ranks8):
    return ranks8.run(compressed_training, N)[:N]


def _replicas_identical(trained: list[dict], run: str) -> None:
    """Bitwise: every rank applied the same update to the same weights."""
    for out in trained[1:]:
        for name, value in trained[0][run]["params"].items():
            assert torch.equal(out[run]["params"][name], value), f"rank {out['rank']} {name}"


def test_without_a_compressor_it_trains_like_one_process_on_the_whole_batch(trained):
    runs = [out["none"] for out in trained]
    want_losses, want_params = CASE.reference()
    mean_losses = torch.tensor([r["losses"] for r in runs]).mean(dim=0)
    torch.testing.assert_close(mean_losses, torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    for r in runs:
        for name, want in want_params.items():
            # Same float32 rounding bound as the other DP variants (test_equivalence).
            torch.testing.assert_close(r["params"][name], want, rtol=1e-5, atol=1e-5)
    _replicas_identical(trained, "none")


def test_without_a_compressor_it_sends_one_fp32_ring_all_reduce_per_step(trained):
    numel = sum(p.numel() for p in CASE.build_model().parameters())
    for out in trained:
        for traffic in out["none"]["traffic"]:
            assert traffic["bytes_sent"] == _ring_bytes(numel, 4, out["rank"])
            assert traffic["rounds"] == 2 * (N - 1)


def test_fp16_cast_trains_close_to_the_reference_on_half_the_bytes(trained):
    _, want_params = CASE.reference()
    for out in trained:
        for name, want in want_params.items():
            # fp16 rounds each averaged gradient by ≤ 2^-11 relative; 3 steps at lr 0.1
            # move the weights by ≪ 1e-3 of that.
            torch.testing.assert_close(out["fp16"]["params"][name], want, rtol=1e-3, atol=1e-3)
        for fp16, fp32 in zip(out["fp16"]["traffic"], out["none"]["traffic"], strict=True):
            assert fp16["bytes_sent"] > 0 and 2 * fp16["bytes_sent"] == fp32["bytes_sent"]
            assert 2 * fp16["bytes_recv"] == fp32["bytes_recv"]
    _replicas_identical(trained, "fp16")


def _topk_replay(trained: list[dict]) -> tuple[list[list[torch.Tensor]], list[int]]:
    """Each rank's Top-K replayed here on its own recorded gradients (its own error
    feedback memory): per step the mean of the decoded payloads, and the payload bytes."""
    names = trained[0]["topk"]["names"]
    compressors = [TopK(TOPK_DENSITY) for _ in range(N)]
    averages, nbytes = [], []
    for step in range(CASE.steps):
        decoded, sizes = [], set()
        for out, compressor in zip(trained, compressors, strict=True):
            grads = out["topk"]["local"][step]
            payloads = [compressor.compress(g, n) for n, g in zip(names, grads, strict=True)]
            sizes.add(sum(p.nbytes for p in payloads))
            decoded.append([compressor.decompress(p) for p in payloads])
        assert len(sizes) == 1
        nbytes.append(sizes.pop())
        averages.append([sum(d[i] for d in decoded) / N for i in range(len(names))])
    return averages, nbytes


def test_topk_replicas_step_with_the_mean_of_every_ranks_own_payload(trained):
    want, _ = _topk_replay(trained)
    names = trained[0]["topk"]["names"]
    for step in range(CASE.steps):  # the ranks really hold different gradients
        first = trained[0]["topk"]["local"][step][0]
        assert all(not torch.equal(out["topk"]["local"][step][0], first) for out in trained[1:])
    for out in trained:
        for step, averaged in enumerate(out["topk"]["averaged"]):
            for name, got, expected in zip(names, averaged, want[step], strict=True):
                torch.testing.assert_close(
                    got,
                    expected,
                    rtol=1e-6,
                    atol=1e-7,
                    msg=f"rank {out['rank']} step {step} {name}",
                )
    _replicas_identical(trained, "topk")


def test_topk_replicas_end_where_sgd_on_those_averages_leads(trained):
    model = CASE.build_model()
    params = dict(model.named_parameters())
    optimizer = CASE.make_optimizer(list(params.values()))
    for averaged in trained[0]["topk"]["averaged"]:
        for name, grad in zip(trained[0]["topk"]["names"], averaged, strict=True):
            params[name].grad = grad.clone()
        optimizer.step()
    for name, value in params.items():
        assert torch.equal(trained[0]["topk"]["params"][name], value.detach()), name


def test_topk_sends_n_minus_one_copies_of_its_payload_per_step(trained):
    _, nbytes = _topk_replay(trained)
    dense = 4 * sum(p.numel() for p in CASE.build_model().parameters())
    assert all(b < dense for b in nbytes)  # it does compress
    for out in trained:
        for step, traffic in enumerate(out["topk"]["traffic"]):
            # ring all-gather (impls.collectives.primitives.all_gather): N − 1 rounds, each
            # forwarding one rank's whole packed payload to the right neighbour.
            assert traffic["bytes_sent"] == (N - 1) * nbytes[step]
            assert traffic["bytes_recv"] == (N - 1) * nbytes[step]
            assert traffic["rounds"] == N - 1


def test_a_compressor_that_is_not_a_compressor_is_refused(trained):
    for out in trained:
        assert out["refusal"].startswith("TypeError: compressor must be"), out["refusal"]
        assert "Compressor" in out["refusal"] and "'topk'" in out["refusal"]
