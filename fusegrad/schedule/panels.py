"""Reads a big matmul's weight in panels: x @ w with w a row-major (k, n) matrix reads w's columns n elements apart,
rows that alias in L1 and defeat the prefetcher. Where the target's register tiles gain from it (the renderer's
`weight_panels` capability), w is first copied into panels of `panel` columns, each contiguous over k
([n/panel][k][panel]), and the matmul's register tile walks one panel's rows one after another. The output keeps its
memory order: (..., n/panel, panel) is (..., n).

The front end builds every matmul the same way (the broadcast product of x's rows and wᵀ, summed over k); this pass
decides the layout, so no front-end code asks which device it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field

from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.uop.ops import Ops, UOp, elementwise_uop
from fusegrad.uop.pattern import PatternMatcher, UPat, rewrite_once

# a matmul this big reads its weight in panels: below, the copy costs more than the panels save (measured on one
# thread with 16-lane vectors: 1024^2 and up gain 10-20 %, 768^2 and smaller lose to the copy)
PANEL_MIN_ROWS, PANEL_MIN_MACS = 64, 1 << 29
# ... and with 8-lane vectors (AVX2), whose tiles of 16 columns alias in L1 more often: panels and their copy beat the
# plain tile from 2^23 multiply-adds (one thread, CPU time with the copy: 128x128x512 0.22 -> 0.19 ms, 128x768x2048
# 7.2 -> 4.6, 128x2048x768 6.2 -> 4.6, 512x768x2048 28 -> 17; 64x256x256 0.10 -> 0.105)
NARROW_PANEL_MIN_MACS, NARROW_VECTOR_BYTES = 1 << 23, 32


@dataclass
class PanelTarget:
    """What the pass needs of the target: the width of one vector register (a panel is two of them); and of the graph,
    the sums and copies read by one node only."""

    vector_bytes: int
    single_reader: set[UOp] = field(default_factory=set)
    origin: dict[UOp, UOp] = field(default_factory=dict)  # a node rebuilt over rewritten sources -> the graph's own

    def read_once(self, u: UOp) -> bool:
        """Whether one node reads u in the graph the pass was given (u, or the node it was rebuilt from)."""
        return self.origin.get(u, u) in self.single_reader

    def columns(self, itemsize: int) -> int:
        return max(2 * self.vector_bytes // itemsize, 1)

    def min_macs(self) -> int:
        """The fewest multiply-adds of a matmul whose weight is worth copying into panels on this target."""
        narrow = self.vector_bytes <= NARROW_VECTOR_BYTES
        return min(PANEL_MIN_MACS, NARROW_PANEL_MIN_MACS) if narrow else PANEL_MIN_MACS


def _weight(cols: UOp, n: int, k: int, ctx: PanelTarget) -> UOp | None:
    """The (k, n) matrix w when cols is wᵀ broadcast to (..., n, k): EXPAND(RESHAPE(PERMUTE(w, (1, 0)))), the
    expand absent when nothing broadcasts, the reshapes adding leading ones. A copy of w that only this matmul reads
    (the front end's contiguous Wᵀ for x @ W.T) is skipped: the panels are copied from w's view at once."""
    if cols.op is Ops.EXPAND:
        cols = cols.src[0]
    if cols.shape[-2:] != (n, k) or prod(cols.shape) != n * k:
        return None
    while cols.op is Ops.RESHAPE:
        cols = cols.src[0]
    if cols.op is not Ops.PERMUTE or cols.arg != (1, 0) or cols.src[0].shape != (k, n):
        return None
    w = cols.src[0]
    copy = w.op is Ops.CONTIGUOUS and (type(w.arg) is int or w.arg == "layout")
    return w.src[0] if copy and ctx.read_once(w) else w


def _rows(rows: UOp, n: int, k: int) -> UOp | None:
    """x's rows (..., m, 1, k) when rows is them broadcast over n: EXPAND(x viewed as (..., m, 1, k))."""
    if rows.op is not Ops.EXPAND or rows.src[0].shape[-2:] != (1, k):
        return None
    return rows.src[0]


def pack_weight(view: UOp, reduce: UOp, ctx: PanelTarget) -> UOp | None:
    """sum_k x[..., m, k] * w[k, n], viewed as (..., m, n), as (x's rows) x (w in panels), when the matmul is big
    enough to pay for the copy and the view is the sum's only reader (else the sum would be computed twice)."""
    if not ctx.read_once(reduce):
        return None
    op, axes = reduce.arg
    shape = reduce.src[0].shape
    if op is not Ops.ADD or axes != (len(shape) - 1,) or len(shape) < 3 or not all(type(d) is int for d in shape):
        return None
    mul = reduce.src[0]
    if mul.op is not Ops.MUL or mul.dtype not in (dtypes.float32, dtypes.float64) or reduce.dtype is not mul.dtype:
        return None
    *lead, n, k = shape
    for a, b in ((0, 1), (1, 0)):
        if (w := _weight(mul.src[b], n, k, ctx)) is not None and (x := _rows(mul.src[a], n, k)) is not None:
            break
    else:
        return None
    panel, rows = ctx.columns(mul.dtype.itemsize), prod(lead)
    if n % panel or n == panel or rows < PANEL_MIN_ROWS or rows * k * n < ctx.min_macs():
        return None
    dt = mul.dtype
    packed = UOp(Ops.PERMUTE, dt, (UOp(Ops.RESHAPE, dt, (w,), (k, n // panel, panel)),), (1, 0, 2))
    packed = UOp(Ops.CONTIGUOUS, dt, (packed,), "weight_panels")  # (n/panel, k, panel)
    full = (*lead, n // panel, panel, k)
    cols = UOp(Ops.PERMUTE, dt, (packed,), (0, 2, 1))
    cols = UOp(Ops.EXPAND, dt, (UOp(Ops.RESHAPE, dt, (cols,), (*(1,) * len(lead), *full[-3:])),), full)
    xs = UOp(Ops.EXPAND, dt, (UOp(Ops.RESHAPE, dt, (x,), (*lead, 1, 1, k)),), full)
    products = elementwise_uop(Ops.MUL, dt, (xs, cols) if a == 0 else (cols, xs), full)
    summed = UOp(Ops.REDUCE_AXIS, dt, (products,), (Ops.ADD, (len(full) - 1,)))
    # through the (..., n/panel, panel) view: the kernel's output axes are then rows, panels and a panel's columns
    return UOp(Ops.RESHAPE, dt, (UOp(Ops.RESHAPE, dt, (summed,), full[:-1]),), view.arg)


pm_weight_panels = PatternMatcher(
    [(UPat(Ops.RESHAPE, src=(UPat(Ops.REDUCE_AXIS, name="reduce"),), name="view"), pack_weight)]
)


def pack_weight_panels(roots: list[UOp], target: PanelTarget | None) -> tuple[list[UOp], dict[UOp, UOp]]:
    """The roots with every big matmul's weight read in panels (no target: the device's kernels do not gain)."""
    if target is None:
        return roots, {}
    readers: dict[UOp, int] = {}
    for u in UOp(Ops.SINK, src=tuple(roots)).toposort():
        for s in u.src:
            if s.op is Ops.REDUCE_AXIS or s.op is Ops.CONTIGUOUS:
                readers[s] = readers.get(s, 0) + 1
    if not readers:
        return roots, {}
    target.single_reader = {r for r, n in readers.items() if n == 1}
    return rewrite_once(roots, pm_weight_panels, target, target.origin)
