"""Ops beyond tests/runtime/test_backend_ops.py's suite (which runs CL too), forward and backward, on the CL device
against the CPU backend (same graph, same inputs): pooling, layernorm, cumsum, slicing, wrapping integer arithmetic.
Results equal within float32 tolerance; integer and boolean results exactly."""

import numpy as np
import pytest
from fusegrad import Tensor, dtypes
from fusegrad.runtime.device import Device

# each op compiles its own PoCL kernels (about ten C compiles each): with the slow tests, in CI; test_cl.py and the
# op suite's quick CL cases run in the fast suite
pytestmark = pytest.mark.slow
pytest.importorskip("pyopencl")
try:
    Device["CL"]
except RuntimeError as e:
    pytest.skip(f"no OpenCL device: {e}", allow_module_level=True)

RNG = np.random.default_rng(1)

# name -> (function of the input tensors, input shapes); every input is float32 and gets a gradient
FLOAT_OPS = {
    "add_mul_sub_div": (lambda x, y: (x + y) * x - y / (y.abs() + 1), [(4, 5), (4, 5)]),
    "broadcast": (lambda x, y: x * y + x, [(3, 1, 5), (1, 4, 5)]),
    "exp_log_sqrt": (lambda x: x.exp() + (x.abs() + 0.1).log() + (x.abs() + 0.1).sqrt(), [(33,)]),
    "sin_cos_tanh": (lambda x: x.sin() * x.cos() + x.tanh(), [(7, 9)]),
    "relu_sigmoid_gelu": (lambda x: x.relu() + x.sigmoid() + x.gelu(), [(64,)]),
    "maximum_minimum_where": (lambda x, y: x.maximum(y) - x.minimum(y) + (x > y).where(x, y), [(6, 6), (6, 6)]),
    "pow": (lambda x: (x.abs() + 0.5) ** 1.7, [(10,)]),
    "sum_axes": (lambda x: x.sum(axis=(0, 2)), [(3, 5, 7)]),
    "mean_var": (lambda x: x.mean(axis=1) + x.var(axis=1), [(8, 31)]),
    "max_min": (lambda x: x.max(axis=0) - x.min(axis=1).sum(), [(9, 9)]),
    "big_sum": (lambda x: x.sum(), [(70000,)]),
    "softmax_logsoftmax": (lambda x: x.softmax(-1) + x.log_softmax(-1), [(6, 10)]),
    "matmul": (lambda x, y: x @ y, [(17, 33), (33, 9)]),
    "batched_matmul": (lambda x, y: x @ y, [(3, 8, 16), (3, 16, 4)]),
    "conv2d": (lambda x, w: x.conv2d(w, padding=1, stride=2), [(2, 3, 9, 9), (4, 3, 3, 3)]),
    "max_avg_pool": (lambda x: x.max_pool2d(2) + x.avg_pool2d(2), [(2, 2, 8, 8)]),
    "permute_reshape_flip": (lambda x: x.permute(2, 0, 1).reshape(4, 15).flip(1) * 2, [(3, 5, 4)]),
    "pad_shrink": (lambda x: x.pad(((1, 2), (0, 3)))[1:4, 2:6] + 1, [(4, 5)]),
    "expand_cat_stack": (lambda x, y: Tensor.cat(x, y, dim=0).stack(Tensor.cat(y, x, dim=0)), [(2, 3), (2, 3)]),
    "cumsum": (lambda x: x.cumsum(1), [(4, 50)]),
    "layernorm": (lambda x: x.layernorm(), [(5, 16)]),
    "cross_entropy": (
        lambda x: x.sparse_categorical_crossentropy(Tensor(np.arange(8, dtype=np.int32) % 10, device=x.device)),
        [(8, 10)],
    ),
    "gather": (lambda x: x.gather(1, Tensor(np.array([[0, 2], [1, 1], [3, 0]], np.int32), device=x.device)), [(3, 4)]),
    "getitem": (lambda x: x[1:, ::2] * x[:-1, 1::2], [(5, 6)]),
}


def run(fn, arrays, device):
    ts = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.sum().backward() if out.shape != () else out.backward()
    return out.numpy(), [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("name", list(FLOAT_OPS))
def test_float_op_forward_and_backward_match_cpu(name):
    fn, shapes = FLOAT_OPS[name]
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    out_cpu, grads_cpu = run(fn, arrays, "CPU")
    out_cl, grads_cl = run(fn, arrays, "CL")
    np.testing.assert_allclose(out_cl, out_cpu, rtol=2e-5, atol=2e-5)
    for g_cl, g_cpu in zip(grads_cl, grads_cpu):
        np.testing.assert_allclose(g_cl, g_cpu, rtol=2e-5, atol=2e-5)


INT_OPS = {
    "int32_arith": (lambda x: (x * 3 - 7) // 5 % 11, np.int32),
    "int32_wraps": (lambda x: x * 1000003 + 2**31 - 1, np.int32),
    "int32_div_by_zero_is_zero": (lambda x: x // (x % 3), np.int32),
    "int64_shift_xor": (lambda x: (x << 20) ^ (x >> 1), np.int64),
    "uint8_wraps": (lambda x: x * 7 + 200, np.uint8),
    "int16_minmax": (lambda x: x.maximum(3) - x.minimum(-2), np.int16),
    "compare_logic": (lambda x: ((x > 3) & (x < 40)) | (x == 0), np.int32),
    "argmax_argmin": (lambda x: x.reshape(4, -1).argmax(1) + x.reshape(4, -1).argmin(1), np.int32),
    "int_sum": (lambda x: x.sum(), np.int64),
    "float64_math": (lambda x: (x.cast(dtypes.float64) / 7).exp().sum(), np.int32),
    "bfloat16_cast": (lambda x: x.cast(dtypes.bfloat16) * 3, np.int32),
    "bitcast": (lambda x: x.cast(dtypes.float32).bitcast(dtypes.int32) + 1, np.int32),
}


@pytest.mark.parametrize("name", list(INT_OPS))
def test_integer_bool_and_other_dtype_ops_match_cpu(name):
    fn, np_dt = INT_OPS[name]
    info = np.iinfo(np_dt)
    x = RNG.integers(max(info.min, -100), min(info.max, 100), 48).astype(np_dt)
    cpu, cl = fn(Tensor(x)).numpy(), fn(Tensor(x, device="CL")).numpy()
    assert cpu.dtype == cl.dtype
    if cpu.dtype.kind == "f":
        np.testing.assert_allclose(cl, cpu, rtol=1e-12)
    else:
        np.testing.assert_array_equal(cl, cpu)


def test_random_and_arange_on_cl_match_cpu():
    Tensor.manual_seed(3)
    cpu = Tensor.rand(100).numpy()
    Tensor.manual_seed(3)
    np.testing.assert_array_equal(Tensor.rand(100, device="CL").numpy(), cpu)
    np.testing.assert_array_equal(Tensor.arange(5, 50, 3, device="CL").numpy(), np.arange(5, 50, 3))
