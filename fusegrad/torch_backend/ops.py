"""The aten ops the `fuse` device implements directly, each on fusegrad Tensors; torch decomposes the rest.

Each implementation takes an `OpCall` (the op's output and arguments as meta tensors, which give torch's result
shape and dtype) and the op's arguments with every `fuse` tensor replaced by its lazy fusegrad Tensor. The result
is cast to torch's dtype by the caller, so an implementation only needs the right values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor

from .dtypes import to_fuse_dtype

aten, prims = torch.ops.aten, torch.ops.prims


@dataclass
class OpCall:
    out: Any  # the op's result on meta tensors
    meta_args: tuple
    device: str  # the fusegrad device of the result


OPS: dict[Any, Callable] = {}
# in-place ops without a functional twin: the implementation returns the new value of `self`
INPLACE: dict[Any, Callable] = {}


def register(*ops: Any, table: dict = OPS) -> Callable:
    def deco(fn: Callable) -> Callable:
        for op in ops:
            table[op] = fn
        return fn

    return deco


def _dt(meta: torch.Tensor):
    return to_fuse_dtype(meta.dtype)


def _cast(x: Any, dt) -> Any:
    return x.cast(dt) if isinstance(x, Tensor) and x.dtype != dt else x


def _tensor(x: Any, dt, device: str) -> Tensor:
    return x.cast(dt) if isinstance(x, Tensor) else Tensor(x, dtype=dt, device=device)


def _common(call: OpCall, i: int, j: int):
    """torch's common dtype of the op's arguments i and j (comparisons compute in it)."""
    return to_fuse_dtype(torch.result_type(call.meta_args[i], call.meta_args[j]))


def _axes(dim: Any, ndim: int) -> tuple[int, ...] | None:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % max(ndim, 1) for d in dims) if ndim else None


# ---- elementwise unary: torch's output dtype is the dtype they compute in (int -> float for float functions)

_UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "abs": Tensor.abs,
    "neg": Tensor.neg,
    "exp": Tensor.exp,
    "exp2": Tensor.exp2,
    "log": Tensor.log,
    "log2": Tensor.log2,
    "log10": Tensor.log10,
    "sqrt": Tensor.sqrt,
    "rsqrt": Tensor.rsqrt,
    "sin": Tensor.sin,
    "cos": Tensor.cos,
    "tan": Tensor.tan,
    "asin": Tensor.asin,
    "acos": Tensor.acos,
    "atan": Tensor.atan,
    "sinh": Tensor.sinh,
    "cosh": Tensor.cosh,
    "tanh": Tensor.tanh,
    "asinh": Tensor.asinh,
    "acosh": Tensor.acosh,
    "atanh": Tensor.atanh,
    "erf": Tensor.erf,
    "sigmoid": Tensor.sigmoid,
    "relu": Tensor.relu,
    "floor": Tensor.floor,
    "ceil": Tensor.ceil,
    "trunc": Tensor.trunc,
    "sign": Tensor.sign,
    "sgn": Tensor.sign,
    "reciprocal": Tensor.reciprocal,
    "bitwise_not": Tensor.bitwise_not,
    "silu": Tensor.silu,
    "erfc": lambda x: 1 - x.erf(),
    "expm1": lambda x: (x.abs() < 1e-3).where(x + x * x * 0.5 + x * x * x / 6, x.exp() - 1),
    "log1p": lambda x: (x.abs() < 1e-4).where(x - x * x * 0.5 + x * x * x / 3, (x + 1).log()),
}


def _unary(fn: Callable[[Tensor], Tensor]) -> Callable:
    def impl(call: OpCall, x: Tensor) -> Tensor:
        return fn(_cast(x, _dt(call.out)))

    return impl


for _name, _fn in _UNARY.items():
    register(getattr(aten, _name).default)(_unary(_fn))
    if hasattr(prims, _name):
        register(getattr(prims, _name).default)(_unary(_fn))


@register(aten.round.default, prims.round.default)
def _round(call: OpCall, x: Tensor) -> Tensor:
    return x.round()


@register(aten.round.decimals)
def _round_decimals(call: OpCall, x: Tensor, decimals: int = 0) -> Tensor:
    scale = 10.0**decimals
    return (x * scale).round() / scale


@register(aten.isnan.default)
def _isnan(call: OpCall, x: Tensor) -> Tensor:
    return x.isnan()


@register(aten.isinf.default)
def _isinf(call: OpCall, x: Tensor) -> Tensor:
    return x.isinf()


@register(aten.logical_not.default)
def _logical_not(call: OpCall, x: Tensor) -> Tensor:
    return x.logical_not()


@register(aten.signbit.default, prims.signbit.default)
def _signbit(call: OpCall, x: Tensor) -> Tensor:
    if not dtypes.is_float(x.dtype):
        return x < 0
    return (x < 0) | ((x == 0) & ((1.0 / x) < 0))


@register(aten.gelu.default)
def _gelu(call: OpCall, x: Tensor, approximate: str = "none") -> Tensor:
    return x.gelu(approximate=approximate)


# ---- elementwise binary and ternary


def _binary(fn: Callable, common: bool = False) -> Callable:
    """fn on both operands cast to torch's result dtype (or, for comparisons, to their common dtype)."""

    def impl(call: OpCall, a: Any, b: Any, *rest: Any, **kw: Any) -> Tensor:
        dt = _common(call, 0, 1) if common else _dt(call.out)
        return fn(_tensor(a, dt, call.device), _cast(b, dt), *rest, **kw)

    return impl


