"""Indexing, gather and scatter (docs/api.md).

Advanced indexing (`t[idx]`, nn.Embedding) loads rows through the index: a GATHER node, which the lowerer turns into
a load whose address holds the loaded index, so its cost is the size of the result, not result x table rows. Its
gradient is a scatter-add: the one-hot masked sum over the picked positions. Everything else picks element j of an
axis by a one-hot comparison of the index against an ARANGE followed by a masked reduce over that axis, which the
scheduler fuses into one kernel and whose gradient (a masked sum, so duplicate indices accumulate) comes from the
primitive rules."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from fusegrad.lazy_numpy import np

from fusegrad.dtype import dtypes
from fusegrad.engine.checks import IndexCheck, register_check
from fusegrad.gradient import register_gradient
from fusegrad.helpers import CHECK_OOB, prod
from fusegrad.runtime.buffers import base_buffer, host_values, is_contiguous_view
from fusegrad.tensor_ops.base import TensorBase
from fusegrad.tensor_ops.shapes import broadcast_shape, check_sym
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.sint import sadd, ssub

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool
SCATTER_REDUCES = ("sum", "prod", "mean", "amax", "amin")
NO_MASKS = "boolean masks: use masked_select or where"


class _IndexPlan(NamedTuple):
    """An index split into its basic part (one (start, count, step) window per dim, then a reshape that drops int dims
    and adds None dims) and its advanced part (integer tensors applied to dims of that view)."""

    windows: tuple[tuple[int, int, int], ...]
    view_shape: tuple[int, ...]
    adv_dims: tuple[int, ...]
    adv_index: tuple[Tensor, ...]
    adv_source_dims: tuple[int, ...] = ()  # the dims of the indexed tensor the advanced indices address


def _const(like: Tensor, value: Scalar) -> Tensor:
    """A 0-d constant of like's dtype (a plain scalar would promote bool and int tensors)."""
    return like._new(UOp.const(like.dtype, value))


def _masked_sum(hit: Tensor, x: Tensor, axis: int) -> Tensor:
    """Sum over `axis` of x where hit, in x's dtype; exact when at most one element per output is hit."""
    picked = hit.where(x, _const(x, 0))
    return picked._reduce(Ops.MAX if x.dtype is dtypes.bool else Ops.ADD, axis, False)


def _inverse(order: Sequence[int]) -> list[int]:
    return sorted(range(len(order)), key=lambda i: order[i])


def _adv_order(view_ndim: int, dims: tuple[int, ...], n_batch: int) -> list[int]:
    """Result dims as a permutation of (broadcast index dims, remaining view dims): numpy puts the index dims where the
    indexed dims were when those are adjacent, else first."""
    n_rest = view_ndim - len(dims)
    if dims != tuple(range(dims[0], dims[0] + len(dims))):
        return list(range(n_batch + n_rest))
    p = dims[0]
    return list(range(n_batch, n_batch + p)) + list(range(n_batch)) + list(range(n_batch + p, n_batch + n_rest))


def check_index_bounds(op: str, bound: str, index: Tensor, low: int, size: int, *guarded: Tensor) -> None:
    """Under CHECK_OOB, make every realize that computes one of `guarded` first check low <= index < size in a
    kernel (engine/checks.py); otherwise out-of-range values read as 0 / write nowhere."""
    if not CHECK_OOB:
        return
    i = index.cast(dtypes.int64).reshape(-1)
    # ~min(i) == max(~i): both extremes come from one max reduce, with no overflow at int64's minimum
    extremes = type(i).stack(~i, i).max(axis=1)
    device = extremes.device[0] if isinstance(extremes.device, tuple) else extremes.device
    check = IndexCheck(op, bound, low, size, extremes.to(device).uop, device)
    register_check(check, *(t.uop for t in guarded))


def _flat_index(
    indices: Sequence[Tensor], sizes: Sequence[int], shape: tuple[int, ...], op: str, dims: Sequence[int]
) -> Tensor:
    """Row-major position in a block of `sizes` addressed by the broadcast indices (of the tensor's `dims`);
    -1 where any index is out of range."""
    big = prod(sizes) >= 2**31 or any(i.dtype.itemsize == 8 or i.dtype is dtypes.uint32 for i in indices)
    wide, device, tensor_class = dtypes.int64 if big else dtypes.int32, indices[0].device, type(indices[0])
    flat = tensor_class.zeros(shape, dtype=wide, device=device)
    valid = tensor_class.ones(shape, dtype=dtypes.bool, device=device)
    for index, size in zip(indices, sizes):
        i = index.cast(wide)._broadcast_to(shape)
        valid = valid & (i >= -size) & (i < size)
        flat = flat * size + (i < 0).where(i + size, i)
    flat = valid.where(flat, -1).cast(dtypes.int32 if prod(sizes) < 2**31 else dtypes.int64)
    for index, size, dim in zip(indices, sizes, dims):
        check_index_bounds(op, f"dim {dim}", index, -size, size, flat)
    return flat


