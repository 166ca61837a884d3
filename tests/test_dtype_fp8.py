"""fp8 dtypes (docs/api.md): the conversion helpers against ml_dtypes, and fp8 tensors on the CPU and PYTHON devices.

ml_dtypes is the independent reference for the bit patterns. Where fusegrad and ml_dtypes differ (ml_dtypes turns a
finite overflow of a format without inf into NaN; fusegrad saturates it), the reference is ml_dtypes applied to the
input clipped to the format's range.
"""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes
from fusegrad.dtype import float_to_fp8, fp8_to_float, least_upper_dtype

ML_TYPE = {
    dtypes.fp8e4m3: ml_dtypes.float8_e4m3fn,
    dtypes.fp8e5m2: ml_dtypes.float8_e5m2,
    dtypes.fp8e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    dtypes.fp8e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
}
HAS_INF = {dtypes.fp8e4m3: False, dtypes.fp8e5m2: True, dtypes.fp8e4m3fnuz: False, dtypes.fp8e5m2fnuz: False}
FP8S = list(ML_TYPE)
DEVICES = ["CPU", "PYTHON"]
ALL_BITS = np.arange(256, dtype=np.uint8)


def ml_max(dt) -> float:
    return float(ml_dtypes.finfo(ML_TYPE[dt]).max)


def ref_bits(x: np.ndarray, dt) -> np.ndarray:
    """ml_dtypes' rounding, with finite overflow saturated where the format has no inf."""
    x = np.asarray(x, dtype=np.float64)
    if not HAS_INF[dt]:
        x = np.where(np.isfinite(x), np.clip(x, -ml_max(dt), ml_max(dt)), x)
    with np.errstate(over="ignore"):  # e5m2 overflowing to inf is the intended result
        return x.astype(ML_TYPE[dt]).view(np.uint8)


def ref_round(x: np.ndarray, dt) -> np.ndarray:
    """x rounded to dt and widened back to float32, as fusegrad stores an op's float32 result."""
    return ref_bits(x, dt).view(ML_TYPE[dt]).astype(np.float32)


def grid(dt) -> np.ndarray:
    """Every non-NaN value of the format, as float32."""
    v = ALL_BITS.view(ML_TYPE[dt]).astype(np.float32)
    return v[~np.isnan(v)]


def dense_inputs(dt, rng_count: int = 4000) -> np.ndarray:
    """float32 inputs that probe every rounding decision: every fp8 value, each tie between neighbours and the floats
    next to it, subnormals, values past the largest finite value, ±inf, NaN, ±0, and random values across the range."""
    finite = np.unique(grid(dt)[np.isfinite(grid(dt))].astype(np.float64))
    ties = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
    assert np.array_equal(ties.astype(np.float64), (finite[1:] + finite[:-1]) / 2), "ties must be exact in float32"
    top = finite[-1]
    beyond = np.float32([top * 1.01, top * 1.04, top * 1.0625, top * 1.07, top * 1.2, top * 2, 1e20, 3.4e38])
    tiny = np.float32([1e-30, 1e-12, finite[finite > 0][0] / 2, finite[finite > 0][0] / 3, finite[finite > 0][0] * 0.7])
    specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan])
    rng = np.random.default_rng(0)
    randoms = (rng.standard_normal(rng_count) * np.exp2(rng.uniform(-20, 18, rng_count))).astype(np.float32)
    parts = [finite.astype(np.float32), ties, beyond, tiny]
    parts += [np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))]
    parts += [np.nextafter(beyond, np.float32(0))]
    body = np.concatenate(parts)
    return np.concatenate([body, -body, specials, randoms])


def nan_bits(dt, negative: bool) -> int:
    """The NaN a NaN input becomes: fnuz has one (0x80); OCP formats keep the sign of the input."""
    if dt in (dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz):
        return 0x80
    positive = int(np.array([np.nan], np.float32).astype(ML_TYPE[dt]).view(np.uint8)[0])
    return positive | (0x80 if negative else 0)


