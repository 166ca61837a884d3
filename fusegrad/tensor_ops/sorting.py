"""Sorting, selection and miscellaneous (API.md G20).

Sorting compares order rows (an order-preserving integer key of each value plus its position), so the order is
total and the sort stable. Long rows go through a bitonic network over the row padded to a power of two:
log2(n)*(log2(n)+1)/2 compare-exchange steps built from movement ops and `where`, a few steps per kernel. Short rows
are ranked instead (all pairs compared in one reduce). Float values ride along, so their gradient flows back through
the same exchanges (each network kernel materializes its gradient, see contiguous_backward)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from fusegrad.dtype import DType, dtypes
from fusegrad.uop.ops import Ops

if TYPE_CHECKING: from fusegrad.tensor import Tensor  # noqa: I001, TC004 (bound at runtime, see tensor_ops/__init__.py)

Scalar = int | float | bool

# compare-exchange steps fused into one kernel: a kernel reads 2**STEPS_PER_KERNEL rows per output, and each kernel
# costs a compile, so a few steps per kernel is the balance
STEPS_PER_KERNEL = 3
# rows up to this length are sorted by ranking all pairs: for short rows that is less work and far fewer kernels
RANK_SORT_MAX = 64

def _order_key(v: Tensor, descending: bool) -> Tensor:
  """Unsigned integers whose order is the sort order of v: -0 equals +0, NaN is the largest value (like torch)."""
  dt = v.dtype
  wide = dt.itemsize == 8
  key_dt = dtypes.uint64 if wide else dtypes.uint32
  sign = 1 << (key_dt.bitsize - 1)
  if dtypes.is_float(dt):
    f = v.cast(dtypes.float64 if wide else dtypes.float32)
    bits = f.eq(0).where(0, f).bitcast(key_dt)
    bits = f.ne(f).where(0x7FF8000000000000 if wide else 0x7FC00000, bits)  # one NaN pattern, above +inf
    # IEEE floats order like sign-magnitude integers: flip negatives entirely, set the sign bit of positives
    key = (bits >= sign).where(~bits, bits | sign)
  elif dtypes.is_unsigned(dt) or dt is dtypes.bool: key = v.cast(key_dt)
  else: key = v.cast(dtypes.int64 if wide else dtypes.int32).bitcast(key_dt) ^ sign
  return ~key if descending else key

def _last_value(dt: DType, descending: bool) -> Scalar:
  """A value that sorts after every other one (ties go to the smaller index, so padding stays behind real data)."""
  if dtypes.is_float(dt): return -float("inf") if descending else float("nan")
  return dt.min if descending else dt.max

def _decode_key(key: Tensor, dt: DType, descending: bool) -> Tensor:
  """The integer or bool value of an order key (the inverse of _order_key for non-float dtypes)."""
  key = ~key if descending else key
  if dtypes.is_unsigned(dt) or dt is dtypes.bool: return key.cast(dt)
  return (key ^ (1 << (key.dtype.bitsize - 1))).bitcast(dtypes.int64 if key.dtype.itemsize == 8 else dtypes.int32).cast(dt)

def _precedes(a: list[Tensor], b: list[Tensor]) -> Tensor:
  """a < b, comparing the lists of order tensors lexicographically."""
  less = a[-1] < b[-1]
  for x, y in zip(reversed(a[:-1]), reversed(b[:-1])): less = (x < y) | (x.eq(y) & less)
  return less

OrderOf = Callable[[list["Tensor"]], list["Tensor"]]

def _sort_state(x: Tensor, descending: bool) -> tuple[list[Tensor], OrderOf]:
  """The tensors a sort moves around, and how to read their order (tensors compared lexicographically): the key
  and the position, so the order is total and ties keep their original order."""
  n = x.shape[-1]
  position = Tensor.arange(n, device=x.device).reshape((1,) * (x.ndim - 1) + (n,)).expand(x.shape)
  # no room to pack a 64-bit key with its position: move the values and positions, and key the values on the fly
  if x.dtype.itemsize == 8: return [x, position], lambda state: [_order_key(state[0], descending), state[1]]
  packed = (_order_key(x, descending).cast(dtypes.uint64) << 32) | position.cast(dtypes.uint64)
  # floats also move their values, so the gradient can follow them back
  return [packed, x] if dtypes.is_float(x.dtype) else [packed], lambda state: [state[0]]

def _sorted_result(state: list[Tensor], dt: DType, descending: bool) -> tuple[Tensor, Tensor]:
  """(values, int32 positions) from a sorted state."""
  if dt.itemsize == 8: return state[0], state[1]
  index = (state[0] & 0xFFFFFFFF).cast(dtypes.int32)
  return state[1] if len(state) > 1 else _decode_key((state[0] >> 32).cast(dtypes.uint32), dt, descending), index

def _rank_sort(x: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
  """Stable sort of short rows: an element's rank is how many elements precede it, then each rank picks its element
  (one reduce each over all pairs: O(n^2) work, but three kernels instead of a network's dozens)."""
  n = x.shape[-1]
  state, order_of = _sort_state(x, descending)
  order = order_of(state)
  rank = _precedes([o.unsqueeze(-2) for o in order], [o.unsqueeze(-1) for o in order]).cast(dtypes.int32).sum(-1)
  rank_is = rank.unsqueeze(-2).eq(Tensor.arange(n, device=x.device).reshape(n, 1))  # [..., r, i]: element i has rank r
  def pick(t: Tensor) -> Tensor: return rank_is.where(t.unsqueeze(-2), False if t.dtype is dtypes.bool else 0)._reduce(Ops.ADD, -1, False)
  return _sorted_result([pick(t) for t in state], x.dtype, descending)

def _bitonic_steps(n: int) -> Iterator[tuple[int, bool]]:
  """(block, mirrored) per compare-exchange step of a bitonic sort of n = 2**k elements: each merge first compares
  mirrored positions of its block (so every comparator sorts ascending), then halves of ever smaller blocks."""
  merge = 2
  while merge <= n:
    yield merge, True
    block = merge // 2
    while block >= 2:
      yield block, False
      block //= 2
    merge *= 2

def _compare_exchange(state: list[Tensor], order_of: OrderOf, block: int, mirrored: bool) -> list[Tensor]:
  """One network step along the last axis: in every block the lower half keeps the first, the upper half the later
  of each pair (element, partner), where the partner is the mirrored or the same position in the other half."""
  shape = state[0].shape
  view = shape[:-1] + (shape[-1] // block, 2, block // 2)
  own = [t.reshape(view) for t in state]
  partner = [t.flip((-2, -1) if mirrored else (-2,)) for t in own]
  lower = Tensor.arange(2, device=own[0].device).reshape(2, 1).eq(0)
  take = lower.eq(_precedes(order_of(partner), order_of(own)))
  return [take.where(p, o).reshape(shape) for p, o in zip(partner, own)]

def _bitonic_sort(x: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
  """Stable sort along the last axis, whose length is a power of two, by the bitonic network."""
  state, order_of = _sort_state(x, descending)
  steps = list(_bitonic_steps(x.shape[-1]))
  for first in range(0, len(steps), STEPS_PER_KERNEL):
    for block, mirrored in steps[first:first + STEPS_PER_KERNEL]: state = _compare_exchange(state, order_of, block, mirrored)
    state = [t.contiguous().contiguous_backward() if dtypes.is_float(t.dtype) else t.contiguous() for t in state]
  return _sorted_result(state, x.dtype, descending)

def _sort_last(x: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
  n = x.shape[-1]
  if n <= RANK_SORT_MAX: return _rank_sort(x, descending)
  size = 1 << (n - 1).bit_length()
  # the padding sorts last: its key is the largest, and it loses ties by position
  padded = x.pad(((0, 0),) * (x.ndim - 1) + ((0, size - n),), value=_last_value(x.dtype, descending)) if size > n else x
  values, index = _bitonic_sort(padded, descending)
  keep = tuple((0, d) for d in x.shape)
  return values.shrink(keep), index.shrink(keep)

class SortingMixin:
  def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    ax = self._axis(dim)
    if self.ndim == 0: return self, Tensor.zeros((), dtype=dtypes.int32, device=self.device)
    last = self.ndim - 1
    x = self.transpose(ax, last)
    n = x.shape[-1]
    if n <= 1 or not x.numel(): return self, Tensor.zeros(self.shape, dtype=dtypes.int32, device=self.device)
    values, index = _sort_last(x, descending)
    return values.transpose(ax, last), index.transpose(ax, last)
  def argsort(self, dim: int = -1, descending: bool = False) -> Tensor: return self.sort(dim, descending)[1]
  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
    if not sorted_: raise NotImplementedError("topk(sorted_=False) is not supported; results always come sorted")
    ax = self._axis(dim)
    size = self.shape[ax] if self.ndim else 1
    if not 0 <= k <= size: raise ValueError(f"topk: k={k} is out of range for dimension {dim} of size {size}")
    values, index = self.sort(ax, descending=largest)
    if not self.ndim: return values, index
    keep = tuple((0, k) if i == ax else (0, d) for i, d in enumerate(self.shape))
    return values.shrink(keep), index.shrink(keep)
  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    if self.ndim not in (1, 2): raise RuntimeError(f"multinomial needs a 1-D or 2-D weight tensor, got shape {self.shape}")
    if num_samples < 1: raise RuntimeError(f"multinomial needs num_samples >= 1, got {num_samples}")
    categories = self.shape[-1]
    if not replacement and num_samples > categories:
      raise RuntimeError(f"cannot draw {num_samples} samples without replacement from {categories} categories")
    weights = self._float().reshape(-1, categories)
    rows = weights.shape[0]
    if replacement:
      # inverse CDF: the sample is the number of cumulative weights at or below a uniform draw
      cdf = weights.cumsum(1)
      cdf = cdf / cdf[:, -1:]
      draws = Tensor.rand(rows, num_samples, 1, device=self.device)
      picked = (cdf.unsqueeze(1) <= draws).sum(2).minimum(categories - 1)
    else:
      # exponential race: the categories reaching E/w first (E ~ Exp(1)) are a weighted draw without replacement
      arrival = -(1 - Tensor.rand(rows, categories, device=self.device)).log() / weights
      picked = arrival.argsort(1)[:, :num_samples]
    return picked.cast(dtypes.int32).reshape(self.shape[:-1] + (num_samples,))
