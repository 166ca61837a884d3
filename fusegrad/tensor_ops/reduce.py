"""Reductions and cumulative scans (docs/api.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from fusegrad.dtype import DType, DTypeLike, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype
from fusegrad.helpers import SUM_DTYPE, ceildiv
from fusegrad.uop.ops import Ops, UOp, reduce_identity
from fusegrad.uop.sint import canonical, sprod, ssub

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool
Axis = int | Sequence[int] | None

# a scan over a longer axis runs in blocks of this size, so its work is O(n * SCAN_BLOCK) rather than O(n^2) (measured
# cumsum: 32 runs 2048x1024 2x, 1M 1.8x and 64x100000 11x faster than 256; 16 and 64 slower than 32)
SCAN_BLOCK = 32


def _acc_dtype(dt: DType) -> DType:
    """Accumulation dtype of sum; SUM_DTYPE can only widen a float accumulator."""
    acc = sum_acc_dtype(dt)
    return least_upper_dtype(acc, to_dtype(SUM_DTYPE.value)) if dtypes.is_float(acc) and SUM_DTYPE.value else acc


def _drop_axes(t: Tensor, axes: tuple[int, ...]) -> Tensor:
    return t.reshape(tuple(d for i, d in enumerate(t.shape) if i not in axes))


def _nonfinite_to_zero(t: Tensor) -> Tensor:
    return (t.abs() == math.inf).where(0, t)


def _shift_right(t: Tensor, fill: Scalar) -> Tensor:
    """t moved one step along the last axis: out[..., 0] = fill, out[..., i] = t[..., i-1]."""
    return t.pad(tuple((0, 0) for _ in t.shape[:-1]) + ((1, 0),), value=fill).shrink(tuple((0, d) for d in t.shape))


def _masked_rows(x: Tensor, fill: Scalar) -> Tensor:
    """(..., n) -> (..., n, n) view whose row i holds x[..., :i+1], then `fill` (no memory: it fuses into a reduce)."""
    n = x.shape[-1]
    pos = type(x).arange(n, device=x.device)
    keep = pos.reshape(n, 1) >= pos.reshape(1, n)
    return keep.where(x.unsqueeze(-2).expand(*x.shape[:-1], n, n), fill)


def _log_add_exp(a: Tensor, b: Tensor) -> Tensor:
    shift = _nonfinite_to_zero(a.maximum(b).detach())
    return ((a - shift).exp() + (b - shift).exp()).log() + shift


def _window_logsumexp(x: Tensor) -> Tensor:
    # shifting every row by its own running max keeps exp() <= 1, so early tiny terms are not lost to a later big max
    shift = _nonfinite_to_zero(_masked_rows(x, -math.inf)._reduce(Ops.MAX, -1, False).detach())
    return (_masked_rows(x, -math.inf) - shift.unsqueeze(-1)).exp()._reduce(Ops.ADD, -1, False).log() + shift


class _Scan(NamedTuple):
    """An associative scan: how to scan a short axis, reduce a block, and fold a prefix into a block's scan."""

    window: Callable[[Tensor], Tensor]
    total: Callable[[Tensor], Tensor]
    combine: Callable[[Tensor, Tensor], Tensor]
    identity: Callable[[DType], Scalar]


def _alu_scan(op: Ops, combine: Callable[[Tensor, Tensor], Tensor]) -> _Scan:
    return _Scan(
        lambda x: _masked_rows(x, reduce_identity(op, x.dtype))._reduce(op, -1, False),
        lambda x: x._reduce(op, -1, False),
        combine,
        lambda dt: reduce_identity(op, dt),
    )


SCANS = {
    "sum": _alu_scan(Ops.ADD, lambda a, b: a + b),
    "prod": _alu_scan(Ops.MUL, lambda a, b: a * b),
    "max": _alu_scan(Ops.MAX, lambda a, b: a.maximum(b)),
    "logsumexp": _Scan(_window_logsumexp, lambda x: x.logsumexp(-1), _log_add_exp, lambda dt: -math.inf),
}


