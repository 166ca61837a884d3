"""Blocked float sums: a long ADD reduce becomes nested reduces over short blocks, each level a fresh partial sum.

One accumulator summing n floats in a row loses about n/2 ulps (16M copies of 0.1 come out 1 % off); summing blocks
of at most INNER_BLOCK values into a fresh partial and adding at most OUTER_BLOCK partials per level above keeps the
error to a few ulps per level, as pairwise summation does, while the innermost loop stays a contiguous, vectorizable
sum. Integer sums are exact and max/min do not round, so only float ADD reduces are blocked."""

from __future__ import annotations
from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from fusegrad.uop.symbolic import pm_symbolic

# the innermost block: long enough that a vectorized loop amortizes its final horizontal add, short enough that a
# block run one add at a time (a matmul's K loop, the PYTHON device) loses only a few ulps per level
INNER_BLOCK = 256
# partials added per level above it: these adds run once per block, so short levels cost nothing
OUTER_BLOCK = 16


class BlockSplitter:
    """Splits each long reduce range the same way wherever it appears, so unrolled copies of one reduce keep sharing
    their loops."""

    def __init__(self, kernel: UOp):
        self.next_id = 1 + max((u.arg[0] for u in kernel.toposort() if u.op is Ops.RANGE), default=-1)
        self.splits: dict[tuple[UOp, int], tuple[UOp, UOp, UOp | None]] = {}
        self.copies: dict[tuple[UOp, UOp, int], UOp] = {}

    def new_range(self, like: UOp, size: int) -> UOp:
        if size == 1:
            return UOp.const(like.dtype, 0)
        r = UOp(Ops.RANGE, like.dtype, (UOp.const(like.dtype, size),), (self.next_id, "reduce"))
        self.next_id += 1
        return r

    def split(self, r: UOp, block: int) -> tuple[UOp, UOp, UOp | None]:
        """r -> (blocks, within, tail): r = blocks*block + within over the whole blocks, then tail after them."""
        if (r, block) not in self.splits:
            size = r.src[0].arg
            tail = None if size % block == 0 else self.new_range(r, size % block)
            self.splits[(r, block)] = (self.new_range(r, size // block), self.new_range(r, block), tail)
        return self.splits[(r, block)]

    def copy(self, r: UOp, split: UOp, block: int) -> UOp:
        """A fresh loop like r inside the tail of split's blocking (one per tail, shared by the unrolled copies)."""
        if (r, split, block) not in self.copies:
            self.copies[(r, split, block)] = self.new_range(r, r.src[0].arg)
        return self.copies[(r, split, block)]


def _substitute(value: UOp, mapping: dict[UOp, UOp]) -> UOp:
    return graph_rewrite(value, PatternMatcher([(UPat(Ops.RANGE, name="x"), lambda x: mapping.get(x))]))


def _block_reduce(red: UOp, ctx: BlockSplitter) -> UOp | None:
    """REDUCE(v, *ranges) over more than a block -> REDUCE(REDUCE(v, *inner block), *outer ranges) [+ tail]."""
    if red.arg is not Ops.ADD or not dtypes.is_float(red.dtype):
        return None
    value, ranges = red.src[0], red.src[1:]
    if any(r.src[0].op is not Ops.CONST for r in ranges):
        return None  # a symbolic loop's length is not known when compiling: it is summed plainly
    sizes = [r.src[0].arg for r in ranges]
    # a reduce over partial sums is a level above a block: its adds are few, so its blocks are short
    block = OUTER_BLOCK if value.op is Ops.REDUCE and value.arg is Ops.ADD else INNER_BLOCK
    if prod(sizes) <= block:
        return None
    # the innermost ranges that fit in one block form it; otherwise the innermost range is cut into blocks
    cut = len(ranges)
    while cut > 0 and prod(sizes[cut - 1 :]) <= block:
        cut -= 1
    if cut < len(ranges):
        inner = UOp(Ops.REDUCE, red.dtype, (value, *ranges[cut:]), Ops.ADD)
        return UOp(Ops.REDUCE, red.dtype, (inner, *ranges[:cut]), Ops.ADD)
    last, outer = ranges[-1], ranges[:-1]
    blocks, within, tail = ctx.split(last, block)
    body = _substitute(value, {last: blocks * block + within})
    inner = UOp(Ops.REDUCE, red.dtype, (body, within), Ops.ADD)
    out_ranges = (*outer, *([blocks] if blocks.op is Ops.RANGE else []))
    out = UOp(Ops.REDUCE, red.dtype, (inner, *out_ranges), Ops.ADD) if out_ranges else inner
    if tail is None:
        return out
    # the tail is another loop nest: its outer loops and the loops of reduces inside value are fresh copies
    inner_loops = dict.fromkeys(s for u in value.toposort() if u.op is Ops.REDUCE for s in u.src[1:])
    copies = {loop: ctx.copy(loop, last, block) for loop in (*inner_loops, *outer)}
    tail_value = _substitute(value, copies | {last: tail + (last.src[0].arg // block) * block})
    tail_ranges = (*(copies[o] for o in outer), *([tail] if tail.op is Ops.RANGE else []))
    return out + (UOp(Ops.REDUCE, red.dtype, (tail_value, *tail_ranges), Ops.ADD) if tail_ranges else tail_value)


pm_blocked_sums = PatternMatcher([(UPat(Ops.REDUCE, name="red"), _block_reduce)])


def block_long_sums(kernel: UOp) -> UOp:
    return graph_rewrite(kernel, pm_blocked_sums + pm_symbolic, ctx=BlockSplitter(kernel))
