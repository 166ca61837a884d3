"""Reductions, arg-reductions, softmax family, matmul-like ops and scans."""

from __future__ import annotations

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.registry import T, axis_of, fold, ints, op


def _axes(n, x, axes_in) -> list[int] | None:
    """The reduced axes: an input (newer opsets) or the attribute; None means all (or none, see noop)."""
    axes = ints(axes_in) if axes_in is not None else n.a("axes")
    if axes is None or len(axes) == 0:
        return None
    return sorted({axis_of(a, x.ndim, n) for a in axes})


def _reduce(fn, pre=None, post=None):
    def run(n, x, axes_in=None):
        x = T(x)
        axes = _axes(n, x, axes_in)
        keep = bool(n.a("keepdims", 1))
        if axes is None:
            if n.a("noop_with_empty_axes", 0):
                return x if pre is None else pre(x)
            axes = list(range(x.ndim))
        y = pre(x) if pre is not None else x
        if not axes:
            r = y
        elif any(x.shape[a] == 0 for a in axes):
            r = _empty_reduce(fn, y, axes, keep)
        else:
            r = fn(y, tuple(axes), keep)
        return (post(r) if post is not None else r).cast(x.dtype)

    return run


_EMPTY = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}


def _empty_reduce(fn, y, axes, keep):
    shape = (
        [1 if i in axes else s for i, s in enumerate(y.shape)]
        if keep
        else [s for i, s in enumerate(y.shape) if i not in axes]
    )
    kind = getattr(fn, "kind", "sum")
    val = _EMPTY[kind]
    if y.dtype == dtypes.bool:
        val = kind in ("min", "prod")
    elif dtypes.is_int(y.dtype) and not np.isfinite(val):
        val = y.dtype.max if kind == "min" else y.dtype.min
    return Tensor.full(tuple(shape), val, dtype=y.dtype)


def _k(kind, fn):
    fn.kind = kind
    return fn


_sum = _k("sum", lambda y, a, k: y.sum(a, keepdim=k, dtype=y.dtype if not dtypes.is_float(y.dtype) else None))
_prod = _k("prod", lambda y, a, k: y.prod(a, keepdim=k))
_max = _k("max", lambda y, a, k: y.max(a, keepdim=k))
_min = _k("min", lambda y, a, k: y.min(a, keepdim=k))
_mean = _k("sum", lambda y, a, k: y.mean(a, keepdim=k))

op("ReduceSum")(_reduce(_sum))
op("ReduceMean")(_reduce(_mean))
op("ReduceMax")(_reduce(_max))
op("ReduceMin")(_reduce(_min))
op("ReduceProd")(_reduce(_prod))
op("ReduceL1")(_reduce(_sum, pre=Tensor.abs))
op("ReduceL2")(_reduce(_sum, pre=lambda x: x.float() * x.float(), post=Tensor.sqrt))
op("ReduceSumSquare")(_reduce(_sum, pre=lambda x: x * x))
op("ReduceLogSum")(_reduce(_sum, post=Tensor.log))


