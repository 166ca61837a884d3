"""Maps a kernel's global loops onto GPU launch dimensions: which work-item id each loop reads, and the grid.

The linearizer opens every global loop first, perfectly nested, and closes them last, so a GPU kernel drops those loops
and gives each work item one iteration: the innermost global loop reads id 0 (neighbouring work items then touch
neighbouring elements), the next one id 1, and the rest are flattened into id 2. Each dimension's global size is its
trip count rounded up to a multiple of its local size; the work items past the end skip the body."""

from __future__ import annotations
from dataclasses import dataclass
from fusegrad.helpers import prod
from fusegrad.uop.ops import Ops, UOp

GROUP_SIZE = 128  # work items per work group (CUDA block): a multiple of the warp, below every device's limit
MAX_GRID_YZ = 65535  # CUDA's bound on a grid's y and z extent, in blocks


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


def launch_dims(lin: tuple[UOp, ...], group_size: int = GROUP_SIZE) -> LaunchDims:
    """The launch of `lin` on a GPU: a pure function of the kernel, so renderer and runtime compute the same."""
    loops = global_loops(lin)
    sizes = [int(r.src[0].arg) for r in loops]
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
