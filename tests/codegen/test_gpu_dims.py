"""codegen/gpu_dims.py: every iteration of a kernel's global loops is run by exactly one work item, within limits."""

import itertools
import pytest
from fusegrad.codegen.gpu_dims import GROUP_SIZE, MAX_GRID_YZ, launch_dims
from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp


def loops(*sizes: int) -> tuple[UOp, ...]:
    return tuple(
        UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, s),), (i, "global")) for i, s in enumerate(sizes)
    )


def run_work_items(sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The loop values each in-bounds work item computes, by evaluating the index expressions in Python."""
    lin = loops(*sizes)
    dims = launch_dims(lin)
    seen = []
    for ids in itertools.product(*(range(g) for g in dims.global_size)):
        values = tuple(
            eval(dims.index(r, str(ids[dims.axes[r].dim])).replace("/", "//"))  # C integer division on non-negatives
            for r in lin
        )
        if all(v < s for v, s in zip(values, sizes)):  # the kernel's bound checks
            seen.append(values)
    return seen


@pytest.mark.parametrize("sizes", [(7,), (3, 5), (2, 3, 4), (2, 3, 4, 5), (1000,), (130, 3), (1, 200)])
def test_each_iteration_runs_exactly_once(sizes):
    seen = run_work_items(sizes)
    assert sorted(seen) == list(itertools.product(*(range(s) for s in sizes)))


@pytest.mark.parametrize("sizes", [(7,), (3, 5), (2, 3, 4, 5), (100000, 3), (70000, 70000, 2)])
def test_launch_is_within_group_and_grid_limits(sizes):
    dims = launch_dims(loops(*sizes))
    assert all(g % lo == 0 for g, lo in zip(dims.global_size, dims.local_size))
    assert dims.local_size[0] * dims.local_size[1] * dims.local_size[2] <= GROUP_SIZE
    assert dims.groups[1] <= MAX_GRID_YZ and dims.groups[2] <= MAX_GRID_YZ
    total = 1
    for s in sizes:
        total *= s
    assert dims.global_size[0] * dims.global_size[1] * dims.global_size[2] >= total


def test_innermost_loop_is_dimension_zero_so_neighbours_read_neighbours():
    lin = loops(4, 6)
    dims = launch_dims(lin)
    assert dims.axes[lin[1]].dim == 0 and dims.axes[lin[0]].dim == 1
    assert dims.index(lin[1], "i") == "i"


def test_a_kernel_without_global_loops_is_one_work_item():
    dims = launch_dims(())
    assert dims.global_size == (1, 1, 1) and dims.local_size == (1, 1, 1)
