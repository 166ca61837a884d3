"""Gather/Scatter (and their Elements/ND variants), TopK, NonZero, Unique, OneHot, Compress, ReverseSequence."""

from __future__ import annotations

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.registry import C, T, axis_of, dtype_of, fold, ints, np_to_tensor, op


def _wrap(idx, size):
    """Negative indices counted from the end, as ONNX allows."""
    if isinstance(idx, np.ndarray):
        return np.where(idx < 0, idx + size, idx).astype(np.int64)
    idx = T(idx)
    return (idx < 0).where(idx + size, idx)


@op("Gather")
def gather(n, x, idx):
    axis = axis_of(n.a("axis", 0), x.ndim, n)
    pre = (slice(None),) * axis
    if isinstance(idx, np.ndarray):
        i = _wrap(idx, x.shape[axis])
        if i.ndim == 0:
            return T(x)[pre + (int(i),)]
        if i.ndim == 1 and i.size and np.all(np.diff(i) == 1):  # a contiguous run is a slice
            return T(x)[pre + (slice(int(i[0]), int(i[-1]) + 1),)]
        if i.size == 0:
            return Tensor.empty(*x.shape[:axis], *i.shape, *x.shape[axis + 1 :], dtype=T(x).dtype)
        return T(x)[pre + (Tensor(i.astype(np.int32)),)]
    return T(x)[pre + (_wrap(idx, x.shape[axis]).cast(dtypes.int32),)]


@fold("Gather")
def gather_fold(n, x, idx):
    axis = axis_of(n.a("axis", 0), x.ndim, n)
    return np.take(x, _wrap(idx, x.shape[axis]), axis=axis)


@op("GatherElements")
def gather_elements(n, x, idx):
    x = T(x)
    axis = axis_of(n.a("axis", 0), x.ndim, n)
    return x.gather(axis, T(_wrap(idx, x.shape[axis])).cast(dtypes.int32))


