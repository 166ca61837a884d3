"""Elementwise aten ops: unary, binary and ternary, in the dtype torch computes them in."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor

from ..dtypes import to_fuse_dtype

from .table import OpCall, aten, as_tensor, cast_if, common_dtype, meta_dtype, prims, register


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
        return fn(cast_if(x, meta_dtype(call.out)))

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
        dt = common_dtype(call, 0, 1) if common else meta_dtype(call.out)
        return fn(as_tensor(a, dt, call.device), cast_if(b, dt), *rest, **kw)

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
    "fmax": (lambda a, b: a.isnan().where(b, as_tensor(b, a.dtype, a.device).isnan().where(a, a.maximum(b))), False),
    "fmin": (lambda a, b: a.isnan().where(b, as_tensor(b, a.dtype, a.device).isnan().where(a, a.minimum(b))), False),
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
    dt = meta_dtype(call.out)
    return Tensor(base, dtype=dt, device=call.device).pow(exponent.cast(dt))


@register(aten.where.self, prims.where.default)
def _where(call: OpCall, cond: Tensor, a: Any, b: Any) -> Tensor:
    dt = meta_dtype(call.out)
    return as_tensor(cond, dtypes.bool, call.device).where(as_tensor(a, dt, call.device), as_tensor(b, dt, call.device))


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(call: OpCall, x: Tensor, lo: Any = None, hi: Any = None) -> Tensor:
    dt = meta_dtype(call.out)
    x = x.cast(dt)
    # torch propagates NaN from the input and from tensor bounds
    if lo is not None:
        x = x.maximum(as_tensor(lo, dt, call.device))
    if hi is not None:
        x = x.minimum(as_tensor(hi, dt, call.device))
    return x


@register(aten.atan2.default, prims.atan2.default)
def _atan2(call: OpCall, y: Tensor, x: Any) -> Tensor:
    dt = meta_dtype(call.out)
    y, x = y.cast(dt), as_tensor(x, dt, call.device)
    base = (y / x).atan()
    pi = math.pi
    fixed = (x < 0).where((y >= 0).where(base + pi, base - pi), base)
    zero_x = (y > 0).where(pi / 2, (y < 0).where(-pi / 2, (x.copysign(1.0) < 0).where(y.copysign(pi), y * 0)))
    return (x == 0).where(zero_x, fixed)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(call: OpCall, x: Tensor, mask: Tensor, value: Any) -> Tensor:
    dt = meta_dtype(call.out)
    return mask.where(as_tensor(value, dt, call.device), x.cast(dt))


@register(prims.convert_element_type.default)
def _convert(call: OpCall, x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.cast(to_fuse_dtype(dtype))