def _add(a: Tensor, b: Any, alpha: Any = 1) -> Tensor:
    return a + (b * alpha if alpha != 1 else b)


def _sub(a: Tensor, b: Any, alpha: Any = 1) -> Tensor:
    return a - (b * alpha if alpha != 1 else b)


def _div(a: Tensor, b: Any, rounding_mode: str | None = None) -> Tensor:
    return a.div(b, rounding_mode=rounding_mode)


_BINARY: dict[str, tuple[Callable, bool]] = {
    "add": (_add, False),
    "sub": (_sub, False),
    "mul": (lambda a, b: a * b, False),
    "div": (_div, False),
    "pow": (lambda a, b: a.pow(b), False),
    "maximum": (lambda a, b: a.maximum(b), False),
    "minimum": (lambda a, b: a.minimum(b), False),
    "remainder": (lambda a, b: a.mod(b), False),
    "fmod": (lambda a, b: a.fmod(b), False),
    "copysign": (lambda a, b: a.copysign(b), False),
    "fmax": (lambda a, b: a.isnan().where(b, _tensor(b, a.dtype, a.device).isnan().where(a, a.maximum(b))), False),
    "fmin": (lambda a, b: a.isnan().where(b, _tensor(b, a.dtype, a.device).isnan().where(a, a.minimum(b))), False),
    "hypot": (lambda a, b: (a * a + b * b).sqrt(), False),
    "bitwise_and": (lambda a, b: a.bitwise_and(b), False),
    "bitwise_or": (lambda a, b: a.bitwise_or(b), False),
    "bitwise_xor": (lambda a, b: a.bitwise_xor(b), False),
    "eq": (lambda a, b: a.eq(b), True),
    "ne": (lambda a, b: a.ne(b), True),
    "lt": (lambda a, b: a < b, True),
    "le": (lambda a, b: a <= b, True),
    "gt": (lambda a, b: a > b, True),
    "ge": (lambda a, b: a >= b, True),
    "logical_and": (lambda a, b: a.bool().bitwise_and(b.bool() if isinstance(b, Tensor) else bool(b)), True),
    "logical_or": (lambda a, b: a.bool().bitwise_or(b.bool() if isinstance(b, Tensor) else bool(b)), True),
    "logical_xor": (lambda a, b: a.bool().bitwise_xor(b.bool() if isinstance(b, Tensor) else bool(b)), True),
}
_OVERLOADS = ("Tensor", "Scalar", "default", "Tensor_mode", "Scalar_mode", "Tensor_Tensor", "Tensor_Scalar", "Scalar")

