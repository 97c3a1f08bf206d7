"""PowerSGD (Vogels et al. 2019) and DGC (Lin et al. 2018) against their papers' algorithms.

A failure here means PowerSGD's estimate is not the projection its Algorithm 1 defines
(lossy where the rank covers the matrix, different across ranks from a single-process run
of the same algorithm, or losing mass under error feedback), moves other bytes than its
factors' ring all-reduces, or that DGC does not apply momentum correction, momentum
factor masking or the warm-up density schedule as the paper describes.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from impls.collectives.partition import even_splits
from impls.compression import DGC, PowerSGD, kept
from impls.compression.sparsify import decode_index
from tests.compression.compression_ranks import dgc_steps, gradient, powersgd_steps

SOLO = SimpleNamespace(rank=0, world_size=1)  # a world of one rank: no collective runs


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- PowerSGD, one process ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (5, 2, 3), (7, 7)])
def test_powersgd_is_lossless_when_the_rank_covers_the_matrix(shape):
    compressor = PowerSGD(16, min_compression_rate=0)
    g = _randn(*shape)
    payload = compressor.compress(g, key="w")
    n, m = shape[0], math.prod(shape[1:])
    assert set(payload.tensors) == {"p", "q"}
    assert payload.tensors["p"].shape == (n, min(n, m))  # rank clamped to min(n, m)
    torch.testing.assert_close(compressor.decompress(payload), g, atol=1e-5, rtol=1e-5)
    assert compressor.memory["w"].abs().max() < 1e-5


def test_vectors_and_poorly_compressible_matrices_go_uncompressed():
    compressor = PowerSGD(2)  # min_compression_rate 2
    bias, small, big = _randn(9), _randn(3, 4), _randn(13, 11)
    for g in (bias, small, _randn(())):
        payload = compressor.compress(g, key=str(g.shape))
        assert set(payload.tensors) == {"dense"} and payload.nbytes == 4 * g.numel()
        assert torch.equal(compressor.decompress(payload), g)
    # 3·4 / ((3 + 4)·2) < 2 but 13·11 / ((13 + 11)·2) ≈ 2.98 ≥ 2
    assert compressor.matrix_shape(small.shape) is None
    assert compressor.matrix_shape(big.shape) == (13, 11, 2)
    payload = compressor.compress(big, key="big")
    assert payload.nbytes == 4 * (13 + 11) * 2
    assert compressor.ratio(payload) == pytest.approx(13 * 11 / (24 * 2))
    assert set(compressor.memory) == {"big"}  # uncompressed tensors leave nothing behind


def test_powersgd_error_feedback_never_loses_mass():
    compressor = PowerSGD(1)
    grads = [_randn(12, 9, seed=t) for t in range(15)]
    sent = sum(compressor.decompress(compressor.compress(g, key="w")) for g in grads)
    torch.testing.assert_close(sent + compressor.memory["w"], sum(grads), atol=1e-4, rtol=0)


def test_warm_start_continues_the_power_iteration():
    m = _randn(20, 2, seed=4) @ _randn(2, 15, seed=5) + 0.3 * _randn(20, 15, seed=6)
    best = torch.linalg.svdvals(m)[2:].square().sum().sqrt()  # the rank-2 optimum
    warm = PowerSGD(2, error_feedback=False)
    errors = [float((warm.decompress(warm.compress(m, key="w")) - m).norm()) for _ in range(20)]
    # The second step starts from the first's Q: one more power iteration, never worse.
    assert errors[1] <= errors[0] + 1e-5
    assert all(b <= a + 1e-4 for a, b in zip(errors[:-1], errors[1:], strict=True))
    assert errors[-1] == pytest.approx(float(best), rel=1e-3)  # converged to the SVD
    assert warm.q["w"].shape == (15, 2)
    cold = PowerSGD(2, error_feedback=False, warm_start=False)
    cold_errors = [float((cold.decompress(cold.compress(m, key="w")) - m).norm()) for _ in range(3)]
    assert cold.q == {} and len(set(cold_errors)) == 3  # a fresh Q every step
    assert max(cold_errors) > errors[-1] * 1.01


def test_powersgd_aggregate_on_one_rank_is_compress_then_decompress():
    shapes = [(13, 11), (9,), (7, 3, 2, 2)]
    a, b = PowerSGD(2), PowerSGD(2)
    for step in range(3):
        named = [(f"t{i}", gradient(0, step, i, s)) for i, s in enumerate(shapes)]
        got = a.aggregate(named, SOLO)
        want = [b.decompress(b.compress(g, key)) for key, g in named]
        for x, y in zip(got, want, strict=True):
            torch.testing.assert_close(x, y)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda: PowerSGD(0), "rank=0"),
        (lambda: PowerSGD(-3), "rank=-3"),
        (lambda: PowerSGD(1.5), "rank=1.5"),
        (lambda: PowerSGD(True), "rank=True"),
        (lambda: PowerSGD(2, min_compression_rate=-1), "min_compression_rate=-1"),
    ],
)
def test_bad_powersgd_settings_are_refused_naming_the_key(make, needle):
    with pytest.raises(ValueError) as error:
        make()
    assert needle in str(error.value)


# -- PowerSGD on 4 ranks -----------------------------------------------------------------

N = 4
SHAPES = [(13, 11), (12,), (7, 3, 2, 2), (3, 4)]  # compressed, vector, conv, too small
STEPS = 3


def reference_powersgd(n: int, shapes, steps: int, rank: int, min_rate: float, seed: int = 0):
    """Algorithm 1 of Vogels et al. on one process, given all N ranks' gradients: the
    averages per step and every rank's final memory (warm start, error feedback)."""
    generator = torch.Generator().manual_seed(seed)
    qs: dict[int, torch.Tensor] = {}
    memory = [dict() for _ in range(n)]
    outputs = []
    for step in range(steps):
        out = []
        for i, shape in enumerate(shapes):
            grads = [gradient(r, step, i, shape) for r in range(n)]
            rows, cols = shape[0], math.prod(shape[1:])
            k = min(rank, rows, cols)
            if len(shape) < 2 or rows * cols < min_rate * (rows + cols) * k:
                out.append(sum(g / n for g in grads))
                continue
            ms = [(g + memory[r].get(i, 0)).reshape(rows, cols) for r, g in enumerate(grads)]
            if i not in qs:
                qs[i] = torch.randn(cols, k, generator=generator)
            p = sum(m @ qs[i] for m in ms) / n
            p = torch.linalg.qr(p).Q
            qs[i] = sum(m.T @ p for m in ms) / n
            approx = p @ qs[i].T
            for r, m in enumerate(ms):
                memory[r][i] = (m - approx).reshape(shape)
            out.append(approx.reshape(shape))
        outputs.append(out)
    return outputs, memory


