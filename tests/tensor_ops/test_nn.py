"""G19 nn functional ops and losses against torch.nn.functional: values, dtypes, shapes, gradients, kernels, errors.

Gradients are taken of `(out * w).sum()` with a random weight `w`, so a gradient routed to the wrong element is caught.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Context, GlobalCounters, Tensor, dtypes
from reference import check_torch as check

GRAD_ATOL, GRAD_RTOL = 1e-4, 1e-3


def rand(*shape, dtype=np.float32, seed=0, lo=None, hi=None):
    rng = np.random.default_rng(seed + 31 * len(shape) + sum(shape))
    if np.issubdtype(dtype, np.integer):
        return rng.integers(lo or 0, 10 if hi is None else hi, shape).astype(dtype)
    if lo is not None:
        return rng.uniform(lo, hi, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def compare(fg_fn, th_fn, *arrays, device="CPU", grad=True, atol=None, rtol=None, views=None):
    """Same inputs into fg_fn and th_fn; outputs must match, and so must the gradients of every float input."""
    fg_in = [Tensor(a, device=device) for a in arrays]
    th_in = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f" and a.dtype != np.float16) for a in arrays]
    if views is not None:
        fg_args, th_args = [views[0](t) for t in fg_in], [views[1](t) for t in th_in]
    else:
        fg_args, th_args = fg_in, th_in
    fg_out, th_out = fg_fn(*fg_args), th_fn(*th_args)
    fg_outs, th_outs = ([fg_out], [th_out]) if isinstance(th_out, torch.Tensor) else (list(fg_out), list(th_out))
    for o, r in zip(fg_outs, th_outs, strict=True):
        check(o, r, atol, rtol)
    targets = [i for i, t in enumerate(th_in) if t.requires_grad]
    float_outs = [i for i, r in enumerate(th_outs) if r.dtype.is_floating_point]
    if not targets or not float_outs:
        return fg_outs
    weights = [rand(*th_outs[i].shape, seed=7 + i) for i in float_outs]
    fg_loss = sum((fg_outs[i] * Tensor(w, device=device)).sum() for i, w in zip(float_outs, weights))
    th_loss = sum((th_outs[i] * torch.tensor(w)).sum() for i, w in zip(float_outs, weights))
    th_loss.backward()
    grads = fg_loss.gradient(*(fg_in[i] for i in targets))
    for i, g in zip(targets, grads):
        assert g.shape == tuple(th_in[i].shape) and g.dtype == fg_in[i].dtype
        np.testing.assert_allclose(
            g.numpy(), th_in[i].grad.numpy(), atol=GRAD_ATOL, rtol=GRAD_RTOL, err_msg=f"grad {i}"
        )
    return fg_outs


def kernels(*tensors):
    GlobalCounters.reset()
    Tensor.realize_all(list(tensors))
    return GlobalCounters.kernel_count


PERMUTED = (lambda t: t.permute(0, 1, 3, 2), lambda t: t.permute(0, 1, 3, 2))

# ---------------------------------------------------------------------------------------------------------------------
# convolution

CONV_CASES = [  # input shape, weight shape, kwargs (torch names)
    ((2, 4, 7, 8), (6, 2, 3, 2), {"groups": 2, "stride": (2, 1), "dilation": (1, 2), "padding": (1, 2)}),
    ((2, 3, 6, 6), (4, 3, 3, 3), {"padding": 1}),
    ((1, 2, 5, 6), (3, 2, 2, 3), {"stride": 2}),
    ((1, 3, 9), (4, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 2, 4, 5, 5), (2, 2, 2, 3, 2), {"padding": (1, 0, 1)}),
    ((1, 4, 6, 6), (4, 1, 3, 3), {"groups": 4, "dilation": 2, "padding": 2}),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_CASES)
def test_conv(xs, ws, kw):
    th = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(ws)]
    compare(
        lambda x, w, b: x.conv2d(w, b, **kw),
        lambda x, w, b: th(x, w, b, **kw),
        rand(*xs),
        rand(*ws, seed=1),
        rand(ws[0], seed=2),
        atol=1e-5,
    )


def test_conv_no_bias_views_and_kernels():
    x, w = rand(2, 3, 6, 7), rand(4, 3, 3, 2, seed=1)
    compare(
        lambda x, w: x.conv2d(w, padding=1), lambda x, w: F.conv2d(x, w, padding=1), x, w, views=PERMUTED, atol=1e-5
    )
    # negative-step views of both input and weight
    compare(
        lambda x, w: x.conv2d(w),
        lambda x, w: F.conv2d(x, w),
        x,
        w,
        atol=1e-5,
        views=(lambda t: t.flip(2, 3)[:, :, ::2], lambda t: t.flip(2, 3)[:, :, ::2]),
    )
    X, W, B = Tensor(x), Tensor(w), Tensor(rand(4, seed=2))
    assert kernels(X.conv2d(W, B)) == 1
    assert kernels(X.conv2d(W, B, padding=2, stride=2, dilation=2)) <= 2


def test_conv_padding_forms():
    x, w = rand(1, 2, 6, 7), rand(3, 2, 3, 3, seed=1)
    X, W, tx, tw = Tensor(x), Tensor(w), torch.tensor(x), torch.tensor(w)
    # flat torch order: (left, right, top, bottom)
    check(X.conv2d(W, padding=[1, 2, 0, 1]), F.conv2d(F.pad(tx, (1, 2, 0, 1)), tw))
    check(X.conv2d(W, padding=(2, 1)), F.conv2d(tx, tw, padding=(2, 1)))
    # negative padding crops
    check(X.conv2d(W, padding=[-1, 0, 1, -1]), F.conv2d(F.pad(tx, (-1, 0, 1, -1)), tw))
    with pytest.raises(ValueError, match="padding"):
        X.conv2d(W, padding=(1, 2, 3))


def test_conv_dtypes():
    x, w = rand(1, 2, 5, 5, dtype=np.float16), rand(3, 2, 2, 2, dtype=np.float16, seed=1)
    ref = F.conv2d(torch.tensor(x).float(), torch.tensor(w).float())
    check(Tensor(x).conv2d(Tensor(w)), ref.half(), atol=1e-2, rtol=1e-2)
    out = Tensor(x).conv2d(Tensor(w), dtype=dtypes.float32)
    check(out, F.conv2d(torch.tensor(x).float(), torch.tensor(w).float()), atol=1e-5)
    xi, wi = rand(1, 2, 5, 5, dtype=np.int32, lo=-5, hi=5), rand(3, 2, 2, 2, dtype=np.int32, lo=-3, hi=3, seed=1)
    check(Tensor(xi).conv2d(Tensor(wi)), F.conv2d(torch.tensor(xi), torch.tensor(wi)))


def test_conv_zero_batch_and_unbatched():
    w = rand(3, 2, 2, 2, seed=1)
    check(Tensor(rand(0, 2, 4, 4)).conv2d(Tensor(w)), F.conv2d(torch.zeros(0, 2, 4, 4), torch.tensor(w)))
    x = rand(2, 4, 4)
    check(Tensor(x).conv2d(Tensor(w), padding=1), F.conv2d(torch.tensor(x), torch.tensor(w), padding=1), atol=1e-5)


def test_conv_errors():
    x, w = Tensor(rand(1, 3, 4, 4)), Tensor(rand(2, 2, 2, 2))
    with pytest.raises(RuntimeError, match=r"expected input\[1, 3, 4, 4\] to have 2 channels, but got 3"):
        x.conv2d(w)
    with pytest.raises(RuntimeError, match="stride"):
        x.conv2d(Tensor(rand(2, 3, 2, 2)), stride=0)
    with pytest.raises(RuntimeError, match="smaller than the dilated kernel"):
        x.conv2d(Tensor(rand(2, 3, 5, 5)))
    with pytest.raises(RuntimeError, match="groups=2"):
        x.conv2d(Tensor(rand(3, 3, 2, 2)), groups=2)
    with pytest.raises(RuntimeError, match="bias"):
        x.conv2d(Tensor(rand(2, 3, 2, 2)), Tensor(rand(3)))


CONV_T_CASES = [
    ((2, 4, 4, 5), (4, 3, 3, 2), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((1, 4, 3, 3), (4, 2, 3, 3), {"groups": 2, "stride": (1, 2), "dilation": (2, 1), "padding": (1, 0)}),
    ((1, 2, 5), (2, 3, 4), {"stride": 3, "padding": 2, "output_padding": 2}),
    ((1, 2, 3, 3), (2, 2, 2, 2), {}),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_T_CASES)
def test_conv_transpose(xs, ws, kw):
    th = {3: F.conv_transpose1d, 4: F.conv_transpose2d}[len(ws)]
    compare(
        lambda x, w, b: x.conv_transpose2d(w, b, **kw),
        lambda x, w, b: th(x, w, b, **kw),
        rand(*xs),
        rand(*ws, seed=1),
        rand(ws[1] * kw.get("groups", 1), seed=2),
        atol=1e-5,
    )


def test_conv_transpose_errors():
    x, w = Tensor(rand(1, 2, 4, 4)), Tensor(rand(2, 1, 3, 3))
    with pytest.raises(RuntimeError, match="output_padding"):
        x.conv_transpose2d(w, stride=2, output_padding=2)
    with pytest.raises(RuntimeError, match="channels"):
        x.conv_transpose2d(Tensor(rand(3, 1, 3, 3)))


# ---------------------------------------------------------------------------------------------------------------------
# pooling

POOL_CASES = [  # input shape, kwargs shared by avg and max pooling
    ((2, 3, 6, 7), {"kernel_size": (2, 2)}),
    ((1, 2, 7, 8), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((1, 2, 7, 9), {"kernel_size": (3, 2), "stride": (2, 3), "padding": (1, 0), "ceil_mode": True}),
    ((1, 1, 8, 8), {"kernel_size": 3, "stride": 3, "ceil_mode": True}),
    ((2, 2, 5, 5), {"kernel_size": 2, "stride": 1, "padding": 1}),
    ((2, 3, 9), {"kernel_size": (3,), "stride": 2, "padding": 1}),
]


def _is_1d(kw):
    return isinstance(kw["kernel_size"], tuple) and len(kw["kernel_size"]) == 1


@pytest.mark.parametrize("xs,kw", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool(xs, kw, count_include_pad):
    th = F.avg_pool1d if _is_1d(kw) else F.avg_pool2d
    compare(
        lambda x: x.avg_pool2d(count_include_pad=count_include_pad, **kw),
        lambda x: th(x, count_include_pad=count_include_pad, **kw),
        rand(*xs),
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 3, "stride": 1, "padding": 1},  # Inception's pools
        {"kernel_size": (3, 2), "stride": 2, "padding": (1, 1), "ceil_mode": True},
    ],
)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_large_padded_avg_pool_reads_a_stored_padded_input(kw, count_include_pad):
    """An avg pool over at least POOL_STORE_REDUCED_SIZE elements with padding stores its padded input first (a
    copy kernel of the padded shape), so the window sum reads it without a bounds check per tap; values and the
    gradient equal torch's."""
    from fusegrad.runtime.device import Device
    from fusegrad.schedule import create_schedule

    x = Tensor.empty(1, 64, 16, 16)
    items, _, _ = create_schedule([x.avg_pool2d(**kw).uop], [Device["CPU"]])
    padded = 64 * (16 + 2) * (16 + 2)
    assert any(it.buffers[0].size == padded for it in items), [it.buffers[0].size for it in items]
    compare(
        lambda x: x.avg_pool2d(count_include_pad=count_include_pad, **kw),
        lambda x: F.avg_pool2d(x, count_include_pad=count_include_pad, **kw),
        rand(1, 64, 16, 16),
    )