for _name, (_fn, _cmp) in _BINARY.items():
    _packet = getattr(aten, _name)
    for _ov in _OVERLOADS:
        if _ov in _packet.overloads():
            register(getattr(_packet, _ov))(_binary(_fn, _cmp))
    if hasattr(prims, _name) and _name not in ("remainder",):
        register(getattr(prims, _name).default)(_binary(_fn, _cmp))


@register(aten.pow.Scalar)
def _pow_scalar(call: OpCall, base: Any, exponent: Tensor) -> Tensor:
    dt = _dt(call.out)
    return Tensor(base, dtype=dt, device=call.device).pow(exponent.cast(dt))


@register(aten.where.self, prims.where.default)
def _where(call: OpCall, cond: Tensor, a: Any, b: Any) -> Tensor:
    dt = _dt(call.out)
    return _tensor(cond, dtypes.bool, call.device).where(_tensor(a, dt, call.device), _tensor(b, dt, call.device))


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(call: OpCall, x: Tensor, lo: Any = None, hi: Any = None) -> Tensor:
    dt = _dt(call.out)
    x = x.cast(dt)
    # torch propagates NaN from the input and from tensor bounds
    if lo is not None:
        x = x.maximum(_tensor(lo, dt, call.device))
    if hi is not None:
        x = x.minimum(_tensor(hi, dt, call.device))
    return x


@register(aten.atan2.default, prims.atan2.default)
def _atan2(call: OpCall, y: Tensor, x: Any) -> Tensor:
    dt = _dt(call.out)
    y, x = y.cast(dt), _tensor(x, dt, call.device)
    base = (y / x).atan()
    pi = math.pi
    fixed = (x < 0).where((y >= 0).where(base + pi, base - pi), base)
    zero_x = (y > 0).where(pi / 2, (y < 0).where(-pi / 2, (x.copysign(1.0) < 0).where(y.copysign(pi), y * 0)))
    return (x == 0).where(zero_x, fixed)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(call: OpCall, x: Tensor, mask: Tensor, value: Any) -> Tensor:
    dt = _dt(call.out)
    return mask.where(_tensor(value, dt, call.device), x.cast(dt))


