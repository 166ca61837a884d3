"""The op suite of test_backend_ops under EMULATED_DTYPES on every backend: half and bfloat16 results are bit-equal
to the native path where the backend has the type, and within the suite's tolerance of the CPU where it does not
(PoCL's float16, LLVM's fp8); fp8 arithmetic likewise."""

from __future__ import annotations

import numpy as np
import pytest

from fusegrad import Context, Tensor, dtypes
from fusegrad.dtype import DType
from test_backend_ops import BACKENDS, CASES, UNSUPPORTED, _need, assert_close, cpu_result, run, short

EMULATED = "half,bfloat16,fp8e4m3,fp8e5m2,fp8e4m3fnuz,fp8e5m2fnuz"
DEVICES = [d for d in BACKENDS if d != "PYTHON"]  # the interpreter has no kernels to rewrite
NARROW = (dtypes.float16, dtypes.bfloat16)
FAST = {"add", "matmul", "sum", "exp"}  # outside CI: these on CPU; the whole suite on every backend is slow


def _params():
    for device in DEVICES:
        for case in CASES.values():
            for dt in case.dtypes:
                if dt in NARROW:
                    marks = () if device == "CPU" and case.name in FAST else (pytest.mark.slow,)
                    yield pytest.param(device, case.name, dt, id=f"{device}-{case.name}-{short(dt)}", marks=marks)


def _bits(x: np.ndarray) -> np.ndarray:
    return (
        x.view({4: np.uint32, 8: np.uint64, 2: np.uint16, 1: np.uint8}[x.dtype.itemsize]) if x.dtype.kind == "f" else x
    )


@pytest.mark.parametrize("device, name, dt", list(_params()))
def test_op_suite_emulated_matches_native(device: str, name: str, dt: DType):
    _need(device)
    with Context(EMULATED_DTYPES=EMULATED):
        got, _ = run(device, name, dt, False)
    if dt in UNSUPPORTED[device]:
        want, _ = cpu_result(name, dt, False)
        assert_close(got, want, dt, CASES[name].sums, f"{name} {dt} emulated on {device} vs native CPU")
        return
    want, _ = run(device, name, dt, False)
    np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{name} {dt} on {device}")


def _wide_params():
    for device in DEVICES:
        for case in CASES.values():
            if dtypes.int32 in case.dtypes:
                marks = () if device == "CPU" else (pytest.mark.slow,)
                yield pytest.param(device, case.name, id=f"{device}-{case.name}", marks=marks)


@pytest.mark.parametrize("device, name", list(_wide_params()))
def test_op_suite_in_int64_emulated_matches_native(device: str, name: str):
    _need(device)
    with Context(EMULATED_DTYPES="long,ulong"):
        got, _ = run(device, name, dtypes.int64, False)
    want, _ = run(device, name, dtypes.int64, False)
    np.testing.assert_array_equal(got, want, err_msg=f"{name} int64 on {device}")


FP8 = (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz)


def _fp8_step(device: str, dt: DType) -> np.ndarray:
    rng = np.random.default_rng(3)
    a, b = (Tensor(rng.uniform(-20, 20, (4, 33)), device=device).cast(dt) for _ in range(2))
    out = ((a * b + a).relu() - (b * 0.25).exp2()).cast(dt)
    return np.concatenate([out.cast(dtypes.float32).numpy().ravel(), a.sum(axis=1).cast(dtypes.float32).numpy()])


@pytest.mark.parametrize("device", [d if d == "CPU" else pytest.param(d, marks=pytest.mark.slow) for d in DEVICES])
@pytest.mark.parametrize("dt", FP8, ids=short)
def test_fp8_arithmetic_emulated_matches_native(device: str, dt: DType):
    _need(device)
    with Context(EMULATED_DTYPES=EMULATED):
        got = _fp8_step(device, dt)
    if dt in UNSUPPORTED[device]:
        want = _fp8_step("CPU", dt)
    else:
        want = _fp8_step(device, dt)
    np.testing.assert_array_equal(_bits(got), _bits(want))