def ring_bytes(numel: int, n: int, rank: int, element_size: int = 4) -> int:
    """Bytes rank `rank` sends in `impls.collectives`' ring all-reduce of `numel` elements:
    the reduce-scatter sends every chunk but its own, the all-gather every chunk but its
    right neighbour's (chunks from `even_splits`, so uneven sizes are exact)."""
    if n == 1 or numel == 0:
        return 0
    lengths = [length for _, length in even_splits(numel, n)]
    return element_size * (2 * numel - lengths[rank] - lengths[(rank + 1) % n])


@pytest.fixture(scope="module")
def powersgd_run(ranks8):
    kwargs = {"rank": 2, "seed": 5}
    return ranks8.run(powersgd_steps, N, SHAPES, STEPS, kwargs)[:N]


def test_powersgd_on_4_ranks_equals_the_single_process_algorithm(powersgd_run):
    want, memory = reference_powersgd(N, SHAPES, STEPS, rank=2, min_rate=2.0, seed=5)
    for res in powersgd_run:
        for step in range(STEPS):
            for got, ref in zip(res["outputs"][step], want[step], strict=True):
                torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
        assert set(res["memory"]) == {"t0", "t2"}  # only the compressed tensors
        for key, i in (("t0", 0), ("t2", 2)):
            torch.testing.assert_close(
                res["memory"][key], memory[res["rank"]][i], atol=1e-5, rtol=1e-4
            )
    # Every rank holds the same estimate and the same warm-start Q (bit for bit).
    for res in powersgd_run[1:]:
        for a, b in zip(res["outputs"][-1], powersgd_run[0]["outputs"][-1], strict=True):
            assert torch.equal(a, b)
        assert all(torch.equal(res["q"][k], powersgd_run[0]["q"][k]) for k in res["q"])


