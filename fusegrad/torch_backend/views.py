"""Reading and writing a torch view (sizes, strides, storage offset) of a flat fusegrad storage.

A view whose strides nest (each a multiple of the next, non-overlapping, broadcast dims of stride 0) is a chain of
movement ops on the flat storage, so it fuses into its reader; any other view gathers through a computed index.
A write replaces the storage's value by a lazy `where` over the region, so graphs built earlier keep the old value.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegrad.helpers import prod
from fusegrad.tensor import Tensor


@dataclass(frozen=True)
class Tiling:
    """A nesting view: the kept dims (size > 1, stride > 0) in decreasing stride order, and the extent they cover."""

    order: tuple[int, ...]
    tile: tuple[int, ...]
    extent: int


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def tiling(size: tuple[int, ...], stride: tuple[int, ...]) -> Tiling | None:
    kept = sorted((d for d in range(len(size)) if size[d] > 1 and stride[d] != 0), key=lambda d: -stride[d])
    if any(stride[d] < 0 for d in kept):
        return None
    for a, b in zip(kept, kept[1:]):
        if stride[a] % stride[b] or stride[a] < stride[b] * size[b]:
            return None
    if not kept:
        return Tiling((), (), 1)
    tile = tuple(stride[a] // stride[b] for a, b in zip(kept, kept[1:])) + (stride[kept[-1]],)
    return Tiling(tuple(kept), tile, size[kept[0]] * stride[kept[0]])


def _fit(flat: Tensor, start: int, length: int) -> Tensor:
    """flat[start:start+length], padded with zeros past the end (never read: the view shrinks them away)."""
    n = flat.shape[0]
    end = min(start + length, n)
    region = flat.shrink(((start, end),))
    return region.pad(((0, start + length - end),)) if end - start < length else region


def read_view(flat: Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Tensor:
    n = flat.shape[0]
    if prod(size) == 0:
        return Tensor.zeros(size, dtype=flat.dtype, device=flat.device)
    if offset == 0 and prod(size) == n and tuple(stride) == contiguous_strides(size):
        return flat.reshape(size)
    plan = tiling(size, stride)
    if plan is None:
        return _gather_view(flat, size, stride, offset)
    if not plan.order:
        t = _fit(flat, offset, 1).reshape((1,) * len(size))
        return t.expand(size)
    first = plan.order[0]
    blocks = (size[first],) + plan.tile
    t = _fit(flat, offset, plan.extent).reshape(blocks)
    t = t.shrink(tuple((0, size[d]) for d in plan.order) + ((0, 1),)).reshape(tuple(size[d] for d in plan.order))
    inverse = sorted(range(len(plan.order)), key=lambda i: plan.order[i])
    t = t.permute(inverse) if inverse != list(range(len(inverse))) else t
    kept = sorted(plan.order)
    return t.reshape(tuple(size[d] if d in kept else 1 for d in range(len(size)))).expand(size)


def _flat_index(size: tuple[int, ...], stride: tuple[int, ...], offset: int, device: str) -> Tensor:
    idx = Tensor.full(size, offset, dtype="int32", device=device)
    for d, (sz, st) in enumerate(zip(size, stride)):
        if sz > 1 and st:
            axis = Tensor.arange(sz, dtype="int32").to(device) * st
            idx = idx + axis.reshape(tuple(sz if i == d else 1 for i in range(len(size))))
    return idx


def _gather_view(flat: Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Tensor:
    return flat[_flat_index(size, stride, offset, flat.device)]


def write_view(flat: Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int, value: Tensor) -> Tensor:
    """The storage's new flat value after writing `value` (of shape `size`) into the view."""
    n = flat.shape[0]
    if prod(size) == 0:
        return flat
    if any(sz > 1 and st == 0 for sz, st in zip(size, stride)):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single memory "
            "location. Please clone() the tensor before performing the operation."
        )
    if offset == 0 and prod(size) == n and tuple(stride) == contiguous_strides(size):
        return value.reshape(n)
    plan = tiling(size, stride)
    if plan is None:
        return flat.scatter(0, _flat_index(size, stride, offset, flat.device).reshape(-1), value.reshape(-1))
    placed, mask = _unview(value, size, plan), _unview(Tensor.ones(size, dtype="bool", device=flat.device), size, plan)
    before, after = offset, n - offset - plan.extent
    pads = ((before, max(after, 0)),)
    placed, mask = placed.pad(pads), mask.pad(pads, value=False)
    if after < 0:
        placed, mask = placed.shrink(((0, n),)), mask.shrink(((0, n),))
    return mask.where(placed, flat)


def _unview(value: Tensor, size: tuple[int, ...], plan: Tiling) -> Tensor:
    """The inverse of read_view's movement ops: `value` laid out flat over the view's extent (gaps padded)."""
    if not plan.order:
        return value.reshape(1)
    t = value.reshape(tuple(size[d] for d in sorted(plan.order)))
    rank = {d: i for i, d in enumerate(sorted(plan.order))}
    order = [rank[d] for d in plan.order]
    t = t.permute(order) if order != list(range(len(order))) else t
    t = t.reshape(t.shape + (1,))
    first = plan.order[0]
    blocks = (size[first],) + plan.tile
    t = t.pad(tuple((0, b - s) for b, s in zip(blocks, t.shape)))
    return t.reshape(plan.extent)
