"""Reductions and cumulative scans (docs/api.md), checked against torch and numpy.

Forward values, result dtypes and shapes, and gradients (through .sum().gradient) are compared on CPU; a subset also
runs on the PYTHON interpreter device with tiny tensors. Kernel counts of the composite ops are asserted."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Context, GlobalCounters, Tensor, dtypes
from reference import NP2FG, NP_TYPES, check_values
from fusegrad.tensor_ops import reduce as reduce_ops


def check(t, ref, dtype=None, atol=1e-6, rtol=1e-3):
    """check_values with 1e-2 for float16: a half result rounds once from float32, torch may round differently."""
    check_values(t, ref, dtype, atol, rtol, f16_tol=(1e-2, 1e-2))


def rnd(*shape, seed=0, dtype=np.float32, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def data(dtype, *shape, seed=0):
    """Random values that fit every dtype (small, with repeats so ties happen in ints and bools)."""
    rng = np.random.default_rng(seed)
    if dtype is np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.unsignedinteger):
        return rng.integers(0, 100, size=shape).astype(dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-60, 60, size=shape).astype(dtype)
    return rng.uniform(-3, 3, size=shape).astype(dtype)


def grad_check(fn, *arrays, torch_fn=None, atol=1e-4, rtol=1e-3, device="CPU"):
    """Forward of fn on fusegrad vs torch (float32 inputs), then the gradients of out.sum() w.r.t. every input."""
    fg_in = [Tensor(a, device=device) for a in arrays]
    th_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, ref = fn(*fg_in), (torch_fn or fn)(*th_in)
    check(out, ref)
    ref_grads = torch.autograd.grad(ref.sum(), th_in, allow_unused=True)
    for g, r, a in zip(out.sum().gradient(*fg_in), ref_grads, arrays):
        check(g, torch.zeros(a.shape) if r is None else r, atol=atol, rtol=rtol)


def kernels(fn, *arrays):
    """The number of kernels realizing fn on already realized inputs, and its value."""
    ins = [Tensor(a).realize() for a in arrays]
    GlobalCounters.reset()
    out = fn(*ins).realize()
    return GlobalCounters.kernel_count, out


# ---------------------------------------------------------------------------------------------------------------------
# sum / prod: accumulation and result dtypes

SUM_DTYPE_OF = {
    np.bool_: dtypes.int32,
    np.int8: dtypes.int32,
    np.uint8: dtypes.uint32,
    np.int16: dtypes.int32,
    np.uint16: dtypes.uint32,
    np.int32: dtypes.int32,
    np.uint32: dtypes.uint32,
    np.int64: dtypes.int64,
    np.uint64: dtypes.uint64,
    np.float16: dtypes.float16,
    np.float32: dtypes.float32,
    np.float64: dtypes.float64,
}


@pytest.mark.parametrize("np_dt", NP_TYPES, ids=lambda d: np.dtype(d).name)
def test_sum_every_dtype(np_dt):
    a = data(np_dt, 3, 4, 5)
    out_dt = SUM_DTYPE_OF[np_dt]
    wide = np.float64 if dtypes.is_float(out_dt) else np.int64
    for axis in (None, 1, (0, 2)):
        ref = a.astype(wide).sum(axis=axis)
        check(Tensor(a).sum(axis), np.asarray(ref), dtype=out_dt)
    check(Tensor(a).sum((0, 2), keepdim=True), a.astype(wide).sum(axis=(0, 2), keepdims=True), dtype=out_dt)


def test_sum_half_accumulates_in_float32():
    # a float16 accumulator gets stuck at 2048 (2048 + 1 rounds back), a float32 one does not
    a = np.ones(3000, np.float16)
    check(Tensor(a).sum(), np.float16(3000))
    check(Tensor(a).mean(), np.float16(1))


def test_sum_dtype_env_widens_float_accumulator():
    a = np.random.default_rng(0).standard_normal(100000).astype(np.float32) * 1000
    exact = np.float32(math.fsum(a.astype(np.float64)))
    with Context(SUM_DTYPE="float64"):
        out = Tensor(a).sum()
        assert out.dtype == dtypes.float32
        assert out.item() == exact  # a float32 accumulator is off by several ulps over 1e5 terms
    with Context(SUM_DTYPE="float16"):
        check(Tensor(a).sum(), exact, rtol=1e-4)  # only ever widens
    with Context(SUM_DTYPE="float64"):
        check(Tensor(np.array([200, 100], np.uint8)).sum(), np.uint32(300))


def test_sum_explicit_dtype():
    a = data(np.int8, 4, 50)
    check(Tensor(a).sum(1, dtype=dtypes.int8), torch.tensor(a).sum(1, dtype=torch.int8))  # wraps like torch
    check(Tensor(a).sum(dtype="float16"), torch.tensor(a).sum(dtype=torch.float16))
    check(Tensor(rnd(5, 6)).sum(0, dtype="float64"), torch.tensor(rnd(5, 6)).sum(0, dtype=torch.float64), rtol=1e-6)
    with pytest.raises(AttributeError, match="float17"):
        Tensor(a).sum(dtype="float17")


@pytest.mark.parametrize(
    "np_dt",
    [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64],
    ids=lambda d: np.dtype(d).name,
)
def test_prod_keeps_dtype(np_dt):
    a = data(np_dt, 3, 6, seed=1)
    if np_dt is not np.bool_ and not np.issubdtype(np_dt, np.floating):
        a = (a % 7).astype(np_dt)  # keep ints small
    if np_dt is np.float16:
        a = (a / 2).astype(np_dt)
    for axis in (None, 1, 0):
        with np.errstate(over="ignore"):
            ref = np.prod(a, axis=axis) if np_dt is not np.bool_ else np.all(a, axis=axis)
        check(Tensor(a).prod(axis), np.asarray(ref, dtype=np_dt), atol=1e-5)
    check(Tensor(a).prod(1, dtype="float64"), np.prod(a.astype(np.float64), axis=1), rtol=1e-6)


def test_prod_int_wraps_like_numpy():
    a = np.array([2**20, 2**15, 3], np.int32)
    with np.errstate(over="ignore"):
        check(Tensor(a).prod(), np.prod(a, dtype=np.int32))


# ---------------------------------------------------------------------------------------------------------------------
# max / min / any / all


@pytest.mark.parametrize("np_dt", NP_TYPES, ids=lambda d: np.dtype(d).name)
def test_max_min_every_dtype(np_dt):
    a = data(np_dt, 4, 5, seed=2)
    for axis in (None, -1):
        check(Tensor(a).max(axis), np.asarray(a.max(axis=axis)))
        check(Tensor(a).min(axis), np.asarray(a.min(axis=axis)))
    check(Tensor(a).max(1, keepdim=True), a.max(axis=1, keepdims=True))


@pytest.mark.parametrize("np_dt", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
def test_max_min_integer_extremes(np_dt):
    info = np.iinfo(np_dt)
    a = np.array([[info.min, 5, info.max], [0, info.min, 1]], np_dt)
    check(Tensor(a).min(1), a.min(1))
    check(Tensor(a).max(1), a.max(1))
    check(Tensor(a).min(), a.min())


def test_max_min_propagate_nan():
    a = np.array([[1.0, np.nan, 3.0], [np.nan, -np.inf, 0.0], [-1.0, 2.0, np.inf], [np.inf, 1.0, np.nan]], np.float32)
    for axis in (None, 0, 1):
        check(Tensor(a).max(axis), torch.tensor(a).amax(axis) if axis is not None else torch.tensor(a).max())
        check(Tensor(a).min(axis), torch.tensor(a).amin(axis) if axis is not None else torch.tensor(a).min())
    check(Tensor(a.astype(np.float16)).max(1), torch.tensor(a.astype(np.float16)).amax(1))


def test_max_min_gradient_splits_ties():
    a = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [5, -1, 4, 5]], np.float32)
    for axis in (None, 1, 0):
        grad_check(
            lambda t, ax=axis: t.max(ax), a, torch_fn=lambda t, ax=axis: t.amax(ax) if ax is not None else t.amax()
        )
        grad_check(
            lambda t, ax=axis: t.min(ax) * 2,
            a,
            torch_fn=lambda t, ax=axis: (t.amin(ax) if ax is not None else t.amin()) * 2,
        )


def test_max_min_gradient_random():
    grad_check(lambda t: t.max(1) * t.min(0).sum(), rnd(4, 7), torch_fn=lambda t: t.amax(1) * t.amin(0).sum())


def test_any_all():
    a = np.array([[0, 0, 1], [2, 3, 4], [0, 0, 0]], np.int32)
    for axis in (None, 0, 1):
        check(Tensor(a).any(axis), torch.tensor(a).any(axis) if axis is not None else torch.tensor(a).any())
        check(Tensor(a).all(axis), torch.tensor(a).all(axis) if axis is not None else torch.tensor(a).all())
    f = np.array([0.0, np.nan, -0.0], np.float32)
    check(Tensor(f).any(), torch.tensor(f).any())
    check(Tensor(f).all(), torch.tensor(f).all())
    check(Tensor(a.astype(bool)).all(1, keepdim=True), torch.tensor(a.astype(bool)).all(1, keepdim=True))
    empty = np.zeros((0, 3), np.float32)
    check(Tensor(empty).any(), np.bool_(False))
    check(Tensor(empty).all(0), np.ones(3, np.bool_))


def test_bfloat16_reductions_and_scans():
    """bfloat16 has no numpy type: compare against torch's bfloat16 (sums accumulate in float32 and round once)."""
    a = rnd(4, 40, seed=25)
    t, tt = Tensor(a).cast(dtypes.bfloat16), torch.tensor(a).bfloat16()
    check(t.sum(1), tt.float().sum(1).bfloat16())
    check(t.max(0), tt.amax(0))
    check(t.min(), tt.min())
    check(t.mean(1), tt.float().mean(1).bfloat16())
    check(t.argmax(1), tt.argmax(1).int())
    check(t.cumsum(1), tt.float().cumsum(1).bfloat16())
    check(t.softmax(1), tt.float().softmax(1).bfloat16())
    check(t.logsumexp(1), tt.float().logsumexp(1).bfloat16())


