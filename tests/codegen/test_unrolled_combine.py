"""The lanes of an unrolled reduce combine as a balanced tree when the combine is exact (max, logic, integers): a 3x3
max pool's 9 taps take 4 dependent steps, not 8. Float sums and products keep their order (the rounding of the kernel
without opts). Values equal torch's, NaN and infinities included."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops


def _deepest_chain(t: Tensor, op: Ops) -> int:
    """The most `op` instructions on one dependency path of the kernel that reduces."""
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    lin = lower_to_linear(items[-1].ast, Device["CPU"].renderer).lin
    depth: dict = {}
    for u in lin:
        below = max((depth.get(s, 0) for s in u.src), default=0)
        depth[u] = below + (u.op is op)
    return max(depth.values())


@pytest.mark.parametrize("kernel, stride", [(3, 2), (3, 1), (2, 2)])
def test_max_pool_taps_combine_as_a_tree_and_equal_torch(kernel, stride):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 17, 19)).astype(np.float32)
    x[0, 1, 3, 4], x[1, 2, 8, 8], x[0, 0, 0, 0] = np.nan, np.inf, -np.inf
    y = Tensor(x).max_pool2d(kernel_size=kernel, stride=stride)
    assert _deepest_chain(y, Ops.MAX) <= int(np.ceil(np.log2(kernel * kernel)))
    want = F.max_pool2d(torch.from_numpy(x), kernel, stride).numpy()
    np.testing.assert_array_equal(y.numpy(), want)


def test_integer_window_sum_is_exact():
    x = np.random.default_rng(1).integers(-1000, 1000, (3, 4, 12, 12)).astype(np.int32)
    y = Tensor(x).reshape(3, 4, 4, 3, 4, 3).sum((3, 5))
    np.testing.assert_array_equal(y.numpy(), x.reshape(3, 4, 4, 3, 4, 3).sum((3, 5)))