def gather_rows(table: Tensor, index: Tensor) -> Tensor:
    """out[i..., j...] = table[index[i...], j...] for an integer index (out of range rows read 0), loaded through the
    index; its gradient adds each output row's gradient into the row it came from (repeated rows accumulate).
    A multi-device or symbolically shaped table takes the one-hot path instead."""
    if not dtypes.is_int(index.dtype):
        raise TypeError(f"gather_rows needs integer indices, got {index.dtype}")
    shapes_known = all(isinstance(d, int) for d in table.shape + index.shape)
    if isinstance(table.device, tuple) or isinstance(index.device, tuple) or not shapes_known or table.ndim == 0:
        hit = index.unsqueeze(-1) == index.arange(table.shape[0], device=index.device)
        x = table.reshape((1,) * index.ndim + table.shape)
        return _masked_sum(hit.reshape(hit.shape + (1,) * (table.ndim - 1)), x, index.ndim)
    out = table._new(UOp(Ops.GATHER, table.dtype, (table.uop, index.uop)))
    n, rest, device = table.shape[0], table.shape[1:], table.device
    table_uop, index_uop, tensor_class = table.uop, index.uop, type(table)

    def backward(g: UOp) -> tuple[UOp]:
        grad, idx = tensor_class(g, device=device), tensor_class(index_uop, device=device).reshape(-1)
        hit = (idx.reshape(-1, 1) == tensor_class.arange(n, device=device)).reshape(
            (idx.shape[0], n) + (1,) * len(rest)
        )
        picked = hit.where(grad.reshape((idx.shape[0], 1) + rest), _const(grad, 0))
        return (picked.sum(0, dtype=grad.dtype).cast(table_uop.dtype).uop,)

    if dtypes.is_float(table.dtype):
        register_gradient(out.uop, (table_uop,), backward)
    return out


def _one_hot_axis(index: Tensor, d: int, size: int, op: str) -> Tensor:
    """hit[..., i, k, ...] = (index[..., i, ...] == k): a one-hot axis of length `size` inserted after dim d."""
    k = type(index).arange(size, device=index.device).reshape((size,) + (1,) * (index.ndim - d - 1))
    hit = index.unsqueeze(d + 1) == k
    check_index_bounds(op, f"dim {d}", index, 0, size, hit)
    return hit


def _inclusive_count(flags: Tensor) -> Tensor:
    """Running count of true flags (1-D bool -> int32), in blocks of ~sqrt(n) so the work is n**1.5, not n**2."""
    n = flags.shape[0]
    b = max(math.isqrt(max(n - 1, 0)) + 1, 1)
    a = -(-n // b)
    m = flags.cast(dtypes.int32).pad(((0, a * b - n),)).reshape(a, b)
    kb, ka = type(flags).arange(b, device=flags.device), type(flags).arange(a, device=flags.device)
    within = (kb.reshape(1, b, 1) >= kb.reshape(1, 1, b)).where(m.reshape(a, 1, b), 0).sum(2)
    before = (ka.reshape(a, 1) > ka.reshape(1, a)).where(m.sum(1).reshape(1, a), 0).sum(1)
    return (within + before.reshape(a, 1)).reshape(a * b).shrink(((0, n),))


def _selected(flags: Tensor, size: int | None) -> tuple[Tensor, Tensor]:
    """hit[k, p]: flat position p holds the k-th true flag, for k < size (size=None: all of them, read back to host);
    and valid[k]: there is a k-th true flag."""
    if size is None:
        size = int(flags.cast(dtypes.int32).sum().item())
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    k = type(flags).arange(size, device=flags.device).reshape(size, 1)
    hit = flags.reshape(1, -1) & (_inclusive_count(flags).reshape(1, -1) == k + 1)
    return hit, hit.any(1)


# ops that only change how a tensor reads the node below it: writing through them writes that node's storage
_VIEW_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP, Ops.DETACH)


def _view_chain(u: UOp) -> tuple[UOp, list[UOp]]:
    """The node under u's chain of view ops, and that chain from u downwards."""
    u, views = u.peel_chain(_VIEW_OPS)
    return u, views


def view_base(u: UOp) -> UOp:
    """The node a tensor views: what writing through its view ops would write."""
    return _view_chain(u)[0]


def _reject_aliased_writes(views: list[UOp]) -> None:
    for u in views:
        if u.op is Ops.EXPAND:
            raise RuntimeError(
                f"setitem through an expanded view (shape {u.src[0].shape} expanded to {u.shape}): several of its "
                "elements are one element of storage, so the result would depend on write order; write a copy"
            )


