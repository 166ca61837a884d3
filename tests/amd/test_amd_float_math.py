"""float64 transcendentals and large-argument float32 sin/cos on DEV=AMD: codegen writes them out in plain arithmetic
(codegen/float_math.py; tests/codegen/test_float_math.py checks it widely on the CPU), and the simulated GPU runs
the machine code."""

from __future__ import annotations

import numpy as np

from fusegrad import Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops

INF, NAN = np.inf, np.nan
X64 = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -3.75, 1e-3, 20.0, -700.0, 709.0, 1e-310, 1e5, -1e300, INF, -INF, NAN])


def close(got, want, rtol):
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-300, equal_nan=True)


def test_the_amd_kernels_have_no_float64_math_call(amdgpu_target):
    from fusegrad.runtime.support.amd.codeobj import compile_ir, parse_code_object

    x = Tensor(X64[:6])
    items, _, _ = create_schedule([x.sin().uop, (x**x).uop, x.float().cos().uop], ["CPU"])
    renderer = AMDGPURenderer()
    for it in items:
        info = lower_to_linear(it.ast, renderer)
        assert not {u.op for u in info.lin} & {Ops.SIN, Ops.COS, Ops.POW}
        ir = renderer.render(info.name, info.lin)
        assert "llvm.sin" not in ir and "llvm.cos" not in ir and "llvm.pow" not in ir
        parse_code_object(compile_ir(ir, amdgpu_target), info.name)


def test_float64_math_on_the_simulated_gpu(simulated_amd):
    x = Tensor(X64, device="AMD")
    with np.errstate(all="ignore"):
        for name in ("exp", "exp2", "log", "log2", "sin", "cos"):
            close(getattr(x, name)().numpy(), getattr(np, name)(X64), rtol=4e-16 if name != "sin" else 1e-15)
        y = np.roll(X64, 3)
        close((x ** Tensor(y, device="AMD")).numpy(), np.power(X64, y), rtol=4e-16)
        close(x.tan().numpy(), np.tan(X64), rtol=1e-15)


def test_float32_sin_cos_of_large_arguments_on_the_simulated_gpu(simulated_amd):
    x = np.float32([1e4, -1e4, 1e30, -1e30, 3.4e38, 88.0, 1e-4, -0.0, 1e6 + 0.5, INF, NAN])
    t = Tensor(x, device="AMD")
    for name in ("sin", "cos"):
        got = getattr(t, name)().numpy()
        assert got.dtype == np.float32
        with np.errstate(all="ignore"):
            close(got, getattr(np, name)(x.astype(np.float64)).astype(np.float32), rtol=1e-7)
    h = np.float16([1e4, -1e4, 6e4, 88.0, 1e-4, -0.0])  # a half sin computes in float32 first
    got = Tensor(h, device="AMD").sin().numpy()
    np.testing.assert_allclose(got.astype(np.float32), np.sin(h.astype(np.float32)), atol=1e-3)