# ---------------------------------------------------------------------------------------------------------------------
# mean / var / std


@pytest.mark.parametrize(
    "np_dt",
    [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64],
    ids=lambda d: np.dtype(d).name,
)
def test_mean_var_std_dtypes(np_dt):
    a = data(np_dt, 3, 8, seed=3)
    out_dt = NP2FG[np.dtype(np_dt)] if np.issubdtype(np_dt, np.floating) else dtypes.float32
    wide = a.astype(np.float64)
    for axis in (None, 1):
        check(Tensor(a).mean(axis), np.asarray(wide.mean(axis=axis)), dtype=out_dt)
        check(Tensor(a).var(axis), np.asarray(wide.var(axis=axis, ddof=1)), dtype=out_dt)
        check(Tensor(a).std(axis), np.asarray(wide.std(axis=axis, ddof=1)), dtype=out_dt)


@pytest.mark.parametrize(
    "axis,keepdim,correction", [(None, False, 1), (0, False, 0), (-1, True, 2), ((0, 2), False, 1), ((1, 2), True, 0)]
)
def test_var_std_mean_against_torch(axis, keepdim, correction):
    a = rnd(3, 4, 5, seed=4)
    for fn, th_fn in ((Tensor.var_mean, torch.var_mean), (Tensor.std_mean, torch.std_mean)):
        spread, mean = fn(Tensor(a), axis, keepdim=keepdim, correction=correction)
        ref_spread, ref_mean = th_fn(torch.tensor(a), dim=axis, keepdim=keepdim, correction=correction)
        check(spread, ref_spread)
        check(mean, ref_mean)


