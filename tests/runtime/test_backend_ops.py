"""One op suite for every backend: each case runs forward (and backward where the op has one) on each device in
BACKENDS and must equal the CPU backend within the dtype's tolerance; on CPU itself it is checked against numpy.

Dtypes a backend does not support (UNSUPPORTED) must raise a clear error naming the dtype:
  CPU: none; LLVM: the fp8 formats; PYTHON: none (it runs the QUICK subset, on small shapes); CL: the fp8 formats,
  and float16 on a device without cl_khr_fp16 (PoCL)."""

from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.dtype import DType
from digits_steps import train_digits_steps

try:
    import llvmlite  # noqa: F401

    HAVE_LLVM = True
except ImportError:
    HAVE_LLVM = False

try:
    from fusegrad.runtime.device import Device

    CL_UNSUPPORTED: tuple[DType, ...] | None = Device["CL"].renderer.unsupported_dtypes()
except (ImportError, RuntimeError):
    CL_UNSUPPORTED = None  # no pyopencl or no OpenCL driver (.ci/run installs PoCL)

BACKENDS = ["CPU", "LLVM", "PYTHON", "CL"]  # another runnable backend is one more entry here
UNSUPPORTED: dict[str, tuple[DType, ...]] = {"CPU": (), "LLVM": dtypes.fp8s, "PYTHON": (), "CL": CL_UNSUPPORTED or ()}
SUBSET_ONLY = {"PYTHON"}  # interpreters: only the QUICK cases
# outside the QUICK cases these run with the slow tests (CI): a new OpenCL kernel costs PoCL about ten C compiles,
# and the CPU backend runs every case; the QUICK ones keep each renderer in the fast run
SLOW_BEYOND_QUICK = {"CL", "LLVM"}

FLOATS = (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64)
INTS = (dtypes.int32, dtypes.int8)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + (dtypes.bool,)
# relative and absolute tolerance between two backends (same math, other instruction order or vector width)
TOLERANCE = {
    dtypes.float32: (2e-5, 2e-5),
    dtypes.float16: (2e-3, 2e-3),
    dtypes.bfloat16: (1.6e-2, 1.6e-2),
    dtypes.float64: (1e-12, 1e-12),
}
SUM_TOLERANCE = {dtypes.float32: (2e-4, 2e-4), dtypes.float64: (1e-10, 1e-10)}


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., Tensor]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[DType, ...]
    grad: bool = False  # also compare the gradients of every float input (float32 and float64)
    low: float = -3.0
    high: float = 3.0
    sums: bool = False  # accumulates many terms: sum tolerance
    reference: Callable[..., np.ndarray] | None = None  # numpy, on float64 inputs, checked on the CPU backend


