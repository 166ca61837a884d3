"""Movement: shape, layout, combine, tile and window (API.md G15, G16)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from fusegrad.dtype import dtypes
from fusegrad.helpers import argfix, prod
from fusegrad.tensor_ops.shapes import check_shape, pad_pairs
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING: from fusegrad.tensor import Tensor

Scalar = int | float | bool

class MovementMixin:
  def reshape(self, shape: Any, *args: Any) -> Tensor:
    new = list(argfix(shape, *args))
    new = [self.shape[i] if d is None else d for i, d in enumerate(new)]
    if sum(1 for d in new if d == -1) > 1: raise RuntimeError(f"only one dimension can be inferred in reshape {tuple(new)}")
    if -1 in new:
      known = prod(d for d in new if d != -1)
      if known == 0 or self.numel() % known: raise ValueError(f"cannot reshape {self.shape} into {tuple(new)}")
      new[new.index(-1)] = self.numel() // known
    shape_t = check_shape(tuple(new))
    if prod(shape_t) != self.numel(): raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) into {shape_t}")
    return self if shape_t == self.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape_t))
  def view(self, shape: Any, *args: Any) -> Tensor: return self.reshape(shape, *args)
  def expand(self, shape: Any, *args: Any) -> Tensor:
    new = argfix(shape, *args)
    if len(new) < self.ndim: raise ValueError(f"expand to {new} has fewer dims than {self.shape}")
    padded = (None,) * (len(new) - self.ndim) + self.shape
    target = tuple(s if d in (-1, None) else d for s, d in zip(padded, new))
    if any(t is None for t in target): raise ValueError(f"cannot keep a new leading dim with -1 in expand {new}")
    return self._broadcast_to(check_shape(target))
  def permute(self, order: Any, *args: Any) -> Tensor:
    order_t = tuple(self._axis(a) for a in argfix(order, *args))
    if sorted(order_t) != list(range(self.ndim)):
      raise RuntimeError(f"permute order {argfix(order, *args)} is not a permutation of {self.ndim} dims")
    return self if order_t == tuple(range(self.ndim)) else self._new(UOp(Ops.PERMUTE, self.dtype, (self.uop,), order_t))
  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    a, b = self._axis(dim0), self._axis(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._axis(start_dim), self._axis(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
    d = self._axis(dim)
    return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])
  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(tuple(d for d in self.shape if d != 1))
    if self.ndim == 0: return self
    d = self._axis(dim)
    return self.reshape(self.shape[:d] + self.shape[d + 1:]) if self.shape[d] == 1 else self
  def unsqueeze(self, dim: int) -> Tensor:
    d = self._axis(dim, extra=1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])
  def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
    if len(arg) != self.ndim: raise ValueError(f"shrink needs one entry per dim ({self.ndim}), got {len(arg)}")
    bounds = tuple((0, s) if a is None else (int(a[0]), int(a[1])) for a, s in zip(arg, self.shape))
    for (b, e), s in zip(bounds, self.shape):
      if not 0 <= b <= e <= s: raise ValueError(f"shrink bounds {tuple(arg)} are invalid for shape {self.shape}")
    if all(b == 0 and e == s for (b, e), s in zip(bounds, self.shape)): return self
    return self._new(UOp(Ops.SHRINK, self.dtype, (self.uop,), bounds))
  def flip(self, axis: Any, *args: Any) -> Tensor:
    axes = [self._axis(a) for a in argfix(axis, *args)]
    if len(set(axes)) != len(axes): raise RuntimeError(f"flip axis {argfix(axis, *args)} repeats a dimension")
    return self._new(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim)))) if axes else self
  def pad(self, padding: Sequence[int] | Sequence[tuple[int, int] | None], mode: str = "constant", value: Scalar = 0.0) -> Tensor:
    if mode != "constant": raise NotImplementedError(f"pad mode {mode!r} is not implemented yet (only 'constant')")
    pads = pad_pairs(padding, self.ndim)
    # negative amounts crop first
    t = self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pads, self.shape)))
    pos = tuple((max(b, 0), max(a, 0)) for b, a in pads)
    if all(p == (0, 0) for p in pos): return t
    out = t._new(UOp(Ops.PAD, t.dtype, (t.uop,), pos))
    if value == 0: return out
    inside = Tensor.ones(t.shape, dtype=dtypes.bool, device=t.device)._new_pad(pos)
    return inside.where(out, value)
  def _new_pad(self, pos: tuple[tuple[int, int], ...]) -> Tensor: return self._new(UOp(Ops.PAD, self.dtype, (self.uop,), pos))