def test_var_std_gradients():
    a = rnd(4, 6, seed=5)
    grad_check(lambda t: t.var(1), a)
    grad_check(lambda t: t.std(0, correction=0), a, torch_fn=lambda t: t.std(0, correction=0))
    grad_check(lambda t: t.std(), a)
    grad_check(lambda t: t.mean((0, 1), keepdim=True) * t, a, torch_fn=lambda t: t.mean((0, 1), keepdim=True) * t)
    grad_check(lambda t: t.std_mean(1)[0] + t.std_mean(1)[1], a, torch_fn=lambda t: sum(torch.std_mean(t, 1)))


@pytest.mark.filterwarnings("ignore:var\\(\\)|std\\(\\):UserWarning")
def test_mean_var_degenerate_counts():
    empty = np.zeros((0, 4), np.float32)
    check(Tensor(empty).mean(), torch.tensor(empty).mean())
    check(Tensor(empty).mean(0), torch.tensor(empty).mean(0))
    check(Tensor(np.zeros((0, 4), np.int32)).mean(0), np.full(4, np.nan, np.float32))
    one = rnd(1, 3)
    check(Tensor(one).var(0), torch.tensor(one).var(0))  # N - correction == 0 -> nan
    check(Tensor(one).var(0, correction=3), np.full(3, np.nan, np.float32))  # 0 / max(1 - 3, 0)
    check(Tensor(one).std(0, correction=0), torch.tensor(one).std(0, correction=0))