def _unview(x: UOp, views: list[UOp]) -> UOp:
    """Carry x, shaped like the top of `views`, back to the shape of the node under them (positions no view element
    reads become 0 / False)."""
    for u in views:
        shape = u.src[0].shape
        if u.op is Ops.RESHAPE:
            x = UOp(Ops.RESHAPE, x.dtype, (x,), shape)
        elif u.op is Ops.PERMUTE:
            x = UOp(Ops.PERMUTE, x.dtype, (x,), tuple(_inverse(u.arg)))
        elif u.op is Ops.FLIP:
            x = UOp(Ops.FLIP, x.dtype, (x,), u.arg)
        elif u.op is Ops.SHRINK:
            x = UOp(Ops.PAD, x.dtype, (x,), tuple((b, s - e) for (b, e), s in zip(u.arg, shape)))
        elif u.op is Ops.PAD:
            x = UOp(Ops.SHRINK, x.dtype, (x,), tuple((b, b + s) for (b, _), s in zip(u.arg, shape)))
    return x


# the views a store follows to its element of storage: each element of the view is one element of storage
_STORE_VIEW_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP)


def _store_view(u: UOp) -> UOp | None:
    """u without its detaches, when every other op down to its BUFFER is a view a store follows; else None."""
    chain = []
    while u.op is not Ops.BUFFER:
        if u.op in _STORE_VIEW_OPS:
            chain.append(u)
        elif u.op is not Ops.DETACH:
            return None
        u = u.src[0]
    for view in reversed(chain):
        u = view.replace(src=(u,))
    return u


def _region_view(t: Tensor, windows: tuple[tuple[Any, Any, int], ...]) -> Tensor:
    """The elements of t that the windows select, shaped (count, ...): shrinks, and for a stride the groups of `step`
    elements of _slice_dim (its pad only completes the last group, whose padded elements are never selected)."""
    for d, (start, count, step) in enumerate(windows):
        if step == 1:
            t = t.shrink(tuple((start, start + count) if i == d else None for i in range(t.ndim)))
        else:
            t = t._slice_dim(d, start, count, step)
    return t


def _symbolic_window(e: slice, size: Any) -> tuple[Any, Any, int]:
    """(start, count, 1) of a slice with a symbolic bound or size: step 1, bounds not clamped (shrink checks them)."""
    if e.step not in (None, 1):
        raise IndexError(f"a slice with a symbolic bound or size takes step 1, got {e.step}")
    start = 0 if e.start is None else e.start
    stop = size if e.stop is None else e.stop
    start, stop = (sadd(v, size) if isinstance(v, int) and v < 0 else v for v in (start, stop))
    return start, ssub(stop, start), 1


