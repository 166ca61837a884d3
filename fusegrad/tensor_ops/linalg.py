"""Linear algebra (API.md G18)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from fusegrad.dtype import DTypeLike

if TYPE_CHECKING: from fusegrad.tensor import Tensor

Scalar = int | float | bool

class LinalgMixin:
  def dot(self, w: Tensor, dtype: DTypeLike | None = None) -> Tensor:
    if self.ndim == 0 or w.ndim == 0: raise RuntimeError(f"dot needs tensors of at least 1 dim, got shapes {self.shape} and {w.shape}")
    k = self.shape[-1]
    wk = w.shape[-2] if w.ndim >= 2 else w.shape[0]
    if k != wk: raise RuntimeError(f"matmul shape mismatch: {self.shape} @ {w.shape} ({k} != {wk})")
    if w.ndim == 1: products = self * w
    elif self.ndim == 1: products = self.reshape(1, k) * w.transpose(-1, -2)
    else: products = self.reshape(self.shape[:-1] + (1, k)) * w.transpose(-1, -2).unsqueeze(-3)
    if dtype is not None: return products.sum(-1, dtype=dtype)
    return products.sum(-1).cast(products.dtype)
  def matmul(self, x: Tensor, reverse: bool = False, dtype: DTypeLike | None = None) -> Tensor:
    return x.dot(self, dtype=dtype) if reverse else self.dot(x, dtype=dtype)