def assert_bits(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> None:
    bad = np.flatnonzero(np.asarray(got) != np.asarray(want))
    assert bad.size == 0, (
        f"{bad.size} mismatches, e.g. {x.reshape(-1)[bad[:6]]} -> {got[bad[:6]]}, want {want[bad[:6]]}"
    )


# ------------------------------------------------------------------ the helpers against ml_dtypes


@pytest.mark.parametrize("dt", FP8S)
def test_fp8_to_float_all_bit_patterns(dt):
    ref = ALL_BITS.view(ML_TYPE[dt]).astype(np.float32)
    got = fp8_to_float(ALL_BITS, dt)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(np.signbit(got[~np.isnan(ref)]), np.signbit(ref[~np.isnan(ref)]))
    scalars = [fp8_to_float(int(b), dt) for b in ALL_BITS]
    assert all(isinstance(s, float) for s in scalars)
    np.testing.assert_array_equal(np.array(scalars, np.float32), ref)


@pytest.mark.parametrize("dt", FP8S)
def test_fp8_format_facts(dt):
    """fnuz: no -0 and a single NaN 0x80; e4m3: finite only; e5m2: has inf."""
    values = fp8_to_float(ALL_BITS, dt)
    nans = np.flatnonzero(np.isnan(values))
    if dt in (dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz):
        assert nans.tolist() == [0x80]
        assert not np.any((values == 0) & np.signbit(values))
    else:
        assert np.any((values == 0) & np.signbit(values))
    assert np.isinf(values).any() == HAS_INF[dt]
    assert np.nanmax(values[np.isfinite(values)]) == ml_max(dt)


@pytest.mark.parametrize("dt", FP8S)
def test_float_to_fp8_dense_float32(dt):
    x = dense_inputs(dt, rng_count=200_000)
    got = float_to_fp8(x, dt)
    assert got.dtype == np.uint8 and got.shape == x.shape
    want = ref_bits(x, dt)
    nan_in = np.isnan(x)
    assert_bits(got[~nan_in], want[~nan_in], x[~nan_in])
    signs = np.signbit(x[nan_in])
    assert got[nan_in].tolist() == [nan_bits(dt, bool(s)) for s in signs]


@pytest.mark.parametrize("dt", FP8S)
def test_float_to_fp8_saturation_and_specials(dt):
    """e4m3 and the fnuz formats saturate finite overflow and give NaN for ±inf; e5m2 overflows to inf."""
    top = ml_max(dt)
    for big in (top * 1.5, 1e30, 1e300):
        for sign in (1.0, -1.0):
            value = fp8_to_float(float_to_fp8(sign * big, dt), dt)
            assert value == (sign * math.inf if HAS_INF[dt] else sign * top), (dt, sign * big, value)
    for inf in (math.inf, -math.inf):
        value = fp8_to_float(float_to_fp8(inf, dt), dt)
        assert value == inf if HAS_INF[dt] else math.isnan(value)
    assert math.isnan(fp8_to_float(float_to_fp8(math.nan, dt), dt))
    negative_zero = float_to_fp8(-0.0, dt)
    underflow = float_to_fp8(-1e-30, dt)
    fnuz = dt in (dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz)
    assert negative_zero == underflow == (0x00 if fnuz else 0x80)


@pytest.mark.parametrize("dt", FP8S)
def test_float_to_fp8_python_floats_round_once(dt):
    """Python floats (float64) round straight to fp8; through float32 a value just past a tie would round twice."""
    finite = np.unique(grid(dt)[np.isfinite(grid(dt))].astype(np.float64))
    ties = (finite[1:] + finite[:-1]) / 2
    x = np.concatenate([ties + ties * 2.0**-40, ties - ties * 2.0**-40, ties, finite, [0.0, -0.0, 1e300, -1e300]])
    want = ref_bits(x, dt)
    assert_bits(float_to_fp8(x, dt), want, x)
    assert_bits(np.array([float_to_fp8(float(v), dt) for v in x], np.uint8), want, x)
    assert all(isinstance(float_to_fp8(float(v), dt), int) for v in x[:4])


def test_helpers_take_dtype_names_and_refuse_non_fp8_dtypes():
    assert float_to_fp8(-1.75, "fp8e5m2") == int(ref_bits(np.array([-1.75]), dtypes.fp8e5m2)[0])
    assert fp8_to_float(0x3C, "fp8e5m2") == float(np.uint8(0x3C).view(ml_dtypes.float8_e5m2))
    with pytest.raises(TypeError, match="float32"):
        float_to_fp8(1.0, dtypes.float32)
    with pytest.raises(TypeError, match="int8"):
        fp8_to_float(3, dtypes.int8)


# ------------------------------------------------------------------ tensors: data in and out


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_tensor_from_python_and_numpy(dt, dev):
    values = [1.0, 2.5, -3.3, 0.1, 1000.0, -1e6, 1e-30, -0.0, 7.0 / 3.0, float("inf"), float("nan")]
    from_list = Tensor(values, dtype=dt, device=dev)
    assert from_list.dtype is dt and from_list.shape == (len(values),)
    out = from_list.numpy()
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, ref_round(np.array(values), dt))
    listed = from_list.tolist()
    assert all(isinstance(v, float) for v in listed)
    np.testing.assert_array_equal(np.array(listed, np.float32), out)
    nested = Tensor([[1, 2], [3, 500]], dtype=dt, device=dev)
    np.testing.assert_array_equal(nested.numpy(), ref_round(np.array([[1, 2], [3, 500]]), dt))
    for np_dtype in (np.float16, np.float32, np.float64, np.int32, np.uint8, np.bool_):
        arr = np.array([[0.4, 1.6, 3.0], [-2.2, 17.9, 300.0]]).astype(np_dtype)
        t = Tensor(arr, dtype=dt, device=dev)
        np.testing.assert_array_equal(t.numpy(), ref_round(arr.astype(np.float64), dt))
    assert Tensor(2.5, dtype=dt, device=dev).item() == float(ref_round(np.array(2.5), dt))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_bitcast_to_and_from_uint8(dt, dev):
    raw = Tensor(ALL_BITS, device=dev)
    as_fp8 = raw.bitcast(dt)
    assert as_fp8.dtype is dt
    np.testing.assert_array_equal(as_fp8.numpy(), ALL_BITS.view(ML_TYPE[dt]).astype(np.float32))
    back = as_fp8.bitcast(dtypes.uint8).numpy()
    if dev == "CPU":
        np.testing.assert_array_equal(back, ALL_BITS)
    else:  # the interpreter holds an fp8 as its float value, so e5m2's NaN payloads come back as its one quiet NaN
        nan = np.isnan(fp8_to_float(ALL_BITS, dt))
        np.testing.assert_array_equal(back[~nan], ALL_BITS[~nan])
        assert back[nan].tolist() == [nan_bits(dt, bool(b & 0x80)) for b in ALL_BITS[nan]]
    np.testing.assert_array_equal(as_fp8.bitcast(dtypes.int8).numpy(), back.view(np.int8))
    values = np.float32([1.0, -2.0, 0.375, 448.0 if HAS_INF[dt] else 1.5])
    np.testing.assert_array_equal(
        Tensor(values, dtype=dt, device=dev).bitcast(dtypes.uint8).numpy(), ref_bits(values, dt)
    )


