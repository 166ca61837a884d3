"""Tensor.custom_kernel: the examples of docs/custom_kernels.md against numpy / torch on every device here."""

import numpy as np
import pytest
import torch
from fusegrad import Device, Tensor, dtypes
from fusegrad.helpers import AMD_SIM
from custom_kernel_examples import add_one, attention_no_softmax, gemm, matmul, row_sum, sum_and_max, tiled_gemm

RNG = np.random.default_rng(0)


def _available(device: str) -> str | None:
    try:
        Device[device]
        (Tensor([1.0], device=device) + 1).numpy()
    except Exception as e:  # noqa: BLE001 (a missing toolchain or driver shows up as any error)
        return f"{device}: {e}"
    return None


@pytest.fixture(params=["CPU", "LLVM", "CL", "AMD", "PYTHON"])
def device(request):
    """Each device here; AMD is the simulated MI350X (AMD_SIM=1), its kernels compiled for amdgcn; PYTHON interprets
    the linear instructions."""
    old = AMD_SIM.value
    if request.param == "AMD":
        AMD_SIM.value = 1
    try:
        if (why := _available(request.param)) is not None:
            pytest.skip(why)
        yield request.param
    finally:
        AMD_SIM.value = old


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_elementwise(device):
    a = rand(3, 7)
    (out,) = Tensor.custom_kernel(Tensor.empty(3, 7, device=device), Tensor(a, device=device), fxn=add_one)
    np.testing.assert_allclose(out.numpy(), a + 1, rtol=1e-6)