def test_powersgd_error_feedback_conserves_the_mean_gradient_over_ranks(powersgd_run):
    for i, shape in enumerate(SHAPES):
        total = sum(gradient(r, t, i, shape) for r in range(N) for t in range(STEPS)) / N
        sent = sum(powersgd_run[0]["outputs"][t][i] for t in range(STEPS))
        left = sum(res["memory"].get(f"t{i}", torch.zeros(shape)) for res in powersgd_run) / N
        torch.testing.assert_close(sent + left, total, atol=1e-4, rtol=0)


def test_powersgd_moves_exactly_its_factors_in_three_ring_all_reduces(powersgd_run):
    # r = 2: P is 13×2 and 7×2, Q is 11×2 and 12×2; the vector and the 3×4 go dense.
    p_numel, q_numel, dense_numel = 13 * 2 + 7 * 2, 11 * 2 + 12 * 2, 12 + 3 * 4
    all_numel = sum(math.prod(s) for s in SHAPES)
    for res in powersgd_run:
        rank = res["rank"]
        want = sum(ring_bytes(k, N, rank) for k in (p_numel, q_numel, dense_numel))
        assert res["bytes_sent"] == [want] * STEPS
        assert res["all_reduces"] == [3] * STEPS
        dense = ring_bytes(all_numel, N, rank)  # what the fp32 all-reduce of all would send
        ratio = dense / want
        assert ratio == pytest.approx(all_numel / (p_numel + q_numel + dense_numel), rel=0.05)
        assert ratio > 2.2


def test_powersgd_with_full_rank_reproduces_the_exact_average(ranks8):
    kwargs = {"rank": 16, "min_compression_rate": 0}
    runs = ranks8.run(powersgd_steps, N, SHAPES, 2, kwargs)[:N]
    for step in range(2):
        for i, shape in enumerate(SHAPES):
            mean = sum(gradient(r, step, i, shape) for r in range(N)) / N
            for res in runs:
                torch.testing.assert_close(res["outputs"][step][i], mean, atol=1e-5, rtol=1e-4)


# -- DGC, one process --------------------------------------------------------------------


def test_dgc_sends_momentum_sgds_velocity_without_masking():
    # Density 1, masking off: the sent values are torch's SGD momentum buffer, step by step.
    dgc = DGC(1.0, momentum=0.9, momentum_masking=False, value_dtype="fp32")
    param = torch.nn.Parameter(torch.zeros(40))
    sgd = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    for t in range(6):
        g = _randn(40, seed=t)
        sent = dgc.decompress(dgc.compress(g, key="w"))
        param.grad = g.clone()
        sgd.step()
        torch.testing.assert_close(sent, sgd.state[param]["momentum_buffer"])
        assert torch.equal(dgc.memory["w"], torch.zeros(40))


def test_with_masking_a_coordinate_sent_every_step_gets_no_momentum():
    dgc = DGC(1.0, momentum=0.9, value_dtype="fp32")
    for t in range(4):
        g = _randn(40, seed=t)
        assert torch.equal(dgc.decompress(dgc.compress(g, key="w")), g)


@pytest.mark.parametrize("value_dtype", ["fp32", "fp16"])
def test_momentum_correction_masking_and_conservation_of_v(value_dtype):
    m = 0.9
    dgc = DGC(0.1, momentum=m, value_dtype=value_dtype)
    u_old, v_old = torch.zeros(200), torch.zeros(200)
    for t in range(8):
        g = _randn(200, seed=t)
        payload = dgc.compress(g, key="w")
        sent, index = dgc.decompress(payload), decode_index(payload)
        u, v = dgc.velocity["w"], dgc.memory["w"]
        assert index.numel() == kept(200, 0.1) == 20
        velocity = m * u_old + g  # momentum correction: u before masking
        accumulated = v_old + velocity
        # Top-k of |v|, and what was not sent is still in v (fp16 rounding included).
        assert torch.equal(index, accumulated.abs().topk(20).indices.sort().values)
        torch.testing.assert_close(sent + v, accumulated, atol=1e-6, rtol=0)
        # Momentum factor masking: u is zero where sent, untouched elsewhere.
        assert torch.equal(u[index], torch.zeros(20))
        rest = torch.ones(200, dtype=torch.bool)
        rest[index] = False
        torch.testing.assert_close(u[rest], velocity[rest])
        if value_dtype == "fp32":
            assert torch.equal(v[index], torch.zeros(20))
        else:  # only the fp16 rounding of the sent values is left
            assert v[index].abs().max() <= accumulated[index].abs().max() * 2**-11
        u_old, v_old = u.clone(), v.clone()


