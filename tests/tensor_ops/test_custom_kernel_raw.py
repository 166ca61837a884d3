"""Raw-source custom kernels (RawKernel): the user's C, OpenCL C or LLVM IR compiled, cached and launched."""

import numpy as np
import pytest
from fusegrad import Device, GlobalCounters, Tensor, TinyJit
from fusegrad.uop.kernel import RawKernel

C_SRC = "void scale(float* out, const float* x) { for (int i = 0; i < 16; i++) out[i] = 2.0f * x[i] + 1.0f; }"
CL_SRC = """__kernel void scale(__global float* out, __global const float* x) {
  int i = get_global_id(0);
  out[i] = 2.0f * x[i] + 1.0f;
}"""
LLVM_SRC = """
define void @scale(ptr %out, ptr %x) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %src = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %src
  %twice = fmul float %v, 2.0
  %r = fadd float %twice, 1.0
  %dst = getelementptr float, ptr %out, i64 %i
  store float %r, ptr %dst
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, 16
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""
SOURCES = {"CPU": C_SRC, "CL": CL_SRC, "LLVM": LLVM_SRC}


@pytest.mark.parametrize("device", list(SOURCES))
def test_raw_kernel_runs_in_order_with_tensor_ops(device):
    try:
        Device[device]
    except Exception as e:  # noqa: BLE001 (a missing driver or toolchain)
        pytest.skip(f"{device}: {e}")
    x = np.arange(16, dtype=np.float32)
    raw = RawKernel(SOURCES[device], "scale", global_size=(16, 1, 1), local_size=(1, 1, 1))
    (out,) = Tensor.custom_kernel(Tensor.empty(16, device=device), Tensor(x, device=device) - 1, fxn=lambda o, i: raw)
    np.testing.assert_allclose((out * 3).numpy(), (2 * (x - 1) + 1) * 3, rtol=1e-6)


def test_raw_kernel_is_compiled_once_and_replayed_by_tinyjit():
    raw = RawKernel(C_SRC, "scale")

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return Tensor.custom_kernel(Tensor.empty(16), x, fxn=lambda o, i: raw)[0].realize()

    GlobalCounters.reset()
    for k in range(4):
        x = np.full(16, k, np.float32)
        np.testing.assert_allclose(step(Tensor(x)).numpy(), 2 * x + 1)
    assert GlobalCounters.compile_count <= 1 and step.captured is not None


def test_raw_kernel_errors():
    with pytest.raises(ValueError, match="raw kernel 'scale' writes slots \\(3,\\), but it was given 2 inputs"):
        Tensor.custom_kernel(
            Tensor.empty(16), Tensor.empty(16), fxn=lambda o, i: RawKernel(C_SRC, "scale", written=(3,))
        )
    with pytest.raises(Exception, match="scale"):  # the C compiler's error, raised where the kernel is written
        Tensor.custom_kernel(Tensor.empty(16), Tensor.empty(16), fxn=lambda o, i: RawKernel("void scale(", "scale"))
