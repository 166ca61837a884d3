"""The C-family renderer as a rule table: every linear op has a rule, dialects override tables and hooks, upcast kernels
render vector types, and the rendered C (and CUDA C, where nvcc is installed) compiles and computes the right values."""

import re
import shutil
import subprocess

import numpy as np
import pytest

from fusegrad import Context, Tensor, dtypes
from fusegrad.codegen import lower_to_linear
from fusegrad.dtype import to_numpy_dtype
from fusegrad.renderer.c import CRenderer
from fusegrad.renderer.cstyle import CODE_FOR_OP, CStyleRenderer, RenderError
from fusegrad.renderer.gpu import CUDARenderer, OpenCLRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import GroupOp, Ops
from fusegrad.uop.pattern import PatternMatcher
from fusegrad.uop.spec import LINEAR_OPS
from tests.rendering import rendered


def vector_bytes() -> int:
    return Device["CPU"].renderer.capabilities.vector_bytes


def kernels(t: Tensor):
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return [lower_to_linear(i.ast, Device["CPU"].renderer) for i in items if i.ast.op is Ops.SINK]


def matmul_info(m: int, k: int, n: int):
    a, b = Tensor.rand(m, k).realize(), Tensor.rand(k, n).realize()
    return kernels(a @ b)[-1]


def test_every_alu_op_has_a_template_and_every_linear_op_a_rule():
    assert set(GroupOp.ALU) <= set(CODE_FOR_OP)
    statement_ops = LINEAR_OPS - {Ops.CONST, Ops.DEFINE_VAR}  # constants are inlined; no kernel has variables yet
    for renderer in (CRenderer, OpenCLRenderer, CUDARenderer):
        assert statement_ops <= set(renderer.string_rewrite.by_op), renderer.__name__


def test_dialects_are_subclasses_that_override_knobs_not_the_driver():
    for dialect in (CRenderer, OpenCLRenderer, CUDARenderer):
        assert issubclass(dialect, CStyleRenderer)
        assert "render" not in vars(dialect)  # one driver for the family
    info = matmul_info(64, 32, 64)
    c, cl, cuda = (rendered(r(), "k", info.lin) for r in (CRenderer, OpenCLRenderer, CUDARenderer))
    # C marks its buffers restrict (no written buffer shares memory with another)
    assert "void k(float* restrict data0, const float* restrict data1" in c and "core_start" in c
    assert "__kernel void k(__global float* data0, __global const float* data1" in cl
    assert "get_global_id(0)" in cl and "core_start" not in cl
    assert 'extern "C" __global__ void k(float* data0, const float* data1' in cuda
    assert "blockIdx.x * blockDim.x + threadIdx.x" in cuda


def test_a_dialect_overrides_one_template():
    class FmaxC(CRenderer):
        code_for_op = {**CODE_FOR_OP, Ops.MAX: lambda r, dt, a, srcs: f"fmaxf({a[0]}, {a[1]})"}

    a = Tensor.rand(16).realize()
    (info,) = kernels(a.maximum(0.5))
    assert "fmaxf(" in rendered(FmaxC(), "k", info.lin) and "fmaxf(" not in rendered(CRenderer(), "k", info.lin)


def test_missing_rule_and_unsupported_dtype_raise_render_error():
    class NoRules(CStyleRenderer):
        string_rewrite = PatternMatcher([])

    (info,) = kernels(Tensor.rand(4).realize() + 1)
    with pytest.raises(RenderError, match="NoRules has no rule for Ops.DEFINE_GLOBAL"):
        rendered(NoRules(), "k", info.lin)
    (fp8,) = kernels(Tensor.rand(4).realize().cast(dtypes.fp8e4m3))
    with pytest.raises(RenderError, match="OpenCLRenderer cannot render dtypes.fp8e4m3"):
        rendered(OpenCLRenderer(), "k", fp8.lin)


