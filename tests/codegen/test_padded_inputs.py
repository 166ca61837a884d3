"""A padded copy of a computed value (a batch norm, ReLU and channel shuffle of a stored buffer, as a conv's padded
input would be): its index arithmetic without divisions by the row width, its per-channel loads ungated, its buffers
`restrict` in C, and its values equal torch's. A conv's own padding pass still stores such an input first."""

import numpy as np
import torch
import torch.nn.functional as F

from fusegrad import Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops
from tests.rendering import rendered

C, G, H = 24, 3, 14


def shuffled_bn_relu(x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    """ShuffleNet's unit input: a batch norm and ReLU of a stored conv output, its channels shuffled over G groups."""
    y = (x * scale.reshape(1, C, 1, 1) + shift.reshape(1, C, 1, 1)).relu()
    return y.reshape(1, G, C // G, H, H).transpose(1, 2).reshape(1, C, H, H)


def arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((1, C, H, H), dtype=np.float32),
        rng.standard_normal((C, 1, 3, 3), dtype=np.float32),
        rng.standard_normal(C, dtype=np.float32),
        rng.standard_normal(C, dtype=np.float32),
    )


def padded_shuffled(xn, sn, tn) -> Tensor:
    x, s, t = (Tensor(a).realize() for a in (xn, sn, tn))
    return shuffled_bn_relu(x, s, t).pad(((0, 0), (0, 0), (1, 1), (1, 1))).contiguous()


def test_padded_shuffle_indexes_rows_and_columns_as_they_are():
    xn, _, sn, tn = arrays()
    items, _, _ = create_schedule([padded_shuffled(xn, sn, tn).uop], [Device["CPU"]])
    kernels = [i for i in items if i.ast.op is Ops.SINK]
    assert len(kernels) == 1
    src = rendered(Device["CPU"].renderer, "k", lower_to_linear(kernels[0].ast, Device["CPU"].renderer).lin)
    # the reshapes keep the rows and columns as they are: only the channel is split into group and channel
    assert f"/{H})" not in src and f"%{H})" not in src, src
    # the scale and shift are read at a channel always inside their buffers: no gate
    assert src.count("?data") == 1, src
    assert "float* restrict data0" in src and "const float* restrict data1" in src


def test_values_equal_torch():
    xn, wn, sn, tn = arrays(1)
    y = torch.relu(torch.tensor(xn) * torch.tensor(sn).reshape(1, C, 1, 1) + torch.tensor(tn).reshape(1, C, 1, 1))
    y = y.reshape(1, G, C // G, H, H).transpose(1, 2).reshape(1, C, H, H)
    np.testing.assert_allclose(
        padded_shuffled(xn, sn, tn).numpy(), F.pad(y, (1, 1, 1, 1)).numpy(), rtol=1e-5, atol=1e-6
    )
    x, w, s, t = (Tensor(a).realize() for a in (xn, wn, sn, tn))
    got = shuffled_bn_relu(x, s, t).conv2d(w, padding=1, groups=C).numpy()
    np.testing.assert_allclose(got, F.conv2d(y, torch.tensor(wn), padding=1, groups=C).numpy(), rtol=1e-5, atol=1e-5)


def test_padded_reshape_with_shared_trailing_dims_equals_numpy():
    # a reshape whose last dims are shared, read through a pad that steps outside them on both sides
    an = np.arange(2 * 6 * 5, dtype=np.float32).reshape(2, 6, 5)
    got = Tensor(an).reshape(3, 4, 5).pad(((1, 0), (0, 0), (2, 1))).numpy()
    np.testing.assert_array_equal(got, np.pad(an.reshape(3, 4, 5), ((1, 0), (0, 0), (2, 1))))
    got = Tensor(an).reshape(2, 30).pad(((0, 1), (3, 2))).reshape(3, 35).numpy()
    np.testing.assert_array_equal(got, np.pad(an.reshape(2, 30), ((0, 1), (3, 2))).reshape(3, 35))
