"""Reductions and cumulative scans (API.md G13, G14)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from fusegrad.dtype import DTypeLike, dtypes, sum_acc_dtype, to_dtype
from fusegrad.helpers import prod
from fusegrad.uop.ops import Ops

if TYPE_CHECKING: from fusegrad.tensor import Tensor

Scalar = int | float | bool

class ReduceMixin:
  def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
    acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
    out = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
    return out.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) else out
  def prod(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
    return self.cast(to_dtype(dtype) if dtype is not None else self.dtype)._reduce(Ops.MUL, axis, keepdim)
  def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    if dtypes.is_unsigned(self.dtype): return self.dtype.max - (self.dtype.max - self).max(axis, keepdim)
    if self.dtype is dtypes.bool: return self.logical_not().max(axis, keepdim).logical_not()
    return -((-self).max(axis, keepdim))
  def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    out_dt = self.dtype if dtypes.is_float(self.dtype) else dtypes.float32
    count = prod(d for i, d in enumerate(self.shape) if i in self._axes(axis))
    total = self.cast(out_dt).sum(axis, keepdim)
    return total.div(count) if count else total * math.nan
  def any(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self.cast(dtypes.bool)._reduce(Ops.MAX, axis, keepdim)
  def all(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self.logical_not().any(axis, keepdim).logical_not()