def test_upcast_kernel_renders_vector_types_in_c_and_opencl():
    width = vector_bytes() // 4
    info = matmul_info(32, 16, 2 * width)
    assert info.opts, "the heuristics upcast a matmul"
    c = rendered(Device["CPU"].renderer, "k", info.lin)
    assert f"typedef float fg_floatx{width} __attribute__((vector_size({vector_bytes()})));" in c
    cl = rendered(OpenCLRenderer(), "k", info.lin)
    assert "float4 vec" in cl and "vload4(0, " in cl and "vstore4(" in cl
    with Context(NOOPT=1):
        plain = kernels(Tensor.rand(32, 16).realize() @ Tensor.rand(16, 8).realize())[-1]
    assert "vector_size" not in rendered(Device["CPU"].renderer, "k", plain.lin)
    assert "float4" not in rendered(OpenCLRenderer(), "k", plain.lin)


def test_constants_follow_the_dialect():
    r_c, r_cl, r_cuda = CRenderer(), OpenCLRenderer(), CUDARenderer()
    assert r_c.render_const(float("nan"), dtypes.float32) == "NAN"
    assert r_c.render_const(float("-inf"), dtypes.float64) == "((double)(-INFINITY))"
    assert r_cl.render_const(2**40, dtypes.int64) == "1099511627776L"
    assert r_cuda.render_const(float("inf"), dtypes.float32) == "__int_as_float(0x7f800000)"
    assert r_cuda.render_const(float("nan"), dtypes.float64) == "__longlong_as_double(0x7ff8000000000000LL)"
    assert r_c.render_const(1.5, dtypes.float16) == "((_Float16)1.5f)" and r_cl.render_const(1.5, dtypes.float16) == (
        "((half)1.5f)"
    )


def test_rendered_c_computes_nan_inf_and_wrapping_like_numpy():
    x = np.array([1.0, np.nan, -np.inf, 0.0, 3.0], np.float32)
    with np.errstate(all="ignore"):
        want = np.maximum(x, 2.0) + np.exp(x)
        np.testing.assert_array_equal((Tensor(x).maximum(2.0) + Tensor(x).exp()).numpy(), want)
        ints = np.array([2**31 - 1, -(2**31), 7], np.int32)
        np.testing.assert_array_equal((Tensor(ints) * 3 + 1).numpy(), ints * 3 + 1)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_source_compiles_to_ptx(tmp_path):
    a = Tensor.rand(16, 16).realize()
    infos = kernels((a @ a).relu()) + kernels(a.half().sqrt().cast(dtypes.bfloat16)) + kernels(a.bitcast(dtypes.int32))
    src = "\n".join(rendered(CUDARenderer(), f"k{i}", info.lin) for i, info in enumerate(infos))
    # one translation unit: the prelude repeats, so each kernel goes in its own file
    for i, info in enumerate(infos):
        path = tmp_path / f"k{i}.cu"
        path.write_text(rendered(CUDARenderer(), f"k{i}", info.lin))
        proc = subprocess.run(["nvcc", "--ptx", str(path), "-o", str(tmp_path / f"k{i}.ptx")], capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode() + src
        assert f".entry k{i}" in (tmp_path / f"k{i}.ptx").read_text()


def test_bool_buffers_are_bytes_in_opencl_and_c():
    # OpenCL C forbids bool buffers; C's _Bool pointer made GCC leave a select on a loaded mask scalar
    a = Tensor.rand(8).realize()
    (info,) = kernels(a < 0.5)
    cl = rendered(OpenCLRenderer(), "k", info.lin)
    assert "__global uchar* data0" in cl and "bool alu" in cl
    assert "unsigned char* restrict data0" in rendered(Device["CPU"].renderer, "k", info.lin)


def test_a_select_on_a_stored_mask_equals_numpy():
    rng = np.random.default_rng(0)
    x, m = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000) > 0
    mask = Tensor(m).realize()
    src = "\n".join(rendered(Device["CPU"].renderer, k.name, k.lin) for k in kernels(mask.where(Tensor(x), -1.0)))
    assert "const unsigned char* restrict" in src
    np.testing.assert_array_equal(mask.where(Tensor(x), -1.0).numpy(), np.where(m, x, -1.0))
    np.testing.assert_array_equal((mask * Tensor(x)).numpy(), m * x)
    np.testing.assert_array_equal((mask & (Tensor(x) > 0)).numpy(), m & (x > 0))


