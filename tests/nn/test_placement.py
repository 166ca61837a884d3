"""placed_like (nn/placement.py): a value moved to a tensor's device or split like it, values unchanged."""

import numpy as np

from fusegrad import Tensor
from fusegrad.nn.placement import placed_like
from fusegrad.uop.multi import multi_axis

DEVS = ("CPU", "CPU:1")
VALUES = np.arange(24, dtype=np.float32).reshape(4, 6)


def test_value_on_the_same_device_is_kept():
    x, t = Tensor(VALUES), Tensor.zeros(4, 6)
    assert placed_like(x, t) is x
    assert placed_like(x, t, match_axis=True) is x


def test_value_moves_to_the_device():
    x, t = Tensor(VALUES), Tensor.zeros(4, 6, device="CPU:1")
    out = placed_like(x, t)
    assert out.device == "CPU:1"
    np.testing.assert_array_equal(out.numpy(), VALUES)


def test_sharded_value_moves_to_one_device():
    x, t = Tensor(VALUES).shard(DEVS, 0), Tensor.zeros(4, 6, device="CPU:1")
    out = placed_like(x, t)
    assert out.device == "CPU:1"
    np.testing.assert_array_equal(out.numpy(), VALUES)


def test_value_is_split_like_the_tensor():
    x, t = Tensor(VALUES), Tensor.zeros(4, 6).shard(DEVS, 1)
    out = placed_like(x, t)
    assert out.device == DEVS and multi_axis(out.uop) == 1
    np.testing.assert_array_equal(out.numpy(), VALUES)


def test_split_along_another_axis_is_resplit_only_with_match_axis():
    x, t = Tensor(VALUES).shard(DEVS, 0), Tensor.zeros(4, 6).shard(DEVS, 1)
    assert placed_like(x, t) is x
    out = placed_like(x, t, match_axis=True)
    assert out.device == DEVS and multi_axis(out.uop) == 1
    np.testing.assert_array_equal(out.numpy(), VALUES)


def test_split_along_the_same_axis_is_kept_with_match_axis():
    x, t = Tensor(VALUES).shard(DEVS, 0), Tensor.zeros(4, 6).shard(DEVS, 0)
    assert placed_like(x, t, match_axis=True) is x