def _cases() -> list[Case]:
    ew = ((4, 33), (4, 33))
    return [
        # elementwise, binary
        Case("add", lambda a, b: a + b, ew, NUMERIC, grad=True, reference=np.add),
        Case("sub", lambda a, b: a - b, ew, NUMERIC, grad=True, reference=np.subtract),
        Case("mul", lambda a, b: a * b, ew, NUMERIC, grad=True, reference=np.multiply),
        Case("div", lambda a, b: a / (b.abs() + 0.5), ew, FLOATS, grad=True, reference=lambda a, b: a / (abs(b) + 0.5)),
        Case("maximum", lambda a, b: a.maximum(b), ew, NUMERIC, grad=True, reference=np.maximum),
        Case("pow", lambda a, b: a.pow(b), ew, FLOATS, grad=True, low=0.5, high=2.0, reference=np.power),
        Case("cmplt", lambda a, b: a < b, ew, ALL, reference=np.less),
        Case("where", lambda a, b: (a > b).where(a, b * 2), ew, NUMERIC, grad=True, reference=None),
        Case("idiv_mod", lambda a, b: a // (b.abs() + 1) + a % (b.abs() + 1), ew, INTS),
        Case("bitwise", lambda a, b: (a & b) ^ (a | 3), ew, INTS + (dtypes.bool,)),
        Case("shift", lambda a: (a << 2) + (a >> 1), ew[:1], INTS),
        # elementwise, unary (transcendental ones included)
        Case("neg", lambda a: -a, ew[:1], NUMERIC, grad=True, reference=np.negative),
        Case("abs", lambda a: a.abs(), ew[:1], NUMERIC, grad=True, reference=np.abs),
        Case("exp", lambda a: a.exp(), ew[:1], FLOATS, grad=True, reference=np.exp),
        Case("log", lambda a: a.log(), ew[:1], FLOATS, grad=True, low=0.1, high=5.0, reference=np.log),
        Case("sqrt", lambda a: a.sqrt(), ew[:1], FLOATS, grad=True, low=0.1, high=5.0, reference=np.sqrt),
        Case("sin", lambda a: a.sin(), ew[:1], FLOATS, grad=True, reference=np.sin),
        Case("cos", lambda a: a.cos(), ew[:1], FLOATS, grad=True, reference=np.cos),
        Case("exp2_log2", lambda a: a.exp2() + (a.abs() + 0.1).log2(), ew[:1], FLOATS, grad=True),
        Case("tanh", lambda a: a.tanh(), ew[:1], FLOATS, grad=True, reference=np.tanh),
        Case("sigmoid", lambda a: a.sigmoid(), ew[:1], FLOATS, grad=True, reference=lambda a: 1 / (1 + np.exp(-a))),
        Case("relu", lambda a: a.relu(), ew[:1], NUMERIC, grad=True, reference=lambda a: np.maximum(a, 0)),
        Case("reciprocal", lambda a: (a.abs() + 0.5).reciprocal(), ew[:1], FLOATS, grad=True),
        Case("gelu", lambda a: a.gelu(), ew[:1], FLOATS, grad=True),
        # reductions
        Case(
            "sum",
            lambda a: a.sum(1),
            ((5, 300),),
            NUMERIC,
            grad=True,
            sums=True,
            reference=lambda a: a.sum(1),
        ),
        Case("sum_all", lambda a: a.sum(), ((129, 65),), FLOATS, grad=True, sums=True, reference=lambda a: a.sum()),
        Case("max", lambda a: a.max(0), ((33, 7),), NUMERIC, grad=True, reference=lambda a: a.max(0)),
        Case("mean", lambda a: a.mean((0, 2)), ((6, 5, 40),), FLOATS, grad=True, sums=True),
        Case("argmax", lambda a: a.argmax(1), ((9, 31),), NUMERIC, reference=lambda a: a.argmax(1)),
        Case("cumsum", lambda a: a.cumsum(1), ((3, 40),), FLOATS + (dtypes.int32,), grad=True, sums=True),
        Case("softmax", lambda a: a.softmax(-1), ((7, 50),), FLOATS, grad=True, sums=True),
        # matmul and conv
        Case("matmul", lambda a, b: a @ b, ((17, 33), (33, 9)), NUMERIC, grad=True, sums=True),
        Case("matmul_tiled", lambda a, b: a @ b, ((64, 48), (48, 80)), FLOATS + (dtypes.int32,), grad=True, sums=True),
        Case(
            "conv2d",
            lambda x, w: x.conv2d(w, padding=1),
            ((2, 3, 9, 9), (4, 3, 3, 3)),
            (dtypes.float32, dtypes.float16, dtypes.float64),
            grad=True,
            sums=True,
        ),
        Case(
            "conv2d_strided",
            lambda x, w: x.conv2d(w, stride=2),
            ((1, 2, 11, 11), (3, 2, 3, 3)),
            (dtypes.float32,),
            grad=True,
            sums=True,
        ),
        # indexing and movement
        Case(
            "gather",
            lambda a: a.gather(1, Tensor([[0, 3, 3], [2, 1, 0], [4, 4, 0]], device=a.device)),
            ((3, 5),),
            ALL,
            grad=True,
        ),
        Case("index_tensor", lambda a: a[Tensor([2, 0, 2, 1], device=a.device)], ((3, 6),), ALL, grad=True),
        Case("slice_pad", lambda a: a[1:, ::2].pad(((1, 0), (0, 2))).flip(0), ((5, 8),), ALL, grad=True),
        Case(
            "permute_expand",
            lambda a: a.permute(1, 0).reshape(1, 6, 4).expand(3, 6, 4) * 1,
            ((4, 6),),
            NUMERIC,
            grad=True,
        ),
    ]


CASES = {c.name: c for c in _cases()}
# the PYTHON subset (float32, int32 and bool only)
QUICK = {
    "add",
    "mul",
    "maximum",
    "cmplt",
    "idiv_mod",
    "exp",
    "relu",
    "max",
    "matmul",
    "slice_pad",
    "div",
    "where",
    "sin",
    "log",
    "argmax",
    "cumsum",
    "softmax",
    "index_tensor",
    "conv2d_strided",
    "bitwise",
}
# a new PoCL kernel costs about a second: CL's fast cases are the QUICK ones in float32, less the strided conv (5 s),
# plus the integer-only ops in int32; the rest run with the slow tests (CI)
CL_SLOW, CL_INT_QUICK = {"conv2d_strided"}, {"idiv_mod", "bitwise"}
CASTS = [(s, d) for s in ALL for d in ALL if s is not d]


def short(dt: DType) -> str:
    return repr(dt).removeprefix("dtypes.")


def _params(devices: list[str]):
    for device in devices:
        for case in CASES.values():
            for dt in case.dtypes:
                quick = case.name in QUICK and dt in (dtypes.float32, dtypes.int32, dtypes.bool)
                if device in SUBSET_ONLY and not quick:
                    continue
                fast = quick and not (device == "CL" and (dt is not dtypes.float32 or case.name in CL_SLOW))
                if device == "CL" and case.name in CL_INT_QUICK and dt is dtypes.int32:
                    fast = True
                marks = pytest.mark.slow if device in SLOW_BEYOND_QUICK and not fast else ()
                yield pytest.param(device, case.name, dt, id=f"{device}-{case.name}-{short(dt)}", marks=marks)


def _need(device: str) -> None:
    if device == "LLVM" and not HAVE_LLVM:
        pytest.skip("the LLVM device needs llvmlite (pip install llvmlite)")
    if device == "CL" and CL_UNSUPPORTED is None:
        pytest.skip("the CL device needs pyopencl and an OpenCL driver (PoCL: apt-get install pocl-opencl-icd)")


def _inputs(case: Case, dt: DType, small: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(abs(hash((case.name, dt.name))) % 2**32)
    out = []
    for shape in case.shapes:
        if small and len(shape) == 2 and case.name in ("sum",):
            shape = (shape[0], 37)
        if dt is dtypes.bool:
            out.append(rng.random(shape) < 0.5)
        elif dtypes.is_int(dt):
            out.append(rng.integers(-9 if dt is dtypes.int8 else -50, 10 if dt is dtypes.int8 else 50, shape))
        else:
            out.append(rng.uniform(case.low, case.high, shape))
    return out


def _tensor(x: np.ndarray, dt: DType, device: str, grad: bool) -> Tensor:
    if dt is dtypes.bool:
        t = Tensor(x.astype(bool), device=device)
    elif dtypes.is_int(dt):
        t = Tensor(x.astype(np.int64), device=device).cast(dt)
    else:
        t = Tensor(x.astype(np.float64), device=device).cast(dt)
    t = t.contiguous().realize()
    return t.requires_grad_(True) if grad else t


def _numpy(t: Tensor) -> np.ndarray:
    if t.dtype in (dtypes.bfloat16, dtypes.float16):
        t = t.cast(dtypes.float32)
    return t.numpy()


def _grad_dtypes(case: Case, dt: DType) -> bool:
    return case.grad and dt in (dtypes.float32, dtypes.float64)


def run(device: str, name: str, dt: DType, small: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    case = CASES[name]
    with_grad = _grad_dtypes(case, dt)
    inputs = [_tensor(x, dt, device, with_grad) for x in _inputs(case, dt, small)]
    out = case.fn(*inputs)
    result = _numpy(out)
    grads = []
    if with_grad:
        weights = np.random.default_rng(7).uniform(-1, 1, out.shape)
        (out * Tensor(weights, device=device).cast(out.dtype)).sum().backward()
        grads = [_numpy(t.grad) for t in inputs]
    return result, grads


@functools.cache
def cpu_result(name: str, dt: DType, small: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    return run("CPU", name, dt, small)


def assert_close(got: np.ndarray, want: np.ndarray, dt: DType, sums: bool, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} vs {want.dtype}"
    if not dtypes.is_float(dt) or got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    rtol, atol = (SUM_TOLERANCE if sums else TOLERANCE).get(dt, TOLERANCE[dt])
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


@pytest.mark.parametrize("device, name, dt", list(_params(BACKENDS)))
def test_op(device: str, name: str, dt: DType):
    _need(device)
    case, small = CASES[name], device in SUBSET_ONLY
    if dt in UNSUPPORTED[device]:
        with pytest.raises(NotImplementedError, match=f"does not support {dt}"):
            run(device, name, dt, small)
        return
    got, grads = run(device, name, dt, small)
    if device == "CPU":
        if case.reference is not None and dt in (dtypes.float32, dtypes.float64):
            with np.errstate(all="ignore"):
                want = case.reference(*_inputs(case, dt, small))
            rtol = 1e-4 if dt is dtypes.float32 else 1e-10
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
        return
    want, want_grads = cpu_result(name, dt, small)
    assert_close(got, want, dt, case.sums, f"{name} {dt} forward on {device}")
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        assert_close(g, w, dt, case.sums, f"{name} {dt} gradient of input {i} on {device}")


def _cast_params(devices: list[str]):
    for device in devices:
        for src, dst in CASTS:
            if device in SUBSET_ONLY and dtypes.float16 in (src, dst):
                continue
            quick = {src, dst} <= {dtypes.float32, dtypes.int32, dtypes.bool}
            marks = pytest.mark.slow if device in SLOW_BEYOND_QUICK and not quick else ()
            yield pytest.param(device, src, dst, id=f"{device}-{short(src)}-to-{short(dst)}", marks=marks)


@pytest.mark.parametrize("device, src, dst", list(_cast_params(BACKENDS)))
def test_cast(device: str, src: DType, dst: DType):
    _need(device)
    if bad := [d for d in (src, dst) if d in UNSUPPORTED[device]]:
        with pytest.raises(NotImplementedError, match=f"does not support {bad[0]}"):
            _tensor(np.zeros(3), src, device, False).cast(dst).numpy()
        return
    # values every dtype holds exactly (float -> int truncates toward zero; anything -> bool is != 0)
    x = np.array([0.0, 1.0, -1.0, 2.5, -7.75, 100.0, 0.5, -0.0])
    if dtypes.is_int(src) or src is dtypes.bool:
        x = np.trunc(x)

    def result(dev: str) -> np.ndarray:
        return _numpy(_tensor(x, src, dev, False).cast(dst))

    got = result(device)
    if device == "CPU":
        want_src = x.astype(bool) if src is dtypes.bool else x if dtypes.is_float(src) else np.trunc(x)
        want = want_src.astype(bool) if dst is dtypes.bool else np.trunc(want_src) if dtypes.is_int(dst) else want_src
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2)
        return
    np.testing.assert_array_equal(got, result("CPU"))


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("dt", dtypes.fp8s, ids=lambda d: short(d))
def test_unsupported_dtypes_raise_a_clear_error(device: str, dt: DType):
    _need(device)
    x = Tensor([0.5, -1.5, 3.0], device=device)
    if dt in UNSUPPORTED[device]:
        with pytest.raises(NotImplementedError, match=f"does not support {dt}"):
            (x.cast(dt) + 0).realize()
        return
    np.testing.assert_array_equal(
        x.cast(dt).cast(dtypes.float32).numpy(), Tensor([0.5, -1.5, 3.0]).cast(dt).cast(dtypes.float32).numpy()
    )


@pytest.mark.slow  # the LLVM op suite above runs every op of the model; this is the whole training loop (CI)
def test_the_digits_model_trains_on_llvm_like_on_cpu():
    """A few Adam steps of the digits demo's convnet on DEV=LLVM follow the CPU run's losses."""
    if not HAVE_LLVM:
        pytest.skip("the LLVM device needs llvmlite")
    cpu_losses, cpu_accuracy = train_digits_steps("CPU", 12, accuracy=True)
    llvm_losses, llvm_accuracy = train_digits_steps("LLVM", 12, accuracy=True)
    assert llvm_losses[-1] < llvm_losses[0] * 0.7, llvm_losses
    np.testing.assert_allclose(llvm_losses, cpu_losses, rtol=1e-3)
    assert abs(llvm_accuracy - cpu_accuracy) < 0.01 and llvm_accuracy > 0.5
