"""Splits a long reduce into few outputs into two kernels, so the CPU's thread pool (which splits a kernel's
outermost output loop) has work for every thread: chunks of the reduce axis into `chunks x outputs` partials, then
a short reduce of the partials."""

from __future__ import annotations

import math

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import NUM_CPU_THREADS
from fusegrad.uop.broadcast import broadcast_const
from fusegrad.uop.ops import Ops, UOp, reduce_identity
from fusegrad.uop.pattern import PatternMatcher, UPat, rewrite_once

# below this many elements per output one thread finishes in tens of microseconds, about what a second kernel costs
REDUCE_SPLIT_MIN_LENGTH = 1 << 16
# with this many outputs per thread the output loop alone already keeps every thread busy
REDUCE_SPLIT_OUTPUTS_PER_THREAD = 4
# enough chunks that the partial kernel's outer loop divides evenly among 2..32 threads (the 16M sum on 2 threads in
# paired rounds: 0.72x torch with 16 chunks, 0.81x with 32, 0.81x with 64); more only adds partials
REDUCE_SPLIT_MIN_CHUNKS, REDUCE_SPLIT_MAX_CHUNKS = 32, 64
# a chunked axis at least this many times longer than the chunk count wastes under 1/16 of its reads on padding
REDUCE_SPLIT_MIN_PER_CHUNK = 16
# a full reduce over a contiguous last dim keeps this many lanes of partials per chunk (4 AVX-512 vectors): the
# partial kernel then adds whole vectors into independent accumulators with no horizontal add per block, and the
# fold adds the lanes (measured: 2x the rate of one accumulator per block in L2, and 8-13 % faster at 16M float32
# from memory)
REDUCE_SPLIT_LANES = 64


def chunk_count(axis_size: int, threads: int) -> int:
    """The first multiple of the thread count in [MIN_CHUNKS, MAX_CHUNKS] that divides the axis (no padding), else the
    smallest."""
    first = threads * math.ceil(REDUCE_SPLIT_MIN_CHUNKS / threads)
    candidates = range(first, max(REDUCE_SPLIT_MAX_CHUNKS, first) + 1, threads)
    return next((c for c in candidates if axis_size % c == 0), first)


def lane_count(op: Ops, dtype: DType) -> int:
    """Lanes of partials per chunk of a full reduce over a contiguous last dim: REDUCE_SPLIT_LANES for float32/float64
    sums and maxes, else 1. Other dtypes would walk the lanes in several passes (the heuristics keep only these in lane
    accumulators); float32 products near 1 drift with the chain lengths, which lanes would change."""
    lane_dtype = dtype in (dtypes.float32, dtypes.float64)
    return REDUCE_SPLIT_LANES if lane_dtype and op in (Ops.ADD, Ops.MAX) else 1