# ---------------------------------------------------------------------------------------------------------------------
# argmax / argmin


@pytest.mark.parametrize("np_dt", [np.bool_, np.int8, np.uint32, np.int64, np.float16], ids=lambda d: np.dtype(d).name)
def test_argmax_argmin_first_occurrence(np_dt):
    a = data(np_dt, 5, 7, seed=6)
    a = np.concatenate([a, a[:, :3]], axis=1)  # every row has repeated values
    for fn, np_fn in (("argmax", np.argmax), ("argmin", np.argmin)):
        check(getattr(Tensor(a), fn)(), np.int32(np_fn(a)))
        check(getattr(Tensor(a), fn)(0), np_fn(a, axis=0).astype(np.int32))
        check(getattr(Tensor(a), fn)(1, keepdim=True), np_fn(a, axis=1, keepdims=True).astype(np.int32))


def test_argmax_against_torch_with_nan_and_keepdim():
    a = np.array([[1, np.nan, 3, np.nan], [2, 5, 5, -np.inf], [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32)
    for fn in ("argmax", "argmin"):
        for axis, keepdim in ((None, False), (None, True), (0, False), (1, True)):
            ref = getattr(torch.tensor(a), fn)(dim=axis, keepdim=keepdim).int()
            check(getattr(Tensor(a), fn)(axis, keepdim=keepdim), ref)


def test_argmax_0d_and_errors():
    check(Tensor(3.5).argmax(), np.int32(0))
    check(Tensor(3.5).argmin(0), np.int32(0))
    with pytest.raises(IndexError, match="empty"):
        Tensor(np.zeros((0, 3), np.float32)).argmax(0)
    with pytest.raises(IndexError, match="2"):
        Tensor(rnd(2, 3)).argmax(2)
    check(Tensor(np.zeros((0, 3), np.float32)).argmax(1), np.zeros(0, np.int32))


# ---------------------------------------------------------------------------------------------------------------------
# logsumexp / softmax family / normalize


def test_logsumexp():
    a = rnd(3, 4, 5, seed=7, lo=-5, hi=5)
    for axis, keepdim in ((None, False), (1, False), ((0, 2), True), (-1, True)):
        dim = axis if axis is not None else (0, 1, 2)
        grad_check(
            lambda t, ax=axis, kd=keepdim: t.logsumexp(ax, keepdim=kd),
            a,
            torch_fn=lambda t, d=dim, kd=keepdim: t.logsumexp(d, keepdim=kd),
        )


def test_logsumexp_extremes():
    a = np.array(
        [[1000, 999, -1000], [-np.inf, -np.inf, -np.inf], [np.inf, 1, 2], [-1000, -1001, -np.inf], [np.nan, 1, 2]],
        np.float32,
    )
    check(Tensor(a).logsumexp(1), torch.tensor(a).logsumexp(1))
    check(Tensor(np.arange(6, dtype=np.int32)).logsumexp(), torch.arange(6).float().logsumexp(0))
    check(Tensor(np.zeros((2, 0), np.float32)).logsumexp(1), torch.zeros(2, 0).logsumexp(1))
    half = rnd(6, seed=1).astype(np.float16)
    check(Tensor(half).logsumexp(), torch.tensor(half).logsumexp(0))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_softmax_family(name):
    a = rnd(3, 4, 6, seed=8, lo=-4, hi=4)
    for axis in (-1, 0):
        grad_check(
            lambda t, ax=axis: getattr(t, name)(ax) * t, a, torch_fn=lambda t, ax=axis: getattr(F, name)(t, ax) * t
        )
    big = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0], [5.0, 5.0, 5.0]], np.float32)
    check(getattr(Tensor(big), name)(), getattr(F, name)(torch.tensor(big), -1))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_softmax_family_dtypes(name):
    ints = np.arange(12, dtype=np.int32).reshape(3, 4) % 5
    check(getattr(Tensor(ints), name)(), getattr(F, name)(torch.tensor(ints).float(), -1))
    a = rnd(3, 5, seed=9)
    check(getattr(Tensor(a), name)(dtype="float64"), getattr(F, name)(torch.tensor(a), -1, dtype=torch.float64))
    half = a.astype(np.float16)
    check(getattr(Tensor(half), name)(0), getattr(F, name)(torch.tensor(half).float(), 0).half())
    check(getattr(Tensor(np.float32(2.0)), name)(), getattr(F, name)(torch.tensor(2.0), 0))