@register(prims.convert_element_type.default)
def _convert(call: OpCall, x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.cast(to_fuse_dtype(dtype))


# ---- reductions


def _reduce(fn: Callable) -> Callable:
    def impl(call: OpCall, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        dt = _dt(call.out if not isinstance(call.out, tuple) else call.out[0])
        return fn(x.cast(dt) if x.dtype != dt else x, _axes(dim, x.ndim), keepdim)

    return impl


def _keep0d(fn: Callable) -> Callable:
    """A reduce over a 0-d tensor is the tensor itself."""
    return lambda x, axes, keepdim: x if x.ndim == 0 else fn(x, axes, keepdim)


register(aten.sum.dim_IntList, aten.sum.default)(_reduce(_keep0d(lambda x, a, k: x.sum(a, keepdim=k))))
register(aten.mean.dim, aten.mean.default)(_reduce(_keep0d(lambda x, a, k: x.mean(a, keepdim=k))))
register(aten.amax.default)(_reduce(_keep0d(lambda x, a, k: x.max(a, keepdim=k))))
register(aten.amin.default)(_reduce(_keep0d(lambda x, a, k: x.min(a, keepdim=k))))
register(aten.max.default)(_reduce(_keep0d(lambda x, a, k: x.max())))
register(aten.min.default)(_reduce(_keep0d(lambda x, a, k: x.min())))
register(aten.any.default, aten.any.dim, aten.any.dims)(_reduce(_keep0d(lambda x, a, k: x.bool().any(a, keepdim=k))))
register(aten.all.default, aten.all.dim, aten.all.dims)(_reduce(_keep0d(lambda x, a, k: x.bool().all(a, keepdim=k))))


@register(aten.prod.default)
def _prod_all(call: OpCall, x: Tensor, *, dtype: Any = None) -> Tensor:
    x = x.cast(_dt(call.out))
    return x if x.ndim == 0 else x.prod()


@register(aten.prod.dim_int)
def _prod(call: OpCall, x: Tensor, dim: int, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = x.cast(_dt(call.out))
    return x if x.ndim == 0 else x.prod(dim, keepdim=keepdim)


@register(aten.var.correction)
def _var(call: OpCall, x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Tensor:
    corr = 1 if correction is None else correction
    x = x.cast(_dt(call.out[0] if isinstance(call.out, tuple) else call.out))
    if x.ndim == 0:
        return (x - x) / (1 - corr) if corr else x - x
    return x.var(_axes(dim, x.ndim), keepdim=keepdim, correction=corr)


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
    x = x.cast(_dt(call.out))
    return x if x.ndim == 0 else x.cumsum(dim)


@register(aten.cumprod.default)
def _cumprod(call: OpCall, x: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    x = x.cast(_dt(call.out))
    return x if x.ndim == 0 else x.cumprod(dim)


@register(aten._softmax.default)
def _softmax(call: OpCall, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return x if x.ndim == 0 else x.cast(_dt(call.out)).softmax(dim)


@register(aten._log_softmax.default)
def _log_softmax(call: OpCall, x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return x * 0 if x.ndim == 0 else x.cast(_dt(call.out)).log_softmax(dim)


# ---- copies, fills, factories


@register(aten.clone.default)
def _clone(call: OpCall, x: Tensor, *, memory_format: Any = None) -> Tensor:
    return x


@register(aten._unsafe_view.default, aten.view_copy.default, aten._reshape_copy.default)
def _unsafe_view(call: OpCall, x: Tensor, size: Any) -> Tensor:
    return x.reshape(tuple(call.out.shape))


@register(aten.expand_copy.default)
def _expand_copy(call: OpCall, x: Tensor, size: Any, *, implicit: bool = False) -> Tensor:
    return x.reshape((1,) * (len(call.out.shape) - x.ndim) + tuple(x.shape)).expand(tuple(call.out.shape))


def _zeros(call: OpCall, *args: Any, **kwargs: Any) -> Tensor:
    return Tensor.zeros(tuple(call.out.shape), dtype=_dt(call.out), device=call.device)


register(
    aten.empty_like.default,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.new_zeros.default,
    aten.zeros_like.default,
    aten.zero.default,
)(_zeros)


def _filled(call: OpCall, value: Any) -> Tensor:
    dt = _dt(call.out)
    return _tensor(value, dt, call.device).reshape((1,) * call.out.ndim).expand(tuple(call.out.shape))


@register(aten.full.default, aten.full_like.default, aten.fill.Scalar, aten.fill.Tensor)
def _full(call: OpCall, size_or_self: Any, value: Any, **kwargs: Any) -> Tensor:
    return _filled(call, value)


@register(aten.new_full.default)
def _new_full(call: OpCall, x: Tensor, size: Any, value: Any, **kwargs: Any) -> Tensor:
    return _filled(call, value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(call: OpCall, value: Any, **kwargs: Any) -> Tensor:
    return Tensor(value, dtype=_dt(call.out), device=call.device)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(call: OpCall, *args: Any, **kwargs: Any) -> Tensor:
    n, dt = call.out.shape[0], _dt(call.out)
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    if dtypes.is_float(dt):
        return (Tensor.arange(n, dtype="float64").to(call.device) * step + start).cast(dt)
    return Tensor.arange(n, dtype="int64").to(call.device).cast(dt) * step + start


@register(aten.fill_.Scalar, aten.fill_.Tensor, table=INPLACE)
def _fill_(call: OpCall, x: Tensor, value: Any) -> Tensor:
    return _tensor(value, x.dtype, call.device).reshape((1,) * x.ndim).expand(x.shape)


@register(aten.zero_.default, table=INPLACE)
def _zero_(call: OpCall, x: Tensor) -> Tensor:
    return Tensor.zeros(x.shape, dtype=x.dtype, device=call.device)


def _rand(shape: tuple, device: str) -> Tensor:
    return Tensor.rand(*shape, device=device) if shape else Tensor.rand(1, device=device).reshape(())


@register(aten.uniform_.default, table=INPLACE)
def _uniform_(call: OpCall, x: Tensor, low: float = 0.0, high: float = 1.0, *, generator: Any = None) -> Tensor:
    return _rand(x.shape, call.device) * (high - low) + low


@register(aten.normal_.default, table=INPLACE)
def _normal_(call: OpCall, x: Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Tensor:
    z = Tensor.randn(*x.shape, device=call.device) if x.shape else Tensor.randn(1, device=call.device).reshape(())
    return z * std + mean


@register(aten.bernoulli_.float, aten.bernoulli_.Tensor, table=INPLACE)
def _bernoulli_(call: OpCall, x: Tensor, p: Any = 0.5, *, generator: Any = None) -> Tensor:
    return _rand(x.shape, call.device) < p


@register(aten.bernoulli.default)
def _bernoulli(call: OpCall, p: Tensor, *, generator: Any = None) -> Tensor:
    return _rand(p.shape, call.device) < p


@register(getattr(aten.random_, "from"), aten.random_.to, table=INPLACE)
def _random_(call: OpCall, x: Tensor, low: int, high: int | None = None, *, generator: Any = None) -> Tensor:
    if high is None:
        low, high = 0, low
    return (_rand(x.shape, call.device) * (high - low)).floor() + low


# ---- linear algebra and convolutions


@register(aten.mm.default, aten.bmm.default, aten.dot.default)
def _mm(call: OpCall, a: Tensor, b: Tensor) -> Tensor:
    return a.matmul(b)


@register(aten.addmm.default)
def _addmm(call: OpCall, bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    prod_ = a.matmul(b)
    prod_ = prod_ * alpha if alpha != 1 else prod_
    if beta == 0:
        return prod_
    return prod_ + (bias * beta if beta != 1 else bias)


def _conv(x: Tensor, w: Tensor, bias: Tensor | None, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return x.conv_transpose2d(
            w, bias, groups, tuple(stride), tuple(dilation), tuple(padding), tuple(output_padding)
        )
    return x.conv2d(w, bias, groups, tuple(stride), tuple(dilation), tuple(padding))


@register(aten.convolution.default)
def _convolution(call: OpCall, x, w, bias, stride, padding, dilation, transposed, output_padding, groups) -> Tensor:
    return _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)


@register(aten.convolution_backward.default)
def _convolution_backward(
    call: OpCall, grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask
) -> tuple:
    """The gradients through fusegrad's own autodiff of the same convolution."""
    xv, wv = x.detach(), w.detach()
    out = _conv(xv, wv, None, stride, padding, dilation, transposed, output_padding, groups)
    gx, gw = out.gradient(xv, wv, gradient=grad)
    gb = grad.sum(tuple(d for d in range(grad.ndim) if d != 1)) if mask[2] else None
    return (gx if mask[0] else None, gw if mask[1] else None, gb)


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d(call: OpCall, x: Tensor, kernel, stride=(), padding=0, dilation=1, ceil_mode=False) -> tuple:
    values, indices = x.max_pool2d(tuple(kernel), tuple(stride) or None, dilation, padding, ceil_mode, True)
    return values, indices.cast("int64")


@register(aten.avg_pool2d.default)
def _avg_pool2d(
    call: OpCall, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
) -> Tensor:
    if divisor_override is not None:
        raise NotImplementedError("fuse: aten.avg_pool2d with divisor_override is not supported")
    return x.avg_pool2d(tuple(kernel), tuple(stride) or None, 1, padding, ceil_mode, count_include_pad)


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(
    call: OpCall, grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
) -> Tensor:
    xv = x.detach()
    out = xv.avg_pool2d(tuple(kernel), tuple(stride) or None, 1, padding, ceil_mode, count_include_pad)
    return out.gradient(xv, gradient=grad)[0]


# ---- movement and indexing that are not views


@register(aten.cat.default)
def _cat(call: OpCall, tensors: list, dim: int = 0) -> Tensor:
    dt = _dt(call.out)
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


@register(aten.var_mean.correction)
def _var_mean(call: OpCall, x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple:
    return _var(call, x, dim, correction=correction, keepdim=keepdim), _reduce(
        _keep0d(lambda t, a, k: t.mean(a, keepdim=k))
    )(OpCall(call.out[1], call.meta_args, call.device), x, dim, keepdim)


@register(prims.var.default)
def _prims_var(call: OpCall, x: Tensor, dims: Any, correction: float = 1, *, output_dtype: Any = None) -> Tensor:
    return _var(call, x, dims, correction=correction)


@register(prims.sum.default)
def _prims_sum(call: OpCall, x: Tensor, dims: Any, *, output_dtype: Any = None) -> Tensor:
    x = x.cast(_dt(call.out))
    return x if x.ndim == 0 else x.sum(_axes(dims, x.ndim))


# ---- the backward and optimizer ops of a training step, direct (their decompositions cost ~10x more dispatch)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(call: OpCall, x: Tensor, end: Tensor, weight: Any) -> Tensor:
    # torch's two-sided form keeps lerp exact at both ends
    small = weight < 0.5 if not isinstance(weight, Tensor) else None
    if small is True:
        return x + (end - x) * weight
    if small is False:
        return end - (end - x) * (1 - weight)
    return (weight.abs() < 0.5).where(x + (end - x) * weight, end - (end - x) * (1 - weight))


@register(aten.addcmul.default)
def _addcmul(call: OpCall, x: Tensor, a: Tensor, b: Tensor, *, value: Any = 1) -> Tensor:
    dt = _dt(call.out)
    return x.cast(dt) + a.cast(dt) * b.cast(dt) * value


@register(aten.addcdiv.default)
def _addcdiv(call: OpCall, x: Tensor, a: Tensor, b: Tensor, *, value: Any = 1) -> Tensor:
    dt = _dt(call.out)
    return x.cast(dt) + a.cast(dt) / b.cast(dt) * value


@register(aten.ones_like.default)
def _ones_like(call: OpCall, x: Tensor, **kwargs: Any) -> Tensor:
    return _filled(call, 1)


@register(aten.threshold_backward.default)
def _threshold_backward(call: OpCall, grad: Tensor, x: Tensor, threshold: Any) -> Tensor:
    return (x <= threshold).where(0, grad)


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward(call: OpCall, grad: Tensor, out: Tensor, dim: int, input_dtype: Any) -> Tensor:
    if out.ndim == 0:
        return grad * 0
    return grad - out.exp() * grad.sum(dim, keepdim=True)


@register(aten._softmax_backward_data.default)
def _softmax_backward(call: OpCall, grad: Tensor, out: Tensor, dim: int, input_dtype: Any) -> Tensor:
    if out.ndim == 0:
        return grad * 0
    return out * (grad - (grad * out).sum(dim, keepdim=True))


def _nll_picks(x: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int) -> tuple[Tensor, Tensor]:
    """Per-sample one-hot of the target class (N, C) and its weight, 0 where ignored."""
    classes = x.shape[-1]
    hot = target.unsqueeze(-1) == Tensor.arange(classes, dtype=target.dtype).to(x.device)
    w = hot.cast(x.dtype) if weight is None else hot.where(weight.cast(x.dtype), 0)
    keep = (target != ignore_index).unsqueeze(-1)
    return keep.where(hot, False), keep.where(w, 0)


@register(aten.nll_loss_forward.default)
def _nll_loss_forward(call: OpCall, x: Tensor, target: Tensor, weight: Any, reduction: int, ignore_index: int):
    if x.ndim > 2:
        return NotImplemented
    _, w = _nll_picks(x, target, weight, ignore_index)
    losses = -(w * x).sum(-1)
    total = w.sum()
    if reduction == 0:
        return losses, total
    return (losses.sum() / total if reduction == 1 else losses.sum()), total


@register(aten.nll_loss_backward.default)
def _nll_loss_backward(call: OpCall, grad, x, target, weight, reduction, ignore_index, total_weight) -> Tensor:
    if x.ndim > 2:
        return NotImplemented
    _, w = _nll_picks(x, target, weight, ignore_index)
    g = grad.unsqueeze(-1) if reduction == 0 else grad
    out = -w * g
    return out / total_weight if reduction == 1 else out


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(call: OpCall, grad, x, kernel, stride, padding, dilation, ceil_mode, indices) -> Tensor:
    """Each output's gradient goes to the input position its index names (torch's first maximum)."""
    lead, plane = x.shape[:-2], x.shape[-2] * x.shape[-1]
    idx = indices.reshape(*lead, -1).cast("int32")
    g = grad.reshape(*lead, -1)
    zeros = Tensor.zeros(*lead, plane, dtype=x.dtype, device=x.device)
    return zeros.scatter_reduce(len(lead), idx, g, "sum").reshape(x.shape)


# ---- special functions, in float64 (then cast back): Lanczos lgamma and the asymptotic series of digamma

_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)


def _lgamma_right(x: Tensor) -> Tensor:
    """lgamma for x >= 0.5 (Lanczos, g = 7)."""
    z = x - 1
    a = sum(
        (c / (z + i) for i, c in enumerate(_LANCZOS[1:], start=1)),
        Tensor.full(x.shape, _LANCZOS[0], dtype=x.dtype, device=x.device),
    )
    t = z + 7.5
    return 0.5 * math.log(2 * math.pi) + (z + 0.5) * t.log() - t + a.log()


@register(aten.lgamma.default, prims.lgamma.default)
def _lgamma(call: OpCall, x: Tensor) -> Tensor:
    x = x.cast(dtypes.float64)
    left = (x < 0.5).where(x, 0.25)  # each branch sees only inputs it is defined for
    right = (x < 0.5).where(1.5, x)
    reflected = math.log(math.pi) - (left * math.pi).sin().abs().log() - _lgamma_right(1 - left)
    return (x < 0.5).where(reflected, _lgamma_right(right))


def _digamma_right(x: Tensor) -> Tensor:
    """digamma for x >= 0.5: the recurrence up to x + 6, then the asymptotic series."""
    shift = sum((1 / (x + k) for k in range(6)), x * 0)
    y = x + 6
    inv2 = 1 / (y * y)
    series = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))
    return y.log() - 0.5 / y - series - shift


@register(aten.digamma.default, prims.digamma.default)
def _digamma(call: OpCall, x: Tensor) -> Tensor:
    x = x.cast(dtypes.float64)
    left = (x < 0.5).where(x, 0.25)
    right = (x < 0.5).where(1.5, x)
    reflected = _digamma_right(1 - left) - math.pi / (left * math.pi).tan()
    at_pole = (x <= 0) & (x == x.floor())
    value = (x < 0.5).where(reflected, _digamma_right(right))
    return at_pole.where((x == 0).where(-math.inf, math.nan), value)


@register(aten.nextafter.default, prims.nextafter.default)
def _nextafter(call: OpCall, x: Tensor, other: Tensor) -> Tensor:
    """The next float after x toward other, by stepping the bit pattern (float32 and float64)."""
    dt = _dt(call.out)
    x, other = x.cast(dt), other.cast(dt)
    ints = dtypes.int32 if dt == dtypes.float32 else dtypes.int64
    bits = x.bitcast(ints)
    away = (other > x) == (x > 0)
    stepped = (away.where(bits + 1, bits - 1)).bitcast(dt)
    tiny = Tensor.ones(x.shape, dtype=ints, device=x.device).bitcast(dt)
    from_zero = (other > 0).where(tiny, -tiny)
    out = (x == 0).where(from_zero, stepped)
    out = (x == other).where(other, out)
    return (x.isnan() | other.isnan()).where(math.nan, out)


# ---- orthogonal polynomials of degree n (truncated to an integer, as torch does; n < 0 gives 0) by recurrence

_POLYNOMIALS: dict[str, tuple[Callable, Callable, Callable]] = {
    # name: (p0, p1, p_{k+1} from k, x, p_k, p_{k-1})
    "chebyshev_polynomial_t": (lambda x: x * 0 + 1, lambda x: x, lambda k, x, p, q: 2 * x * p - q),
    "chebyshev_polynomial_u": (lambda x: x * 0 + 1, lambda x: 2 * x, lambda k, x, p, q: 2 * x * p - q),
    "chebyshev_polynomial_v": (lambda x: x * 0 + 1, lambda x: 2 * x - 1, lambda k, x, p, q: 2 * x * p - q),
    "chebyshev_polynomial_w": (lambda x: x * 0 + 1, lambda x: 2 * x + 1, lambda k, x, p, q: 2 * x * p - q),
    "hermite_polynomial_h": (lambda x: x * 0 + 1, lambda x: 2 * x, lambda k, x, p, q: 2 * x * p - 2 * k * q),
    "hermite_polynomial_he": (lambda x: x * 0 + 1, lambda x: x, lambda k, x, p, q: x * p - k * q),
    "laguerre_polynomial_l": (
        lambda x: x * 0 + 1,
        lambda x: 1 - x,
        lambda k, x, p, q: ((2 * k + 1 - x) * p - k * q) / (k + 1),
    ),
    "legendre_polynomial_p": (
        lambda x: x * 0 + 1,
        lambda x: x,
        lambda k, x, p, q: ((2 * k + 1) * x * p - k * q) / (k + 1),
    ),
}
_MAX_DEGREE = 4096


def _polynomial(name: str, shifted: bool) -> Callable:
    p0, p1, step = _POLYNOMIALS[name]

    def impl(call: OpCall, x: Any, n: Any) -> Tensor:
        x, n = _tensor(x, dtypes.float64, call.device), _tensor(n, dtypes.float64, call.device).trunc()
        shape = tuple(call.out.shape)
        x, n = (
            x.reshape((1,) * (len(shape) - x.ndim) + x.shape).expand(shape),
            n.reshape((1,) * (len(shape) - n.ndim) + n.shape).expand(shape),
        )
        if shifted:
            x = 2 * x - 1
        top = int(n.max().item()) if n.numel() else 0
        if top > _MAX_DEGREE:
            return NotImplemented
        q, p = p0(x), p1(x)
        out = (n == 0).where(q, (n == 1).where(p, 0.0))
        for k in range(1, top):
            q, p = p, step(k, x, p, q)
            out = (n == k + 1).where(p, out)
        return out

    return impl


for _name in _POLYNOMIALS:
    for _shifted in (False, True) if _name.startswith("chebyshev") else (False,):
        _packet = getattr(aten, f"special_shifted_{_name}" if _shifted else f"special_{_name}")
        for _ov in ("default", "x_scalar", "n_scalar"):
            register(getattr(_packet, _ov))(_polynomial(_name, _shifted))