@pytest.mark.parametrize("xs,kw", POOL_CASES)
def test_max_pool_with_indices(xs, kw):
    th = F.max_pool1d if _is_1d(kw) else F.max_pool2d
    compare(lambda x: x.max_pool2d(return_indices=True, **kw)[0], lambda x: th(x, **kw), rand(*xs))
    values, indices = Tensor(rand(*xs)).max_pool2d(return_indices=True, **kw)
    ref_values, ref_indices = th(torch.tensor(rand(*xs)), return_indices=True, **kw)
    check(values, ref_values)
    assert indices.dtype == dtypes.int32
    np.testing.assert_array_equal(indices.numpy(), ref_indices.numpy())


TILED_POOL_CASES = [  # input shape, kernel: windows side by side inside the input (the tap-picking gradient)
    ((2, 3, 8, 8), 2),
    ((2, 3, 7, 9), 2),  # a row and a column past the last window
    ((1, 2, 9, 7), 3),
    ((2, 2, 6, 7), (2, 3)),
    ((2, 3, 9), (3,)),
    ((1, 2, 4, 6, 5), (2, 3, 2)),
    ((1, 1, 2, 7), (1, 2)),
]


@pytest.mark.parametrize("xs,kernel", TILED_POOL_CASES)
def test_tiled_max_pool_gradient_goes_to_the_tap_torch_picks(xs, kernel):
    """Ties (plateaus of equal values, ReLU zeros), NaN windows (one NaN, several), infinities: the gradient of each
    window goes where torch's goes (the first maximum, the last NaN), under a ReLU before the pool too."""
    th = {3: F.max_pool1d, 4: F.max_pool2d, 5: F.max_pool3d}[len(xs)]
    xn = np.round(rand(*xs), 0)  # many exact ties
    flat = xn.reshape(-1)
    flat[[1, 4, 5, 11]] = [np.nan, np.inf, np.nan, -np.inf]
    for relu in (False, True):
        x, tx = Tensor(xn, requires_grad=True), torch.tensor(xn, requires_grad=True)
        out = (x.relu() if relu else x).max_pool2d(kernel)
        tout = th(F.relu(tx) if relu else tx, kernel)
        gn = rand(*tout.shape, seed=3)
        (out * Tensor(gn)).sum().backward()
        (tout * torch.tensor(gn)).sum().backward()
        np.testing.assert_array_equal(out.numpy(), tout.detach().numpy())
        np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())