class IndexingMixin:
    # ------------------------------------------------------------------ __getitem__ / __setitem__
    def _index_entry(self, i: Any) -> Any:
        """One validated index: int, slice, None, Ellipsis, or an integer Tensor on self's device."""
        if isinstance(i, (bool, np.bool_, float, np.floating)):
            raise IndexError(f"index {i!r} of type {type(i).__name__} is not supported ({NO_MASKS})")
        if isinstance(i, (int, np.integer)):
            return int(i)
        if isinstance(i, UOp):
            return check_sym("index", i)  # a symbolic position (a bound Variable): a shrink of one element
        if i is None or i is Ellipsis:
            return i
        if isinstance(i, slice):
            for v in (i.start, i.stop, i.step):
                if isinstance(v, UOp) and v is not i.step:
                    continue  # a symbolic bound (a bound Variable), checked when the shrink is built
                if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool)):
                    raise TypeError(f"slice bounds must be ints or None, got {type(v).__name__} in {i!r}")
            if i.step == 0:
                raise ValueError("slice step cannot be zero")
            return i
        if isinstance(i, TensorBase):
            if not dtypes.is_int(i.dtype):
                raise IndexError(f"tensors used as indices must be integer tensors, got {i.dtype} ({NO_MASKS})")
            return i.to(self.device)
        if isinstance(i, (list, tuple, np.ndarray)):
            try:
                arr = np.asarray(i)
            except ValueError:
                raise IndexError(f"list index {i!r} is ragged") from None
            if arr.size and arr.dtype.kind not in "iu":
                raise IndexError(f"list index {i!r} must hold only ints, got {arr.dtype} ({NO_MASKS})")
            small = not arr.size or (arr.min() >= -(2**31) and arr.max() < 2**31)
            return type(self)(arr.astype(np.int32 if small else np.int64), device=self.device)
        raise IndexError(f"unsupported index {i!r} of type {type(i).__name__}")

    def _index_plan(self, indices: Any) -> _IndexPlan:
        # like torch, a short top-level list holding sequences, tensors, slices, None or ... is a tuple of indices
        if (
            isinstance(indices, list)
            and len(indices) < 32
            and any(
                isinstance(i, (list, tuple, TensorBase, slice, np.ndarray)) or i is None or i is Ellipsis
                for i in indices
            )
        ):
            indices = tuple(indices)
        entries = [self._index_entry(i) for i in (indices if isinstance(indices, tuple) else (indices,))]
        ellipses = [k for k, e in enumerate(entries) if e is Ellipsis]
        if len(ellipses) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        n_real = sum(1 for e in entries if e is not None and e is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices for tensor of dimension {self.ndim} ({n_real} given)")
        fill = [slice(None)] * (self.ndim - n_real)
        entries = entries[: ellipses[0]] + fill + entries[ellipses[0] + 1 :] if ellipses else entries + fill
        windows, view_shape, adv_dims, adv_index, adv_source_dims, dim = [], [], [], [], [], 0
        for e in entries:
            if e is None:
                view_shape.append(1)
                continue
            size = self.shape[dim]
            if isinstance(e, TensorBase):
                windows.append((0, size, 1))
                adv_dims.append(len(view_shape))
                adv_index.append(e)
                adv_source_dims.append(dim)
                view_shape.append(size)
            elif isinstance(e, UOp):
                windows.append((e, 1, 1))  # negative positions are not wrapped: shrink checks the bounds
            elif isinstance(e, int):
                if not -size <= e < size:
                    raise IndexError(f"index {e} is out of bounds for dimension {dim} with size {size}")
                windows.append((e + size if e < 0 else e, 1, 1))
            elif any(isinstance(v, UOp) for v in (e.start, e.stop, size)):
                windows.append(_symbolic_window(e, size))
                view_shape.append(windows[-1][1])
            else:
                start, stop, step = e.indices(size)
                windows.append((start, len(range(start, stop, step)), step))
                view_shape.append(windows[-1][1])
            dim += 1
        return _IndexPlan(tuple(windows), tuple(view_shape), tuple(adv_dims), tuple(adv_index), tuple(adv_source_dims))

    def __getitem__(self, indices: Any) -> Tensor:
        plan = self._index_plan(indices)
        t = self
        for d, (start, count, step) in enumerate(plan.windows):
            t = t._slice_dim(d, start, count, step)
        t = t.reshape(plan.view_shape)
        return t._take(plan.adv_dims, plan.adv_index, plan.adv_source_dims) if plan.adv_dims else t

    def _take(self, dims: tuple[int, ...], indices: tuple[Tensor, ...], source_dims: tuple[int, ...]) -> Tensor:
        """Advanced indexing of the dims `dims` by the broadcast integer tensors `indices` (out of range reads 0)."""
        shape = functools.reduce(broadcast_shape, (i.shape for i in indices))
        sizes = [self.shape[d] for d in dims]
        rest = [d for d in range(self.ndim) if d not in dims]
        n_pick, n_rest = prod(sizes), tuple(self.shape[d] for d in rest)
        flat = _flat_index(indices, sizes, shape, "getitem", source_dims)
        out = gather_rows(self.permute(list(dims) + rest).reshape((n_pick,) + n_rest), flat)
        out = out.permute(_adv_order(self.ndim, dims, len(shape)))
        for index, size, dim in zip(indices, sizes, source_dims):
            check_index_bounds("getitem", f"dim {dim}", index, -size, size, out)
        return out

    def _slice_dim(self, dim: int, start: int, count: int, step: int) -> Tensor:
        """Take `count` elements from `start` with stride `step` along dim, as flip/shrink/pad/reshape views."""
        t, size = self, self.shape[dim]
        if count == 0:
            return t.shrink(tuple((0, 0) if d == dim else None for d in range(t.ndim)))
        if step < 0:
            t, start, step = t.flip(dim), size - 1 - start, -step
        t = t.shrink(tuple((start, start + (count - 1) * step + 1) if d == dim else None for d in range(t.ndim)))
        if step == 1:
            return t
        t = t.pad(tuple((0, count * step - t.shape[dim]) if d == dim else (0, 0) for d in range(t.ndim)))
        t = t.reshape(t.shape[:dim] + (count, step) + t.shape[dim + 1 :])
        t = t.shrink(tuple((0, 1) if d == dim + 1 else None for d in range(t.ndim)))
        return t.reshape(t.shape[: dim + 1] + t.shape[dim + 2 :])

    def _unslice_dim(self, dim: int, start: int, count: int, step: int, size: int) -> Tensor:
        """Inverse of _slice_dim: place this dim's `count` elements at start, start+step, ...
        of a zero dim of `size`."""

        def pad_dim(t: Tensor, before: int, after: int) -> Tensor:
            return t.pad(tuple((before, after) if d == dim else (0, 0) for d in range(t.ndim)))

        t = self
        if count == 0:
            return pad_dim(t, 0, size)
        if step < 0:
            t, start, step = t.flip(dim), start + (count - 1) * step, -step
        if step > 1:  # step-1 zeros after each element, then drop the trailing ones
            t = t.unsqueeze(dim + 1)
            t = t.pad(tuple((0, step - 1) if d == dim + 1 else (0, 0) for d in range(t.ndim)))
            t = t.reshape(t.shape[:dim] + (count * step,) + t.shape[dim + 2 :])
            t = t.shrink(tuple((0, (count - 1) * step + 1) if d == dim else None for d in range(t.ndim)))
        return pad_dim(t, start, size - start - t.shape[dim])

    def __setitem__(self, indices: Any, v: Any) -> None:
        plan = self._index_plan(indices)
        if isinstance(v, TensorBase):
            if v.dtype != self.dtype:
                raise RuntimeError(f"setitem of a {v.dtype} value into a {self.dtype} tensor; cast it first")
            v = v.to(self.device)
        else:
            v = type(self)(v, device=self.device, dtype=self.dtype)
        region = self._region_shape(plan)
        if v.ndim > len(region):
            lead = v.shape[: v.ndim - len(region)]
            if any(s != 1 for s in lead):
                raise ValueError(f"cannot broadcast value of shape {v.shape} to indexed region {region}")
            v = v.reshape(v.shape[len(lead) :])
        v = v._broadcast_to(region)
        if self.uop.op is Ops.ASSIGN:
            self.realize()  # a pending assign lands first, so the write goes to the storage it wrote
        base, views = _view_chain(self.uop)
        multi = isinstance(self.device, tuple)
        if not multi and base.op is not Ops.BUFFER and views and base.op not in (Ops.CONST, Ops.ARANGE):
            raise RuntimeError(
                f"setitem into a view ({views[0].op}) of an unrealized {base.op} node would change no tensor; "
                "realize what it views first, or write into a .contiguous() copy"
            )
        if base.op is Ops.BUFFER:
            # every tensor that views this storage sees the write; one that lazily computes from it would not
            self._check_no_lazy_readers([v, *plan.adv_index])
            _reject_aliased_writes(views)
            if not plan.adv_dims and not multi and not self.device.startswith("DISK") and self._store_region(plan, v):
                return
        if plan.adv_dims:
            value, written = v._put(plan)
        else:
            value, written = v, type(self).ones(plan.view_shape, dtype=dtypes.bool, device=self.device)
        counts = tuple(count for _, count, _ in plan.windows)
        value, written = value.reshape(counts), written.reshape(counts)
        for d, (start, count, step) in enumerate(plan.windows):
            value = value._unslice_dim(d, start, count, step, self.shape[d])
            written = written._unslice_dim(d, start, count, step, self.shape[d])
        if multi:
            self.assign(written.where(value, self)).realize()
            return
        if base.op is not Ops.BUFFER:
            # no storage to share: the tensor takes the new value as a graph, so gradients reach v and the rest of self
            self.uop = written.where(value, self).uop
            return
        target = type(self)(base, device=self.device)
        new_base = type(self)(_unview(written.uop, views), device=self.device).where(
            type(self)(_unview(value.uop, views), device=self.device), target
        )
        type(self)._realize([target.assign(new_base)], keep_old_versions=False)

    def _store_region(self, plan: _IndexPlan, v: Tensor) -> bool:
        """Store v into the part of storage a basic index selects, by a kernel whose loops cover that part only (a KV
        cache row costs one row, not a pass over the cache). False when no chain of views a store follows reaches it."""
        counts = tuple(count for _, count, _ in plan.windows)
        if any(isinstance(c, int) and c == 0 for c in counts):
            return True  # an empty region: nothing to write
        if (stored := _store_view(self.uop)) is None:
            return False
        region = _region_view(self._new(stored), plan.windows)
        write = self._new(UOp(Ops.ASSIGN, self.dtype, (region.uop, v.reshape(counts).uop)))
        type(self)._realize([write], keep_old_versions=False)
        return True

    def __delitem__(self, indices: Any) -> None:
        raise TypeError("Tensor does not support item deletion (del t[idx])")

    def _region_shape(self, plan: _IndexPlan) -> tuple[int, ...]:
        """Shape of self[indices] for a plan, without building it."""
        if not plan.adv_dims:
            return plan.view_shape
        batch = functools.reduce(broadcast_shape, (i.shape for i in plan.adv_index))
        rest = tuple(s for d, s in enumerate(plan.view_shape) if d not in plan.adv_dims)
        order = _adv_order(len(plan.view_shape), plan.adv_dims, len(batch))
        return tuple((batch + rest)[o] for o in order)

    def _put(self, plan: _IndexPlan) -> tuple[Tensor, Tensor]:
        """Scatter self (shaped like the advanced-indexed region) back into view_shape: (values, written mask)."""
        dims, view_shape = plan.adv_dims, plan.view_shape
        batch = functools.reduce(broadcast_shape, (i.shape for i in plan.adv_index))
        sizes = [view_shape[d] for d in dims]
        rest = [d for d in range(len(view_shape)) if d not in dims]
        n_pick, n_batch, n_rest = prod(sizes), prod(batch), tuple(view_shape[d] for d in rest)
        v = self.permute(_inverse(_adv_order(len(view_shape), dims, len(batch)))).reshape((n_batch, 1) + n_rest)
        flat = _flat_index(plan.adv_index, sizes, batch, "setitem", plan.adv_source_dims).reshape(n_batch)
        # of several writes to one place the last wins: drop a write when a later one hits the same place
        order = type(self).arange(n_batch, device=self.device)
        same = flat.reshape(n_batch, 1) == flat.reshape(1, n_batch)
        flat = (same & (order.reshape(1, n_batch) > order.reshape(n_batch, 1))).any(1).where(-1, flat)
        hit = flat.reshape(n_batch, 1) == type(self).arange(n_pick, device=self.device).reshape(1, n_pick)
        value = _masked_sum(hit.reshape((n_batch, n_pick) + (1,) * len(rest)), v, 0)
        written = hit.any(0).reshape(tuple(sizes) + (1,) * len(rest)).expand(tuple(sizes) + n_rest)
        back = _inverse(list(dims) + rest)
        value, written = value.reshape(tuple(sizes) + n_rest).permute(back), written.permute(back)
        for index, size, dim in zip(plan.adv_index, sizes, plan.adv_source_dims):
            check_index_bounds("setitem", f"dim {dim}", index, -size, size, value, written)
        return value, written

    def _check_no_lazy_readers(self, consumed: list[Tensor]) -> None:
        """An in-place write must not change what an unrealized graph (other than those it consumes) will compute."""
        buf = view_base(self.uop)
        if buf.op is not Ops.BUFFER:
            return  # self gets a fresh buffer: no one else reads it
        # up from the storage through its views (which see the write, as they should): a live node computing from it
        # is a lazy reader; the storage knows the nodes built on it, so no other graph is walked
        readers: list[UOp] = []
        consumed_nodes: set[UOp] | None = None
        stack, seen = [buf], {buf}
        while stack:
            for parent in stack.pop().live_readers():
                if parent in seen:
                    continue
                seen.add(parent)
                if parent.op in _VIEW_OPS:
                    stack.append(parent)
                    continue
                if consumed_nodes is None:
                    consumed_nodes = set(UOp(Ops.SINK, src=tuple(t.uop for t in consumed)).toposort())
                if parent not in consumed_nodes:
                    readers.append(parent)
        if readers:
            raise RuntimeError(
                f"setitem would overwrite values that {len(readers)} unrealized graph node(s) still read "
                f"({', '.join(f'{u.op.name} of shape {u.shape}' for u in readers[:4])}); realize them first"
            )

    # ------------------------------------------------------------------ gather / scatter
    def _check_index(self, name: str, d: int, index: Any, src: Tensor | None = None) -> None:
        if not isinstance(index, TensorBase) or not dtypes.is_int(index.dtype):
            got = getattr(index, "dtype", type(index).__name__)
            raise RuntimeError(f"{name}(): index must be an integer Tensor, got {got}")
        if index.ndim != self.ndim:
            raise RuntimeError(
                f"{name}(): index has {index.ndim} dims but the tensor has {self.ndim} "
                f"(shapes {index.shape}, {self.shape})"
            )
        if any(i != d and n > s for i, (n, s) in enumerate(zip(index.shape, self.shape))):
            raise RuntimeError(
                f"{name}(): index shape {index.shape} is larger than the tensor shape {self.shape} outside dim {d}"
            )
        if src is not None and (src.ndim != index.ndim or any(n > s for n, s in zip(index.shape, src.shape))):
            raise RuntimeError(f"{name}(): index shape {index.shape} does not fit in src shape {src.shape}")

    def _index_region(self, shape: tuple[int, ...], d: int) -> Tensor:
        """The part of self that an index of `shape` along dim d can address."""
        return self.shrink(tuple(None if i == d else (0, n) for i, n in enumerate(shape)))

    def _paste(self, region: Tensor) -> Tensor:
        """self with its leading corner replaced by `region`."""
        if region.shape == self.shape:
            return region
        pads = tuple((0, s - r) for r, s in zip(region.shape, self.shape))
        inside = type(self).ones(region.shape, dtype=dtypes.bool, device=self.device).pad(pads)
        return inside.where(region.pad(pads), self)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        if self.ndim == 0:
            return self._via_1d(dim, index, None, lambda x, i, _: x.gather(0, i))
        d = self._axis(dim)
        self._check_index("gather", d, index)
        index = index.to(self.device)
        hit = _one_hot_axis(index, d, self.shape[d], "gather")
        out = _masked_sum(hit, self._index_region(index.shape, d).unsqueeze(d), d + 1)
        check_index_bounds("gather", f"dim {d}", index, 0, self.shape[d], out)
        return out

    def _scatter_src(self, name: str, d: int, index: Tensor, src: Tensor | Scalar) -> Tensor:
        """src as a tensor of self's dtype shrunk to index's shape."""
        if not isinstance(src, TensorBase):
            return type(self).full(index.shape, src, dtype=self.dtype, device=self.device)
        if src.dtype != self.dtype:
            raise RuntimeError(f"{name}(): src dtype {src.dtype} must equal the tensor dtype {self.dtype}")
        return src.to(self.device).shrink(tuple((0, n) for n in index.shape))

    def scatter(self, dim: int, index: Tensor, src: Tensor | Scalar, reduce: str | None = None) -> Tensor:
        if reduce is not None:
            if reduce not in ("add", "multiply"):
                raise TypeError(f"scatter reduce must be 'add' or 'multiply', got {reduce!r}")
            if isinstance(src, TensorBase):
                raise TypeError("scatter with reduce takes a scalar src; use scatter_reduce for a Tensor src")
            return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
        if self.ndim == 0:
            return self._via_1d(dim, index, src, lambda x, i, s: x.scatter(0, i, s))
        d = self._axis(dim)
        self._check_index("scatter", d, index, src if isinstance(src, TensorBase) else None)
        index = index.to(self.device)
        src = self._scatter_src("scatter", d, index, src)
        n = index.shape[d]
        hit = _one_hot_axis(index, d, self.shape[d], "scatter")
        order = type(self).arange(n, device=self.device)
        later = order.reshape((1, n) + (1,) * (self.ndim - d - 1)) > order.reshape((n, 1) + (1,) * (self.ndim - d - 1))
        overwritten = ((index.unsqueeze(d + 1) == index.unsqueeze(d)) & later).any(d + 1)
        if dtypes.is_float(src.dtype):
            # an overwritten write adds an exact 0 yet keeps d/dsrc = 1,
            # like torch's scatter backward (grad.gather(index))
            ghost = src - src.detach()
            src = overwritten.where((ghost == 0).where(ghost, 0.0), src)
        else:
            hit = hit & overwritten.logical_not().unsqueeze(d + 1)
        value = _masked_sum(hit, src.unsqueeze(d + 1), d)
        region = self._index_region(index.shape, d)
        out = self._paste(hit.any(d).where(value, region))
        check_index_bounds("scatter", f"dim {d}", index, 0, self.shape[d], out)
        return out

    def _via_1d(self, dim: int, index: Any, src: Any, fn: Any) -> Tensor:
        """0-d gathers and scatters run as 1-element ones."""
        self._axis(dim)
        as_1d = [t.reshape(1) if isinstance(t, TensorBase) else t for t in (index, src)]
        return fn(self.reshape(1), *as_1d).reshape(())

    def scatter_reduce(
        self, dim: int, index: Tensor, src: Tensor | Scalar, reduce: str, include_self: bool = True
    ) -> Tensor:
        if reduce not in SCATTER_REDUCES:
            raise RuntimeError(f"scatter_reduce reduce must be one of {SCATTER_REDUCES}, got {reduce!r}")
        if self.ndim == 0:
            return self._via_1d(dim, index, src, lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self))
        d = self._axis(dim)
        self._check_index("scatter_reduce", d, index, src if isinstance(src, TensorBase) else None)
        index = index.to(self.device)
        src = self._scatter_src("scatter_reduce", d, index, src).unsqueeze(d + 1)
        hit = _one_hot_axis(index, d, self.shape[d], "scatter_reduce")
        x, touched = self._index_region(index.shape, d), hit.any(d)
        if reduce in ("amax", "amin"):
            out = self._scatter_extreme(d, hit, src, x, reduce == "amin", include_self)
        elif reduce == "prod":
            out = hit.where(src, _const(src, 1)).prod(d)
            if include_self:
                out = x * out
        else:
            out = hit.where(src, _const(src, 0)).sum(d).cast(self.dtype)
            if include_self:
                out = x + out
            if reduce == "mean":
                count = (hit.cast(dtypes.int32).sum(d) + int(include_self)).maximum(1)
                out = out.div(count, rounding_mode="floor") if dtypes.is_int(self.dtype) else out.div(count)
        out = self._paste(touched.where(out.cast(self.dtype), x))
        check_index_bounds("scatter_reduce", f"dim {d}", index, 0, self.shape[d], out)
        return out

    def _scatter_extreme(self, d: int, hit: Tensor, src: Tensor, x: Tensor, is_min: bool, include_self: bool) -> Tensor:
        """amax/amin over the hits (and self): one max reduce, so ties share the gradient evenly as in torch."""

        def flip_order(t: Tensor) -> Tensor:
            return -t if dtypes.is_float(t.dtype) else ~t

        if is_min:
            src, x = flip_order(src), flip_order(x)
        lowest = -math.inf if dtypes.is_float(self.dtype) else False if self.dtype is dtypes.bool else self.dtype.min
        cand = hit.where(src, _const(src, lowest))
        if include_self:  # self joins the reduce as one more slot along d
            n = cand.shape[d]
            slot = type(self).arange(n + 1, device=self.device).reshape((n + 1,) + (1,) * (cand.ndim - d - 1)) == n
            own = x.unsqueeze(d).pad(tuple((n, 0) if i == d else (0, 0) for i in range(cand.ndim)))
            cand = slot.where(own, cand.pad(tuple((0, 1) if i == d else (0, 0) for i in range(cand.ndim))))
        out = cand.max(d)
        return flip_order(out) if is_min else out

    # ------------------------------------------------------------------ selection by mask, one-hot
    def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Scalar = 0) -> Tensor:
        if not isinstance(mask, TensorBase) or mask.dtype is not dtypes.bool:
            got = getattr(mask, "dtype", type(mask).__name__)
            raise RuntimeError(f"masked_select: mask must be a bool Tensor, got {got}")
        shape = broadcast_shape(self.shape, mask.shape)
        flags = mask.to(self.device)._broadcast_to(shape).reshape(-1)
        hit, valid = _selected(flags, size)
        values = _masked_sum(hit, self._broadcast_to(shape).reshape(1, -1), 1)
        return valid.where(values, _const(values, fill_value))

    def nonzero(self, size: int | None = None, fill_value: int = 0) -> Tensor:
        hit, valid = _selected((self != 0).reshape(-1), size)
        n = self.numel()
        position = _masked_sum(hit, type(self).arange(n, device=self.device).reshape(1, n), 1).reshape(-1, 1)
        strides = type(self)(
            np.array([prod(self.shape[d + 1 :]) for d in range(self.ndim)], np.int32), device=self.device
        )
        sizes = type(self)(np.array(self.shape, np.int32), device=self.device)
        coords = (position // strides.reshape(1, -1)) % sizes.reshape(1, -1)
        return valid.reshape(-1, 1).where(coords, _const(coords, fill_value)).cast(dtypes.int32)

    def one_hot(self, num_classes: int = -1) -> Tensor:
        """Values outside [0, num_classes) raise ValueError when already known (realized data or a constant); lazy
        ones give an all-zero row, or under CHECK_OOB=1 an IndexError when the result is realized."""
        if not dtypes.is_int(self.dtype):
            raise RuntimeError(f"one_hot needs an integer tensor, got {self.dtype}")
        if num_classes == -1:
            if self.numel() == 0:
                raise RuntimeError("one_hot cannot infer num_classes from an empty tensor")
            num_classes = int(self.max().item()) + 1
        if num_classes < 0:
            raise ValueError(f"one_hot num_classes must be non-negative, got {num_classes}")
        if (known := self._known_values()) is not None and known.size:
            if (low := int(known.min())) < 0:
                raise ValueError(f"one_hot: class values must be non-negative, got {low}")
            if (high := int(known.max())) >= num_classes:
                raise ValueError(f"one_hot: class values must be smaller than num_classes={num_classes}, got {high}")
        hit = self.unsqueeze(-1) == type(self).arange(num_classes, device=self.device)
        out = hit.cast(dtypes.default_int)
        check_index_bounds("one_hot", "num_classes", self, 0, num_classes, hit, out)
        return out

    def _known_values(self) -> np.ndarray | None:
        """The values when they are already known on the host side (a realized buffer or a constant), else None:
        reading them costs no kernel over unrealized work."""
        u = self.uop
        u = u.peel((Ops.RESHAPE, Ops.EXPAND))
        if u.op is Ops.CONST:
            return np.array([u.arg])
        if u.op is Ops.BUFFER and is_contiguous_view(self.uop):
            return host_values(self.uop)
        return self.numpy() if base_buffer(self.uop) is not None else None