def _scan_last(x: Tensor, scan: _Scan) -> Tensor:
    """Inclusive scan along the last axis. A long axis is cut into blocks: scan inside each block, scan the block totals
    (recursively), and fold each block's preceding total into it."""
    n = x.shape[-1]
    if n <= SCAN_BLOCK:
        return scan.window(x)
    nb, lead = ceildiv(n, SCAN_BLOCK), x.shape[:-1]
    keep_lead = tuple((0, 0) for _ in lead)
    blocks = x.pad(keep_lead + ((0, nb * SCAN_BLOCK - n),), value=scan.identity(x.dtype)).reshape(*lead, nb, SCAN_BLOCK)
    before = _shift_right(_scan_last(scan.total(blocks), scan), scan.identity(x.dtype))
    out = scan.combine(before.unsqueeze(-1), scan.window(blocks))
    return out.reshape(*lead, nb * SCAN_BLOCK).shrink(tuple((0, d) for d in lead) + ((0, n),))


class ReduceMixin:
    # ------------------------------------------------------------------ reductions (G13)
    def _reduced_count(self, axis: Axis) -> int:
        return sprod(self.shape[i] for i in self._axes(axis))

    def _order_flip(self) -> Tensor:
        """An order-reversing bijection (negation, bitwise not), so min/argmin/cummin reuse the max code;
        NaN stays NaN."""
        if dtypes.is_float(self.dtype):
            return -self
        return self.logical_not() if self.dtype is dtypes.bool else ~self

    def _float(self) -> Tensor:
        return self.cast(least_upper_float(self.dtype))

    def sum(self, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
        if dtype is not None:
            return self.cast(to_dtype(dtype))._reduce(Ops.ADD, axis, keepdim)
        out = self.cast(_acc_dtype(self.dtype))._reduce(Ops.ADD, axis, keepdim)
        return out.cast(self.dtype) if dtypes.is_float(self.dtype) else out

    def prod(self, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
        out_dt = to_dtype(dtype) if dtype is not None else self.dtype
        if out_dt is dtypes.bool:
            return self.all(axis, keepdim)
        acc = dtypes.float32 if dtypes.is_float(out_dt) and out_dt.itemsize < 4 else out_dt
        return self.cast(acc)._reduce(Ops.MUL, axis, keepdim).cast(out_dt)

    def max(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        return self._order_flip()._reduce(Ops.MAX, axis, keepdim)._order_flip()

    def any(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        return self.cast(dtypes.bool)._reduce(Ops.MAX, axis, keepdim)

    def all(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        return self.logical_not().any(axis, keepdim).logical_not()

    def mean(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        out_dt = self.dtype if dtypes.is_float(self.dtype) else dtypes.float32
        count = self._reduced_count(axis)
        total = self.cast(out_dt).sum(axis, keepdim, dtype=_acc_dtype(out_dt))
        # over zero elements the mean is nan, like torch
        return (total / count if count else total * math.nan).cast(out_dt)

    def var(self, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> Tensor:
        x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.float32)
        squares = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim)
        count = self._reduced_count(axis)
        if isinstance(count, UOp):  # a symbolic count: max(count - correction, 0) is computed in the kernel
            if correction != int(correction):
                raise NotImplementedError(f"var over a symbolic count takes an integer correction, got {correction}")
            return squares / canonical(ssub(count, int(correction)).maximum(0))
        return squares / max(count - correction, 0)

    def std(self, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> Tensor:
        variance = self.var(axis, keepdim, correction)
        # like torch, a zero deviation has zero gradient (not the infinite slope of sqrt at 0 times 0)
        is_zero = variance == 0
        return is_zero.where(0, is_zero.where(1, variance).sqrt())

    def var_mean(self, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> tuple[Tensor, Tensor]:
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self, axis: Axis = None, keepdim: bool = False, correction: float = 1) -> tuple[Tensor, Tensor]:
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        if axis is None:
            flat = self.flatten().argmax(0)
            return flat.reshape((1,) * self.ndim) if keepdim else flat
        ax = self._axis(axis)
        if self.ndim == 0:
            return type(self).zeros((), dtype=dtypes.int32, device=self.device)
        n = self.shape[ax]
        if n == 0:
            raise IndexError(f"argmax/argmin: dimension {axis} of shape {self.shape} is empty")
        hit = self == self.max(ax, keepdim=True)
        # a NaN is the maximum (max propagates it), and NaN == NaN is false
        if dtypes.is_float(self.dtype):
            hit = hit | self.ne(self)
        # the first hit has the largest n - position
        from_end = type(self).arange(n, 0, -1, device=self.device).reshape((n,) + (1,) * (self.ndim - ax - 1))
        return (n - hit.where(from_end, 0).max(ax, keepdim)).cast(dtypes.int32)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        return self._order_flip().argmax(axis, keepdim)

    def logsumexp(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        x, axes = self._float(), self._axes(axis)
        # shift by the max (detached: the result does not depend on it); an infinite max would turn into nan, so skip it
        shift = _nonfinite_to_zero(x.max(axes, keepdim=True).detach())
        out = (x - shift).exp().sum(axes, keepdim=True).log() + shift
        return out if keepdim else _drop_axes(out, axes)

    def _exp_shifted(self, axis: int, dtype: DTypeLike | None) -> tuple[Tensor, Tensor]:
        """(x - max, its exp's sum) along axis, the shared part of the softmax family."""
        x = self.cast(dtype) if dtype is not None else self._float()
        shifted = x - x.max(axis, keepdim=True).detach()
        return shifted, shifted.exp().sum(axis, keepdim=True)

    def softmax(self, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
        shifted, total = self._exp_shifted(axis, dtype)
        return shifted.exp() / total

    def log_softmax(self, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
        shifted, total = self._exp_shifted(axis, dtype)
        return shifted - total.log()

    def softmin(self, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
        x = self.cast(dtype) if dtype is not None else self._float()
        return (-x).softmax(axis)

    def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        x = self._float()
        magnitude = x.abs()
        if p == 0:
            norm = (x != 0).sum(dim, keepdim=True).cast(x.dtype)
        elif p == math.inf:
            norm = magnitude.max(dim, keepdim=True)
        elif p == -math.inf:
            norm = magnitude.min(dim, keepdim=True)
        elif p == 1:
            norm = magnitude.sum(dim, keepdim=True)
        else:
            powered = magnitude.pow(p).sum(dim, keepdim=True)
            # the root's slope is infinite at 0: take the root of 1 there (and discard it),
            # so the zero vector's gradient stays finite
            is_zero = powered == 0
            norm = is_zero.where(0, is_zero.where(1, powered).pow(1 / p))
        return x / norm.maximum(eps)

    # ------------------------------------------------------------------ cumulative scans (G14)
    def _cumulative(self, axis: int, scan: _Scan) -> Tensor:
        ax = self._axis(axis)
        if self.ndim == 0:
            return self
        last = self.ndim - 1
        return _scan_last(self.transpose(ax, last), scan).transpose(ax, last)

    def cumsum(self, axis: int = 0) -> Tensor:
        out = self.cast(_acc_dtype(self.dtype))._cumulative(axis, SCANS["sum"])
        return out.cast(self.dtype) if dtypes.is_float(self.dtype) else out

    def cumprod(self, axis: int) -> Tensor:
        acc = dtypes.float32 if dtypes.is_float(self.dtype) and self.dtype.itemsize < 4 else self.dtype
        return self.cast(acc)._cumulative(axis, SCANS["prod"]).cast(self.dtype)

    def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        values = self._cumulative(axis, SCANS["max"])
        if self.ndim == 0:
            return values, type(self).zeros((), dtype=dtypes.int32, device=self.device)
        ax = self._axis(axis)
        n = self.shape[ax]
        along = tuple((0, 0) if i != ax else (1, 0) for i in range(self.ndim))
        before = values.pad(along).shrink(tuple((0, d) for d in self.shape))
        # the running max first holds its value where it changes; NaN != NaN, but a NaN run keeps its first position
        rises = values != before
        if dtypes.is_float(self.dtype):
            rises = rises & (values.eq(values) | before.eq(before))
        pos = type(self).arange(n, device=self.device).reshape((n,) + (1,) * (self.ndim - ax - 1))
        return values, rises.where(pos, 0)._cumulative(ax, SCANS["max"])

    def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        values, indices = self._order_flip().cummax(axis)
        return values._order_flip(), indices

    def logcumsumexp(self, axis: int = 0) -> Tensor:
        return self._float()._cumulative(axis, SCANS["logsumexp"])
