"""A long reduce into few outputs runs as two kernels (issue 9): chunks of the reduce axis into partials spread over the
CPU threads, then a short reduce of the partials. Values match numpy float64 within the accuracy bound of
test_reduce_accuracy, exactly for max/min/argmax/int sums; small reduces stay one kernel."""

import math

import numpy as np
import pytest
import torch

from fusegrad import Context, GlobalCounters, Tensor, dtypes
from fusegrad.helpers import NUM_CPU_THREADS
from fusegrad.schedule import split_reduce
from fusegrad.uop.ops import Ops
from reference import C_ULPS_SERIAL, assert_sum_accurate

N_POW2 = 1 << 20
N_ODD = (1 << 20) + 7  # no chunk count divides it: the chunked axis is padded with the reduce's identity


def realize_counting(fn, *arrays):
    tensors = [Tensor(a).realize() for a in arrays]
    GlobalCounters.reset()
    out = fn(*tensors).realize()
    return out.numpy(), GlobalCounters.kernel_count


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(n).astype(np.float32) for n in (N_POW2, N_ODD)}


def test_issue_reproducer_16m_sum_is_two_kernels():
    x = np.random.default_rng(1).uniform(0, 1, 1 << 24).astype(np.float32)
    out, kernels = realize_counting(lambda t: t.sum(), x)
    assert kernels == 2
    x64 = x.astype(np.float64)
    assert_sum_accurate(out, x64.sum(), np.abs(x64).sum(), x.size)


def test_partial_kernel_splits_evenly_over_threads():
    for threads in (2, 3, 8):
        with Context(NUM_CPU_THREADS=threads):
            items = Tensor.empty(N_ODD).sum().schedule_linear()
        assert len(items) == 2
        # a full sum keeps lanes of partials per chunk; the chunks' outer loop is what the threads split
        lanes = split_reduce.lane_count(Ops.ADD, dtypes.float32)
        chunks, rem = divmod(items[0].buffers[0].size, lanes)
        assert rem == 0 and chunks % threads == 0 and 16 <= chunks <= 64, (threads, chunks)
        assert items[1].buffers[0].size == 1


