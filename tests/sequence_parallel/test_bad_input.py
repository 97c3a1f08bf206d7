"""Misuse is refused with a message naming the offending key, and the layouts are right.

A failure in the refusals means a configuration that cannot work (heads P does not
divide, attention dropout that would break equality with the reference, a sequence
length that does not match the chunks) is accepted and would silently compute something
else. A failure in the layout test means Ulysses' all-to-all puts a head or a position in
the wrong place, or disagrees with torch.distributed's own `all_to_all_single`.
"""

from __future__ import annotations

import pytest

from impls.sequence_parallel import local_seq_len
from impls.sequence_parallel.analytic import activation_bytes_per_rank, layer_traffic
from tests.sequence_parallel.sp_ranks import bad_input_errors, layout_errors

EXPECTED = {
    "ulysses heads": "n_heads=2",
    "megatron_sp heads": "n_heads=2",
    "ulysses dropout": "dropout=0.1",
    "ring dropout": "dropout=0.1",
    "gather seq_len": "seq_len=12",
    "zero seq_len": "seq_len",
    "ring shapes": "shape",
}


@pytest.mark.timeout(120)
def test_refusals_and_ulysses_layout(ranks8):
    messages = ranks8.run(bad_input_errors)[0]
    assert [m.split(":")[0] for m in messages] == list(EXPECTED)
    for message, key in zip(messages, EXPECTED.values(), strict=True):
        assert key in message.split(":", 1)[1], message
    errors = [e for rank_errors in ranks8.run(layout_errors) for e in rank_errors or []]
    assert errors == []


@pytest.mark.parametrize(
    "call, key",
    [
        (lambda: layer_traffic("zigzag", sp=2, batch=1, seq_len=8, d_model=4), "method"),
        (lambda: layer_traffic("ulysses", sp=0, batch=1, seq_len=8, d_model=4), "sp"),
        (
            lambda: activation_bytes_per_rank(
                "ulysses", sp=2, batch=1, seq_len=0, d_model=4, n_heads=2
            ),
            "seq_len",
        ),
        (lambda: local_seq_len(0, 2), "seq_len"),
    ],
)
def test_analytic_refuses_bad_keys(call, key):
    with pytest.raises(ValueError, match=key):
        call()


def test_per_link_volume_scaling():
    """The papers' claim in numbers: Ulysses' per-link bytes fall as 1/P (here exactly
    4·2·(P−1)/P² · b·s·h·e), Megatron-SP's and Ring Attention's do not."""
    kw = {"batch": 1, "seq_len": 64, "d_model": 16}
    ulysses = [layer_traffic("ulysses", sp=p, **kw).bytes_per_link for p in (2, 4, 8)]
    megatron = [layer_traffic("megatron_sp", sp=p, **kw).bytes_per_link for p in (2, 4, 8)]
    bsh = 64 * 16 * 4
    assert ulysses == [8 * (p - 1) * bsh // p**2 for p in (2, 4, 8)]
    assert megatron == [8 * (p - 1) * bsh // p for p in (2, 4, 8)]
    assert [m // u for m, u in zip(megatron, ulysses, strict=True)] == [2, 4, 8]
