"""EMULATED_DTYPES (codegen/emulate.py): kernels that hold half, bfloat16 and fp8 as bits give the native path's bits
for every pattern decoded and for float32/float64 values encoded, ties and specials included."""

import numpy as np
import pytest

from fusegrad import Context, Tensor, dtypes
from fusegrad.helpers import EMULATED_DTYPES
from fusegrad.runtime.device import Device

NARROW = [dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz]
ALL = "half,bfloat16,fp8e4m3,fp8e5m2,fp8e4m3fnuz,fp8e5m2fnuz"


def bits_dtype(dt):
    return dtypes.uint16 if dt.itemsize == 2 else dtypes.uint8


def native_and_emulated(fn):
    """fn() without and with every narrow float emulated, as numpy arrays."""
    native = fn()
    with Context(EMULATED_DTYPES=ALL):
        return native, fn()


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_every_bit_pattern_decodes_like_the_native_cast(dt):
    n = 1 << (8 * dt.itemsize)
    pattern = np.arange(n, dtype=np.uint16 if n > 256 else np.uint8)
    native, emulated = native_and_emulated(
        lambda: Tensor(pattern).bitcast(dt).cast(dtypes.float32).numpy().view(np.uint32)
    )
    np.testing.assert_array_equal(emulated, native)
    native, emulated = native_and_emulated(lambda: Tensor(pattern).bitcast(dt).cast(dtypes.float64).numpy())
    np.testing.assert_array_equal(emulated.view(np.uint64), native.view(np.uint64))


def _float32_cases() -> np.ndarray:
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, 60000, dtype=np.uint64).astype(np.uint32)
    # every value a narrow float holds and the midpoints between them (the ties), both signs
    grid = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    grid = np.sort(grid[np.isfinite(grid)])
    mids = (grid[:-1].astype(np.float64) + grid[1:]) / 2
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.0e38, 1e-45, 448, 464, 480, 57344, 61440, 65520])
    return np.concatenate([random_bits.view(np.float32), grid, mids.astype(np.float32), special.astype(np.float32)])


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_float32_values_encode_like_the_native_cast(dt):
    x = _float32_cases()
    native, emulated = native_and_emulated(lambda: Tensor(x).cast(dt).bitcast(bits_dtype(dt)).numpy())
    np.testing.assert_array_equal(emulated, native)


@pytest.mark.parametrize("dt", NARROW, ids=lambda d: d.name)
def test_float64_values_round_once_like_the_native_cast(dt):
    rng = np.random.default_rng(1)
    grid = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    grid = np.sort(grid[np.isfinite(grid)])
    mids = (grid[:-1] + grid[1:]) / 2
    # a hair off each tie: rounded to float32 first, these would round as the tie itself
    x = np.concatenate([mids, mids * (1 + 2.0**-40), mids * (1 - 2.0**-40), rng.standard_normal(20000) * 100])
    native, emulated = native_and_emulated(lambda: Tensor(x).cast(dt).bitcast(bits_dtype(dt)).numpy())
    np.testing.assert_array_equal(emulated, native)


def test_emulated_kernels_hold_no_narrow_float_type():
    from fusegrad.codegen import lower_to_linear

    a = Tensor(np.array([1.5, 2.5], np.float32)).cast(dtypes.half)
    out = (a * a).cast(dtypes.fp8e4m3)
    sched = out.schedule()
    with Context(EMULATED_DTYPES=ALL):
        lin = lower_to_linear(sched[-1].ast, Device["CPU"].renderer).lin
    assert not {u.dtype for u in lin} & set(NARROW)
    with Context(EMULATED_DTYPES=ALL):
        np.testing.assert_array_equal(out.cast(dtypes.float32).numpy(), [2.25, 6.0])


def test_emulated_dtypes_tolist_and_bad_names():
    with Context(EMULATED_DTYPES="half,bfloat16,fp8e4m3,fp8e5m2,long,ulong"):
        assert EMULATED_DTYPES.tolist(dtypes) == [
            dtypes.half,
            dtypes.bfloat16,
            dtypes.fp8e4m3,
            dtypes.fp8e5m2,
            dtypes.long,
            dtypes.ulong,
        ]
        assert EMULATED_DTYPES.tolist() == ["half", "bfloat16", "fp8e4m3", "fp8e5m2", "long", "ulong"]
    with Context(EMULATED_DTYPES="half,float17"), pytest.raises(ValueError, match="float17"):
        (Tensor([1.0]) + 2).numpy()
