"""The `fuse` torch device: placement, laziness, views and aliasing, in-place and out=, autograd, bad use."""

import numpy as np
import pytest
import torch

import fusegrad.torch_backend  # noqa: F401
from fusegrad.helpers import GlobalCounters, Context


def test_device_registered_and_roundtrip():
    x = torch.randn(3, 4)
    f = x.to("fuse")
    assert f.device == torch.device("fuse", 0) and f.is_fuse and torch.fuse.is_available()
    assert torch.equal(f.cpu(), x)
    assert torch.randn(2, 3, device="fuse").device.type == "fuse"
    assert torch.equal(torch.arange(5, device="fuse").cpu(), torch.arange(5))
    assert torch.equal(torch.zeros(2, 2, device="fuse").cpu(), torch.zeros(2, 2))
    assert torch.equal(torch.full((2,), 7, device="fuse").cpu(), torch.full((2,), 7))


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.float64],
)
def test_dtypes_roundtrip(dtype):
    x = (torch.randn(4, 3) * 10).to(dtype)
    f = x.to("fuse")
    assert f.dtype == dtype and torch.equal(f.cpu(), x)
    assert torch.equal((f + f).cpu(), x + x)


def test_ops_are_lazy_until_values_are_needed():
    a, b = torch.randn(64, 64).to("fuse"), torch.randn(64, 64).to("fuse")
    a.cpu(), b.cpu()
    before = GlobalCounters.kernel_count
    c = ((a * 2 + b).relu() - 1).sum(0)
    assert GlobalCounters.kernel_count == before
    np.testing.assert_allclose(
        c.cpu().numpy(), ((a.cpu() * 2 + b.cpu()).relu() - 1).sum(0).numpy(), rtol=1e-4, atol=1e-5
    )
    assert GlobalCounters.kernel_count - before <= 2


def test_views_alias_their_base():
    x = torch.arange(24.0).reshape(4, 6)
    f = x.to("fuse")
    f[1:3, ::2].mul_(-1)
    x[1:3, ::2].mul_(-1)
    f.t()[0].add_(100)
    x.t()[0].add_(100)
    f.view(-1)[5] = 7.0
    x.view(-1)[5] = 7.0
    f.diagonal().zero_()
    x.diagonal().zero_()
    assert torch.equal(f.cpu(), x)
    e = f[0:1].expand(3, 6)
    assert torch.equal(e.cpu(), x[0:1].expand(3, 6))
    with pytest.raises(RuntimeError, match="more than one element"):
        e.add_(1)


def test_earlier_results_keep_their_values():
    f = torch.ones(3).to("fuse")
    y = f * 2
    f.add_(10)
    assert torch.equal(y.cpu(), torch.full((3,), 2.0)) and torch.equal(f.cpu(), torch.full((3,), 11.0))


def test_inplace_copy_and_out():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    f, g = x.to("fuse"), y.to("fuse")
    out = torch.empty(3, 4, device="fuse")
    torch.add(f, g, out=out)
    assert torch.allclose(out.cpu(), x + y)
    f.copy_(g[0])
    assert torch.equal(f.cpu(), y[0].expand(3, 4))
    f.zero_()
    assert torch.equal(f.cpu(), torch.zeros(3, 4))
    i = torch.ones(3, dtype=torch.int32).to("fuse")
    with pytest.raises(RuntimeError, match="in-place|cast"):
        i.add_(torch.ones(3).to("fuse") * 0.5)


def test_autograd_and_no_grad():
    x = torch.randn(5, 3, requires_grad=True)
    w = torch.randn(3, 2, requires_grad=True)
    fx, fw = (t.detach().to("fuse").requires_grad_() for t in (x, w))
    (torch.tanh(x @ w) ** 2).mean().backward()
    (torch.tanh(fx @ fw) ** 2).mean().backward()
    torch.testing.assert_close(fx.grad.cpu(), x.grad)
    torch.testing.assert_close(fw.grad.cpu(), w.grad)
    with torch.no_grad():
        assert (fx * 2).requires_grad is False


def test_device_mismatch_raises():
    f, c = torch.randn(3).to("fuse"), torch.randn(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        f + c
    assert torch.allclose((f + torch.tensor(2.0)).cpu(), f.cpu() + 2)  # a 0-d CPU tensor is a scalar


def test_unsupported_dtype_and_op():
    with pytest.raises(TypeError, match="complex64"):
        torch.randn(3, dtype=torch.complex64).to("fuse")
    f = torch.randn(3).to("fuse")
    with pytest.raises(NotImplementedError, match="special_bessel_j0"):
        torch.special.bessel_j0(f)


def test_cpu_fallback_warns_once():
    f = torch.rand(3).to("fuse") + 0.5
    with Context(FUSE_CPU_FALLBACK=1):
        with pytest.warns(UserWarning, match="bessel_j0"):
            d = torch.special.bessel_j0(f)
        torch.special.bessel_j0(f)
    assert d.device.type == "fuse"
    torch.testing.assert_close(d.cpu(), torch.special.bessel_j0(f.cpu()))


def test_bad_fuse_device_env():
    with Context(FUSE_DEVICE="NOSUCHDEVICE"):
        with pytest.raises(RuntimeError, match="NOSUCHDEVICE"):
            torch.randn(2).to("fuse")


def test_backward_error_is_raised_on_the_main_thread():
    f = torch.randn(4).to("fuse").requires_grad_()
    torch.nn.functional.softshrink(f, 0.5).sum().backward()  # its backward op runs on autograd's device thread
    with pytest.raises(NotImplementedError, match="softshrink_backward"):
        f.grad.cpu()


def test_fuse_device_selects_the_fusegrad_device():
    with Context(FUSE_DEVICE="PYTHON"):
        y = torch.ones(3).to("fuse") + 1
        assert y._fuse_storage.value.device == "PYTHON"
        assert torch.equal(y.cpu(), torch.full((3,), 2.0))
    z = torch.ones(3).to("fuse:1")
    assert z.device == torch.device("fuse", 1) and z._fuse_storage.value.device.endswith(":1")
    assert torch.equal((z * 2).cpu(), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="same device"):
        z + torch.ones(3).to("fuse")


def test_strided_views_and_python_values():
    x = torch.arange(10.0)
    f = x.to("fuse")
    assert torch.equal(f.as_strided((4, 3), (2, 1), 1).cpu(), x.as_strided((4, 3), (2, 1), 1))  # overlapping
    assert torch.equal(f.unfold(0, 4, 3).cpu(), x.unfold(0, 4, 3))
    m = torch.arange(12.0).reshape(3, 4)
    g = m.to("fuse")
    g[:, 1::2] = torch.tensor([[1.0, 2.0]]).to("fuse")
    m[:, 1::2] = torch.tensor([[1.0, 2.0]])
    g[torch.tensor([0, 2]).to("fuse")] = 9.0
    m[torch.tensor([0, 2])] = 9.0
    assert torch.equal(g.cpu(), m)
    assert g[1, 2:].tolist() == m[1, 2:].tolist() and g.sum().item() == m.sum().item()
    with pytest.raises(TypeError, match="fuse:0 device type tensor to numpy"):
        g.numpy()