# ------------------------------------------------------------------ casts in the kernels


def _cpu_python_inputs(dt, dev) -> np.ndarray:
    # the interpreter runs one scalar at a time: it gets the structured inputs and fewer random ones
    return dense_inputs(dt, rng_count=4000 if dev == "CPU" else 300)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_kernel_cast_float32_to_fp8_bit_exact(dt, dev):
    x = _cpu_python_inputs(dt, dev)
    got = Tensor(x, device=dev).cast(dt).bitcast(dtypes.uint8).numpy()
    assert_bits(got, float_to_fp8(x, dt), x)
    nan_in = np.isnan(x)
    assert_bits(got[~nan_in], ref_bits(x[~nan_in], dt), x[~nan_in])


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_kernel_cast_float64_to_fp8_rounds_once(dt, dev):
    finite = np.unique(grid(dt)[np.isfinite(grid(dt))].astype(np.float64))
    ties = (finite[1:] + finite[:-1]) / 2
    x = np.concatenate([ties + ties * 2.0**-40, ties - ties * 2.0**-40, ties, [1e300, -1e300, np.inf, -0.0]])
    got = Tensor(x, device=dev).cast(dt).bitcast(dtypes.uint8).numpy()
    assert_bits(got, ref_bits(x, dt), x)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_kernel_cast_fp8_to_every_dtype(dt, dev):
    """fp8 -> float dtypes is exact; -> int truncates toward zero (values in range); -> bool is != 0."""
    bits = Tensor(ALL_BITS, device=dev).bitcast(dt)
    values = ALL_BITS.view(ML_TYPE[dt]).astype(np.float32)
    np.testing.assert_array_equal(bits.cast(dtypes.float32).numpy(), values)
    np.testing.assert_array_equal(bits.cast(dtypes.float64).numpy(), values.astype(np.float64))
    np.testing.assert_array_equal(bits.cast(dtypes.float16).numpy(), values.astype(np.float16))
    np.testing.assert_array_equal(bits.cast(dtypes.bfloat16).numpy(), values)
    np.testing.assert_array_equal(bits.cast(dtypes.bool).numpy(), values != 0)
    number = ~np.isnan(values)
    for other in FP8S:
        got = bits.cast(other).bitcast(dtypes.uint8).numpy()
        assert_bits(got[number], float_to_fp8(values[number], other), values[number])
        # a cast to its own dtype changes nothing, so e5m2's NaN payloads may survive it
        assert np.isnan(fp8_to_float(got[~number], other)).all()
    for int_dt, np_int in ((dtypes.int8, np.int8), (dtypes.int32, np.int32), (dtypes.int64, np.int64)):
        keep = np.isfinite(values) & (np.abs(values) < 127)
        ints = Tensor(values[keep], device=dev, dtype=dt).cast(int_dt).numpy()
        np.testing.assert_array_equal(ints, np.trunc(values[keep]).astype(np_int))
    for uint_dt, np_uint in ((dtypes.uint8, np.uint8), (dtypes.uint32, np.uint32)):
        keep = np.isfinite(values) & (values >= 0) & (values < 255)
        np.testing.assert_array_equal(
            Tensor(values[keep], device=dev, dtype=dt).cast(uint_dt).numpy(), np.trunc(values[keep]).astype(np_uint)
        )


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_kernel_cast_every_dtype_to_fp8(dt, dev):
    ints = np.array([-128, -100, -17, -1, 0, 1, 3, 9, 17, 33, 100, 127])
    for int_dt, np_int in (
        (dtypes.int8, np.int8),
        (dtypes.int16, np.int16),
        (dtypes.int32, np.int32),
        (dtypes.int64, np.int64),
    ):
        got = Tensor(ints.astype(np_int), device=dev).cast(dt).bitcast(dtypes.uint8).numpy()
        assert_bits(got, ref_bits(ints, dt), ints)
    big = np.array([0, 1, 255, 1000, 70000, 2**31 - 1])
    got = Tensor(big.astype(np.uint32), device=dev).cast(dt).bitcast(dtypes.uint8).numpy()
    assert_bits(got, ref_bits(big, dt), big)
    halves = np.float16([0.1, -0.3, 5.5, 1e-7, -6e4, np.inf, -0.0, 300.0])
    got = Tensor(halves, device=dev).cast(dt).bitcast(dtypes.uint8).numpy()
    assert_bits(got, ref_bits(halves, dt), halves)
    bf = Tensor([0.1, -0.3, 5.5, 1e-7, -6e4, 300.0], device=dev, dtype=dtypes.bfloat16)
    got = bf.cast(dt).bitcast(dtypes.uint8).numpy()
    assert_bits(got, ref_bits(bf.numpy(), dt), bf.numpy())
    flags = np.array([True, False, True])
    got = Tensor(flags, device=dev).cast(dt).numpy()
    np.testing.assert_array_equal(got, flags.astype(np.float32))