def test_tiled_max_pool_gradient_float64_and_second_pool():
    compare(lambda x: x.max_pool2d(2).max_pool2d(2), lambda x: F.max_pool2d(F.max_pool2d(x, 2), 2), rand(2, 3, 9, 8))
    compare(lambda x: x.max_pool2d((1, 3)), lambda x: F.max_pool2d(x, (1, 3)), rand(1, 2, 3, 7).astype(np.float64))
    # windows that overlap or reach into padding keep the plain rule
    compare(lambda x: x.max_pool2d(2, stride=1), lambda x: F.max_pool2d(x, 2, stride=1), rand(1, 2, 5, 5))
    compare(lambda x: x.max_pool2d(2, padding=1), lambda x: F.max_pool2d(x, 2, padding=1), rand(1, 2, 5, 5))


def test_max_pool_dilation_views_dtypes():
    kw = {"kernel_size": (2, 3), "stride": (1, 2), "dilation": (2, 1), "padding": (1, 1)}
    compare(lambda x: x.max_pool2d(**kw), lambda x: F.max_pool2d(x, **kw), rand(1, 2, 7, 8), views=PERMUTED)
    xi = rand(1, 2, 5, 6, dtype=np.int32, lo=-50, hi=50)
    check(Tensor(xi).max_pool2d(3, 2, padding=1), F.max_pool2d(torch.tensor(xi), 3, 2, padding=1))
    # a window that only holds -inf still picks a real element, never padding
    xn = np.full((1, 1, 3, 3), -np.inf, np.float32)
    v, i = Tensor(xn).max_pool2d(2, 2, padding=1, return_indices=True)
    rv, ri = F.max_pool2d(torch.tensor(xn), 2, 2, padding=1, return_indices=True)
    check(v, rv)
    np.testing.assert_array_equal(i.numpy(), ri.numpy())
    x3 = rand(1, 1, 4, 5, 6)
    check(Tensor(x3).max_pool2d((2, 2, 3)), F.max_pool3d(torch.tensor(x3), (2, 2, 3)))
    check(Tensor(x3).avg_pool2d((2, 3, 2), stride=1), F.avg_pool3d(torch.tensor(x3), (2, 3, 2), stride=1))


