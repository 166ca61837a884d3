"""Kernel AST (tensor-level ops over DEFINE_GLOBALs) -> loops over ranges with explicit index arithmetic."""

from __future__ import annotations
import itertools
from typing import Callable
from fusegrad.dtype import dtypes
from fusegrad.codegen.opt import (
    Opt,
    OptError,
    ReduceOpts,
    check_opts,
    check_reduce_block,
    check_reduce_opts,
    blockable_sum,
)
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from fusegrad.uop.sint import smax
from fusegrad.uop.symbolic import pm_symbolic
from fusegrad.uop.trampoline import Step, run_steps

TRUE = UOp.const(dtypes.bool, True)


class Lowerer:
    """Evaluates each tensor-level node at given per-dimension indices by its rule (LOWERING_RULES below); movement
    ops become index arithmetic."""

    def __init__(self, idx_dtype):
        self.idx_dtype = idx_dtype
        self.memo: dict[tuple, UOp] = {}
        self.reduce_ranges: dict[tuple[UOp, frozenset[UOp]], tuple[UOp, ...]] = {}
        self.next_range = 0
        # REDUCE_BLOCK: (the reduce, its loop over blocks, block size); its reduced index is blocks*size + within
        self.blocked: tuple[UOp, UOp, int] | None = None
        # UNROLL and PADTO: the reduce they apply to and what they do to its axes
        self.reduce_opts: tuple[UOp, ReduceOpts] | None = None

    def as_index(self, d: int | UOp) -> UOp:
        """A size or bound as an index-typed UOp: a constant, or a symbolic size over the kernel's variables."""
        return d.cast(self.idx_dtype) if isinstance(d, UOp) else UOp.const(self.idx_dtype, d)

    def new_range(self, size: int | UOp, kind: str) -> UOp:
        if isinstance(size, int) and size == 1:
            return UOp.const(self.idx_dtype, 0)
        r = UOp(Ops.RANGE, self.idx_dtype, (self.as_index(size),), (self.next_range, kind))
        self.next_range += 1
        return r

    def index_term(self, d: int | UOp) -> int | UOp:
        """A size or bound to combine with an index: an int as it is, a symbolic one in the index dtype."""
        return self.as_index(d) if isinstance(d, UOp) else d

    def stride_times(self, a: int | UOp, b: int | UOp) -> int | UOp:
        # strides stay Python ints until a symbolic size joins them
        return a * b if isinstance(a, int) and isinstance(b, int) else self.as_index(a) * self.as_index(b)

    def flat_index(self, idxs: tuple[UOp, ...], shape: tuple[int | UOp, ...]) -> UOp:
        out, stride = UOp.const(self.idx_dtype, 0), 1
        for i, d in reversed(list(zip(idxs, shape))):
            if not isinstance(d, int) or d != 1:
                out = out + i * stride
            stride = self.stride_times(stride, d)
        return out

    def unflatten(self, flat: UOp, shape: tuple[int | UOp, ...]) -> tuple[UOp, ...]:
        out, stride = [], 1
        for j, d in reversed(list(enumerate(shape))):
            if isinstance(d, int) and d == 1:
                out.append(UOp.const(self.idx_dtype, 0))
            else:
                out.append(
                    (flat // stride) % (self.as_index(d) if isinstance(d, UOp) else d) if j > 0 else flat // stride
                )
            stride = self.stride_times(stride, d)
        return tuple(reversed(out))

    def store_index(self, view: UOp, idxs: tuple[UOp, ...]) -> UOp:
        """The element of the buffer under `view` (reshapes, permutes, shrinks, flips of a DEFINE_GLOBAL) at idxs."""
        # a pad in the view (a strided slice's last group) must fold away: a store has no gate
        load = graph_rewrite(self.lower(view, idxs, TRUE), pm_symbolic + pm_loads)
        if load.op is not Ops.LOAD or len(load.src) != 2:
            raise NotImplementedError(f"a store through {view.op} of shape {view.shape} may land in padding")
        return load.src[1]

    def lower(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> UOp:
        return run_steps(self.at(u, idxs, valid))

    def at(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
        """u's value at idxs, as a step on run_steps' stack, not Python's: a kernel's value graph can be thousands of
        nodes deep."""
        key = (u, idxs, valid)
        if (r := self.memo.get(key)) is None:
            if (rule := LOWERING_RULES.get(u.op)) is None:
                raise NotImplementedError(f"cannot lower {u.op} inside a kernel")
            step = rule(self, u, idxs, valid)
            r = self.memo[key] = step if isinstance(step, UOp) else (yield step)
        return r


# ---- the lowering rules: each evaluates one tensor-level op at per-dimension indices (idxs) under a load gate (valid):
# a value, or a step that asks the lowerer for its sources at the indices it reads them (`yield lw.at(src, ...)`)

Rule = Callable[["Lowerer", UOp, tuple[UOp, ...], UOp], "UOp | Step"]


def _load(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> UOp:
    # a gate says where the element is padding (a pad, a gather or a PADTO selects 0 or the identity there itself); a
    # load whose index, a function of the loops alone, is inside its buffer everywhere reads without it (a batch norm's
    # per-channel scale under a conv's padding): one gated load less for the C compiler to if-convert. An index read
    # from data keeps its gate: GCC turned BERT's gathered mask loads, ungated, into slower vector gathers (2x)
    index = idxs[0]
    if valid is not TRUE and isinstance(size := u.arg[1], int) and 0 <= index.vmin and index.vmax < size:
        if not any(x.op is Ops.LOAD for x in index.toposort()):
            valid = TRUE
    return UOp(Ops.LOAD, u.dtype, (u, idxs[0]) + (() if valid is TRUE else (valid,)))


def _itself(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> UOp:
    # a constant, or a bound variable's value used as data (a mean over a symbolic axis divides by it)
    return u


def _arange(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> UOp:
    return idxs[0].cast(u.dtype)


def _gather(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    """table[index[i...], j...]: the row is a loaded value, clamped into the table so the address stays inside it
    and gated so an out-of-range index reads 0 (CHECK_OOB checks the indices before the kernel runs)."""
    table, index = u.src
    n, k = table.shape[0], len(index.shape)
    row = (yield lw.at(index, idxs[:k], valid)).cast(lw.idx_dtype)
    inside = (row >= 0) & (row < lw.index_term(n))
    last = lw.as_index(n) - 1 if isinstance(n, UOp) else UOp.const(lw.idx_dtype, n - 1)
    clamped = -((-row.maximum(UOp.const(lw.idx_dtype, 0))).maximum(-last))  # min(max(row, 0), n - 1)
    picked = yield lw.at(table, (clamped,) + idxs[k:], valid & inside)
    return inside.where(picked, UOp.const(u.dtype, 0))


def _reshape(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    src = u.src[0]
    if src.op is Ops.RESHAPE:
        # one reshape: the middle shape's dims would be split off by division only to be merged again
        return (yield lw.at(src.replace(arg=u.arg), idxs, valid))
    old = src.shape
    if tuple(d for d in old if d != 1) == tuple(d for d in u.arg if d != 1):  # only size-1 dims moved
        it = iter(i for i, d in zip(idxs, u.arg) if d != 1)
        return (yield lw.at(src, tuple(UOp.const(lw.idx_dtype, 0) if d == 1 else next(it) for d in old), valid))
    # dims both shapes share at the start and at the end keep their indices; only those between are flattened and split
    # again: a padded view's index may step outside its dims, where the divisions of a whole flat index would not fold
    # (a channel shuffle read through a conv's padding)
    new, n = u.arg, min(len(u.arg), len(old))
    end = 0
    while end < n and _same_dim(new[-1 - end], old[-1 - end]):
        end += 1
    start = 0
    while start < n - end and _same_dim(new[start], old[start]):
        start += 1
    middle = lw.unflatten(
        lw.flat_index(idxs[start : len(new) - end], new[start : len(new) - end]), old[start : len(old) - end]
    )
    return (yield lw.at(src, idxs[:start] + middle + idxs[len(new) - end :], valid))


def _same_dim(a: int | UOp, b: int | UOp) -> bool:
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _permute(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    old_idxs: list[UOp] = [UOp.const(lw.idx_dtype, 0)] * len(idxs)
    for new_axis, old_axis in enumerate(u.arg):
        old_idxs[old_axis] = idxs[new_axis]
    return (yield lw.at(u.src[0], tuple(old_idxs), valid))


def _expand(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    expanded = tuple(UOp.const(lw.idx_dtype, 0) if o == 1 else i for i, o in zip(idxs, u.src[0].shape))
    return (yield lw.at(u.src[0], expanded, valid))


def _shrink(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    shifted = tuple(i + lw.index_term(b) if _nonzero(b) else i for i, (b, _) in zip(idxs, u.arg))
    return (yield lw.at(u.src[0], shifted, valid))


def _flip(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    flipped = tuple((lw.index_term(d) - 1) - i if f else i for i, f, d in zip(idxs, u.arg, u.shape))
    return (yield lw.at(u.src[0], flipped, valid))


def _pad(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    in_bounds = TRUE
    for i, (b, a), d in zip(idxs, u.arg, u.src[0].shape):
        if _nonzero(b):
            in_bounds = in_bounds & (i >= lw.index_term(b))
        if _nonzero(a):
            in_bounds = in_bounds & (
                i < (d + b if isinstance(d, int) and isinstance(b, int) else lw.as_index(d) + lw.as_index(b))
            )
    unpadded = tuple(i - lw.index_term(b) if _nonzero(b) else i for i, (b, _) in zip(idxs, u.arg))
    inner = yield lw.at(u.src[0], unpadded, valid & in_bounds)
    return in_bounds.where(inner, UOp.const(u.dtype, 0))


def _reduce(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    src, (reduce_op, axes) = u.src[0], u.arg
    # lowerings of one reduce inside the same enclosing reduce loops share their loops, so unrolled copies accumulate
    # in one loop; inside different enclosing loops (one reduce feeding two reduces) each gets its own loops
    key = (u, frozenset(r for i in idxs for r in i.toposort() if r.op is Ops.RANGE and r.arg[1] == "reduce"))
    blocked = lw.blocked is not None and lw.blocked[0] is u
    ropts = lw.reduce_opts[1] if lw.reduce_opts is not None and lw.reduce_opts[0] is u else None
    unroll, padto = (ropts.unroll, ropts.padto) if ropts is not None else ({}, {})
    if key not in lw.reduce_ranges:
        sizes = [lw.blocked[2] if blocked else src.shape[a] for a in axes]  # type: ignore[index]
        sizes = [padto.get(a, d) // unroll.get(a, 1) for a, d in zip(axes, sizes)]
        lw.reduce_ranges[key] = tuple(lw.new_range(d, "reduce") for d in sizes)
    loop_of = dict(zip(axes, lw.reduce_ranges[key]))
    if blocked:
        loop_of = {a: lw.blocked[1] * lw.blocked[2] + r for a, r in loop_of.items()}  # type: ignore[index]
    ranges = tuple(r for r in lw.reduce_ranges[key] if r.op is Ops.RANGE)
    # each unrolled lane is lowered on its own and the lanes are combined before the accumulator; a padded tail reads
    # nothing and gives the identity
    lane_values = []
    for lanes in itertools.product(*(range(unroll.get(a, 1)) for a in axes)):
        lane_of = dict(zip(axes, lanes))
        at = {a: r * unroll[a] + lane_of[a] if a in unroll else r for a, r in loop_of.items()}
        inside = TRUE
        for a in padto:
            inside = inside & (at[a] < src.shape[a])
        new_idxs = tuple(at.get(a, i) for a, i in enumerate(idxs))
        lane = yield lw.at(src, new_idxs, valid if inside is TRUE else valid & inside)
        if inside is not TRUE:
            lane = inside.where(lane, UOp.const(u.dtype, identity(reduce_op, u.dtype)))
        lane_values.append(lane)
    # bool lanes combine as logic (max is any, product is all), which the simplifier folds with constants
    combine = {Ops.MAX: Ops.OR, Ops.MUL: Ops.AND, Ops.ADD: Ops.OR}[reduce_op] if u.dtype is dtypes.bool else reduce_op
    if combine in (Ops.ADD, Ops.MUL) and dtypes.is_float(u.dtype):
        value = lane_values[0]  # a float sum or product in order: the rounding of the kernel without opts
        for lane in lane_values[1:]:
            value = UOp(combine, u.dtype, (value, lane))
    else:
        # an exact combine (max, logic, integers) as a balanced tree: half the dependent steps of a chain (a 3x3 max
        # pool's 9 taps: 4 instead of 8, each a NaN-aware compare and select)
        while len(lane_values) > 1:
            pairs = [UOp(combine, u.dtype, (a, b)) for a, b in zip(lane_values[::2], lane_values[1::2])]
            lane_values = pairs + lane_values[len(pairs) * 2 :]
        value = lane_values[0]
    if src.size == 0 or any(src.shape[a] == 0 for a in axes):
        value = UOp.const(u.dtype, identity(reduce_op, u.dtype))
    return UOp(Ops.REDUCE, u.dtype, (value, *ranges), reduce_op) if ranges else value


def _elementwise(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    lowered_src = []
    for s in u.src:
        lowered_src.append((yield lw.at(s, idxs, valid)))
    return UOp(u.op, u.dtype, tuple(lowered_src), u.arg)


def _source(lw: Lowerer, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
    return (yield lw.at(u.src[0], idxs, valid))  # a contiguous or detach is its source's value


# tensor-level op -> its lowering rule
LOWERING_RULES: dict[Ops, Rule] = {
    Ops.DEFINE_GLOBAL: _load,
    Ops.CONST: _itself,
    Ops.DEFINE_VAR: _itself,
    Ops.ARANGE: _arange,
    Ops.GATHER: _gather,
    Ops.RESHAPE: _reshape,
    Ops.PERMUTE: _permute,
    Ops.EXPAND: _expand,
    Ops.SHRINK: _shrink,
    Ops.FLIP: _flip,
    Ops.PAD: _pad,
    Ops.REDUCE_AXIS: _reduce,
    **{op: _elementwise for op in GroupOp.ALU | {Ops.CAST, Ops.BITCAST}},
    Ops.CONTIGUOUS: _source,
    Ops.DETACH: _source,
}


def _nonzero(x: int | UOp) -> bool:
    return isinstance(x, UOp) or x != 0


def identity(op: Ops, dtype) -> object:
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    return dtype.min  # MAX


pm_loads = PatternMatcher(
    [
        # a PADTO lane known to be inside (or outside) the reduced axis
        (
            UPat(Ops.WHERE, src=(UPat.cvar("c", dtypes.bool), UPat.var("a"), UPat.var("b"))),
            lambda c, a, b: a if c.arg else b,
        ),
        # a padded load is already gated: selecting its zero again is redundant
        (
            UPat(
                Ops.WHERE,
                src=(
                    UPat.var("g"),
                    UPat(Ops.LOAD, name="ld", src=(UPat.var(), UPat.var(), UPat.var("g"))),
                    UPat.cvar("z"),
                ),
            ),
            lambda g, ld, z: ld if z.arg == 0 else None,
        ),
        (
            UPat(Ops.LOAD, src=(UPat.var("b"), UPat.var("i"), UPat.const(dtypes.bool, True))),
            lambda b, i: UOp(Ops.LOAD, b.dtype, (b, i)),
        ),
        (
            UPat(Ops.LOAD, name="ld", src=(UPat.var(), UPat.var(), UPat.const(dtypes.bool, False))),
            lambda ld: UOp.const(ld.dtype, 0),
        ),
    ]
)


def _tile_start(r: UOp, amount: int, size: int | UOp) -> UOp:
    """First index of tile r of an axis cut into tiles of amount; a last partial tile is moved back to end at size,
    overlapping the one before it (its outputs are computed twice, to equal values)."""
    if amount == 1:
        return r
    if isinstance(size, int) and size % amount == 0 or r.op is Ops.CONST:
        return r * amount
    last = UOp.const(r.dtype, size - amount) if isinstance(size, int) else size - amount
    return (r * amount < last).where(r * amount, last)


def output_value(ast: UOp) -> UOp:
    """The value a kernel stores, below reshapes over a reduce that merge dims: its output loops run over the reduce's
    own dims (a grouped conv's groups and channels), so no output index is split again by division. Opts name axes of
    this value's shape."""
    value = ast.src[0].src[1]
    inner = value
    inner = inner.peel(Ops.RESHAPE)
    if inner.op is not Ops.REDUCE_AXIS:
        return value
    while value.op is Ops.RESHAPE and sum(d != 1 for d in value.src[0].shape) > sum(d != 1 for d in value.shape):
        value = value.src[0]
    return value


def lower_kernel(ast: UOp, opts: tuple[Opt, ...] = ()) -> UOp:
    """SINK(STORE(out, value)) -> SINK(STORE(out, index, scalar value), ...) with RANGE loops and LOADs; each UPCAST
    opt cuts its output axis into tiles whose outputs are separate stores of separately lowered values, each TILE opt
    walks an axis's tiles in blocks, the loop within a block innermost among the output loops, and REDUCE_BLOCK makes
    the blocks of a plain sum's reduce an output loop right after the first (the one threads split)."""
    out, value = ast.src[0].src[0], output_value(ast)
    # an assign into part of a buffer stores through its view of the buffer: the loops cover the view, not the buffer
    region = None if out.op is Ops.DEFINE_GLOBAL else out
    if region is not None:
        if region.shape != value.shape:  # output_value went below reshapes: the same elements in the same order
            region = UOp(Ops.RESHAPE, region.dtype, (region,), value.shape)
        out = out.peel(GroupOp.Movement)  # the store view's buffer
    # a symbolic shape counts at its largest (UOp.size)
    sizes = [u.arg[1] for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL] + [u.size for u in ast.toposort()]
    idx_dtype = dtypes.int64 if max(sizes, default=0) >= 2**31 - 1 else dtypes.int32
    shape = value.shape
    reduce = blockable_sum(value)
    block = check_reduce_block(opts, (reduce.src[0].shape, reduce.arg[1][0]) if reduce is not None else None)
    own = bool(opts) and reads_own_output(lower_kernel(ast))
    if block is not None and own:
        raise OptError(
            f"{block}: the kernel reads its own output (an assign adding into its storage), which the blocks' partial"
            " sums would overwrite"
        )
    # partial sums added in memory read the output, so no tile may overlap another
    reads_output = block is not None or own
    applied = check_opts(opts, shape, reads_output)
    up, tiles = applied.upcasts, applied.tiles
    reduces = [u for u in value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL) if u.op is Ops.REDUCE_AXIS]
    only = reduces[0] if len(reduces) == 1 else None
    ropts = check_reduce_opts(opts, (only.src[0].shape, only.arg[1]) if only else None, block is not None)
    # check_opts cuts a symbolic axis only by an UPCAST: its tile count is symbolic too
    counts = [d if up.get(a, 1) == 1 else (d + (up[a] - 1)) // up[a] for a, d in enumerate(shape)]
    lowerer = Lowerer(idx_dtype)
    if only is not None and (ropts.unroll or ropts.padto):
        lowerer.reduce_opts = (only, ropts)
    trips = [c if tiles.get(a, 1) == 1 else -(-c // tiles[a]) for a, c in enumerate(counts)]
    # THREAD: the loop over chunks of its axis comes first (lowest range id: outermost), the one threads split
    chunks = None
    if applied.thread is not None:
        chunks = lowerer.new_range(applied.thread[1], "global")
        if block is not None:  # the loop over blocks comes right after the threaded loop
            blocks = lowerer.new_range(reduce.src[0].shape[block.axis] // block.amount, "global")  # type: ignore[union-attr]
            lowerer.blocked = (reduce, blocks, block.amount)  # type: ignore[assignment]
    outer: list[UOp] = []
    # the outermost loop is the one threads split at a size fixed when compiling: a symbolic one gets a loop of one
    # trip around it
    first = next((c for c in counts if not isinstance(c, int) or c != 1), 1)
    lead = UOp(Ops.RANGE, idx_dtype, (UOp.const(idx_dtype, 1),), (-1, "global")) if isinstance(first, UOp) else None
    for a, t in enumerate(trips):
        if applied.thread is not None and a == applied.thread[0]:
            per_chunk = t // applied.thread[1]
            outer.append(chunks * per_chunk + lowerer.new_range(per_chunk, "global"))  # type: ignore[operator]
            continue
        outer.append(lowerer.new_range(t, "global"))
        # the loop over blocks comes right after the first output loop, the one threads split
        if block is not None and lowerer.blocked is None and outer[-1].op is Ops.RANGE:
            blocks = lowerer.new_range(reduce.src[0].shape[block.axis] // block.amount, "global")  # type: ignore[union-attr]
            lowerer.blocked = (reduce, blocks, block.amount)  # type: ignore[assignment]
    if block is not None and lowerer.blocked is None:
        raise OptError(f"{block}: the output {shape} needs a loop of more than one tile for the blocks to run inside")
    within = {a: lowerer.new_range(amount, "global") for a, amount in tiles.items()}
    tile_index = [_tile_start(r, tiles[a], counts[a]) + within[a] if a in tiles else r for a, r in enumerate(outer)]
    starts = [_tile_start(t, up.get(a, 1), shape[a]) for a, t in enumerate(tile_index)]
    stores = []
    for lanes in itertools.product(*(range(up.get(a, 1)) for a in range(len(shape)))):
        idxs = tuple(s + lane if lane else s for s, lane in zip(starts, lanes))
        if region is not None:
            index = lowerer.store_index(region, idxs)
        else:
            # a symbolic shape is stored in a buffer of its largest shape (schedule's view of it reads it that way)
            index = lowerer.flat_index(idxs, tuple(smax(d) for d in shape))
        if lead is not None:
            index = index + lead
        partial = lowerer.lower(value, idxs, TRUE)
        if lowerer.blocked is not None:
            # the first block stores its partial; each later one adds its partial to what the blocks before stored;
            # an epilogue over the sum (bias, activation) is applied by the last block only
            later = lowerer.blocked[1].ne(0)  # a RANGE: check_reduce_block asks for more than one block
            sums = [u for u in partial.toposort() if u.op is Ops.REDUCE]
            if partial.op is Ops.REDUCE or len(sums) != 1:
                partial = later.where(UOp(Ops.LOAD, value.dtype, (out, index, later)) + partial, partial)
            else:
                total = later.where(UOp(Ops.LOAD, value.dtype, (out, index, later)) + sums[0], sums[0])
                last = lowerer.blocked[1].eq(lowerer.blocked[1].src[0].arg - 1)
                partial = last.where(substitute(partial, sums[0], total), total)
        stores.append(UOp(Ops.STORE, src=(out, index, partial)))
    return graph_rewrite(UOp(Ops.SINK, src=tuple(stores)), pm_symbolic + pm_loads)


def substitute(root: UOp, old: UOp, new: UOp) -> UOp:
    """root with old replaced by new (new may contain old: nothing below a replacement is visited again)."""
    memo: dict[UOp, UOp] = {}
    for u in root.toposort(gate=lambda x: x is not old):
        memo[u] = new if u is old else u.replace(src=tuple(memo[s] for s in u.src)) if u.src else u
    return memo[root]


def reads_own_output(kernel: UOp) -> bool:
    outs = {u.src[0] for u in kernel.src if u.op is Ops.STORE}
    return any(u.op is Ops.LOAD and u.src[0] in outs for u in kernel.toposort())
