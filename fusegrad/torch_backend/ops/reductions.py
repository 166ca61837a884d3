"""Reductions, scans and softmax."""

from __future__ import annotations

from typing import Any, Callable


from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor


from .table import OpCall, aten, axes_of, meta_dtype, prims, register


def reduction(fn: Callable) -> Callable:
    def impl(call: OpCall, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        dt = meta_dtype(call.out if not isinstance(call.out, tuple) else call.out[0])
        return fn(x.cast(dt) if x.dtype != dt else x, axes_of(dim, x.ndim), keepdim)

    return impl


def keep_0d(fn: Callable) -> Callable:
    """A reduce over a 0-d tensor is the tensor itself."""
    return lambda x, axes, keepdim: x if x.ndim == 0 else fn(x, axes, keepdim)


register(aten.sum.dim_IntList, aten.sum.default)(reduction(keep_0d(lambda x, a, k: x.sum(a, keepdim=k))))
register(aten.mean.dim, aten.mean.default)(reduction(keep_0d(lambda x, a, k: x.mean(a, keepdim=k))))
register(aten.amax.default)(reduction(keep_0d(lambda x, a, k: x.max(a, keepdim=k))))
register(aten.amin.default)(reduction(keep_0d(lambda x, a, k: x.min(a, keepdim=k))))
register(aten.max.default)(reduction(keep_0d(lambda x, a, k: x.max())))
register(aten.min.default)(reduction(keep_0d(lambda x, a, k: x.min())))
register(aten.any.default, aten.any.dim, aten.any.dims)(reduction(keep_0d(lambda x, a, k: x.bool().any(a, keepdim=k))))
register(aten.all.default, aten.all.dim, aten.all.dims)(reduction(keep_0d(lambda x, a, k: x.bool().all(a, keepdim=k))))


@register(aten.prod.default)
def _prod_all(call: OpCall, x: Tensor, *, dtype: Any = None) -> Tensor:
    x = x.cast(meta_dtype(call.out))
    return x if x.ndim == 0 else x.prod()


@register(aten.prod.dim_int)
def _prod(call: OpCall, x: Tensor, dim: int, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = x.cast(meta_dtype(call.out))
    return x if x.ndim == 0 else x.prod(dim, keepdim=keepdim)


@register(aten.var.correction)
def variance(call: OpCall, x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Tensor:
    corr = 1 if correction is None else correction
    x = x.cast(meta_dtype(call.out[0] if isinstance(call.out, tuple) else call.out))
    if x.ndim == 0:
        return (x - x) / (1 - corr) if corr else x - x
    return x.var(axes_of(dim, x.ndim), keepdim=keepdim, correction=corr)


def _extreme_dim(is_max: bool) -> Callable:
    def impl(call: OpCall, x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
        if x.ndim == 0:
            return x, Tensor.zeros((), dtype="int64", device=x.device)
        values = x.max(dim, keepdim=True) if is_max else x.min(dim, keepdim=True)
        return (values if keepdim else values.squeeze(dim)), _first_index(x, values, dim, keepdim)

    return impl


register(aten.max.dim)(_extreme_dim(True))
register(aten.min.dim)(_extreme_dim(False))


def _first_index(x: Tensor, extreme: Tensor, dim: int, keepdim: bool) -> Tensor:
    """The first position along dim holding `extreme` (a NaN counts as the extreme, as torch's max does)."""
    dim = dim % x.ndim
    n = x.shape[dim]
    hit = (x == extreme) | (x.isnan() & extreme.isnan()) if dtypes.is_float(x.dtype) else x == extreme
    pos = Tensor.arange(n, dtype="int32").to(x.device).reshape(tuple(n if i == dim else 1 for i in range(x.ndim)))
    idx = hit.where(pos, n).min(dim, keepdim=keepdim)
    return idx.cast("int64")


def _arg_extreme(is_max: bool) -> Callable:
    def impl(call: OpCall, x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
        if dim is None:
            flat = x.reshape(-1)
            ext = flat.max() if is_max else flat.min()
            idx = _first_index(flat, ext.reshape(1), 0, False)
            return idx.reshape((1,) * x.ndim) if keepdim else idx
        if x.ndim == 0:
            return Tensor.zeros((), dtype="int64", device=x.device)
        ext = x.max(dim, keepdim=True) if is_max else x.min(dim, keepdim=True)
        return _first_index(x, ext, dim, keepdim)

    return impl


register(aten.argmax.default)(_arg_extreme(True))
register(aten.argmin.default)(_arg_extreme(False))


@register(aten.cumsum.default)
def _cumsum(call: OpCall, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    x = x.cast(meta_dtype(call.out))
    return x if x.ndim == 0 else x.cumsum(dim)


@register(aten.cumprod.default)
def _cumprod(call: OpCall, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    x = x.cast(meta_dtype(call.out))
    return x if x.ndim == 0 else x.cumprod(dim)


@register(aten._softmax.default)
def _softmax(call: OpCall, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return x if x.ndim == 0 else x.cast(meta_dtype(call.out)).softmax(dim)


@register(aten._log_softmax.default)
def _log_softmax(call: OpCall, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return x * 0 if x.ndim == 0 else x.cast(meta_dtype(call.out)).log_softmax(dim)


@register(aten.var_mean.correction)
def _var_mean(call: OpCall, x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple:
    return variance(call, x, dim, correction=correction, keepdim=keepdim), reduction(
        keep_0d(lambda t, a, k: t.mean(a, keepdim=k))
    )(OpCall(call.out[1], call.meta_args, call.device), x, dim, keepdim)


@register(prims.var.default)
def _prims_var(call: OpCall, x: Tensor, dims: Any, correction: float = 1, *, output_dtype: Any = None) -> Tensor:
    return variance(call, x, dims, correction=correction)


@register(prims.sum.default)
def _prims_sum(call: OpCall, x: Tensor, dims: Any, *, output_dtype: Any = None) -> Tensor:
    x = x.cast(meta_dtype(call.out))
    return x if x.ndim == 0 else x.sum(axes_of(dims, x.ndim))
