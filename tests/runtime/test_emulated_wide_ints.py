"""EMULATED_DTYPES long/ulong: 64-bit integers held as pairs of 32-bit words give the native path's bits for every
op, with values that use all 64 bits (carries, signs, the extremes), on every backend that compiles kernels."""

from __future__ import annotations

import numpy as np
import pytest

from fusegrad import Context, Tensor, dtypes
from fusegrad.codegen.emulate_wide import WideIntError
from fusegrad.runtime.device import Device
from test_backend_ops import UNSUPPORTED, _need

DEVICES = ["CPU", pytest.param("LLVM", marks=pytest.mark.slow), pytest.param("CL", marks=pytest.mark.slow)]
EDGES = [-(2**63), 2**63 - 1, 0, -1, 1, 2**32, 2**32 - 1, -(2**32), 2**31, -(2**31) - 1, 2**53 + 1, -(2**53) - 3]


def _inputs(dt) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max, (4, 40), dtype=dt, endpoint=True)
    b = rng.integers(info.min >> 20, info.max >> 20, (4, 40), dtype=dt, endpoint=True)
    a[0, : len(EDGES)] = np.array(EDGES, dtype=np.int64).astype(dt)
    b[1, : len(EDGES)] = np.array(EDGES[::-1], dtype=np.int64).astype(dt)
    b[2, :3] = [0, 1, 0]  # division by zero is defined as 0
    return a, b


SIGNED_CASES = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "neg": lambda x, y: -x,
    "maximum": lambda x, y: x.maximum(y),
    "cmplt": lambda x, y: x < y,
    "cmpeq": lambda x, y: x == y,
    "cmpne": lambda x, y: x != y,
    "where": lambda x, y: (x > y).where(x, y * 2),
    "idiv": lambda x, y: x // y,
    "mod": lambda x, y: x % y,
    "bitwise": lambda x, y: (x & y) ^ (x | 3),
    "shift": lambda x, y: (x << 2) + (x >> 1) + (x >> 35) + (x << 33),
    "sum": lambda x, y: x.sum(1),
    "sum_all": lambda x, y: x.sum(),
    "max": lambda x, y: x.max(0),
    "min": lambda x, y: x.min(1),
    "argmax": lambda x, y: x.argmax(1),
    "matmul": lambda x, y: x[:, :7] @ y[:, :7].T,
    "to_float32": lambda x, y: x.cast(dtypes.float32),
    "to_float64": lambda x, y: x.cast(dtypes.float64),
    "to_half": lambda x, y: (x >> 50).cast(dtypes.float16),
    "to_int32": lambda x, y: x.cast(dtypes.int32),
    "to_int8": lambda x, y: x.cast(dtypes.int8),
    "to_bool": lambda x, y: (x * (y & 1)).cast(dtypes.bool),
    "from_float64": lambda x, y: (x.cast(dtypes.float64) * -0.37).cast(dtypes.int64),
    "from_float32": lambda x, y: (x.cast(dtypes.float32) * 1e-9).cast(dtypes.int64),
    "from_int8": lambda x, y: x.cast(dtypes.int8).cast(dtypes.int64) * 3,
    "gather": lambda x, y: x[Tensor([3, 0, 3, 1], device=x.device)],
    "slice_pad": lambda x, y: x[1:, ::2].pad(((1, 0), (0, 2))).flip(0),
}
UNSIGNED_CASES = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "idiv_mod": lambda x, y: x // y + x % y,
    "shift": lambda x, y: (x >> 3) + (x << 31),
    "cmplt": lambda x, y: x < y,
    "maximum": lambda x, y: x.maximum(y),
    "max": lambda x, y: x.max(1),
    "sum": lambda x, y: x.sum(0),
    "to_float32": lambda x, y: x.cast(dtypes.float32),
    "to_float64": lambda x, y: x.cast(dtypes.float64),
    "to_int64": lambda x, y: x.cast(dtypes.int64) >> 1,
}


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint8) if x.dtype.kind == "f" else x


def _both(device: str, fn, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = []
    # a device without float16 (PoCL) holds it emulated on both sides
    narrow = "half" if dtypes.float16 in UNSUPPORTED[device] else ""
    for emulated in (narrow, ",".join(filter(None, ("long,ulong", narrow)))):
        with Context(EMULATED_DTYPES=emulated):
            out.append(fn(Tensor(a, device=device), Tensor(b, device=device)).numpy())
    return out[0], out[1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(SIGNED_CASES))
def test_int64_emulated_matches_native(device: str, name: str):
    _need(device)
    native, emulated = _both(device, SIGNED_CASES[name], *_inputs(np.int64))
    np.testing.assert_array_equal(_bits(emulated), _bits(native), err_msg=f"{name} int64 on {device}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(UNSIGNED_CASES))
def test_uint64_emulated_matches_native(device: str, name: str):
    _need(device)
    native, emulated = _both(device, UNSIGNED_CASES[name], *_inputs(np.uint64))
    np.testing.assert_array_equal(_bits(emulated), _bits(native), err_msg=f"{name} uint64 on {device}")


def test_results_agree_with_numpy():
    a, b = _inputs(np.int64)
    with Context(EMULATED_DTYPES="long"):
        x, y = Tensor(a), Tensor(b)
        got = [(x + y).numpy(), (x * y).numpy(), x.sum(1).numpy(), (x >> 7).numpy(), x.max(0).numpy()]
    with np.errstate(over="ignore"):
        want = [a + b, a * b, a.sum(1), a >> 7, a.max(0)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_kernels_hold_no_64_bit_type():
    from fusegrad.codegen import lower_to_linear

    x = Tensor(np.array([2**40, -3], np.int64))
    out = (x * x + 1).sum()
    with Context(EMULATED_DTYPES="long"):
        lin = lower_to_linear(out.schedule()[-1].ast, Device["CPU"].renderer).lin
        assert not {u.dtype for u in lin} & {dtypes.int64, dtypes.uint64}
        assert out.item() == 2**80 % 2**64 + 9 + 2


def test_a_long_sum_slices_its_low_words_narrower():
    # 70,000 terms: the low words' 16-bit slices would overflow a word, so the sum slices them narrower
    a = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 70_000, dtype=np.int64)
    with Context(EMULATED_DTYPES="long"):
        got = Tensor(a).sum().item()
    with np.errstate(over="ignore"):
        assert got == int(a.sum())


@pytest.mark.parametrize(
    "fn, what",
    [
        (lambda x: x.prod(), "MUL reduce over dtypes.int64"),
        (lambda x: x.bitcast(dtypes.float64), "bitcast from dtypes.int64 to dtypes.float64"),
    ],
)
def test_what_the_words_cannot_express_raises_naming_it(fn, what):
    x = Tensor(np.arange(3000, dtype=np.int64) % 3 + 1)
    with Context(EMULATED_DTYPES="long"), pytest.raises(WideIntError, match=what):
        fn(x).numpy()
    assert isinstance(WideIntError("x"), NotImplementedError)