def test_reduction_with_register_accumulator(device):
    x = rand(5, 33)
    (out,) = Tensor.custom_kernel(Tensor.empty(5, device=device), Tensor(x, device=device), fxn=row_sum)
    np.testing.assert_allclose(out.numpy(), x.sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fxn", [gemm, tiled_gemm], ids=["gemm", "tiled"])
def test_gemm(device, fxn):
    a, b = rand(8, 12), rand(12, 16)
    C = Tensor.empty(8, 16, device=device)
    (out,) = Tensor.custom_kernel(C, Tensor(a, device=device), Tensor(b, device=device), fxn=fxn)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_two_outputs(device):
    x = rand(6, 10)
    t, m = Tensor.empty(6, device=device), Tensor.empty(6, device=device)
    total, biggest = Tensor.custom_kernel(t, m, Tensor(x, device=device), fxn=sum_and_max)
    np.testing.assert_allclose(total.numpy(), x.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(biggest.numpy(), x.max(1))


def test_attention_without_softmax(device):
    q, k, v = rand(5, 8), rand(7, 8), rand(7, 3)
    ins = [Tensor(a, device=device) for a in (q, k, v)]
    (out,) = Tensor.custom_kernel(Tensor.empty(5, 3, device=device), *ins, fxn=attention_no_softmax)
    want = (torch.tensor(q) @ torch.tensor(k).T / np.sqrt(8)) @ torch.tensor(v)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_lazy_and_in_order_with_the_ops_around_it():
    from fusegrad import GlobalCounters

    a = Tensor(rand(4, 4)).realize()
    x = a * 2  # computed first, read by the kernel
    (out,) = Tensor.custom_kernel(Tensor.empty(4, 4), x, fxn=add_one)
    y = (out - 1).sum()  # reads the kernel's output
    GlobalCounters.reset()
    y.realize()
    assert GlobalCounters.kernel_count == 3  # x, the custom kernel, y: nothing fuses across the custom kernel
    np.testing.assert_allclose(y.numpy(), (a.numpy() * 2).sum(), rtol=1e-5)


def test_inputs_keep_their_values():
    a = rand(9)
    start = Tensor(np.zeros(9, np.float32))
    (out,) = Tensor.custom_kernel(start, Tensor(a), fxn=add_one)
    np.testing.assert_allclose(out.numpy(), a + 1, rtol=1e-6)
    np.testing.assert_array_equal(start.numpy(), np.zeros(9, np.float32))


def test_int_kernel():
    a = np.arange(10, dtype=np.int32)
    (out,) = Tensor.custom_kernel(Tensor.empty(10, dtype=dtypes.int32), Tensor(a), fxn=add_one)
    np.testing.assert_array_equal(out.numpy(), a + 1)


def _train_mlp(mm, steps: int = 4) -> list[np.ndarray]:
    from fusegrad.nn.optim import SGD

    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((16, 8)).astype(np.float32))
    y = Tensor(rng.standard_normal((16, 4)).astype(np.float32))
    w1 = Tensor(rng.standard_normal((8, 12)).astype(np.float32) * 0.3, requires_grad=True)
    w2 = Tensor(rng.standard_normal((12, 4)).astype(np.float32) * 0.3, requires_grad=True)
    opt = SGD([w1, w2], lr=0.1)
    with Tensor.train():
        for _ in range(steps):
            opt.zero_grad()
            loss = ((mm(mm(x, w1).relu(), w2) - y) ** 2).mean()
            loss.backward()
            opt.step()
    return [w1.numpy(), w2.numpy()]


def test_gemm_with_custom_backward_trains_like_the_builtin_matmul():
    got, want = _train_mlp(matmul), _train_mlp(lambda a, b: a @ b)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_gradient_matches_torch():
    a, b = rand(3, 5), rand(5, 2)
    ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    (matmul(ta, tb) * 3).sum().backward()
    pa, pb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    ((pa @ pb) * 3).sum().backward()
    np.testing.assert_allclose(ta.grad.numpy(), pa.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tb.grad.numpy(), pb.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_backward_without_grad_fxn_names_the_kernel():
    x = Tensor(rand(2, 3), requires_grad=True)
    (out,) = Tensor.custom_kernel(Tensor.empty(2, 3), x, fxn=add_one)
    with pytest.raises(RuntimeError, match="custom kernel 'add_one' has no gradient"):
        out.sum().backward()


def test_captured_and_replayed_by_tinyjit():
    from fusegrad import GlobalCounters, TinyJit

    @TinyJit
    def step(a: Tensor, b: Tensor) -> Tensor:
        return (matmul(a, b) + 1).realize()

    for _ in range(4):
        a, b = rand(4, 8), rand(8, 4)
        GlobalCounters.reset()
        out = step(Tensor(a), Tensor(b))
        np.testing.assert_allclose(out.numpy(), a @ b + 1, rtol=1e-5, atol=1e-5)
    assert step.captured is not None and step.cnt == 4  # captured on the second call, replayed after


def test_one_kernel_of_its_own_and_a_partial_store_keeps_the_rest():
    from fusegrad import GlobalCounters, KernelInfo, UOp

    def first_half(B: UOp, A: UOp) -> UOp:
        i = UOp.range(4, 0)
        return B[0:4][i].store(A[i] * 10).end(i).sink(arg=KernelInfo(name="first_half"))

    a = rand(8)
    x, base = Tensor(a).realize(), Tensor(np.ones(8, np.float32)).realize()
    GlobalCounters.reset()
    (out,) = Tensor.custom_kernel(Tensor.empty(8), x, fxn=first_half)
    out.realize()
    assert GlobalCounters.kernel_count == 1  # an empty output is not copied in
    GlobalCounters.reset()
    (out,) = Tensor.custom_kernel(base, x, fxn=first_half)
    out.realize()
    assert GlobalCounters.kernel_count == 2  # the copy of the written input, then the kernel
    np.testing.assert_allclose(out.numpy(), np.concatenate([a[:4] * 10, np.ones(4)]), rtol=1e-6)


def test_blocked_gemm(device):
    from custom_kernel_examples import blocked_gemm

    a, b = rand(16, 12), rand(12, 32)
    C = Tensor.empty(16, 32, device=device)
    (out,) = Tensor.custom_kernel(
        C, Tensor(a, device=device), Tensor(b, device=device), fxn=lambda *p: blocked_gemm(*p, ROWS=2)
    )
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_sharded_inputs_run_once_per_shard():
    from fusegrad import GlobalCounters

    devices = ("CPU", "CPU:1")
    a, b = rand(8, 12), rand(12, 5)
    x, w = Tensor(a).shard(devices, 0).realize(), Tensor(b).shard(devices, None).realize()
    out_rows = Tensor.empty(8, 5).shard(devices, 0).realize()
    GlobalCounters.reset()
    (out,) = Tensor.custom_kernel(out_rows, x, w, fxn=gemm)  # each device multiplies its 4 rows
    assert out.device == devices and out.shape == (8, 5)
    out.realize()
    assert GlobalCounters.kernel_count == 4  # per device: the copy of its output shard, then the kernel
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_gradient_of_a_kernel_with_two_outputs():
    from fusegrad import KernelInfo, UOp

    def plus_one_and_double(P: UOp, D: UOp, A: UOp) -> UOp:
        i = UOp.range(A.shape[0], 0)
        both = UOp.group(P[i].store(A[i] + 1), D[i].store(A[i] * 2))
        return both.end(i).sink(arg=KernelInfo(name="plus_one_and_double"))

    def backward(grads, P, D, A):
        g_plus, g_double = grads
        return [None, None, g_plus + g_double * 2]

    a = rand(6)
    x = Tensor(a, requires_grad=True)
    plus, double = Tensor.custom_kernel(Tensor.empty(6), Tensor.empty(6), x, fxn=plus_one_and_double, grad_fxn=backward)
    (plus * plus * 3 + double * 5).sum().backward()
    pa = torch.tensor(a, requires_grad=True)
    ((pa + 1) * (pa + 1) * 3 + pa * 2 * 5).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), pa.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(double.numpy(), a * 2, rtol=1e-6)


def test_kernel_parameter_is_an_input_that_fills_its_buffer():
    from fusegrad.runtime.buffers import Buffer, buffer_uop
    from fusegrad.schedule.custom import fills_its_buffer
    from fusegrad.uop.ops import Ops, UOp
    from fusegrad.uop.sint import Variable

    b = buffer_uop(Buffer("CPU", 12, dtypes.float32))
    rows = UOp(Ops.RESHAPE, b.dtype, (b,), (3, 4))
    assert fills_its_buffer(b) and fills_its_buffer(rows)
    assert not fills_its_buffer(UOp(Ops.PERMUTE, b.dtype, (rows,), (1, 0)))
    assert not fills_its_buffer(UOp(Ops.SHRINK, b.dtype, (b,), ((0, 6),)))
    # contiguous, but at its largest (20 elements) not the 12-element buffer
    assert not fills_its_buffer(UOp(Ops.RESHAPE, b.dtype, (b,), (Variable("v", 1, 20).bind(12),)))
