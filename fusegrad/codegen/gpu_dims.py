"""Maps a kernel's global loops onto GPU launch dimensions: which work-item id each loop reads, and the grid.

The linearizer opens every global loop first, perfectly nested, and closes them last, so a GPU kernel drops those loops
and gives each work item one iteration: the innermost global loop reads id 0 (neighbouring work items then touch
neighbouring elements), the next one id 1, and the rest are flattened into id 2. Each dimension's global size is its
trip count rounded up to a multiple of its local size; the work items past the end skip the body.

A kernel with few outputs and one reduce loop nest (a sum to a scalar, a row of partial sums) would leave most of the
GPU idle: its work group instead has `lanes` work items along dimension 0 that split the outermost reduce loop, combine
their partial accumulators in local memory with barriers, and one lane writes the result; the global loops then read
dimension 1 (one work group per output). A device whose work items are CPU threads (PoCL) gains nothing from it and
turns it off."""

from __future__ import annotations
from dataclasses import dataclass
from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.uop.ops import Ops, UOp

GROUP_SIZE = 128  # work items per work group (CUDA block): a multiple of the warp, below every device's limit
MAX_GRID_YZ = 65535  # CUDA's bound on a grid's y and z extent, in blocks
MAX_GROUPED_OUTPUTS = 4096  # up to this many outputs a reduce is split over a work group (more already fill a GPU)
MIN_GROUPED_TRIPS = 8  # a shorter outermost reduce loop is left to one work item
# accumulators combined in local memory: wider than a byte and no narrow float (those accumulate in float32 anyway)
GROUPED_DTYPES = (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.uint64)
GROUPED_OPS = (Ops.ADD, Ops.MUL, Ops.MAX)


@dataclass(frozen=True)
class AxisIndex:
    """A global loop's value in a work item: (id[dim] // divisor) % size, the modulo dropped when `outermost`."""

    dim: int
    divisor: int
    size: int
    outermost: bool


@dataclass(frozen=True)
class LaunchDims:
    global_size: tuple[int, int, int]  # work items per dimension, a multiple of local_size
    local_size: tuple[int, int, int]
    axes: dict[UOp, AxisIndex]
    grouped: UOp | None = None  # the reduce loop the lanes of a work group split, if any
    lanes: int = 1

    @property
    def groups(self) -> tuple[int, int, int]:
        return tuple(g // lo for g, lo in zip(self.global_size, self.local_size))  # type: ignore[return-value]

    def index(self, r: UOp, work_item_id: str) -> str:
        """C expression of loop r's value, given the expression of its dimension's work-item id."""
        a = self.axes[r]
        expr = work_item_id if a.divisor == 1 else f"({work_item_id}/{a.divisor})"
        return expr if a.outermost else f"({expr}%{a.size})"


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def global_loops(lin: tuple[UOp, ...]) -> list[UOp]:
    return [u for u in lin if u.op is Ops.RANGE and u.arg[1] == "global"]


def grouped_reduce(lin: tuple[UOp, ...]) -> UOp | None:
    """The reduce loop a work group splits over its lanes: the kernel's only top-level reduce loop, when the kernel
    has at most MAX_GROUPED_OUTPUTS outputs and that loop's accumulators combine in local memory."""
    if prod(int(r.src[0].arg) for r in global_loops(lin)) > MAX_GROUPED_OUTPUTS:
        return None
    top, depth = [], 0
    for u in lin:
        if u.op is Ops.RANGE and u.arg[1] == "reduce":
            if depth == 0:
                top.append(u)
            depth += 1
        elif u.op is Ops.ENDRANGE and u.src[0].arg[1] == "reduce":
            depth -= 1
    if len(top) != 1 or int(top[0].src[0].arg) < MIN_GROUPED_TRIPS:
        return None
    updates = grouped_updates(lin, top[0])
    if not updates or any(u.dtype not in GROUPED_DTYPES or u.arg not in GROUPED_OPS for u in updates):
        return None
    return top[0]


def grouped_updates(lin: tuple[UOp, ...], r: UOp) -> list[UOp]:
    """The accumulator updates that loop r carries (their accumulators are combined across the lanes)."""
    return [u for u in lin if u.op is Ops.ACC_UPDATE and r in u.src[2:]]


def launch_dims(lin: tuple[UOp, ...], group_reduce: bool = True, group_size: int = GROUP_SIZE) -> LaunchDims:
    """The launch of `lin` on a GPU: a pure function of the kernel and the device's choice to split reductions over
    work groups, so renderer and runtime compute the same."""
    loops = global_loops(lin)
    if any(r.src[0].op is not Ops.CONST for r in loops):
        # a grid's size is fixed when the kernel is launched from its compiled form; no runtime size reaches it
        raise NotImplementedError(
            "a kernel over a symbolic shape (a bound Variable's size) does not run on GPU devices yet: its output loop "
            "has no fixed trip count for the launch grid; run it on CPU or LLVM, or pad the tensor to a fixed shape"
        )
    sizes = [int(r.src[0].arg) for r in loops]
    if group_reduce and (grouped := grouped_reduce(lin)) is not None:
        lanes = min(group_size, _pow2_at_least(int(grouped.src[0].arg)))
        axes, divisor = {}, 1
        for k, r in enumerate(reversed(loops)):  # every global loop flattened into dimension 1, innermost fastest
            axes[r] = AxisIndex(1, divisor, int(r.src[0].arg), outermost=k == len(loops) - 1)
            divisor *= int(r.src[0].arg)
        return LaunchDims((lanes, prod(sizes), 1), (lanes, 1, 1), axes, grouped, lanes)
    # innermost loop -> dimension 0, the next -> 1, all outer ones flattened into 2
    groups: list[list[int]] = [[i] for i in reversed(range(len(loops)))][:2]
    if len(loops) > 2:
        groups.append(list(range(len(loops) - 2)))
    extents = [prod(sizes[i] for i in g) for g in groups]
    if any(e > MAX_GRID_YZ for e in extents[1:]):  # too tall for a grid: everything flattened into dimension 0
        groups, extents = [list(range(len(loops)))], [prod(sizes)]
    axes: dict[UOp, AxisIndex] = {}
    for dim, members in enumerate(groups):
        divisor = 1
        for k, i in enumerate(reversed(sorted(members))):  # innermost member varies fastest
            axes[loops[i]] = AxisIndex(dim, divisor, sizes[i], outermost=k == len(members) - 1)
            divisor *= sizes[i]
    extents += [1] * (3 - len(extents))
    local, budget = [], group_size
    for e in extents:
        lo = min(_pow2_at_least(e), budget)
        local.append(lo)
        budget //= lo
    global_size = tuple(-(-max(e, 1) // lo) * lo for e, lo in zip(extents, local))
    return LaunchDims(global_size, tuple(local), axes)  # type: ignore[arg-type]
