"""Indexing, gather and scatter (API.md G17)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING: from fusegrad.tensor import Tensor

Scalar = int | float | bool

class IndexingMixin:
  def __getitem__(self, indices: Any) -> Tensor:
    idx = list(indices) if isinstance(indices, tuple) else [indices]
    for i in idx:
      if isinstance(i, (Tensor, list, np.ndarray)): raise NotImplementedError("tensor and list indices are not supported yet")
      if isinstance(i, (bool, float)): raise IndexError(f"index {i!r} of type {type(i).__name__} is not supported")
      if not isinstance(i, (int, slice, type(None), type(Ellipsis))): raise IndexError(f"unsupported index {i!r}")
    if sum(i is Ellipsis for i in idx) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > self.ndim: raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    if Ellipsis in idx:
      e = idx.index(Ellipsis)
      idx = idx[:e] + [slice(None)] * (self.ndim - n_real) + idx[e + 1:]
    else: idx += [slice(None)] * (self.ndim - n_real)
    t, dim, new_shape = self, 0, []
    for i in idx:
      if i is None:
        new_shape.append(1)
        continue
      size = t.shape[dim]
      if isinstance(i, int):
        if not -size <= i < size: raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
        i = i + size if i < 0 else i
        t = t._slice_dim(dim, i, 1, 1)
      else:
        if i.step == 0: raise ValueError("slice step cannot be zero")
        for v in (i.start, i.stop, i.step):
          if v is not None and not isinstance(v, int): raise TypeError(f"slice bounds must be ints or None, got {v!r}")
        start, stop, step = i.indices(size)
        count = len(range(start, stop, step))
        t = t._slice_dim(dim, start, count, step)
        new_shape.append(count)
      dim += 1
    return t.reshape(tuple(new_shape))
  def _slice_dim(self, dim: int, start: int, count: int, step: int) -> Tensor:
    """Take `count` elements from `start` with stride `step` along dim, as flip/shrink/pad/reshape views."""
    t, size = self, self.shape[dim]
    if count == 0: return t.shrink(tuple((0, 0) if d == dim else None for d in range(t.ndim)))
    if step < 0: t, start, step = t.flip(dim), size - 1 - start, -step
    t = t.shrink(tuple((start, start + (count - 1) * step + 1) if d == dim else None for d in range(t.ndim)))
    if step == 1: return t
    t = t.pad(tuple((0, count * step - t.shape[dim]) if d == dim else (0, 0) for d in range(t.ndim)))
    t = t.reshape(t.shape[:dim] + (count, step) + t.shape[dim + 1:])
    t = t.shrink(tuple((0, 1) if d == dim + 1 else None for d in range(t.ndim)))
    return t.reshape(t.shape[:dim + 1] + t.shape[dim + 2:])