@op("ReduceLogSumExp")
def reduce_log_sum_exp(n, x, axes_in=None):
    x = T(x)
    axes = _axes(n, x, axes_in)
    keep = bool(n.a("keepdims", 1))
    if axes is None:
        if n.a("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.ndim))
    if any(x.shape[a] == 0 for a in axes):
        return _empty_reduce(_max, x, axes, keep)
    xf = x.float() if x.dtype != dtypes.float64 else x
    m = xf.max(tuple(axes), keepdim=True)
    m = m.isinf().where(0, m)
    r = (xf - m).exp().sum(tuple(axes), keepdim=True).log() + m
    if not keep:
        r = r.reshape([s for i, s in enumerate(r.shape) if i not in axes])
    return r.cast(x.dtype)


@fold("ReduceProd")
def reduce_prod_fold(n, x, axes_in=None):
    axes = (
        None
        if axes_in is None and n.a("axes") is None
        else tuple(ints(axes_in) if axes_in is not None else n.a("axes"))
    )
    return np.prod(x, axis=axes or None, keepdims=bool(n.a("keepdims", 1))).astype(x.dtype)


def _arg(fn):
    def run(n, x):
        x = T(x)
        axis, keep = axis_of(n.a("axis", 0), x.ndim, n), bool(n.a("keepdims", 1))
        if n.a("select_last_index", 0):
            idx = x.shape[axis] - 1 - fn(x.flip(axis), axis, keep).cast(dtypes.int64)
        else:
            idx = fn(x, axis, keep).cast(dtypes.int64)
        return idx

    return run


op("ArgMax")(_arg(lambda x, a, k: x.argmax(a, keepdim=k)))
op("ArgMin")(_arg(lambda x, a, k: x.argmin(a, keepdim=k)))


def _softmax(kind):
    def run(n, x):
        x = T(x)
        axis = n.a("axis", 1 if n.opset < 13 else -1)
        axis = axis_of(axis, x.ndim, n)
        if n.opset < 13:  # the input is seen as 2-D: [prod(dims before axis), prod(dims from axis)]
            shape = x.shape
            x2 = x.reshape(int(np.prod(shape[:axis], dtype=np.int64)), -1)
            return _softmax_axis(kind, x2, 1).reshape(shape)
        return _softmax_axis(kind, x, axis)

    return run


def _softmax_axis(kind, x, axis):
    if kind == "softmax":
        return x.softmax(axis)
    if kind == "log":
        return x.log_softmax(axis)
    idx = x.argmax(axis, keepdim=True)
    return (Tensor.arange(x.shape[axis]).reshape([-1 if i == axis else 1 for i in range(x.ndim)]) == idx).cast(x.dtype)


op("Softmax")(_softmax("softmax"))
op("LogSoftmax")(_softmax("log"))
op("Hardmax")(_softmax("hard"))


@op("MatMul")
def matmul(n, a, b):
    return T(a).matmul(T(b))


@op("MatMulInteger")
def matmul_integer(n, a, b, a_zero=None, b_zero=None):
    a, b = T(a).cast(dtypes.int32), T(b).cast(dtypes.int32)
    if a_zero is not None:
        z = T(a_zero).cast(dtypes.int32)
        a = a - (z.reshape(-1, 1) if z.ndim == 1 and z.shape[0] > 1 else z)
    if b_zero is not None:
        b = b - T(b_zero).cast(dtypes.int32)
    return a.matmul(b, dtype=dtypes.int32)


@op("Gemm")
def gemm(n, a, b, c=None):
    a, b = T(a), T(b)
    if n.a("transA", 0):
        a = a.T
    if n.a("transB", 0):
        b = b.T
    y = a.matmul(b)
    alpha, beta = n.a("alpha", 1.0), n.a("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0:
        c = T(c)
        y = y + (c * beta if beta != 1.0 else c)
    return y


@op("Einsum")
def einsum(n, *xs):
    return Tensor.einsum(n.a("equation").replace(" ", ""), *[T(x) for x in xs])


def _scan(kind):
    def run(n, x, axis):
        x = T(x)
        ax = axis_of(ints(axis)[0], x.ndim, n)
        if n.a("reverse", 0):
            x = x.flip(ax)
        if n.a("exclusive", 0):  # shift by one along the axis, the identity element entering first
            pad = [(0, 0)] * x.ndim
            pad[ax] = (1, 0)
            x = x.pad(tuple(pad), value=0 if kind == "sum" else 1)[
                tuple(slice(0, x.shape[ax]) if i == ax else slice(None) for i in range(x.ndim))
            ]
        y = (x.cumsum(ax) if kind == "sum" else x.cumprod(ax)).cast(x.dtype)
        return y.flip(ax) if n.a("reverse", 0) else y

    return run


op("CumSum")(_scan("sum"))
op("CumProd")(_scan("prod"))


@op("Det")
def det(n, x):
    """Determinant by Gaussian elimination with partial pivoting, unrolled over the (small) matrix size."""
    a = T(x)
    acc = dtypes.float64 if a.dtype == dtypes.float64 else dtypes.float32
    a = a.cast(acc)
    m = a.shape[-1]
    out = Tensor.ones(*a.shape[:-2], dtype=acc)
    for k in range(m):
        rows = a[..., k:, :]
        p = rows[..., k].abs().argmax(-1)
        pick = (Tensor.arange(m - k) == p.unsqueeze(-1)).cast(acc).unsqueeze(-1)
        pivot_row = (pick * rows).sum(-2)
        swapped = rows + pick * (rows[..., 0:1, :] - rows)  # the old first row moves to the pivot's place
        piv = pivot_row[..., k]
        out = out * piv * (p == 0).where(1.0, -1.0)
        safe = (piv == 0).where(1.0, piv)
        below = swapped[..., 1:, :]
        below = below - (below[..., :, k] / safe.unsqueeze(-1)).unsqueeze(-1) * pivot_row.unsqueeze(-2)
        a = a[..., :k, :].cat(pivot_row.unsqueeze(-2), below, dim=-2)
    return out.cast(T(x).dtype)