def test_pool_zero_batch():
    x = rand(0, 2, 4, 4)
    check(Tensor(x).max_pool2d(2), F.max_pool2d(torch.tensor(x), 2))
    check(
        Tensor(x).avg_pool2d(3, 1, padding=1, count_include_pad=False),
        F.avg_pool2d(torch.tensor(x), 3, 1, padding=1, count_include_pad=False),
    )


def test_pool_kernel_counts():
    x = Tensor(rand(2, 3, 8, 8))
    assert kernels(x.avg_pool2d()) == 1
    assert kernels(x.max_pool2d(3, 2, padding=1)) == 1
    assert kernels(*x.max_pool2d(3, 2, padding=1, return_indices=True)) <= 3


def test_pool_errors():
    x = Tensor(rand(1, 1, 4, 4))
    with pytest.raises(RuntimeError, match="pad should be"):
        x.max_pool2d(2, padding=2)
    with pytest.raises(RuntimeError, match="pad should be"):
        x.avg_pool2d(3, padding=-1)
    with pytest.raises(RuntimeError, match="too small"):
        x.avg_pool2d(5)
    with pytest.raises(RuntimeError, match="stride"):
        x.max_pool2d(2, stride=0)
    with pytest.raises(ValueError, match="stride"):
        x.max_pool2d((2, 2), stride=(1, 1, 1))


@pytest.mark.parametrize(
    "xs,kw,out",
    [
        ((2, 2, 6, 6), {"kernel_size": 2}, None),
        ((1, 2, 7, 8), {"kernel_size": 3, "stride": 2, "padding": 1}, (7, 8)),
        ((1, 1, 6, 6), {"kernel_size": 3, "stride": 1}, (1, 1, 6, 6)),
    ],
)
def test_max_unpool(xs, kw, out):
    vals, idx = F.max_pool2d(torch.tensor(rand(*xs)), return_indices=True, **kw)
    compare(
        lambda v: v.max_unpool2d(Tensor(idx.numpy().astype(np.int32)), output_size=out, **kw),
        lambda v: F.max_unpool2d(v, idx, output_size=out, **kw),
        vals.numpy(),
    )


@pytest.mark.parametrize("kernel", [(1, 2), (2, 2)])
def test_max_pool_unpool_nonfinite_like_torch(kernel):
    # inf maxima survive the unpool (no inf - inf), and a NaN maximum takes the gradient (not NaN everywhere)
    inf, nan = float("inf"), float("nan")
    x = np.array(
        [[[[1.0, inf, 2.0, 1.5], [-inf, nan, -inf, -5.0], [3.0, 0.5, -1.0, nan], [-inf, 7.0, inf, 5.0]]]], np.float32
    )
    t, tt = Tensor(x), torch.tensor(x, requires_grad=True)
    vals, idx = t.max_pool2d(kernel, return_indices=True)
    tvals, tidx = F.max_pool2d(tt, kernel, return_indices=True)
    check(vals, tvals)
    out, tout = vals.max_unpool2d(idx, kernel), F.max_unpool2d(tvals, tidx, kernel)
    check(out, tout)
    out.sum().backward()
    tout.sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())  # no ties: torch's argmax is unique


def test_max_unpool_errors():
    v = Tensor(rand(1, 1, 2, 2))
    with pytest.raises(RuntimeError, match="indices shape"):
        v.max_unpool2d(Tensor(np.zeros((1, 1, 2, 3), np.int32)))
    with pytest.raises(RuntimeError, match="integer"):
        v.max_unpool2d(Tensor(np.zeros((1, 1, 2, 2), np.float32)))


# ---------------------------------------------------------------------------------------------------------------------
# interpolate


@pytest.mark.parametrize(
    "mode,align_corners", [("nearest", False), ("nearest-exact", False), ("linear", False), ("linear", True)]
)
@pytest.mark.parametrize("size", [(8, 11), (3, 4), (5, 14), (1, 1)])
def test_interpolate_2d(mode, align_corners, size):
    th_mode = "bilinear" if mode == "linear" else mode
    compare(
        lambda x: x.interpolate(size, mode=mode, align_corners=align_corners),
        lambda x: F.interpolate(x, size=size, mode=th_mode, align_corners=align_corners if th_mode != mode else None),
        rand(2, 3, 5, 7),
        atol=1e-5,
    )


