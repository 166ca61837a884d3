"""The CL device (runtime/ops_cl.py) on whatever OpenCL driver is installed (PoCL in CI): copies to and from it are
exact, mixed-device ops raise, binaries are cached per device, and the digits model trains like on CPU."""

import numpy as np
import pytest
from fusegrad import Tensor, dtypes
from fusegrad.runtime.buffers import Buffer, view_buffer
from fusegrad.runtime.device import Device, copy_buffer
from digits_steps import train_digits_steps

pytest.importorskip("pyopencl")
try:
    Device["CL"]
except RuntimeError as e:  # no OpenCL driver: .ci/run installs PoCL, a bare machine may lack it
    pytest.skip(f"no OpenCL device: {e}", allow_module_level=True)

from fusegrad.runtime import ops_cl  # noqa: E402

RNG = np.random.default_rng(0)
VALUES = {
    dtypes.float32: RNG.standard_normal(37).astype(np.float32),
    dtypes.float64: RNG.standard_normal(37),
    dtypes.int32: RNG.integers(-(2**31), 2**31 - 1, 37, dtype=np.int32),
    dtypes.int64: RNG.integers(-(2**62), 2**62, 37, dtype=np.int64),
    dtypes.uint8: RNG.integers(0, 256, 37, dtype=np.uint8),
    dtypes.int16: RNG.integers(-(2**15), 2**15 - 1, 37, dtype=np.int16),
    dtypes.bool: RNG.random(37) > 0.5,
}


@pytest.mark.parametrize("dt", list(VALUES), ids=lambda d: d.name)
def test_to_cl_and_back_round_trips_exactly(dt):
    x = VALUES[dt]
    t = Tensor(x).to("CL")
    assert t.device == "CL"
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal(t.to("CPU").numpy(), x)
    np.testing.assert_array_equal(t.to("PYTHON").to("CL").to("CPU").numpy(), x)


def test_bfloat16_and_empty_tensors_round_trip():
    x = Tensor([1.5, -2.25, 3e38, float("inf")], dtype=dtypes.bfloat16)
    np.testing.assert_array_equal(x.to("CL").to("CPU").numpy(), x.numpy())
    assert Tensor.zeros(0, 3).to("CL").numpy().shape == (0, 3)


def test_cl_buffers_have_no_host_view_and_copy_directly_between_cl_buffers():
    t = Tensor(VALUES[dtypes.float32]).to("CL").realize()
    buf = view_buffer(t.uop)
    assert buf is not None and not buf.is_host
    with pytest.raises(RuntimeError, match="CL buffers live in device memory"):
        buf.host_view()
    other = Buffer("CL", buf.size, buf.dtype)
    assert other.allocator.can_transfer_from(buf.allocator)
    copy_buffer(other, buf)
    np.testing.assert_array_equal(other.numpy(), VALUES[dtypes.float32])


def test_mixed_device_op_raises_the_documented_error():
    a, b = Tensor([1.0, 2.0]).to("CL"), Tensor([3.0, 4.0])
    with pytest.raises(RuntimeError, match="different devices: CL and CPU|different devices: CPU and CL"):
        (a + b).realize()
    np.testing.assert_array_equal((a + b.to("CL")).numpy(), [4.0, 6.0])  # both tensors still usable


def test_kernels_compute_on_cl_with_several_global_axes_and_reductions():
    x = RNG.standard_normal((3, 5, 7, 9)).astype(np.float32)
    t = Tensor(x).to("CL")
    np.testing.assert_allclose((t * 2 + 1).numpy(), x * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(t.sum(axis=(1, 3)).numpy(), x.sum(axis=(1, 3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.permute(3, 1, 0, 2).contiguous().numpy(), x.transpose(3, 1, 0, 2))
    np.testing.assert_allclose(t.max().numpy(), x.max())


def test_binaries_are_cached_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    dev = Device["CL"]
    compiler = ops_cl.CLCompiler(dev)
    src = "__kernel void twice(__global float* a) { a[get_global_id(0)] *= 2.0f; }"
    builds = []
    real = ops_cl.CLCompiler.compile
    monkeypatch.setattr(ops_cl.CLCompiler, "compile", lambda self, s, n: builds.append(n) or real(self, s, n))
    first = compiler.compile_cached(src, "twice")
    again = ops_cl.CLCompiler(dev).compile_cached(src, "twice")
    assert first == again and builds == ["twice"]
    cached = list((tmp_path / "fusegrad" / "cl").glob("*.bin"))
    assert len(cached) == 1 and cached[0].read_bytes() == first
    assert dev.cl_device.name in compiler.identity()


def test_build_error_names_the_kernel_and_shows_the_source():
    with pytest.raises(ops_cl.CompileError, match="kernel broken failed") as e:
        ops_cl.CLCompiler(Device["CL"]).compile("__kernel void broken(__global float* a) { a[0] = nope; }", "broken")
    assert "nope" in str(e.value)


@pytest.mark.skipif("cl_khr_fp16" in Device["CL"].cl_device.extensions, reason="the device has half")
def test_half_without_cl_khr_fp16_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="does not support dtypes.float16.*lacks cl_khr_fp16"):
        (Tensor([1.0, 2.0], dtype=dtypes.float16).to("CL") + 1).realize()


@pytest.mark.slow  # a new PoCL kernel costs about ten C compiles; the CL op suites run the model's ops (CI)
def test_digits_model_trains_on_cl_like_on_cpu():
    (cpu, _), (cl, _) = train_digits_steps("CPU", 4), train_digits_steps("CL", 4)
    np.testing.assert_allclose(cl, cpu, rtol=1e-4)
    assert cl[-1] < cl[0]


@pytest.fixture
def grouped_reductions(monkeypatch):
    # on by default on GPUs only; the kernels below have shapes no other test builds, so none is cached ungrouped
    monkeypatch.setattr(
        Device["CL"].renderer, "capabilities", Device["CL"].renderer.capabilities.replace(group_reduce=True)
    )


def test_reductions_with_few_outputs_split_over_a_work_group(capsys, grouped_reductions):
    from fusegrad import Context

    x = RNG.standard_normal((3, 4096)).astype(np.float32)  # a sum of 16 blocks of 256 (codegen/accumulators.py)
    x[1, 17] = np.nan
    t = Tensor(x).to("CL")
    with Context(DEBUG=4):
        total = t[0].sum().numpy()
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in capsys.readouterr().out  # the lanes combine in local memory
    np.testing.assert_allclose(total, x[0].sum(), rtol=1e-5)
    np.testing.assert_array_equal(np.isnan(t.max(axis=1).numpy()), [False, True, False])  # NaN wins across lanes
    np.testing.assert_allclose(t[::2].max(axis=1).numpy(), x[::2].max(axis=1))
    ints = RNG.integers(-(2**31), 2**31 - 1, 5003, dtype=np.int32)
    assert Tensor(ints).to("CL").sum().item() == Tensor(ints).sum().item()  # wraps like the CPU backend
    np.testing.assert_allclose(Tensor(x[::2]).to("CL").var(axis=1).numpy(), x[::2].var(axis=1, ddof=1), rtol=1e-4)


def test_grouped_reduce_into_its_own_output_reads_before_any_lane_writes(grouped_reductions):
    out = Tensor([1.0, 2.0]).to("CL").realize()
    x = Tensor(np.ones((2, 2048), np.float32)).to("CL")
    for _ in range(3):
        out.assign(out + x.sum(axis=1)).realize()
    np.testing.assert_array_equal(out.numpy(), [6145.0, 6146.0])