def test_two_gated_loads_of_one_buffer_in_a_strided_loop_read_the_right_elements():
    # GCC 12's loop vectorizer read lane 1 of this kernel one element too far (an upcast over a padded axis: two
    # if-converted loads of x at consecutive offsets, each with its own gate); such kernels skip if-conversion
    from fusegrad.codegen.opt import Opt, OptOps

    xs, ys = np.arange(1, 14, dtype=np.float32), np.array([2.0, 3.0], np.float32)
    x, y = Tensor(xs).realize(), Tensor(ys).realize()
    out = x.pad(((2, 1),)).reshape(16, 1) * y.reshape(1, 2)
    (item,) = create_schedule([out.uop], [Device["CPU"]])[0]
    info = lower_to_linear(item.ast, Device["CPU"].renderer, opts=(Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 2)))
    Device["CPU"].build(info)(item.buffers)
    want = np.pad(xs, (2, 1))[:, None] * ys[None, :]
    np.testing.assert_array_equal(item.buffers[0].numpy().reshape(16, 2), want)
    assert "FG_NO_IF_CONVERT void" in Device["CPU"].render(info)


def test_a_cast_of_a_product_to_bool_compiles_without_the_compilers_warning():
    # (bool)(a*b) made gcc warn (-Wint-in-bool-context), and the CPU device refuses kernels that warn
    a, b = Tensor([3, 0, -2]), Tensor([1, 5, 2])
    assert (a * b).cast(dtypes.bool).tolist() == [True, False, True]


@pytest.mark.parametrize("n, plain", [(32, True), (1 << 18, False)])
def test_a_sum_of_8_bit_products_is_plain_signed_c_only_where_it_cannot_overflow(n, plain):
    # 32 products of at most 128 * 128 fit int32 many times over; 2**18 of them could reach 2**32, so the sum that
    # adds them all up wraps (a split sum's partials over shorter loops may still be plain)
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-128, 128, n).astype(np.int8) for _ in range(2))
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    out = (ta.cast(dtypes.int32) * tb.cast(dtypes.int32)).sum()
    src = "\n".join(Device["CPU"].render(info) for info in kernels(out))
    acc = [ln for ln in src.splitlines() if ln.strip().startswith("acc") and "=" in ln and "int acc" not in ln]
    wrapped = [ln for ln in acc if "unsigned" in ln]
    assert acc and (not wrapped if plain else wrapped), acc
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert out.item() == np.int64(want).astype(np.int32)


@pytest.mark.parametrize(
    "dt", [dtypes.float16, dtypes.float32, dtypes.float64, dtypes.int8, dtypes.uint8, dtypes.int64]
)
def test_a_bool_cast_to_a_number_is_a_select_and_equals_numpy(dt):
    # GCC vectorizes no conversion from a 1-bit type: `(float)(b)` left a ReLU backward's loop scalar
    x = np.array([-1.5, 0.0, 2.0, np.nan, -0.0, 3.0, -7.0, 1e-30], np.float32)
    mask = Tensor(x) > 0
    out = mask.cast(dt) * 3
    src = "\n".join(rendered(Device["CPU"].renderer, k.name, k.lin) for k in kernels(out))
    bools = re.findall(r"_Bool (\w+) =", src)
    assert bools and not any(re.search(rf"\)\({b}\)\)", src) for b in bools), src
    np.testing.assert_array_equal(out.numpy(), (x > 0).astype(to_numpy_dtype(dt)) * 3)