def test_interpolate_1d_3d_views_dtypes():
    compare(
        lambda x: x.interpolate((13,)), lambda x: F.interpolate(x, size=13, mode="linear"), rand(2, 3, 6), atol=1e-5
    )
    compare(
        lambda x: x.interpolate((5, 3, 7), align_corners=True),
        lambda x: F.interpolate(x, size=(5, 3, 7), mode="trilinear", align_corners=True),
        rand(1, 2, 3, 4, 5),
        atol=1e-5,
    )
    compare(
        lambda x: x.interpolate((9, 4), mode="nearest"),
        lambda x: F.interpolate(x, size=(9, 4), mode="nearest"),
        rand(1, 2, 5, 6),
        views=PERMUTED,
    )
    xu = rand(1, 2, 5, 6, dtype=np.uint8, hi=256)
    ref = F.interpolate(torch.tensor(xu), size=(9, 4), mode="nearest-exact")
    check(Tensor(xu).interpolate((9, 4), mode="nearest-exact"), ref)
    # uint8 linear equals torch's integer kernel exactly (more sizes in test_interpolate_uint8_like_torch)
    check(Tensor(xu).interpolate((9, 4)), F.interpolate(torch.tensor(xu), size=(9, 4), mode="bilinear"))
    xh = rand(1, 1, 4, 4, dtype=np.float16)
    check(Tensor(xh).interpolate((6, 3)), F.interpolate(torch.tensor(xh).float(), size=(6, 3), mode="bilinear").half())


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize(
    "shape,size", [((2, 3, 2, 3), (3, 5)), ((1, 3, 4, 4), (7, 9)), ((2, 5, 6, 6), (13, 5)), ((1, 1, 9, 9), (4, 17))]
)
def test_interpolate_uint8_like_torch(shape, size, align_corners):
    # torch's uint8 bilinear is separable (last dim first) in fixed point, rounding after each pass
    x = rand(*shape, dtype=np.uint8, hi=256)
    out = Tensor(x).interpolate(size, align_corners=align_corners)
    check(out, F.interpolate(torch.tensor(x), size=size, mode="bilinear", align_corners=align_corners))


def test_interpolate_errors():
    x = Tensor(rand(1, 1, 4, 4))
    with pytest.raises(ValueError, match="align_corners"):
        x.interpolate((2, 2), mode="nearest", align_corners=True)
    with pytest.raises(NotImplementedError, match="bicubic"):
        x.interpolate((2, 2), mode="bicubic")
    with pytest.raises(ValueError, match="size"):
        x.interpolate((2, 2, 2, 2, 2))


# ---------------------------------------------------------------------------------------------------------------------
# normalisation, dropout, attention


@pytest.mark.parametrize("axis,shape", [(-1, (5,)), ((1, 2), (4, 5))])
def test_layernorm(axis, shape):
    compare(
        lambda x: x.layernorm(axis=axis, eps=1e-5), lambda x: F.layer_norm(x, shape, eps=1e-5), rand(3, 4, 5), atol=1e-5
    )


def test_layernorm_kernels_views_dtypes():
    assert kernels(Tensor(rand(4, 16)).layernorm()) <= 3
    compare(lambda x: x.layernorm(), lambda x: F.layer_norm(x, (4,)), rand(2, 2, 4, 3), views=PERMUTED, atol=1e-5)
    xh = rand(3, 8, dtype=np.float16)
    check(Tensor(xh).layernorm(), F.layer_norm(torch.tensor(xh).float(), (8,)).half(), atol=2e-3)
    check(Tensor(np.zeros((2, 0), np.float32)).layernorm(axis=0), F.layer_norm(torch.zeros(0, 2), (2,)).T)


def test_batchnorm():
    mean, var = rand(4, seed=3), rand(4, seed=4, lo=0.5, hi=2.0)

    def th(x, w, b):
        return F.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, eps=1e-5)

    def fg(x, w, b):
        return x.batchnorm(w, b, Tensor(mean), Tensor(1 / np.sqrt(var + 1e-5)))

    compare(fg, th, rand(2, 4, 3, 3), rand(4, seed=1), rand(4, seed=2), atol=1e-5)
    x = Tensor(rand(2, 4))
    ref = F.batch_norm(torch.tensor(rand(2, 4)), torch.tensor(mean), torch.tensor(var), eps=1e-5)
    check(x.batchnorm(None, None, Tensor(mean), Tensor(1 / np.sqrt(var + 1e-5))), ref, atol=1e-5)
    # stats along the last axis
    xl = rand(3, 4)
    out = Tensor(xl).batchnorm(Tensor(rand(4, seed=1)), None, Tensor(mean), Tensor(var), axis=-1)
    np.testing.assert_allclose(out.numpy(), (xl - mean) * rand(4, seed=1) * var, atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="mean"):
        x.batchnorm(None, None, Tensor(rand(3)), Tensor(var))