# ------------------------------------------------------------------ arithmetic: computed in float32, stored back


def fp8_operands(dt, shape, rng, low=-4.0, high=4.0) -> np.ndarray:
    """Random values on the fp8 grid (exact in fp8)."""
    return ref_round(rng.uniform(low, high, shape), dt)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_elementwise_in_float32_rounded_back(dt, dev):
    rng = np.random.default_rng(1)
    a = np.concatenate([fp8_operands(dt, 40, rng), grid(dt)[::7]])
    b = np.concatenate([fp8_operands(dt, 40, rng), grid(dt)[::-7][: a.size - 40]])
    b = np.resize(b, a.shape).astype(np.float32)
    ta, tb = Tensor(a, dtype=dt, device=dev), Tensor(b, dtype=dt, device=dev)
    with np.errstate(all="ignore"):
        cases = {
            "add": (ta + tb, a + b),
            "mul": (ta * tb, a * b),
            "sub": (ta - tb, a - b),
            "div": (ta / tb, a / b),
            "relu": (ta.relu(), np.maximum(a, 0)),
            "neg": (-ta, -a),
            "square": (ta * ta, a * a),
            "exp": (ta.exp(), np.exp(a)),
            "scalar": (ta * 2.5, a * np.float32(ref_round(np.array(2.5), dt))),
        }
    for name, (out, want) in cases.items():
        assert out.dtype is dt, name
        np.testing.assert_array_equal(out.numpy(), ref_round(want, dt), err_msg=name)
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)
    np.testing.assert_array_equal(Tensor.where(ta < tb, ta, tb).numpy(), np.where(a < b, a, b))


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", FP8S)
def test_sum_and_matmul(dt, dev):
    """sum accumulates in float32 and rounds once; matmul is a product (one fp8 op) then that sum.
    Operands stay in [-4, 4] so every float32 partial sum is exact and the summation order cannot matter."""
    rng = np.random.default_rng(2)
    x = fp8_operands(dt, (6, 8), rng)
    t = Tensor(x, dtype=dt, device=dev)
    for axis in (None, 0, 1):
        out = t.sum(axis=axis)
        assert out.dtype is dt
        np.testing.assert_array_equal(out.numpy(), ref_round(x.sum(axis=axis, dtype=np.float32), dt))
    w = fp8_operands(dt, (8, 5), rng)
    tw = Tensor(w, dtype=dt, device=dev)
    products = ref_round(x[:, :, None] * w[None, :, :], dt)
    out = t @ tw
    assert out.dtype is dt
    np.testing.assert_array_equal(out.numpy(), ref_round(products.sum(axis=1, dtype=np.float32), dt))
    wide = t.matmul(tw, dtype=dtypes.float32)
    assert wide.dtype is dtypes.float32
    np.testing.assert_array_equal(wide.numpy(), x @ w)