def test_without_momentum_dgc_is_topk_with_error_feedback():
    dgc = DGC(0.05, momentum=0.0)
    grads = [_randn(300, seed=t) for t in range(20)]
    sent = sum(dgc.decompress(dgc.compress(g, key="w")) for g in grads)
    torch.testing.assert_close(sent + dgc.memory["w"], sum(grads), atol=1e-4, rtol=0)


def test_warm_up_lowers_the_density_exponentially_once_per_aggregate():
    dgc = DGC(0.25 / 64, momentum=0.5, warmup_steps=3, warmup_start=0.25)
    densities = [0.25, 0.0625, 0.015625, 0.25 / 64, 0.25 / 64]
    assert [dgc.density_at(t) for t in range(5)] == pytest.approx(densities)
    for t, density in enumerate(densities):
        assert dgc.step == t  # one step per aggregate call, however many tensors
        named = [("a", _randn(1024, seed=t)), ("b", _randn(300, seed=50 + t))]
        out = dgc.aggregate(named, SOLO)
        assert [int((o != 0).sum()) for o in out] == [kept(1024, density), kept(300, density)]
    assert [kept(1024, d) for d in densities] == [256, 64, 16, 4, 4]
    assert [kept(300, d) for d in densities] == [75, 19, 5, 1, 1]


def test_local_clipping_scales_the_threshold_by_one_over_sqrt_n():
    dgc = DGC(1.0, momentum=0.0, clip_norm=2.0, value_dtype="fp32")
    grads = [torch.full((4,), 3.0), torch.full((5,), -4.0)]  # joint norm √(36 + 80)
    for n in (1, 4):
        clipped = dgc.clip_gradients(grads, n)
        norm = math.sqrt(sum(float(c.square().sum()) for c in clipped))
        assert norm == pytest.approx(2.0 / math.sqrt(n))
        torch.testing.assert_close(clipped[0] / clipped[1][0], grads[0] / grads[1][0])
    small = [torch.full((4,), 0.1)]
    assert torch.equal(dgc.clip_gradients(small, 4)[0], small[0])
    out = dgc.aggregate([("a", grads[0]), ("b", grads[1])], SOLO)  # N = 1: clip to 2
    assert math.sqrt(sum(float(o.square().sum()) for o in out)) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda: DGC(0.0), "ratio=0.0"),
        (lambda: DGC(0.1, momentum=1.0), "momentum=1.0"),
        (lambda: DGC(0.1, momentum=-0.1), "momentum=-0.1"),
        (lambda: DGC(0.1, clip_norm=0), "clip_norm=0"),
        (lambda: DGC(0.1, clip_norm=-1.0), "clip_norm=-1.0"),
        (lambda: DGC(0.1, warmup_steps=-1), "warmup_steps=-1"),
        (lambda: DGC(0.1, warmup_steps=2.5), "warmup_steps=2.5"),
        (lambda: DGC(0.5, warmup_steps=2, warmup_start=0.25), "warmup_start=0.25"),
        (lambda: DGC(0.1, value_dtype="bf16"), "value_dtype='bf16'"),
    ],
)
def test_bad_dgc_settings_are_refused_naming_the_key(make, needle):
    with pytest.raises(ValueError) as error:
        make()
    assert needle in str(error.value)


# -- DGC on 4 ranks ----------------------------------------------------------------------


def test_dgc_at_density_1_without_momentum_is_plain_averaging(ranks8):
    shapes = [(30,), (6, 5)]
    kwargs = {"density": 1.0, "momentum": 0.0}
    runs = ranks8.run(dgc_steps, N, shapes, 3, kwargs, True)[:N]
    for step in range(3):
        for i, shape in enumerate(shapes):
            mean = sum(gradient(r, step, i, shape, integer=True) for r in range(N)) / N
            for res in runs:
                assert torch.equal(res["outputs"][step][i], mean)


def test_dgc_on_4_ranks_averages_what_each_rank_sent(ranks8):
    shapes = [(500,), (20, 15)]
    kwargs = {"density": 0.02, "momentum": 0.9, "clip_norm": 5.0, "warmup_steps": 2}
    runs = ranks8.run(dgc_steps, N, shapes, 4, kwargs, False)[:N]
    for step in range(4):
        for i in range(len(shapes)):
            mean = sum(res["own"][step][i] for res in runs) / N
            for res in runs:
                torch.testing.assert_close(res["outputs"][step][i], mean, atol=1e-6, rtol=0)
