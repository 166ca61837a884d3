"""The CUDA device's compile path without a GPU: every kernel of an op suite (forward and backward) renders as CUDA C
and compiles to PTX and a cubin; opening the device without the NVIDIA driver names what is missing."""

import shutil
import numpy as np
import pytest
from fusegrad import Tensor, dtypes
from fusegrad.runtime import ops_cuda
from fusegrad.runtime.device import Device
from tests.rendering import rendered


pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None and ops_cuda.libnvrtc() is None, reason="no CUDA compiler (nvcc or NVRTC)"
)

RNG = np.random.default_rng(0)
LEAVES: list[Tensor] = []  # the inputs a suite entry made, whose gradients are lowered too


def a(*shape):
    t = Tensor(RNG.standard_normal(shape).astype(np.float32), device="NULL", requires_grad=True)
    LEAVES.append(t)
    return t


# forward and backward of each: the suite covers elementwise, broadcasting, reductions, movement, matmul, conv, indexing
OPS = {
    "elementwise": lambda: (a(4, 5) * a(4, 5) + a(4, 5).exp() - a(4, 5).sigmoid()).sum(),
    "unary_math": lambda: (a(33).abs().sqrt() + a(33).sin() + a(33).cos() + a(33).tanh() + a(33).abs().log()).sum(),
    "broadcast": lambda: (a(3, 1, 5) / (a(1, 4, 5).abs() + 1)).sum(),
    "reduce_axes": lambda: (a(3, 5, 7).max(axis=1) + a(3, 5, 7).mean(axis=1)).sum(),
    "softmax": lambda: a(6, 10).softmax(-1).log().sum(),
    "matmul": lambda: (a(8, 16) @ a(16, 4)).relu().sum(),
    "conv2d": lambda: a(2, 3, 8, 8).conv2d(a(4, 3, 3, 3), padding=1).max_pool2d(2).sum(),
    "movement": lambda: (a(4, 6).permute(1, 0).reshape(3, 8).flip(0).pad(((1, 1), (0, 2))) * 2).sum(),
    "cumsum_where": lambda: (a(17).cumsum(0) * (a(17) > 0).where(1.0, -1.0)).sum(),
    "gather": lambda: a(5, 7).gather(1, Tensor(RNG.integers(0, 7, (5, 3)).astype(np.int32), device="NULL")).sum(),
    "cross_entropy": lambda: a(8, 10).sparse_categorical_crossentropy(
        Tensor(RNG.integers(0, 10, 8).astype(np.int32), device="NULL")
    ),
}
DTYPES = {
    "int_math": lambda: Tensor(np.arange(20, dtype=np.int32), device="NULL") * 3 // 7 % 5,
    "int64_shift": lambda: Tensor(np.arange(9, dtype=np.int64), device="NULL") << 3,
    "float64": lambda: Tensor(np.arange(6, dtype=np.float64), device="NULL").exp().sum(),
    "half": lambda: (Tensor(np.ones(8, np.float16), device="NULL") * 3).sum(),
    "bfloat16": lambda: Tensor(np.ones(8, np.float32), device="NULL").cast(dtypes.bfloat16) * 2,
    "bool_uint8": lambda: (Tensor(np.arange(10, dtype=np.uint8), device="NULL") > 4).cast(dtypes.uint8),
    "bitcast": lambda: Tensor(np.ones(4, np.float32), device="NULL").bitcast(dtypes.int32) + 1,
}


def kernels_of(build, monkeypatch) -> list:
    """The KernelInfos that realizing build()'s output and its gradients lowers (on NULL: nothing runs)."""
    infos = []
    null = Device["NULL"]
    real = type(null).build
    monkeypatch.setattr(type(null), "build", lambda self, info: infos.append(info) or real(self, info))
    out = build()
    if out.requires_grad and dtypes.is_float(out.dtype) and out.shape == ():
        out.backward()
    out.realize()
    return infos


@pytest.mark.parametrize("name", list(OPS) + list(DTYPES))
def test_every_kernel_compiles_to_ptx_and_cubin(name, monkeypatch):
    from fusegrad.renderer.gpu import CUDAKernelRenderer

    LEAVES.clear()
    infos = kernels_of(OPS.get(name) or DTYPES[name], monkeypatch)
    for t in LEAVES:
        if t.grad is not None:
            infos += kernels_of(lambda g=t.grad: g.contiguous(), monkeypatch)
    assert infos, f"{name}: no kernels lowered"
    renderer, compiler = CUDAKernelRenderer(), ops_cuda.CUDACompiler(ops_cuda.default_arch())
    for info in {i.name + repr(i.lin): i for i in infos}.values():
        src = rendered(renderer, info.name, info.lin)
        assert f"void {info.name}(" in src
        binary = compiler.compile_cached(src, info.name)
        if shutil.which("ptxas"):
            assert binary[:4] == b"\x7fELF", f"{info.name}: ptxas gave no cubin"
        else:
            assert f".entry {info.name}" in binary.decode()


def test_ptx_names_the_kernel_entry():
    ptx = ops_cuda.CUDACompiler("sm_90").to_ptx(
        'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }', "k"
    )
    assert ".visible .entry k(" in ptx and ".target sm_90" in ptx


def test_compile_error_names_the_kernel_and_shows_the_source():
    with pytest.raises(ops_cuda.CompileError, match="failed on kernel broken") as e:
        ops_cuda.CUDACompiler("sm_90").compile('extern "C" __global__ void broken(float* a) { a[0] = nope; }', "broken")
    assert "nope" in str(e.value)


@pytest.mark.skipif(ops_cuda.libcuda() is not None, reason="the NVIDIA driver is installed")
def test_opening_cuda_without_a_driver_names_what_is_missing():
    with pytest.raises(RuntimeError, match="needs the NVIDIA driver's libcuda.so.1"):
        Device["CUDA"]
    assert "CUDA" not in list(Device.get_available_devices())
