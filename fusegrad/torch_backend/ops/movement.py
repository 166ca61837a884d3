"""Movement and indexing ops that are not views."""

from __future__ import annotations

from typing import Any


from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor


from .table import OpCall, aten, meta_dtype, register


@register(aten.cat.default)
def _cat(call: OpCall, tensors: list, dim: int = 0) -> Tensor:
    dt = meta_dtype(call.out)
    parts = [t.cast(dt) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return Tensor.zeros(tuple(call.out.shape), dtype=dt, device=call.device)
    return parts[0].cat(*parts[1:], dim=dim) if len(parts) > 1 else parts[0]


@register(aten.constant_pad_nd.default)
def _pad(call: OpCall, x: Tensor, pad: list, value: Any = 0) -> Tensor:
    return x.pad(tuple(pad), value=value)


@register(aten.flip.default)
def _flip(call: OpCall, x: Tensor, dims: list) -> Tensor:
    return x.flip(tuple(dims)) if dims and x.ndim else x


@register(aten.gather.default)
def _gather(call: OpCall, x: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    return x.gather(dim, index) if x.ndim else x.reshape(1).gather(0, index.reshape(-1)).reshape(index.shape)


@register(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(call: OpCall, x: Tensor, indices: list) -> Tensor:
    if any(i is not None and i.dtype == dtypes.bool for i in indices):
        raise NotImplementedError("fuse: aten.index with a boolean mask has a data-dependent shape")
    key = tuple(slice(None) if i is None else i for i in indices)
    return x[key]


@register(aten.index_select.default)
def _index_select(call: OpCall, x: Tensor, dim: int, index: Tensor) -> Tensor:
    if x.ndim == 0:
        return x.reshape(1)[index.reshape(-1)].reshape(tuple(call.out.shape))
    key = tuple(slice(None) for _ in range(dim % x.ndim)) + (index,)
    return x[key]


@register(aten.index_put.default)
def _index_put(call: OpCall, x: Tensor, indices: list, values: Tensor, accumulate: bool = False) -> Tensor:
    if len(indices) != 1 or indices[0] is None or indices[0].dtype == dtypes.bool:
        raise NotImplementedError("fuse: aten.index_put supports one integer index tensor on the first dim")
    idx, n = indices[0].reshape(-1), x.shape[0]
    rest = tuple(x.shape[1:])
    vals = values.cast(x.dtype).reshape((1,) * (len(indices[0].shape) + len(rest) - values.ndim) + values.shape)
    vals = vals.expand(tuple(indices[0].shape) + rest).reshape((idx.shape[0],) + rest)
    idx = (idx < 0).where(idx + n, idx)
    hot = idx.unsqueeze(1) == Tensor.arange(n, dtype=idx.dtype).to(x.device).unsqueeze(0)
    flat = vals.reshape(idx.shape[0], -1)
    if accumulate:
        added = hot.cast(x.dtype).T.matmul(flat).reshape((n,) + rest)
        return x + added
    # last write wins, as torch's CPU kernel does for duplicates
    last = hot.where(Tensor.arange(idx.shape[0]).to(x.device).unsqueeze(1), -1).max(0)
    picked = flat[last.maximum(0)].reshape((n,) + rest)
    written = (last >= 0).reshape((n,) + (1,) * len(rest))
    return written.where(picked, x)


@register(aten.scatter.src, aten.scatter.value)
def _scatter(call: OpCall, x: Tensor, dim: int, index: Tensor, src: Any) -> Tensor:
    return x.scatter(dim, index, src)


@register(aten.scatter_add.default)
def _scatter_add(call: OpCall, x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return x.scatter_reduce(dim, index, src, "sum")


@register(aten.tril.default)
def _tril(call: OpCall, x: Tensor, diagonal: int = 0) -> Tensor:
    return x.tril(diagonal)


@register(aten.triu.default)
def _triu(call: OpCall, x: Tensor, diagonal: int = 0) -> Tensor:
    return x.triu(diagonal)


@register(aten.sort.default)
def _sort(call: OpCall, x: Tensor, dim: int = -1, descending: bool = False) -> tuple:
    if x.ndim == 0:
        return x, Tensor.zeros((), dtype="int64", device=x.device)
    values, indices = x.sort(dim, descending)
    return values, indices.cast("int64")


@register(aten.topk.default)
def _topk(call: OpCall, x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
    if x.ndim == 0:
        return x, Tensor.zeros((), dtype="int64", device=x.device)
    values, indices = x.topk(k, dim, largest, sorted)
    return values, indices.cast("int64")