@pytest.mark.parametrize("name,limit", [("softmax", 3), ("log_softmax", 3), ("logsumexp", 2)])
def test_softmax_family_kernel_counts(name, limit):
    a = rnd(16, 32, seed=10)
    fn = (lambda t: t.logsumexp(-1)) if name == "logsumexp" else (lambda t: getattr(t, name)(-1))
    count, out = kernels(fn, a)
    assert count <= limit, f"{name} took {count} kernels"
    ref = torch.tensor(a).logsumexp(-1) if name == "logsumexp" else getattr(F, name)(torch.tensor(a), -1)
    check(out, ref)


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 0), (3.0, -1), (math.inf, 1), (-math.inf, 1), (0, 1), (0.5, 1)])
def test_normalize(p, dim):
    a = rnd(4, 5, seed=11)

    def grad_fn(t):
        return t.normalize(p, dim) * t

    def th_fn(t):
        return F.normalize(t, p, dim) * t

    if p == 0:  # the norm is a count: no gradient through it
        check(Tensor(a).normalize(p, dim), F.normalize(torch.tensor(a), p, dim))
    else:
        grad_check(grad_fn, a, torch_fn=th_fn)


def test_normalize_zero_vector_and_ints():
    z = np.zeros((2, 3), np.float32)
    grad_check(lambda t: t.normalize() * 3, z, torch_fn=lambda t: F.normalize(t) * 3)
    ints = np.array([[3, 4], [0, 0]], np.int32)
    check(Tensor(ints).normalize(dim=1), F.normalize(torch.tensor(ints).float(), dim=1))
    check(Tensor(rnd(3, 4)).normalize(eps=10.0), F.normalize(torch.tensor(rnd(3, 4)), eps=10.0))


# ---------------------------------------------------------------------------------------------------------------------
# shapes: 0-d, 0-size, broadcast, non-contiguous and negative-step views

REDUCTIONS = [
    ("sum", lambda t, ax: t.sum(ax)),
    ("prod", lambda t, ax: t.prod(ax)),
    ("max", lambda t, ax: t.amax(ax)),
    ("min", lambda t, ax: t.amin(ax)),
    ("mean", lambda t, ax: t.mean(ax)),
    ("var", lambda t, ax: t.var(ax)),
    ("std", lambda t, ax: t.std(ax)),
    ("logsumexp", lambda t, ax: t.logsumexp(ax)),
]

VIEWS = {
    "permuted": (lambda t: t.permute(2, 0, 1), lambda t: t.permute(2, 0, 1)),
    "sliced": (lambda t: t[1:, ::2], lambda t: t[1:, ::2]),
    "negative_step": (lambda t: t[::-1, :, ::-2], lambda t: t.flip(0, 2)[:, :, ::2]),
    "broadcast": (lambda t: t[:, :1].expand(3, 4, 5), lambda t: t[:, :1].expand(3, 4, 5)),
}


@pytest.mark.parametrize("i", range(len(REDUCTIONS)), ids=[r[0] for r in REDUCTIONS])
def test_reductions_of_views(i):
    """Each reduction on two of the views (every view is met by several reductions), forward and gradient."""
    name, th_fn = REDUCTIONS[i]
    a = rnd(3, 4, 5, seed=12, lo=0.5, hi=1.5)
    fg_fn = {"max": lambda t, ax: t.max(ax), "min": lambda t, ax: t.min(ax)}.get(
        name, lambda t, ax: getattr(t, name)(ax)
    )
    for view in (list(VIEWS)[i % 4], list(VIEWS)[(i + 1) % 4]):
        fg_view, th_view = VIEWS[view]
        grad_check(lambda t, v=fg_view: fg_fn(v(t), 1), a, torch_fn=lambda t, v=th_view: th_fn(v(t), 1))


