"""Copies, fills, factories and random fills."""

from __future__ import annotations

from typing import Any


from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor


from .table import INPLACE, OpCall, aten, as_tensor, meta_dtype, register


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
    return Tensor.zeros(tuple(call.out.shape), dtype=meta_dtype(call.out), device=call.device)


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


def filled(call: OpCall, value: Any) -> Tensor:
    dt = meta_dtype(call.out)
    return as_tensor(value, dt, call.device).reshape((1,) * call.out.ndim).expand(tuple(call.out.shape))


@register(aten.full.default, aten.full_like.default, aten.fill.Scalar, aten.fill.Tensor)
def _full(call: OpCall, size_or_self: Any, value: Any, **kwargs: Any) -> Tensor:
    return filled(call, value)


@register(aten.new_full.default)
def _new_full(call: OpCall, x: Tensor, size: Any, value: Any, **kwargs: Any) -> Tensor:
    return filled(call, value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(call: OpCall, value: Any, **kwargs: Any) -> Tensor:
    return Tensor(value, dtype=meta_dtype(call.out), device=call.device)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(call: OpCall, *args: Any, **kwargs: Any) -> Tensor:
    n, dt = call.out.shape[0], meta_dtype(call.out)
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    if dtypes.is_float(dt):
        return (Tensor.arange(n, dtype="float64").to(call.device) * step + start).cast(dt)
    return Tensor.arange(n, dtype="int64").to(call.device).cast(dt) * step + start


@register(aten.fill_.Scalar, aten.fill_.Tensor, table=INPLACE)
def _fill_(call: OpCall, x: Tensor, value: Any) -> Tensor:
    return as_tensor(value, x.dtype, call.device).reshape((1,) * x.ndim).expand(x.shape)


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
