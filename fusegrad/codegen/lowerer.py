"""Kernel AST (tensor-level ops over DEFINE_GLOBALs) -> loops over ranges with explicit index arithmetic."""

from __future__ import annotations
import itertools
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
    """Evaluates each tensor-level node at given per-dimension indices; movement ops become index arithmetic."""

    def __init__(self, idx_dtype):
        self.idx_dtype = idx_dtype
        self.memo: dict[tuple, UOp] = {}
        self.reduce_ranges: dict[tuple[UOp, frozenset[UOp]], tuple[UOp, ...]] = {}
        self.next_range = 0
        # REDUCE_BLOCK: (the reduce, its loop over blocks, block size); its reduced index is blocks*size + within
        self.blocked: tuple[UOp, UOp, int] | None = None
        # UNROLL and PADTO: the reduce they apply to and what they do to its axes
        self.reduce_opts: tuple[UOp, ReduceOpts] | None = None

    def sz(self, d: int | UOp) -> UOp:
        """A size or bound as an index-typed UOp: a constant, or a symbolic size over the kernel's variables."""
        return d.cast(self.idx_dtype) if isinstance(d, UOp) else UOp.const(self.idx_dtype, d)

    def new_range(self, size: int | UOp, kind: str) -> UOp:
        if isinstance(size, int) and size == 1:
            return UOp.const(self.idx_dtype, 0)
        r = UOp(Ops.RANGE, self.idx_dtype, (self.sz(size),), (self.next_range, kind))
        self.next_range += 1
        return r

    def idx(self, d: int | UOp) -> int | UOp:
        """A size or bound to combine with an index: an int as it is, a symbolic one in the index dtype."""
        return self.sz(d) if isinstance(d, UOp) else d

    def smul(self, a: int | UOp, b: int | UOp) -> int | UOp:
        # strides stay Python ints until a symbolic size joins them
        return a * b if isinstance(a, int) and isinstance(b, int) else self.sz(a) * self.sz(b)

    def flat_index(self, idxs: tuple[UOp, ...], shape: tuple[int | UOp, ...]) -> UOp:
        out, stride = UOp.const(self.idx_dtype, 0), 1
        for i, d in reversed(list(zip(idxs, shape))):
            if not isinstance(d, int) or d != 1:
                out = out + i * stride
            stride = self.smul(stride, d)
        return out

    def unflatten(self, flat: UOp, shape: tuple[int | UOp, ...]) -> tuple[UOp, ...]:
        out, stride = [], 1
        for j, d in reversed(list(enumerate(shape))):
            if isinstance(d, int) and d == 1:
                out.append(UOp.const(self.idx_dtype, 0))
            else:
                out.append((flat // stride) % (self.sz(d) if isinstance(d, UOp) else d) if j > 0 else flat // stride)
            stride = self.smul(stride, d)
        return tuple(reversed(out))

    def store_index(self, view: UOp, idxs: tuple[UOp, ...]) -> UOp:
        """The element of the buffer under `view` (reshapes, permutes, shrinks, flips of a DEFINE_GLOBAL) at idxs."""
        # a pad in the view (a strided slice's last group) must fold away: a store has no gate
        load = graph_rewrite(self.lower(view, idxs, TRUE), pm_symbolic + pm_loads)
        if load.op is not Ops.LOAD or len(load.src) != 2:
            raise NotImplementedError(f"a store through {view.op} of shape {view.shape} may land in padding")
        return load.src[1]

    def lower(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> UOp:
        return run_steps(self._lower_step(u, idxs, valid))

    def _lower_step(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
        # a step on run_steps' stack, not Python's: a kernel's value graph can be thousands of nodes deep
        key = (u, idxs, valid)
        if (r := self.memo.get(key)) is None:
            r = self.memo[key] = yield self._lower(u, idxs, valid)
        return r

    def _lower_gather(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
        """table[index[i...], j...]: the row is a loaded value, clamped into the table so the address stays inside it
        and gated so an out-of-range index reads 0 (CHECK_OOB checks the indices before the kernel runs)."""
        table, index = u.src
        n, k = table.shape[0], len(index.shape)
        row = (yield self._lower_step(index, idxs[:k], valid)).cast(self.idx_dtype)
        inside = (row >= 0) & (row < self.idx(n))
        last = self.sz(n) - 1 if isinstance(n, UOp) else UOp.const(self.idx_dtype, n - 1)
        clamped = -((-row.maximum(UOp.const(self.idx_dtype, 0))).maximum(-last))  # min(max(row, 0), n - 1)
        picked = yield self._lower_step(table, (clamped,) + idxs[k:], valid & inside)
        return inside.where(picked, UOp.const(u.dtype, 0))

    def _lower(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp) -> Step:
        op, src = u.op, u.src
        if op is Ops.DEFINE_GLOBAL:
            return UOp(Ops.LOAD, u.dtype, (u, idxs[0]) + (() if valid is TRUE else (valid,)))
        if op is Ops.CONST:
            return u
        if op is Ops.DEFINE_VAR:
            return u  # a bound variable's value used as data (a mean over a symbolic axis divides by it)
        if op is Ops.ARANGE:
            return idxs[0].cast(u.dtype)
        if op is Ops.GATHER:
            return (yield from self._lower_gather(u, idxs, valid))
        if op is Ops.RESHAPE and src[0].op is Ops.RESHAPE:
            # one reshape: the middle shape's dims would be split off by division only to be merged again
            return (yield self._lower_step(src[0].replace(arg=u.arg), idxs, valid))
        if op is Ops.RESHAPE:
            old = src[0].shape
            if tuple(d for d in old if d != 1) == tuple(d for d in u.arg if d != 1):  # only size-1 dims moved
                it = iter(i for i, d in zip(idxs, u.arg) if d != 1)
                return (
                    yield self._lower_step(
                        src[0], tuple(UOp.const(self.idx_dtype, 0) if d == 1 else next(it) for d in old), valid
                    )
                )
            return (yield self._lower_step(src[0], self.unflatten(self.flat_index(idxs, u.arg), old), valid))
        if op is Ops.PERMUTE:
            old_idxs: list[UOp] = [UOp.const(self.idx_dtype, 0)] * len(idxs)
            for new_axis, old_axis in enumerate(u.arg):
                old_idxs[old_axis] = idxs[new_axis]
            return (yield self._lower_step(src[0], tuple(old_idxs), valid))
        if op is Ops.EXPAND:
            expanded = tuple(UOp.const(self.idx_dtype, 0) if o == 1 else i for i, o in zip(idxs, src[0].shape))
            return (yield self._lower_step(src[0], expanded, valid))
        if op is Ops.SHRINK:
            shifted = tuple(i + self.idx(b) if _nonzero(b) else i for i, (b, _) in zip(idxs, u.arg))
            return (yield self._lower_step(src[0], shifted, valid))
        if op is Ops.FLIP:
            flipped = tuple((self.idx(d) - 1) - i if f else i for i, f, d in zip(idxs, u.arg, u.shape))
            return (yield self._lower_step(src[0], flipped, valid))
        if op is Ops.PAD:
            in_bounds = TRUE
            for i, (b, a), d in zip(idxs, u.arg, src[0].shape):
                if _nonzero(b):
                    in_bounds = in_bounds & (i >= self.idx(b))
                if _nonzero(a):
                    in_bounds = in_bounds & (
                        i < (d + b if isinstance(d, int) and isinstance(b, int) else self.sz(d) + self.sz(b))
                    )
            unpadded = tuple(i - self.idx(b) if _nonzero(b) else i for i, (b, _) in zip(idxs, u.arg))
            inner = yield self._lower_step(src[0], unpadded, valid & in_bounds)
            return in_bounds.where(inner, UOp.const(u.dtype, 0))
        if op is Ops.REDUCE_AXIS:
            reduce_op, axes = u.arg
            # lowerings of one reduce inside the same enclosing reduce loops share their loops, so unrolled copies
            # accumulate in one loop; inside different enclosing loops (one reduce feeding two reduces) each gets its
            # own loops
            key = (u, frozenset(r for i in idxs for r in i.toposort() if r.op is Ops.RANGE and r.arg[1] == "reduce"))
            blocked = self.blocked is not None and self.blocked[0] is u
            ropts = self.reduce_opts[1] if self.reduce_opts is not None and self.reduce_opts[0] is u else None
            unroll, padto = (ropts.unroll, ropts.padto) if ropts is not None else ({}, {})
            if key not in self.reduce_ranges:
                sizes = [self.blocked[2] if blocked else src[0].shape[a] for a in axes]  # type: ignore[index]
                sizes = [padto.get(a, d) // unroll.get(a, 1) for a, d in zip(axes, sizes)]
                self.reduce_ranges[key] = tuple(self.new_range(d, "reduce") for d in sizes)
            loop_of = dict(zip(axes, self.reduce_ranges[key]))
            if blocked:
                loop_of = {a: self.blocked[1] * self.blocked[2] + r for a, r in loop_of.items()}  # type: ignore[index]
            ranges = tuple(r for r in self.reduce_ranges[key] if r.op is Ops.RANGE)
            # each unrolled lane is lowered on its own and the lanes are combined before the accumulator; a padded
            # tail reads nothing and gives the identity
            lane_values = []
            for lanes in itertools.product(*(range(unroll.get(a, 1)) for a in axes)):
                lane_of = dict(zip(axes, lanes))
                at = {a: r * unroll[a] + lane_of[a] if a in unroll else r for a, r in loop_of.items()}
                inside = TRUE
                for a in padto:
                    inside = inside & (at[a] < src[0].shape[a])
                new_idxs = tuple(at.get(a, i) for a, i in enumerate(idxs))
                lane = yield self._lower_step(src[0], new_idxs, valid if inside is TRUE else valid & inside)
                if inside is not TRUE:
                    lane = inside.where(lane, UOp.const(u.dtype, identity(reduce_op, u.dtype)))
                lane_values.append(lane)
            value = lane_values[0]
            # bool lanes combine as logic (max is any, product is all), which the simplifier folds with constants
            combine = (
                {Ops.MAX: Ops.OR, Ops.MUL: Ops.AND, Ops.ADD: Ops.OR}[reduce_op] if u.dtype is dtypes.bool else reduce_op
            )
            for lane in lane_values[1:]:
                value = UOp(combine, u.dtype, (value, lane))
            if src[0].size == 0 or any(src[0].shape[a] == 0 for a in axes):
                value = UOp.const(u.dtype, identity(reduce_op, u.dtype))
            return UOp(Ops.REDUCE, u.dtype, (value, *ranges), reduce_op) if ranges else value
        if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
            lowered_src = []
            for s in src:
                lowered_src.append((yield self._lower_step(s, idxs, valid)))
            return UOp(op, u.dtype, tuple(lowered_src), u.arg)
        if op in (Ops.CONTIGUOUS, Ops.DETACH):
            return (yield self._lower_step(src[0], idxs, valid))
        raise NotImplementedError(f"cannot lower {op} inside a kernel")


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


def _tile_start(r: UOp, amount: int, size: int) -> UOp:
    """First index of tile r of an axis cut into tiles of amount; a last partial tile is moved back to end at size,
    overlapping the one before it (its outputs are computed twice, to equal values)."""
    if amount == 1:
        return r
    if size % amount == 0 or r.op is Ops.CONST:
        return r * amount
    return (r * amount < size - amount).where(r * amount, UOp.const(r.dtype, size - amount))


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
        while out.op is not Ops.DEFINE_GLOBAL:
            out = out.src[0]
    # a symbolic shape counts at its largest (UOp.size)
    sizes = [u.arg[1] for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL] + [u.size for u in ast.toposort()]
    idx_dtype = dtypes.int64 if max(sizes, default=0) >= 2**31 - 1 else dtypes.int32
    shape = value.shape
    reduce = blockable_sum(value)
    block = check_reduce_block(opts, (reduce.src[0].shape, reduce.arg[1][0]) if reduce is not None else None)
    # partial sums added in memory read the output, so no tile may overlap another
    reads_output = bool(opts) and (block is not None or reads_own_output(lower_kernel(ast)))
    applied = check_opts(opts, shape, reads_output)
    up, tiles = applied.upcasts, applied.tiles
    reduces = [u for u in value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL) if u.op is Ops.REDUCE_AXIS]
    only = reduces[0] if len(reduces) == 1 else None
    ropts = check_reduce_opts(opts, (only.src[0].shape, only.arg[1]) if only else None, block is not None)
    # check_opts cuts no symbolic axis
    counts = [d if up.get(a, 1) == 1 else -(-d // up[a]) for a, d in enumerate(shape)]
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