@pytest.mark.filterwarnings("ignore:var\\(\\)|std\\(\\):UserWarning")
@pytest.mark.parametrize("name,th_fn", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reductions_of_scalar_and_empty(name, th_fn):
    fg_fn = {"max": lambda t, ax: t.max(ax), "min": lambda t, ax: t.min(ax)}.get(
        name, lambda t, ax: getattr(t, name)(ax)
    )
    s = np.float32(1.25)
    check(fg_fn(Tensor(s), None), th_fn(torch.tensor(s), 0))
    check(fg_fn(Tensor(s), 0), th_fn(torch.tensor(s), 0))
    empty = np.zeros((2, 0, 3), np.float32)
    if name not in ("max", "min"):
        check(fg_fn(Tensor(empty), 1), th_fn(torch.tensor(empty), 1))
    check(fg_fn(Tensor(empty), 2), th_fn(torch.tensor(empty), 2))


def test_reduction_bad_axes():
    t = Tensor(rnd(2, 3))
    with pytest.raises(IndexError, match="3"):
        t.sum(3)
    with pytest.raises(IndexError, match="-3"):
        t.max(-3)
    with pytest.raises(IndexError):
        t.softmax(2)
    with pytest.raises(RuntimeError, match="repeats"):
        t.mean((0, 0))
    with pytest.raises(RuntimeError, match="repeats"):
        t.var((1, -1))
    with pytest.raises(TypeError):
        t.sum(1.0)


# ---------------------------------------------------------------------------------------------------------------------
# cumulative scans


def cummax_first(a, axis):
    """Reference: running max along axis and the first position holding it (NaN: the first NaN)."""
    a = np.moveaxis(a, axis, -1)
    vals, idx = np.empty_like(a), np.zeros(a.shape, np.int32)
    for r in np.ndindex(a.shape[:-1]):
        best, at = None, 0
        for i, v in enumerate(a[r]):
            if best is None or (not np.isnan(best) and (np.isnan(v) or v > best)):
                best, at = v, i
            vals[r + (i,)], idx[r + (i,)] = best, at
    return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


CUMSUM_DTYPE = {
    np.bool_: np.int32,
    np.int8: np.int32,
    np.uint8: np.uint32,
    np.int16: np.int32,
    np.uint16: np.uint32,
    np.int32: np.int32,
    np.uint32: np.uint32,
    np.int64: np.int64,
    np.float16: np.float16,
    np.float32: np.float32,
    np.float64: np.float64,
}


@pytest.mark.parametrize("np_dt", list(CUMSUM_DTYPE), ids=lambda d: np.dtype(d).name)
def test_cumsum_dtypes(np_dt):
    a = data(np_dt, 3, 9, seed=13)
    for axis in (0, -1):
        ref = np.cumsum(a.astype(np.float64 if np.issubdtype(np_dt, np.floating) else np.int64), axis=axis)
        check(Tensor(a).cumsum(axis), ref.astype(CUMSUM_DTYPE[np_dt]))


@pytest.mark.parametrize(
    "np_dt", [np.int8, np.int32, np.uint8, np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name
)
def test_cumprod_keeps_dtype(np_dt):
    a = data(np_dt, 3, 7, seed=14)
    a = (a % 4).astype(np_dt) if not np.issubdtype(np_dt, np.floating) else (a / 2).astype(np_dt)
    for axis in (0, 1):
        with np.errstate(over="ignore"):
            ref = np.cumprod(a, axis=axis, dtype=np_dt)
        check(Tensor(a).cumprod(axis), ref, atol=1e-5)


@pytest.mark.parametrize("n", [1, 9, 300])
def test_scans_long_axes(n):
    """Beyond SCAN_BLOCK the scan runs blocked (two levels at 300) and must still be exact."""
    a = rnd(2, n, seed=15)
    t = torch.tensor(a, dtype=torch.float64)
    check(Tensor(a).cumsum(1), t.cumsum(1).float(), atol=1e-5)
    check(Tensor(a).logcumsumexp(1), t.logcumsumexp(1).float(), atol=1e-5)
    p = rnd(2, n, seed=16, lo=0.9, hi=1.1)
    check(Tensor(p).cumprod(1), torch.tensor(p, dtype=torch.float64).cumprod(1).float(), atol=1e-6)
    for sign, fn in ((1, Tensor.cummax), (-1, Tensor.cummin)):
        values, index = fn(Tensor(a), 1)
        ref_values, ref_index = cummax_first(sign * a, 1)
        check(values, sign * ref_values)
        check(index, ref_index)


def test_scans_three_levels_without_n_squared_memory():
    n = 70000
    a = rnd(n, seed=17)
    big = Tensor(a).realize()
    GlobalCounters.reset()
    out = big.cumsum(0).realize()
    # the triangular windows stay views fused into reduces: no n*n (or n*SCAN_BLOCK) buffer is ever written
    assert GlobalCounters.global_mem < n * 4 * 16, f"cumsum moved {GlobalCounters.global_mem} bytes"
    check(out, torch.tensor(a, dtype=torch.float64).cumsum(0).float(), atol=3e-3)
    ints = data(np.int16, n, seed=18) % 50
    values, index = Tensor(ints).cummax(0)
    ref_values, ref_index = cummax_first(ints, 0)
    check(values, ref_values)
    check(index, ref_index)


@pytest.mark.parametrize("n", [5, 300])
def test_scan_gradients(n):
    a = rnd(3, n, seed=19)
    grad_check(lambda t: t.cumsum(1) * t, a)
    grad_check(lambda t: t.logcumsumexp(1) * t, a)
    grad_check(lambda t: t.cummax(1)[0] * t, a, torch_fn=lambda t: t.cummax(1)[0] * t)
    p = rnd(3, n, seed=20, lo=0.9, hi=1.1)
    grad_check(lambda t: t.cumprod(1), p)


def test_cumprod_gradient_with_zeros():
    a = np.array([[2.0, 0.0, 3.0, 0.0, 4.0], [1.0, 2.0, 0.0, 5.0, 1.5]], np.float32)
    grad_check(lambda t: t.cumprod(1), a)
    grad_check(lambda t: t.cumprod(0) * 3, a)


def test_cummax_cummin_ties_and_nan():
    a = np.array([3, 1, 3, 2, 5], np.float32)
    values, index = Tensor(a).cummax(0)
    check(values, np.array([3, 3, 3, 3, 5], np.float32))
    check(index, np.array([0, 0, 0, 0, 4], np.int32))  # the first position holding the running max (torch: last)
    values, index = Tensor(a).cummin(0)
    check(values, np.array([3, 1, 1, 1, 1], np.float32))
    check(index, np.array([0, 1, 1, 1, 1], np.int32))
    b = np.array([[3, np.nan, 4, np.nan, 5], [-np.inf, -np.inf, 0, np.inf, np.inf]], np.float32)
    for axis in (1, 0):
        for sign in (1, -1):
            values, index = Tensor(b).cummax(axis) if sign == 1 else Tensor(b).cummin(axis)
            ref_values, ref_index = cummax_first(sign * b, axis)
            check(values, sign * ref_values)
            check(index, ref_index)


@pytest.mark.parametrize(
    "np_dt,axis", [(np.bool_, 0), (np.int8, 1), (np.uint8, 0), (np.uint32, 1), (np.int64, 0), (np.float16, 1)]
)
def test_cummax_cummin_dtypes(np_dt, axis):
    a = data(np_dt, 4, 6, seed=21)
    values, index = Tensor(a).cummax(axis)
    ref_values, ref_index = cummax_first(a, axis)
    check(values, ref_values)
    check(index, ref_index)
    values, index = Tensor(a).cummin(axis)
    flipped = ~a if not np.issubdtype(np_dt, np.floating) else -a
    ref_values, ref_index = cummax_first(flipped, axis)
    check(values, ~ref_values if not np.issubdtype(np_dt, np.floating) else -ref_values)
    check(index, ref_index)


def test_logcumsumexp_extremes_and_ints():
    a = np.array(
        [[-1000, 0, 1000, -np.inf, 3], [-np.inf, -np.inf, 0, np.inf, 1], [5, -1000, -1000, 1000, -1000]], np.float32
    )
    for axis in (0, 1):
        check(Tensor(a).logcumsumexp(axis), torch.tensor(a).logcumsumexp(axis))
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    check(Tensor(ints).logcumsumexp(1), torch.tensor(ints).float().logcumsumexp(1))


SCANS = [
    ("cumsum", lambda t, ax: t.cumsum(ax), lambda t, ax: t.cumsum(ax)),
    ("cumprod", lambda t, ax: t.cumprod(ax), lambda t, ax: t.cumprod(ax)),
    ("cummax", lambda t, ax: t.cummax(ax)[0], lambda t, ax: t.cummax(ax)[0]),
    ("cummin", lambda t, ax: t.cummin(ax)[0], lambda t, ax: t.cummin(ax)[0]),
    ("logcumsumexp", lambda t, ax: t.logcumsumexp(ax), lambda t, ax: t.logcumsumexp(ax)),
]


@pytest.mark.parametrize("i", range(len(SCANS)), ids=[s[0] for s in SCANS])
def test_scans_of_views(i):
    """Each scan on two of the views (every view is met by several scans), forward and gradient."""
    _, fg_fn, th_fn = SCANS[i]
    a = rnd(3, 4, 5, seed=22, lo=0.5, hi=1.5)
    for view in (list(VIEWS)[i % 4], list(VIEWS)[(i + 1) % 4]):
        fg_view, th_view = VIEWS[view]
        grad_check(lambda t, v=fg_view: fg_fn(v(t), 1) * 1.5, a, torch_fn=lambda t, v=th_view: th_fn(v(t), 1) * 1.5)


@pytest.mark.parametrize("name,fg_fn,th_fn", SCANS, ids=[s[0] for s in SCANS])
def test_scans_of_scalar_and_empty(name, fg_fn, th_fn):
    check(fg_fn(Tensor(np.float32(2.5)), 0), th_fn(torch.tensor(2.5), 0))
    check(fg_fn(Tensor(np.float32(2.5)), -1), th_fn(torch.tensor(2.5), -1))
    empty = np.zeros((2, 0, 3), np.float32)
    check(fg_fn(Tensor(empty), 1), th_fn(torch.tensor(empty), 1))
    check(fg_fn(Tensor(empty), 2), th_fn(torch.tensor(empty), 2))


def test_scan_0d_indices_and_bad_axes():
    values, index = Tensor(7).cummax(0)
    check(values, np.int32(7))
    check(index, np.int32(0))
    check(Tensor(True).cumsum(), np.int32(1))
    with pytest.raises(IndexError, match="1"):
        Tensor(2.0).cumsum(1)
    with pytest.raises(IndexError, match="2"):
        Tensor(rnd(2, 3)).cumsum(2)
    with pytest.raises(IndexError, match="-3"):
        Tensor(rnd(2, 3)).cummax(-3)
    with pytest.raises(IndexError):
        Tensor(rnd(2, 3)).logcumsumexp(5)
    with pytest.raises(TypeError):
        Tensor(rnd(2, 3)).cumprod()  # the axis is required


def test_scan_block_size_is_what_the_blocked_tests_cross():
    assert 9 < reduce_ops.SCAN_BLOCK < 300 < reduce_ops.SCAN_BLOCK**2 < 70000


# ---------------------------------------------------------------------------------------------------------------------
# the PYTHON interpreter device (tiny tensors)


def test_python_device_subset():
    a = rnd(3, 4, seed=23)
    d = "PYTHON"
    for fn in (
        lambda t: t.sum(1),
        lambda t: t.mean(1),
        lambda t: t.var(0),
        lambda t: t.logsumexp(1),
        lambda t: t.softmax(1) * t,
        lambda t: t.log_softmax(0) * t,
        lambda t: t.cumsum(1) * t,
        lambda t: t.logcumsumexp(0),
    ):
        grad_check(fn, a, device=d)
    grad_check(lambda t: t.max(0), a, torch_fn=lambda t: t.amax(0), device=d)
    grad_check(lambda t: t.min(), a, torch_fn=lambda t: t.amin(), device=d)
    ints = data(np.int8, 3, 5, seed=24)
    check(Tensor(ints, device=d).sum(1), ints.sum(1, dtype=np.int32))
    check(Tensor(ints, device=d).argmax(1), ints.argmax(1).astype(np.int32))
    check(Tensor(ints, device=d).argmin(), np.int32(ints.argmin()))
    values, index = Tensor(ints, device=d).cummax(1)
    ref_values, ref_index = cummax_first(ints, 1)
    check(values, ref_values)
    check(index, ref_index)
    nan = np.array([1, np.nan, 2], np.float32)
    check(Tensor(nan, device=d).max(), np.float32(np.nan))
    check(Tensor(nan, device=d).argmax(), np.int32(1))