def _linear_index(idx: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Row-major offset of the last-axis coordinates in `idx` into a block of shape `dims` (negatives wrapped)."""
    strides = np.cumprod((1,) + tuple(dims[::-1]))[:-1][::-1]
    out = None
    for k, (d, s) in enumerate(zip(dims, strides)):
        term = _wrap(idx[..., k], d) * int(s)
        out = term if out is None else out + term
    return out


@op("GatherND")
def gather_nd(n, x, idx):
    x, idx = T(x), T(idx).cast(dtypes.int64)
    b = n.a("batch_dims", 0)
    k = idx.shape[-1]
    batch, inner, rest = x.shape[:b], x.shape[b : b + k], x.shape[b + k :]
    nb = int(np.prod(batch, dtype=np.int64))
    flat = x.reshape(nb, int(np.prod(inner, dtype=np.int64)), *rest)
    lin = _linear_index(idx, inner).reshape(nb, -1).cast(dtypes.int32)
    m = lin.shape[1]
    bidx = Tensor.arange(nb).reshape(nb, 1).expand(nb, m)
    out = flat[bidx, lin]
    return out.reshape(*idx.shape[:-1], *rest)


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@op("ScatterElements", "Scatter")
def scatter_elements(n, x, idx, upd):
    x, upd = T(x), T(upd)
    axis = axis_of(n.a("axis", 0), x.ndim, n)
    idx = T(_wrap(idx, x.shape[axis])).cast(dtypes.int32)
    red = n.a("reduction", "none")
    if red == "none":
        return x.scatter(axis, idx, upd)
    return x.scatter_reduce(axis, idx, upd, _REDUCE[red], include_self=True)


@op("ScatterND")
def scatter_nd(n, x, idx, upd):
    x, idx, upd = T(x), T(idx).cast(dtypes.int64), T(upd)
    k = idx.shape[-1]
    inner, rest = x.shape[:k], x.shape[k:]
    flat = x.reshape(int(np.prod(inner, dtype=np.int64)), *rest)
    lin = _linear_index(idx, inner).reshape(-1)
    m = lin.shape[0]
    u = upd.reshape(m, *rest)
    index = lin.cast(dtypes.int32).reshape(m, *([1] * len(rest))).expand(m, *rest)
    red = n.a("reduction", "none")
    out = flat.scatter(0, index, u) if red == "none" else flat.scatter_reduce(0, index, u, _REDUCE[red])
    return out.reshape(x.shape)


@op("TopK")
def topk(n, x, k=None):
    x = T(x)
    k = ints(k)[0] if k is not None else n.a("k")
    axis = axis_of(n.a("axis", -1), x.ndim, n)
    largest = bool(n.a("largest", 1))
    v, i = x.topk(k, dim=axis, largest=largest)
    return v, i.cast(dtypes.int64)


@op("NonZero")
def nonzero(n, x):
    x = T(x)
    if x.ndim == 0:
        return np.zeros((0, int(bool(C(x)))), dtype=np.int64)
    return x.nonzero().cast(dtypes.int64).T


@op("Unique")
def unique(n, x):
    """The output length depends on the values, so X is read on the host and the four outputs built there."""
    dtype = dtype_of(x)
    data = C(x)
    axis = n.a("axis")
    if axis is None:
        data = data.reshape(-1)
    else:
        axis = axis_of(axis, data.ndim, n)
    y, first, inverse, counts = np.unique(data, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not n.a("sorted", 1):  # order of first occurrence: permute the sorted result by where each value first shows
        order = np.argsort(first, kind="stable")
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts = first[order], counts[order]
        inverse = np.argsort(order)[inverse]
    y = np_to_tensor(np.ascontiguousarray(y)).cast(dtype)
    return y, *(np_to_tensor(v.astype(np.int64)) for v in (first, inverse, counts))


@op("OneHot")
def one_hot(n, idx, depth, values):
    d = int(C(depth).reshape(-1)[0])
    idx, values = T(idx), T(values)
    axis = n.a("axis", -1)
    rank = idx.ndim + 1
    axis = axis_of(axis, rank, n)
    idx = (idx < 0).where(idx + d, idx)
    ar = Tensor.arange(d).reshape([d if i == axis else 1 for i in range(rank)])
    hit = idx.unsqueeze(axis).cast(dtypes.int64) == ar.cast(dtypes.int64)
    return hit.where(values[1], values[0]).cast(values.dtype)


@op("Compress")
def compress(n, x, cond):
    keep = np.nonzero(C(cond).astype(bool))[0]
    x = T(x)
    axis = n.a("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = axis_of(axis, x.ndim, n)
    keep = keep[keep < x.shape[axis]]
    if keep.size == 0:
        return Tensor.empty(*x.shape[:axis], 0, *x.shape[axis + 1 :], dtype=x.dtype)
    return x[(slice(None),) * axis + (Tensor(keep.astype(np.int32)),)]


@op("ReverseSequence")
def reverse_sequence(n, x, lens):
    x = T(x)
    b_ax, t_ax = n.a("batch_axis", 1), n.a("time_axis", 0)
    T_, B = x.shape[t_ax], x.shape[b_ax]
    lens = T(lens).cast(dtypes.int32)
    t = Tensor.arange(T_).reshape(T_, 1)
    src = (t < lens.reshape(1, B)).where(lens.reshape(1, B) - 1 - t, t)  # (T, B) source time index
    shape = [1] * x.ndim
    shape[t_ax], shape[b_ax] = T_, B
    if t_ax > b_ax:
        src = src.T
    index = src.reshape([T_ if i == t_ax else B if i == b_ax else 1 for i in range(x.ndim)]).expand(x.shape)
    return x.gather(t_ax, index)


@op("TensorScatter")
def tensor_scatter(n, past, update, write=None):
    past, update = T(past), T(update)
    axis = axis_of(n.a("axis", -2), past.ndim, n)
    B, size, length = past.shape[0], past.shape[axis], update.shape[axis]
    w = T(write).cast(dtypes.int32).reshape(B, 1) if write is not None else Tensor.zeros(B, 1, dtype=dtypes.int32)
    # invert the write: cache slot s holds update row s - w[b] (mod the cache length when circular), if in range
    u = Tensor.arange(size, dtype=dtypes.int32).reshape(1, size) - w
    if n.a("mode", "linear") == "circular":
        u = u.mod(size)
    hit = (u >= 0) & (u < length)
    shape = [B if i == 0 else size if i == axis else 1 for i in range(past.ndim)]
    u, hit = u.clip(0, length - 1).reshape(shape).expand(past.shape), hit.reshape(shape)
    return hit.where(update.gather(axis, u), past)