def test_promotion():
    """Promotion: fp8 -> {float16, bfloat16} -> float32; two different fp8 formats meet at float16."""
    for a in FP8S:
        for b in FP8S:
            assert least_upper_dtype(a, b) is (a if a is b else dtypes.float16)
        assert least_upper_dtype(a, dtypes.bfloat16) is dtypes.bfloat16
        assert least_upper_dtype(a, dtypes.float32) is dtypes.float32
        assert least_upper_dtype(a, dtypes.int64) is a
        assert least_upper_dtype(a, dtypes.bool) is a


@pytest.mark.parametrize("dev", DEVICES)
def test_mixed_fp8_arithmetic_promotes(dev):
    rng = np.random.default_rng(3)
    a = fp8_operands(dtypes.fp8e4m3, 16, rng)
    b = fp8_operands(dtypes.fp8e5m2, 16, rng)
    ta, tb = Tensor(a, dtype=dtypes.fp8e4m3, device=dev), Tensor(b, dtype=dtypes.fp8e5m2, device=dev)
    out = ta + tb
    assert out.dtype is dtypes.float16
    np.testing.assert_array_equal(out.numpy(), (a.astype(np.float16) + b.astype(np.float16)))
    fnuz = Tensor(b, dtype=dtypes.fp8e4m3fnuz, device=dev)
    assert (ta * fnuz).dtype is dtypes.float16
    assert (ta + Tensor(b, device=dev)).dtype is dtypes.float32
    np.testing.assert_array_equal((ta + Tensor(b, device=dev)).numpy(), a + b)
    ints = Tensor(np.arange(16, dtype=np.int32), device=dev)
    assert (ta + ints).dtype is dtypes.fp8e4m3
    np.testing.assert_array_equal((ta + ints).numpy(), ref_round(a + np.arange(16, dtype=np.float32), dtypes.fp8e4m3))


@pytest.mark.parametrize("dt", FP8S)
def test_gradients_run_like_half(dt):
    """Backward through fp8 works wherever it works for float16; each backward op also rounds to fp8."""
    rng = np.random.default_rng(4)
    x = fp8_operands(dt, (3, 4), rng, -2.0, 2.0)
    t = Tensor(x, dtype=dt, requires_grad=True)
    (t * t).sum().backward()
    assert t.grad is not None and t.grad.dtype is dt
    np.testing.assert_array_equal(t.grad.numpy(), 2 * x)  # x*1 + x*1: exact in every format
    w_values = fp8_operands(dt, (4, 2), rng)
    for wdt in (dt, dtypes.float16):
        t, w = Tensor(x, dtype=wdt, requires_grad=True), Tensor(w_values, dtype=wdt, requires_grad=True)
        (t @ w).relu().sum().backward()
        assert t.grad.dtype is wdt and w.grad.dtype is wdt
        tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w_values, requires_grad=True)
        (tx @ tw).relu().sum().backward()
        # two fp8 roundings (product, sum) of at most half an ulp each: within 2**-mantissa_bits relative
        rtol = 2.0 ** -dtypes.finfo(wdt)[1]
        np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=1e-6)
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=rtol, atol=1e-6)