def test_dropout():
    x = Tensor(rand(4, 5))
    assert x.dropout(0.5) is x  # inference: identity
    with Context(TRAINING=1):
        Tensor.manual_seed(1)
        a = Tensor.ones(2000).dropout(0.25).numpy()
        Tensor.manual_seed(1)
        b = Tensor.ones(2000).dropout(0.25).numpy()
        np.testing.assert_array_equal(a, b)
        assert set(np.unique(a).tolist()) == {0.0, np.float32(1 / 0.75)}
        assert 0.2 < (a == 0).mean() < 0.3
        np.testing.assert_array_equal(Tensor.ones(7).dropout(1.0).numpy(), np.zeros(7))
        assert Tensor.ones(3).dropout(0.0).tolist() == [1.0, 1.0, 1.0]
        xs = Tensor(rand(50))
        out = xs.dropout(0.5)
        g = (out * 3).sum().gradient(xs)[0].numpy()
        kept = out.numpy() != 0
        np.testing.assert_allclose(g, np.where(kept, 6.0, 0.0))
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            x.dropout(p)


SDPA_CASES = [  # query, key, value shapes, kwargs
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {}),
    ((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), {"is_causal": True}),
    ((2, 3, 4, 6), (2, 3, 7, 6), (2, 3, 7, 6), {"is_causal": True}),
    ((4, 8), (6, 8), (6, 3), {}),
    ((1, 6, 4, 8), (1, 2, 6, 8), (1, 2, 6, 4), {"enable_gqa": True}),
]


@pytest.mark.parametrize("qs,ks,vs,kw", SDPA_CASES)
def test_sdpa(qs, ks, vs, kw):
    compare(
        lambda q, k, v: q.scaled_dot_product_attention(k, v, **kw),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw),
        rand(*qs),
        rand(*ks, seed=1),
        rand(*vs, seed=2),
        atol=1e-5,
    )


def test_sdpa_masks_and_dtypes():
    q, k, v = rand(2, 3, 4, 8), rand(2, 3, 6, 8, seed=1), rand(2, 3, 6, 5, seed=2)
    bool_mask = rand(4, 6, seed=3) > -0.5
    float_mask = rand(3, 4, 6, seed=4)
    for mask in (bool_mask, float_mask):
        compare(
            lambda q, k, v, mask=mask: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(mask)),
            lambda q, k, v, mask=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(mask)),
            q,
            k,
            v,
            atol=1e-5,
        )
    qh, kh, vh = (a.astype(np.float16) for a in (q, k, v))
    out = Tensor(qh).scaled_dot_product_attention(Tensor(kh), Tensor(vh))
    ref = F.scaled_dot_product_attention(*(torch.tensor(a).float() for a in (q, k, v)))
    assert out.dtype == dtypes.float16
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=3e-3, rtol=3e-3)
    masked = Tensor(qh).scaled_dot_product_attention(Tensor(kh), Tensor(vh), attn_mask=Tensor(float_mask))
    ref = F.scaled_dot_product_attention(
        *(torch.tensor(a).float() for a in (q, k, v)), attn_mask=torch.tensor(float_mask)
    )
    assert masked.dtype == dtypes.float16
    np.testing.assert_allclose(masked.numpy(), ref.numpy(), atol=3e-3, rtol=3e-3)
    with pytest.raises(RuntimeError, match="is_causal"):
        Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(bool_mask), is_causal=True)


def test_sequential():
    x = Tensor(rand(3, 4))
    out = x.sequential([lambda t: t * 2, Tensor.relu, lambda t: t + 1])
    np.testing.assert_allclose(out.numpy(), np.maximum(rand(3, 4) * 2, 0) + 1)
    assert x.sequential([]) is x


# ---------------------------------------------------------------------------------------------------------------------
# losses

REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_crossentropy(reduction):
    p, y = rand(3, 4, lo=0.01, hi=0.99), (rand(3, 4, seed=1) > 0).astype(np.float32)
    compare(
        lambda p, y: p.binary_crossentropy(y, reduction=reduction),
        lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction),
        p,
        y,
    )
    compare(
        lambda p, y: p.binary_crossentropy(y, reduction=reduction),
        lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction),
        np.array(0.3, np.float32),
        np.array(1.0, np.float32),
    )
    # saturated probabilities: torch clamps the log at -100
    edge = np.array([0.0, 1.0, 0.5], np.float32)
    check(
        Tensor(edge).binary_crossentropy(Tensor(np.array([1.0, 0.0, 1.0], np.float32)), reduction=reduction),
        F.binary_cross_entropy(torch.tensor(edge), torch.tensor([1.0, 0.0, 1.0]), reduction=reduction),
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("pos_weight", [False, True])
def test_binary_crossentropy_logits(reduction, pos_weight):
    x, y, pw = rand(3, 4) * 30, rand(3, 4, seed=1, lo=0.0, hi=1.0), rand(4, seed=2, lo=0.5, hi=3.0)
    fg_pw, th_pw = (Tensor(pw), torch.tensor(pw)) if pos_weight else (None, None)
    compare(
        lambda x, y: x.binary_crossentropy_logits(y, reduction=reduction, pos_weight=fg_pw),
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction, pos_weight=th_pw),
        x,
        y,
        atol=1e-5,
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy_indices(reduction, label_smoothing):
    labels = rand(4, 3, dtype=np.int64, hi=5)
    kw = {"reduction": reduction, "label_smoothing": label_smoothing}
    compare(
        lambda x: x.cross_entropy(Tensor(labels.astype(np.int32)), **kw),
        lambda x: F.cross_entropy(x, torch.tensor(labels), **kw),
        rand(4, 5, 3),
        atol=1e-5,
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_cross_entropy_probabilities(reduction, label_smoothing):
    probs = F.softmax(torch.tensor(rand(4, 5, seed=3)), 1).numpy()
    kw = {"reduction": reduction, "label_smoothing": label_smoothing}
    compare(
        lambda x, p: x.cross_entropy(p, **kw), lambda x, p: F.cross_entropy(x, p, **kw), rand(4, 5), probs, atol=1e-5
    )


def test_cross_entropy_spatial_dims():
    labels = rand(2, 4, 3, dtype=np.int64, hi=5)
    compare(
        lambda x: x.cross_entropy(Tensor(labels), label_smoothing=0.1),
        lambda x: F.cross_entropy(x, torch.tensor(labels), label_smoothing=0.1),
        rand(2, 5, 4, 3),
        atol=1e-5,
    )
    probs = F.softmax(torch.tensor(rand(2, 5, 4, 3, seed=1)), 1).numpy()
    compare(
        lambda x, p: x.cross_entropy(p, reduction="none"),
        lambda x, p: F.cross_entropy(x, p, reduction="none"),
        rand(2, 5, 4, 3),
        probs,
        atol=1e-5,
    )
    logp = F.log_softmax(torch.tensor(rand(2, 5, 4, 3)), 1).numpy()
    compare(
        lambda x: x.nll_loss(Tensor(labels), reduction="none"),
        lambda x: F.nll_loss(x, torch.tensor(labels), reduction="none"),
        logp,
    )


def test_cross_entropy_1d_views_dtypes_errors():
    compare(
        lambda x: x.cross_entropy(Tensor(np.array(2, np.int32))), lambda x: F.cross_entropy(x, torch.tensor(2)), rand(5)
    )
    labels = rand(3, 2, dtype=np.int64, hi=4)
    compare(
        lambda x: x.cross_entropy(Tensor(labels)),
        lambda x: F.cross_entropy(x, torch.tensor(labels)),
        rand(3, 2, 4),
        views=(lambda t: t.permute(0, 2, 1), lambda t: t.permute(0, 2, 1)),
        atol=1e-5,
    )
    xh = rand(3, 5, dtype=np.float16)
    out = Tensor(xh).cross_entropy(Tensor(labels[:, 0]))
    check(out, F.cross_entropy(torch.tensor(xh).float(), torch.tensor(labels[:, 0])).half(), atol=2e-3)
    x = Tensor(rand(3, 4))
    with pytest.raises(RuntimeError, match="target"):
        x.cross_entropy(Tensor(np.zeros(2, np.int32)))
    with pytest.raises(ValueError, match="batch_size"):
        x.cross_entropy(Tensor(np.zeros(2, np.int32)))
    with pytest.raises(RuntimeError, match="target"):
        x.cross_entropy(Tensor(rand(3, 5)))
    with pytest.raises(ValueError, match="reduction"):
        x.cross_entropy(Tensor(np.zeros(3, np.int32)), reduction="avg")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ignore_index,label_smoothing", [(-1, 0.0), (2, 0.0), (2, 0.1), (-1, 0.25)])
def test_sparse_categorical_crossentropy(reduction, ignore_index, label_smoothing):
    labels = rand(6, dtype=np.int64, hi=5)
    labels[1] = 2
    th_ignore = ignore_index if ignore_index != -1 else -100
    compare(
        lambda x: x.sparse_categorical_crossentropy(
            Tensor(labels.astype(np.int32)),
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            reduction=reduction,
        ),
        lambda x: F.cross_entropy(
            x, torch.tensor(labels), ignore_index=th_ignore, label_smoothing=label_smoothing, reduction=reduction
        ),
        rand(6, 5),
        atol=1e-5,
    )


def test_cross_entropy_of_masked_classes_matches_torch():
    # a -inf logit (a masked class) that is not the label: torch's loss is finite, and so is its gradient
    logits = rand(4, 5)
    logits[0, 3] = logits[2, 1] = -np.inf
    labels = np.array([0, 4, 2, 1], np.int64)
    labels[2] = 3
    compare(
        lambda x: x.sparse_categorical_crossentropy(Tensor(labels.astype(np.int32))),
        lambda x: F.cross_entropy(x, torch.tensor(labels)),
        logits,
        atol=1e-5,
    )
    compare(
        lambda x: x.cross_entropy(Tensor(labels.astype(np.int32))),
        lambda x: F.cross_entropy(x, torch.tensor(labels)),
        logits,
        atol=1e-5,
    )


def test_sparse_categorical_crossentropy_classes_last():
    labels = rand(2, 3, dtype=np.int64, hi=4)
    compare(
        lambda x: x.sparse_categorical_crossentropy(Tensor(labels)),
        lambda x: F.cross_entropy(x.permute(0, 2, 1), torch.tensor(labels)),
        rand(2, 3, 4),
        atol=1e-5,
    )
    # integer-valued float labels are accepted too
    check(
        Tensor(rand(2, 3, 4)).sparse_categorical_crossentropy(Tensor(labels.astype(np.float32))),
        F.cross_entropy(torch.tensor(rand(2, 3, 4)).permute(0, 2, 1), torch.tensor(labels)),
        atol=1e-5,
    )
    x = Tensor(rand(2, 3, 4))
    with pytest.raises(RuntimeError, match="labels"):
        x.sparse_categorical_crossentropy(Tensor(np.zeros((2, 4), np.int32)))
    with pytest.raises(ValueError, match="reduction"):
        x.sparse_categorical_crossentropy(Tensor(labels), reduction="max")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted,ignore_index", [(False, None), (True, None), (True, 1), (False, 3)])
def test_nll_loss(reduction, weighted, ignore_index):
    labels, weight = rand(4, 3, dtype=np.int64, hi=5), rand(5, seed=5, lo=0.1, hi=2.0)
    logp = F.log_softmax(torch.tensor(rand(4, 5, 3)), 1).numpy()
    kw_th = {"weight": torch.tensor(weight) if weighted else None, "reduction": reduction}
    if ignore_index is not None:
        kw_th["ignore_index"] = ignore_index
    compare(
        lambda x: x.nll_loss(
            Tensor(labels.astype(np.int32)),
            weight=Tensor(weight) if weighted else None,
            ignore_index=ignore_index,
            reduction=reduction,
        ),
        lambda x: F.nll_loss(x, torch.tensor(labels), **kw_th),
        logp,
        atol=1e-5,
    )


def test_nll_loss_errors():
    x = Tensor(rand(3, 4))
    with pytest.raises(ValueError, match="batch_size"):
        x.nll_loss(Tensor(np.zeros(2, np.int32)))
    with pytest.raises(RuntimeError, match="weight"):
        x.nll_loss(Tensor(np.zeros(3, np.int32)), weight=Tensor(rand(3)))
    with pytest.raises(RuntimeError, match="integer"):
        x.nll_loss(Tensor(rand(3)))
    with pytest.raises(ValueError, match="reduction"):
        x.nll_loss(Tensor(np.zeros(3, np.int32)), reduction="")
    with pytest.raises(ValueError, match="reduction"):
        x.binary_crossentropy(Tensor(rand(3, 4)), reduction="avg")
    with pytest.raises(ValueError, match="shape"):
        x.binary_crossentropy_logits(Tensor(rand(4)))


def test_loss_kernel_counts():
    x, y = Tensor(rand(8, 10)), Tensor(rand(8, dtype=np.int32, hi=10))
    assert kernels(x.sparse_categorical_crossentropy(y)) <= 3
    assert kernels(x.cross_entropy(y)) <= 3


# ---------------------------------------------------------------------------------------------------------------------
# the PYTHON interpreter backend on tiny tensors


def test_python_device_subset():
    dev = "PYTHON"
    compare(
        lambda x, w, b: x.conv2d(w, b, padding=1, stride=2),
        lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2),
        rand(1, 2, 4, 4),
        rand(2, 2, 2, 2, seed=1),
        rand(2, seed=2),
        device=dev,
        atol=1e-5,
    )
    compare(
        lambda x: x.max_pool2d(2, return_indices=True)[0], lambda x: F.max_pool2d(x, 2), rand(1, 1, 4, 4), device=dev
    )
    indices = Tensor(rand(1, 1, 4, 4), device=dev).max_pool2d(2, return_indices=True)[1]
    ref_indices = F.max_pool2d(torch.tensor(rand(1, 1, 4, 4)), 2, return_indices=True)[1]
    np.testing.assert_array_equal(indices.numpy(), ref_indices.numpy())
    compare(
        lambda x: x.avg_pool2d(3, 2, padding=1, count_include_pad=False),
        lambda x: F.avg_pool2d(x, 3, 2, padding=1, count_include_pad=False),
        rand(1, 1, 4, 4),
        device=dev,
    )
    compare(
        lambda x: x.interpolate((3, 5)),
        lambda x: F.interpolate(x, size=(3, 5), mode="bilinear"),
        rand(1, 1, 2, 3),
        device=dev,
        atol=1e-5,
    )
    compare(lambda x: x.layernorm(), lambda x: F.layer_norm(x, (4,)), rand(3, 4), device=dev, atol=1e-5)
    labels = np.array([0, 3, 1], np.int32)
    compare(
        lambda x: x.cross_entropy(Tensor(labels, device=dev), label_smoothing=0.1),
        lambda x: F.cross_entropy(x, torch.tensor(labels).long(), label_smoothing=0.1),
        rand(3, 4),
        device=dev,
        atol=1e-5,
    )
    compare(
        lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        rand(3, 4),
        rand(3, 4, seed=1),
        rand(3, 2, seed=2),
        device=dev,
        atol=1e-5,
    )


def test_reduce_feeding_two_reduces_regression():
    """Codegen regression: one fused reduce used by two different reduces must get its own loops in each."""
    for dev in ("CPU", "PYTHON"):
        a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=dev)
        w = a.sum(-1) * 2
        ref = np.arange(12).reshape(3, 4).sum(-1) * 2
        np.testing.assert_allclose((w.sum() / (w * w).sum()).numpy(), ref.sum() / (ref * ref).sum(), rtol=1e-6)