def test_small_reduces_stay_one_kernel():
    rng = np.random.default_rng(2)
    short = rng.standard_normal(split_reduce.REDUCE_SPLIT_MIN_LENGTH - 1).astype(np.float32)
    out, kernels = realize_counting(lambda t: t.sum(), short)
    assert kernels == 1
    np.testing.assert_allclose(out, short.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
    # enough outputs for every thread: the output loop already runs in parallel
    rows = split_reduce.REDUCE_SPLIT_OUTPUTS_PER_THREAD * int(NUM_CPU_THREADS.value)
    wide = rng.standard_normal((rows, split_reduce.REDUCE_SPLIT_MIN_LENGTH)).astype(np.float32)
    out, kernels = realize_counting(lambda t: t.sum(axis=1), wide)
    assert kernels == 1
    np.testing.assert_allclose(out, wide.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("n", [N_POW2, N_ODD])
def test_sum_and_mean_accurate(data, n):
    x = data[n]
    x64 = x.astype(np.float64)
    out, kernels = realize_counting(lambda t: t.sum(), x)
    assert kernels == 2
    assert_sum_accurate(out, x64.sum(), np.abs(x64).sum(), n)
    # the mean's scale fuses into the kernel that folds the partials
    out, kernels = realize_counting(lambda t: t.mean(), x)
    assert kernels == 2
    assert_sum_accurate(out * n, x64.sum(), np.abs(x64).sum(), n)


@pytest.mark.parametrize("n", [N_POW2, N_ODD])
def test_var_std(data, n):
    x = data[n]
    out = Tensor(x).var().numpy()
    np.testing.assert_allclose(out, x.astype(np.float64).var(ddof=1), rtol=1e-5)
    np.testing.assert_allclose(Tensor(x).std().numpy(), x.astype(np.float64).std(ddof=1), rtol=1e-5)


@pytest.mark.parametrize("n", [N_POW2, N_ODD])
def test_max_min_exact(data, n):
    # all negative: a padding of zeros (instead of the identity) would show up as the max
    x = -np.abs(data[n]) - 1
    out, kernels = realize_counting(lambda t: t.max(), x)
    assert kernels == 2 and out == x.max()
    y = np.abs(data[n]) + 1
    out, kernels = realize_counting(lambda t: t.min(), y)
    assert kernels == 2 and out == y.min()


def test_max_of_all_minus_infinity_and_nan_propagation(data):
    x = np.full(N_ODD, -np.inf, np.float32)
    assert Tensor(x).max().numpy() == -np.inf
    assert Tensor(-x).min().numpy() == np.inf
    y = data[N_ODD].copy()
    y[N_ODD // 3] = np.nan
    assert np.isnan(Tensor(y).max().numpy())
    assert np.isnan(Tensor(y).min().numpy())
    assert np.isnan(Tensor(y).sum().numpy())
    # like torch, argmax points at the NaN
    assert Tensor(y).argmax().numpy() == torch.from_numpy(y).argmax().item() == N_ODD // 3


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8])
def test_int_max_min_with_padding_identity(dtype):
    info = np.iinfo(dtype)
    x = np.full(N_ODD, info.min, dtype)
    assert Tensor(x).max().numpy() == info.min
    y = np.full(N_ODD, info.max, dtype)
    assert Tensor(y).min().numpy() == info.max


@pytest.mark.parametrize("n", [N_POW2, N_ODD])
def test_prod(n):
    x = (1 + 1e-4 * np.random.default_rng(3).standard_normal(n)).astype(np.float32)
    out, kernels = realize_counting(lambda t: t.prod(), x)
    assert kernels == 2
    np.testing.assert_allclose(out, np.prod(x.astype(np.float64)), rtol=1e-3)
    # padding with 0 instead of the identity 1 would give 0
    assert Tensor(np.full(n, 1.0, np.float32)).prod().numpy() == 1.0


@pytest.mark.parametrize("n", [N_POW2, N_ODD])
def test_argmax_argmin_first_index(data, n):
    x = data[n].copy()
    # ties in different chunks: the first index wins
    x[[5, n // 2, n - 1]] = 10.0
    x[[7, n - 2]] = -10.0
    assert Tensor(x).argmax().numpy() == 5
    assert Tensor(x).argmin().numpy() == 7
    x[5] = 0.0
    assert Tensor(x).argmax().numpy() == n // 2


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_sums_exact(dtype):
    x = np.random.default_rng(4).integers(-1000, 1000, N_ODD).astype(dtype)
    out, kernels = realize_counting(lambda t: t.sum(), x)
    assert kernels == 2
    assert out == x.astype(np.int64).sum()


def test_bool_any_all():
    x = np.zeros(N_ODD, np.bool_)
    assert not Tensor(x).any().numpy() and not Tensor(x).all().numpy()
    x[N_ODD - 1] = True
    assert Tensor(x).any().numpy() and not Tensor(x).all().numpy()
    assert Tensor(np.ones(N_ODD, np.bool_)).all().numpy()


def test_float16_inputs():
    # the sum (~26000) stays below float16's largest value
    x = np.random.default_rng(5).uniform(0, 0.05, N_ODD).astype(np.float16)
    x64 = x.astype(np.float64)
    out = Tensor(x).sum()
    assert out.dtype == dtypes.float16
    assert_sum_accurate(out.numpy(), x64.sum(), np.abs(x64).sum(), N_ODD, out_dtype=np.float16)
    assert Tensor(x).max().numpy() == x.max() and Tensor(x).min().numpy() == x.min()
    np.testing.assert_allclose(Tensor(x).mean().numpy(), x64.mean(), rtol=1e-3)


def test_axis0_of_tall_tensor():
    x = np.random.default_rng(6).standard_normal((N_POW2, 3)).astype(np.float32)
    x64 = x.astype(np.float64)
    out, kernels = realize_counting(lambda t: t.sum(axis=0), x)
    assert kernels == 2 and out.shape == (3,)
    for got, exact, abs_sum in zip(out, x64.sum(0), np.abs(x64).sum(0)):
        assert_sum_accurate(got, exact, abs_sum, N_POW2, c_ulps=C_ULPS_SERIAL)
    np.testing.assert_array_equal(Tensor(x).max(axis=0, keepdim=True).numpy(), x.max(0, keepdims=True))
    np.testing.assert_array_equal(Tensor(x).argmax(axis=0).numpy(), x.argmax(0))


def test_last_axis_of_wide_tensor():
    x = np.random.default_rng(7).standard_normal((3, N_ODD)).astype(np.float32)
    x64 = x.astype(np.float64)
    out, kernels = realize_counting(lambda t: t.sum(axis=1), x)
    assert kernels == 2
    for got, exact, abs_sum in zip(out, x64.sum(1), np.abs(x64).sum(1)):
        assert_sum_accurate(got, exact, abs_sum, N_ODD)
    np.testing.assert_array_equal(Tensor(x).argmin(axis=1).numpy(), x.argmin(1))


def test_several_axes():
    x = np.random.default_rng(8).standard_normal((4, 3, 100003)).astype(np.float32)
    x64 = x.astype(np.float64)
    # non-adjacent axes: the longest one is chunked
    out, kernels = realize_counting(lambda t: t.sum(axis=(0, 2)), x)
    assert kernels == 2
    np.testing.assert_allclose(out, x64.sum((0, 2)), rtol=1e-5)
    np.testing.assert_array_equal(Tensor(x).max(axis=(0, 2)).numpy(), x.max((0, 2)))
    # adjacent axes merge into one before chunking
    out, kernels = realize_counting(lambda t: t.sum(axis=(1, 2)), x)
    assert kernels == 2
    np.testing.assert_allclose(out, x64.sum((1, 2)), rtol=1e-5)
    out, kernels = realize_counting(lambda t: t.permute(2, 0, 1).sum(), x)
    assert kernels == 2
    assert_sum_accurate(out, x64.sum(), np.abs(x64).sum(), x.size, c_ulps=C_ULPS_SERIAL)


def test_elementwise_producer_and_consumer_fuse():
    a, b = (np.random.default_rng(i).standard_normal(N_ODD).astype(np.float32) for i in (9, 10))
    out, kernels = realize_counting(lambda a, b: ((a * b).relu().sum() + 1).sqrt(), a, b)
    assert kernels == 2
    np.testing.assert_allclose(out, np.sqrt(np.maximum(a * b, 0).astype(np.float64).sum() + 1), rtol=1e-5)
    # the result broadcast back: the folded value is realized once, the consumer reads it
    out = (Tensor(a) - Tensor(a).mean()).numpy()
    np.testing.assert_allclose(out, a - a.astype(np.float64).mean(), rtol=1e-5, atol=1e-6)


def test_backward_through_split_reduces():
    x = np.random.default_rng(11).standard_normal(N_ODD).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    (t.sum() * 2 + t.max() + t.square().mean()).backward()
    tt = torch.from_numpy(x).requires_grad_()
    (tt.sum() * 2 + tt.max() + tt.square().mean()).backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-5, atol=1e-8)


def test_python_device_matches(monkeypatch):
    # thresholds lowered so the interpreter runs a split reduce in a moment
    monkeypatch.setattr(split_reduce, "REDUCE_SPLIT_MIN_LENGTH", 64)
    x = np.random.default_rng(12).standard_normal((2, 1001)).astype(np.float32)
    ops = {
        "sum": (lambda t: t.sum(axis=1), 2),
        "max": (lambda t: t.max(), 2),
        "argmax": (lambda t: t.argmax(axis=1), 4),
        "prod": (lambda t: (t * 0.01 + 1).prod(axis=1), 2),
        "int sum": (lambda t: t.cast(dtypes.int32).sum(axis=1), 2),
    }
    results = {}
    for device in ("PYTHON", "CPU"):
        t = Tensor(x, device=device).realize()
        results[device] = []
        for name, (fn, expected_kernels) in ops.items():
            GlobalCounters.reset()
            results[device].append(fn(t).numpy())
            assert GlobalCounters.kernel_count == expected_kernels, (device, name)
    for py, cpu in zip(results["PYTHON"], results["CPU"]):
        np.testing.assert_allclose(py, cpu, rtol=1e-5)
    np.testing.assert_allclose(results["PYTHON"][0], x.astype(np.float64).sum(1), rtol=1e-5)
    assert results["PYTHON"][1] == x.max()
    np.testing.assert_array_equal(results["PYTHON"][2], x.argmax(1))


def test_chunk_count_prefers_a_divisor():
    assert split_reduce.chunk_count(1 << 24, 2) == 32
    assert split_reduce.chunk_count(3 * 7 * 1000, 3) == 42  # 33, 36 and 39 do not divide it
    assert split_reduce.chunk_count(N_ODD, 2) == 32  # nothing divides it: padded
    assert split_reduce.chunk_count(1 << 20, 128) == 128
    assert all(split_reduce.chunk_count(n, 5) % 5 == 0 for n in (1000, 1001, 2**20))
    assert math.gcd(split_reduce.chunk_count(2**20, 8), 8) == 8


def test_split_reduce_value_is_kept_for_later_graphs():
    x = Tensor(np.random.default_rng(13).standard_normal(N_POW2).astype(np.float32)).realize()
    centered = x - x.mean(keepdim=True)
    centered.square().sum().realize()
    GlobalCounters.reset()
    # the mean computed for the first sum is read from its buffer: only the new (split) max runs
    out = centered.abs().max().numpy()
    assert GlobalCounters.kernel_count == 2
    x64 = x.numpy().astype(np.float64)
    np.testing.assert_allclose(out, np.abs(x64 - x64.mean()).max(), rtol=1e-6)


def test_empty_outputs_and_empty_axes():
    assert Tensor.empty(0, 1 << 20).sum(axis=1).numpy().shape == (0,)
    assert Tensor.ones(1 << 20, 0).sum(axis=(0, 1)).numpy() == 0
    np.testing.assert_array_equal(Tensor.ones(3, 1 << 20, 0).sum(axis=(1, 2)).numpy(), np.zeros(3))


def test_long_dot_products():
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal(N_ODD).astype(np.float32), rng.standard_normal(N_ODD).astype(np.float32)
    products = a.astype(np.float64) * b
    out, kernels = realize_counting(lambda a, b: a @ b, a, b)
    assert kernels == 2
    assert_sum_accurate(out, products.sum(), np.abs(products).sum(), N_ODD, c_ulps=C_ULPS_SERIAL)
    m = np.stack([a, b])
    gram = m.astype(np.float64) @ m.T.astype(np.float64)
    out, kernels = realize_counting(lambda m: m @ m.T, m)
    assert kernels == 2
    np.testing.assert_allclose(out, gram, rtol=1e-5, atol=1e-2)


def test_full_sum_partials_keep_vector_lanes_in_accumulators(avx512_target):
    """The partial kernel of a full sum writes chunks x lanes partials and upcasts all the lanes (independent vector
    accumulators, one pass over the input); the fold adds them; values stay within the blocked-sum bound."""
    from fusegrad.codegen import lower_to_linear
    from fusegrad.codegen.opt import Opt, OptOps

    lanes = split_reduce.REDUCE_SPLIT_LANES
    n_odd_small = N_POW2 // 2 + 7  # padded to whole lanes of every chunk
    # in cache and from memory alike (16M float32 is 64 MiB): whole vectors into independent accumulators
    for n in (N_POW2, n_odd_small, 1 << 24):
        items = Tensor.empty(n).sum().schedule_linear()
        assert len(items) == 2 and items[0].buffers[0].size % lanes == 0
        info = lower_to_linear(items[0].ast, avx512_target)
        assert Opt(OptOps.UPCAST, 2, lanes) in info.opts, info.opts
    x = np.random.default_rng(7).uniform(-1, 2, n_odd_small).astype(np.float32)
    for fn, ref in ((lambda t: t.sum(), x.astype(np.float64).sum()), (lambda t: t.max(), x.max())):
        out, kernels = realize_counting(fn, x)
        assert kernels == 2
        if ref is x.max():
            assert out == ref
        else:
            assert_sum_accurate(out, ref, np.abs(x.astype(np.float64)).sum(), x.size)


def test_lanes_only_for_a_full_reduce_over_the_last_dim():
    # an axis sum into several outputs folds its chunks only: no lanes
    items = Tensor.empty(N_POW2, 2).sum(axis=0).schedule_linear()
    chunks = split_reduce.chunk_count(N_POW2, int(NUM_CPU_THREADS.value))
    assert len(items) == 2 and items[0].buffers[0].size == chunks * 2
    # integer sums keep one partial per chunk (no lane accumulators for them)
    items = Tensor.empty(N_POW2, dtype=dtypes.int32).sum().schedule_linear()
    assert len(items) == 2 and items[0].buffers[0].size < split_reduce.REDUCE_SPLIT_LANES
    x = np.random.default_rng(8).standard_normal((N_POW2 // 4, 3)).astype(np.float32)
    out, _ = realize_counting(lambda t: t.sum(axis=0), x)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-2)


@pytest.mark.parametrize("n", [N_ODD, 1_000_000, (1 << 16) + 1023])
def test_a_full_sum_of_any_length_reads_whole_vectors_and_adds_its_tail_after_the_fold(n, avx512_target):
    """A length no chunks x lanes divides: the lanes take the longest whole part (no padding, so no gate per lane,
    which kept every lane scalar: 1M + 7 ran 10x slower than torch), the last elements are a small reduce of their
    own in the fold's kernel. Values as numpy's, NaN and infinities in the tail included."""
    from fusegrad.codegen import lower_to_linear
    from fusegrad.codegen.opt import Opt, OptOps

    lanes = split_reduce.REDUCE_SPLIT_LANES
    items = Tensor.empty(n).sum().schedule_linear()
    assert len(items) == 2 and items[0].buffers[0].size % lanes == 0
    partial = items[0].ast.toposort()
    assert not any(u.op is Ops.PAD for u in partial)
    assert Opt(OptOps.UPCAST, 2, lanes) in lower_to_linear(items[0].ast, avx512_target).opts
    x = np.random.default_rng(9).standard_normal(n).astype(np.float32)
    x64 = x.astype(np.float64)
    out, kernels = realize_counting(lambda t: t.sum(), x)
    assert kernels == 2
    assert_sum_accurate(out, x64.sum(), np.abs(x64).sum(), n)
    for fn, ref in ((lambda t: t.max(), x.max()), (lambda t: t.min(), x.min())):
        out, kernels = realize_counting(fn, x)
        assert kernels == 2 and out == ref
    for special in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[-1] = special  # in the tail
        check_sum, check_max = Tensor(y).sum().item(), Tensor(y).max().item()
        ty = torch.from_numpy(y)
        np.testing.assert_equal([check_sum, check_max], [ty.sum().item(), ty.max().item()])
