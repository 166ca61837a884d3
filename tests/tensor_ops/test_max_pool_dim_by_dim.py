"""A large max pool with overlapping windows runs one spatial dim after another (tensor_ops/pool.py,
`_max_pool_dim_by_dim`): values and gradients equal torch's (padding, ceil_mode, dilation, NaN, infinities, ints, 3-D),
each dim is one kernel, and an elementwise input (a ReLU) is computed by the first pass, not stored before it."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import GlobalCounters, Tensor, dtypes
from fusegrad.tensor_ops.pool import POOL_STORE_REDUCED_SIZE, _separable

CASES = [  # input shape, kwargs: every input holds at least POOL_STORE_REDUCED_SIZE elements
    ((1, 8, 47, 49), {"kernel_size": 3, "stride": 2}),
    ((1, 8, 47, 49), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    ((2, 6, 40, 41), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((1, 8, 45, 50), {"kernel_size": (3, 2), "stride": (1, 2), "padding": (1, 0), "ceil_mode": True}),
    ((1, 8, 50, 50), {"kernel_size": 3, "stride": 1, "dilation": 2, "padding": 1}),
    ((1, 8, 44, 52), {"kernel_size": (2, 3), "stride": (2, 1)}),
]


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def kernels(t: Tensor) -> int:
    GlobalCounters.reset()
    t.realize()
    return GlobalCounters.kernel_count


@pytest.mark.parametrize("shape, kw", CASES)
def test_values_and_gradient_equal_torch(shape, kw):
    assert np.prod(shape) >= POOL_STORE_REDUCED_SIZE
    xn = rand(shape)
    xn.reshape(-1)[[3, 700, 701, 5000]] = [np.nan, np.inf, -np.inf, np.nan]
    x, tx = Tensor(xn, requires_grad=True), torch.tensor(xn, requires_grad=True)
    out, tout = x.relu().max_pool2d(**kw), F.max_pool2d(F.relu(tx), **kw)
    np.testing.assert_array_equal(out.numpy(), tout.detach().numpy())
    # the gradient without NaN or ties (random data): torch's first-maximum rule and the max's agree
    xn = rand(shape, seed=1)
    x, tx = Tensor(xn, requires_grad=True), torch.tensor(xn, requires_grad=True)
    out, tout = x.max_pool2d(**kw), F.max_pool2d(tx, **kw)
    gn = rand(tout.shape, seed=2)
    (out * Tensor(gn)).sum().backward()
    (tout * torch.tensor(gn)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_ints_and_3d_equal_torch():
    xi = np.random.default_rng(3).integers(-100, 100, (1, 4, 50, 50)).astype(np.int32)
    got = Tensor(xi).max_pool2d(3, 2, padding=1)
    assert got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), F.max_pool2d(torch.tensor(xi), 3, 2, padding=1).numpy())
    x3 = rand((1, 2, 20, 21, 22))
    got = Tensor(x3).max_pool2d((3, 3, 3), 2, padding=1, ceil_mode=True)
    np.testing.assert_array_equal(got.numpy(), F.max_pool3d(torch.tensor(x3), 3, 2, padding=1, ceil_mode=True).numpy())


def test_one_kernel_per_dim_with_the_relu_in_the_first():
    x = Tensor(rand((1, 16, 55, 55))).realize()
    assert kernels(x.max_pool2d(3, 2)) == kernels(x.relu().max_pool2d(3, 2)) == 2, "no ReLU pass of its own"
    assert kernels(x.relu().max_pool2d((3, 3, 3), 2)) == 3  # (16, 55, 55) pooled as 3 spatial dims
    # windows side by side, or a small input, stay one kernel over the whole window, and so do rows
    # shorter than SEPARABLE_MIN_ROW
    assert kernels(x.relu().max_pool2d(2)) == 1
    assert kernels(Tensor(rand((1, 2, 9, 9))).relu().max_pool2d(3, 2)) == 1
    # (checked on the path choice: the scheduler may store a large pool's padded input first)
    short = Tensor(rand((1, 1024, 7, 7)))
    assert not _separable(short._pool_args(3, 1, 1, 1, False), short), "rows too short"


def test_tied_taps_share_the_gradient_as_the_single_kernel_pool_does(monkeypatch):
    """Ties (a window of zeros) split a window's gradient equally, as the single-kernel pool's window max does; a chain
    of maximums would halve it at each tie instead (0.375 where the window max gives 0.4167)."""
    import fusegrad.tensor_ops.pool as pool

    xn = np.round(rand((1, 8, 48, 48)), 0)  # many ties; POOL_STORE_REDUCED_SIZE elements or more
    xn[0, 0] = 0.0
    g = rand((1, 8, 24, 24), seed=1)

    def grad_of(min_row: int) -> np.ndarray:
        monkeypatch.setattr(pool, "SEPARABLE_MIN_ROW", min_row)
        x = Tensor(xn, requires_grad=True)
        (x.max_pool2d(3, 2, padding=1) * Tensor(g)).sum().backward()
        return x.grad.numpy()

    got, single = grad_of(12), grad_of(10**9)
    np.testing.assert_allclose(got, single, rtol=1e-6, atol=1e-7)
    # channel 0 is all zeros: its corner input sits in one window of 4 tied taps, shared with nothing else
    np.testing.assert_allclose(got[0, 0, 0, 0], g[0, 0, 0, 0] / 4, rtol=1e-6)
