"""Accuracy of long float sums (issue 8): float32 sum/mean/var/matmul over up to 16M elements stay within
C_ULPS * ulp * log2(n) of the float64 result, like pairwise summation, instead of drifting by ~n/2 ulps.

The bound is the classic one for a summation tree of depth ~log2(n): C_ULPS * ulp(float32(sum |x|)) * log2(n), which is
ulp(result) * log2(n) for data of one sign; a result narrower than float32 may round once more (half an ulp of it).
Contiguous sums run their blocks of 256 vectorized (8-16 lanes, so 16-32 adds in a row); where a block runs serially
(matmul's K loop across unrolled outputs, a strided column sum, the PYTHON interpreter) its 256 adds in a row allow
C_ULPS_SERIAL instead, which is what a BLAS kernel's K blocking gives."""

import math

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes
from reference import C_ULPS, C_ULPS_SERIAL, FG2NP, assert_sum_accurate, ulp


def distribution(name: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if name == "const":
        return np.full(n, 0.1, np.float32)
    if name == "uniform":
        return rng.uniform(0, 1, n).astype(np.float32)
    if name == "mixed":
        return rng.standard_normal(n).astype(np.float32)
    # a few large values among many small ones: the small ones are lost when added one by one to a large total
    return np.where(rng.uniform(size=n) < 0.01, 1e4, 1e-3).astype(np.float32)


DISTRIBUTIONS = ["const", "uniform", "mixed", "large_small"]


def exact_sum(x: np.ndarray, axis=None) -> tuple[np.ndarray, np.ndarray]:
    x64 = x.astype(np.float64)
    return x64.sum(axis), np.abs(x64).sum(axis)


def test_issue_reproducer_matches_torch():
    got = Tensor.full((1 << 24,), 0.1).contiguous().sum().item()
    reference = torch.full((1 << 24,), 0.1).sum().item()
    exact = float(np.float32(0.1)) * (1 << 24)
    assert_sum_accurate(got, exact, exact, 1 << 24)
    assert abs(got - reference) <= 2 * C_ULPS * ulp(exact) * 24


# 135425 = 256 * (16 * (16 * 2 + 1) + 1) + 1: a one-element tail at every level of blocks
@pytest.mark.parametrize("n", [1, 7, 1000, 1 << 20, 1000003, 135425])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_full_sum_float32(n, dist):
    x = distribution(dist, n)
    exact, abs_sum = exact_sum(x)
    assert_sum_accurate(Tensor(x).sum().item(), float(exact), float(abs_sum), n)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_mean_float32(dist):
    n = 1 << 20
    x = distribution(dist, n, seed=1)
    exact, abs_sum = exact_sum(x)
    assert_sum_accurate(Tensor(x).mean().item() * n, float(exact), float(abs_sum), n)


@pytest.mark.parametrize("dist", ["uniform", "mixed", "large_small"])
def test_var_std_float32(dist):
    n = 1 << 20
    x = distribution(dist, n, seed=2)
    x64 = x.astype(np.float64)
    squares = (x64 - x64.mean()) ** 2
    t = Tensor(x)
    # var is a sum of squares divided by n - 1: its error is that of the sum, scaled
    assert_sum_accurate(t.var().item() * (n - 1), float(squares.sum()), float(squares.sum()), n)
    assert abs(t.std().item() - math.sqrt(squares.sum() / (n - 1))) <= C_ULPS * ulp(math.sqrt(squares.mean())) * 20


@pytest.mark.parametrize("dist", ["const", "uniform"])
@pytest.mark.parametrize(
    "shape,axis",
    [((4, 1 << 20), 1), ((1 << 18, 4), 0), ((3, 100003), 1), ((1024, 1024), None), ((2, 3, 100003), (0, 2))],
)
def test_axis_and_2d_sums_float32(shape, axis, dist):
    x = distribution(dist, math.prod(shape), seed=3).reshape(shape)
    exact, abs_sum = exact_sum(x, axis)
    got = Tensor(x).sum(axis).numpy()
    n = math.prod(shape) // math.prod(got.shape)
    c_ulps = C_ULPS_SERIAL if axis == 0 else C_ULPS  # the column sum keeps one accumulator per column
    for g, e, a in zip(np.atleast_1d(got), np.atleast_1d(exact), np.atleast_1d(abs_sum)):
        assert_sum_accurate(g, float(e), float(a), n, c_ulps=c_ulps)


@pytest.mark.parametrize("fg_dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("dist", ["const", "uniform", "mixed"])
def test_half_sums_accumulate_in_float32(fg_dtype, dist):
    n = 1 << 20
    # values small enough that the total fits float16
    x32 = distribution(dist, n, seed=4) * np.float32(0.01)
    t = Tensor(x32).cast(fg_dtype)
    x = torch.tensor(x32).to(torch.bfloat16 if fg_dtype is dtypes.bfloat16 else torch.float16).float().numpy()
    exact, abs_sum = exact_sum(x)
    out_np = np.float16 if fg_dtype is dtypes.float16 else None
    got = t.sum()
    assert got.dtype is fg_dtype
    if out_np is not None:
        assert_sum_accurate(got.item(), float(exact), float(abs_sum), n, out_np)
    else:
        # bfloat16 has 8 significant bits: half its ulp is 2**-8 relative
        bound = abs(float(exact)) * 2.0**-8 + C_ULPS * ulp(float(abs_sum)) * 20
        assert abs(got.item() - float(exact)) <= bound
    assert_sum_accurate(t.sum(dtype=dtypes.float32).item(), float(exact), float(abs_sum), n)


@pytest.mark.parametrize(
    "dist", [pytest.param("const", marks=pytest.mark.slow), "uniform", pytest.param("mixed", marks=pytest.mark.slow)]
)
def test_matmul_large_k_float32(dist):
    k = 1 << 20
    a = distribution(dist, 2 * k, seed=5).reshape(2, k)
    b = distribution("uniform", k * 16, seed=6).reshape(k, 16)
    got = (Tensor(a) @ Tensor(b)).numpy()
    exact = a.astype(np.float64) @ b.astype(np.float64)
    abs_sum = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    for g, e, s in zip(got.ravel(), exact.ravel(), abs_sum.ravel()):
        assert_sum_accurate(g, float(e), float(s), k, c_ulps=C_ULPS_SERIAL)


@pytest.mark.parametrize("np_dtype", [np.int32, np.int64])
def test_integer_sums_stay_exact(np_dtype):
    x = np.random.default_rng(7).integers(-1000, 1000, size=(1 << 20) + 3).astype(np_dtype)
    got = Tensor(x).sum()
    assert got.dtype is {np.int32: dtypes.int32, np.int64: dtypes.int64}[np_dtype]
    assert got.item() == int(x.astype(np.int64).sum())
    assert FG2NP[got.dtype] == np.dtype(np_dtype)


def test_max_min_over_long_axis_exact():
    x = distribution("mixed", (1 << 20) + 5, seed=8)
    assert Tensor(x).max().item() == float(x.max())
    assert Tensor(x).min().item() == float(x.min())


@pytest.mark.parametrize("n", [3000, 20000])
def test_python_device_blocks_the_same_way(n):
    """The PYTHON interpreter runs the same blocked loops (tails included), one add at a time."""
    x = distribution("const", n)  # one add at a time over all n loses ~n/8 ulps here (26 and 195 ulps * log2(n))
    exact, abs_sum = exact_sum(x)
    assert_sum_accurate(Tensor(x, device="PYTHON").sum().item(), float(exact), float(abs_sum), n, c_ulps=C_ULPS_SERIAL)
    assert_sum_accurate(Tensor(x, device="CPU").sum().item(), float(exact), float(abs_sum), n)


def test_python_device_blocks_outer_axes_and_tails():
    """Summing axes (0, 2): the tail of the long inner axis repeats the outer axis in a loop nest of its own."""
    x = distribution("uniform", 2 * 3 * 700, seed=9).reshape(2, 3, 700)
    exact, abs_sum = exact_sum(x, (0, 2))
    for device, c_ulps in (("PYTHON", C_ULPS_SERIAL), ("CPU", C_ULPS)):
        got = Tensor(x, device=device).sum((0, 2)).numpy()
        for g, e, a in zip(got, exact, abs_sum):
            assert_sum_accurate(g, float(e), float(a), 1400, c_ulps=c_ulps)
