"""codegen/gpu_dims.py: every iteration of a kernel's global loops is run by exactly one work item, within limits."""

import itertools
import numpy as np
import pytest
from fusegrad import Tensor, Variable
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


def lowered_kernels(build) -> list:
    """The linear kernels realizing build() lowers (on NULL: nothing runs)."""
    from fusegrad.runtime.device import Device

    infos, null = [], Device["NULL"]
    real = type(null).build
    type(null).build = lambda self, info: infos.append(info) or real(self, info)
    try:
        build().realize()
    finally:
        type(null).build = real
    return infos


def test_few_outputs_with_one_reduce_nest_split_the_reduce_over_a_work_group():
    import numpy as np
    from fusegrad import Tensor

    (info,) = lowered_kernels(lambda: Tensor(np.ones((6, 300), np.float32), device="NULL").max(axis=1))
    dims = launch_dims(info.lin)
    reduce = next(u for u in info.lin if u.op is Ops.RANGE and u.arg[1] == "reduce")
    assert dims.grouped is reduce and dims.lanes == GROUP_SIZE
    assert dims.local_size == (GROUP_SIZE, 1, 1) and dims.global_size == (GROUP_SIZE, 6, 1)
    assert all(a.dim == 1 for a in dims.axes.values())
    plain = launch_dims(info.lin, group_reduce=False)
    assert plain.grouped is None and plain.global_size[0] >= 6
    # many outputs fill a GPU without splitting: no grouping
    (wide,) = lowered_kernels(lambda: Tensor(np.ones((5000, 40), np.float32), device="NULL").sum(axis=1))
    assert launch_dims(wide.lin).grouped is None


def test_a_symbolic_shape_on_a_gpu_device_is_a_clear_error():
    """A kernel over a bound Variable's size on CL raises NotImplementedError saying so (it was a TypeError from
    deep in the launch-grid code); the same tensor still runs on CPU."""
    rows = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    n = Variable("n", 1, 64).bind(5)
    with pytest.raises(NotImplementedError, match="symbolic shape"):
        Tensor(rows, device="CL")[:n].exp().contiguous().realize()
    got = Tensor(rows)[:n].exp().contiguous().realize().pad(((0, 64 - n), None)).numpy()[:5]
    np.testing.assert_allclose(got, np.exp(rows[:5]), rtol=1e-6)