def _merge_reduce_runs(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Adjacent reduced dims merged into one (a reshape, free): the merged shape and its reduced dims."""
    merged: list[int] = []
    merged_axes: list[int] = []
    for i, d in enumerate(shape):
        if i in axes and i - 1 in axes:
            merged[-1] *= d
        else:
            if i in axes:
                merged_axes.append(len(merged))
            merged.append(d)
    return tuple(merged), tuple(merged_axes)


def _pad_with_identity(x: UOp, axis: int, extra: int, identity: bool | int | float) -> UOp:
    """x padded at the end of `axis` by `extra` elements holding `identity` (PAD itself fills zeros)."""
    pads = tuple((0, extra if i == axis else 0) for i in range(len(x.shape)))
    padded = UOp(Ops.PAD, x.dtype, (x,), pads)
    if identity == 0:
        return padded
    inside = UOp(Ops.PAD, dtypes.bool, (broadcast_const(dtypes.bool, True, x.shape),), pads)
    return inside.alu(Ops.WHERE, padded, broadcast_const(x.dtype, identity, padded.shape))


def split_reduce(reduce: UOp) -> UOp | None:
    """REDUCE_AXIS over few outputs and a long axis -> the same value from two reduces with a realized partial between.
    The largest (merged) reduced dim n becomes (chunks, n / chunks), padded with the reduce's identity when chunks does
    not divide n; the chunk dim moves to the front so the partial kernel's outer loop runs over chunks, and a second
    reduce folds the chunks."""
    op, axes = reduce.arg
    src = reduce.src[0]
    threads = max(int(NUM_CPU_THREADS.value), 1)
    few_outputs = 0 < reduce.size < REDUCE_SPLIT_OUTPUTS_PER_THREAD * threads
    if not few_outputs or src.size < REDUCE_SPLIT_MIN_LENGTH * reduce.size:
        return None
    if any(isinstance(d, UOp) for d in src.shape):
        return None  # a symbolic length is not known when compiling: the reduce runs whole
    shape, merged_axes = _merge_reduce_runs(src.shape, axes)
    split_axis = max(merged_axes, key=lambda a: shape[a])
    chunks = chunk_count(shape[split_axis], threads)
    if shape[split_axis] < chunks * REDUCE_SPLIT_MIN_PER_CHUNK:
        return None
    x = UOp(Ops.RESHAPE, src.dtype, (src,), shape) if shape != src.shape else src
    full = reduce.size == 1 and split_axis == len(shape) - 1
    lanes = lane_count(op, reduce.dtype) if full else 1
    if lanes > 1 and (tail := shape[split_axis] % (chunks * lanes)):
        # padding would gate every lane of the loads, and gated lanes stay scalar: the whole rows go through the lanes,
        # the last (under chunks x lanes) elements are a small reduce of their own, combined after the fold
        whole = shape[split_axis] - tail
        main = _shrink_last(x, 0, whole)
        folded = _split_into(main, (*shape[:-1], whole), merged_axes, split_axis, reduce, chunks, lanes)
        rest = UOp(Ops.REDUCE_AXIS, reduce.dtype, (_shrink_last(x, whole, shape[-1]),), (op, merged_axes))
        rest = UOp(Ops.RESHAPE, reduce.dtype, (rest,), reduce.shape)
        return folded.alu(op, rest)
    return _split_into(x, shape, merged_axes, split_axis, reduce, chunks, lanes)


def _shrink_last(x: UOp, start: int, end: int) -> UOp:
    return UOp(Ops.SHRINK, x.dtype, (x,), (*((0, d) for d in x.shape[:-1]), (start, end)))


def _split_into(
    x: UOp, shape: tuple[int, ...], merged_axes: tuple[int, ...], split_axis: int, reduce: UOp, chunks: int, lanes: int
) -> UOp:
    """The split of reduce over x (its source with the reduced dims merged: `shape`, `merged_axes`) along
    `split_axis`: chunks x lanes partials (padded with the identity where chunks x lanes does not divide the axis),
    then their fold."""
    op, axes = reduce.arg
    per_chunk = math.ceil(shape[split_axis] / (chunks * lanes)) * lanes
    if (extra := per_chunk * chunks - shape[split_axis]) > 0:
        x = _pad_with_identity(x, split_axis, extra, reduce_identity(op, reduce.dtype))
    chunk_dims = (per_chunk // lanes, lanes) if lanes > 1 else (per_chunk,)
    chunked_shape = (*shape[:split_axis], chunks, *chunk_dims, *shape[split_axis + 1 :])
    x = UOp(Ops.RESHAPE, x.dtype, (x,), chunked_shape)
    if split_axis:
        order = (split_axis, *(i for i in range(len(chunked_shape)) if i != split_axis))
        x = UOp(Ops.PERMUTE, x.dtype, (x,), order)
    # dim 0 now holds the chunks; merged dim a, and the chunk's own elements for the split dim, sit at a + 1 (lanes,
    # when kept, last)
    partial_axes = tuple(1 + a for a in merged_axes)
    partial = UOp(Ops.REDUCE_AXIS, reduce.dtype, (x,), (op, partial_axes))
    partials = UOp(Ops.CONTIGUOUS, reduce.dtype, (partial,), "reduce_split")
    # the fold reads the partials with the chunks in place of the first reduced dim, so it yields the reduce's own
    # shape: the scheduler then sees the same node as the caller's reduce, and keeps its value for the caller
    first = min(axes)
    folded = (chunks * lanes, *reduce.shape[:first], *reduce.shape[first + 1 :])
    view = UOp(Ops.RESHAPE, reduce.dtype, (partials,), folded)
    if first:
        order = (*range(1, first + 1), 0, *range(first + 1, len(reduce.shape)))
        view = UOp(Ops.PERMUTE, reduce.dtype, (view,), order)
    return UOp(Ops.REDUCE_AXIS, reduce.dtype, (view,), (op, (first,)))


pm_split_reduces = PatternMatcher([(UPat(Ops.REDUCE_AXIS, name="reduce"), split_reduce)])


def split_long_reduces(roots: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp]]:
    """The roots with every long reduce into few outputs split in two; also each changed node's replacement. One pass,
    so the two reduces a split makes are never split again."""
    if not any(u.op is Ops.REDUCE_AXIS for u in UOp(Ops.SINK, src=tuple(roots)).toposort()):
        return roots, {}
    return rewrite_once(roots, pm_split_reduces)
