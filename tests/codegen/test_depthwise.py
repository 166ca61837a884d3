"""Depthwise convolutions (a 3x3 window per channel, ShuffleNet's and MobileNet's): the heuristics unroll the window
and leave the output row's loop to the C compiler, the packer leaves it the weight loads, and the values equal
torch's for stride 1 and 2, with the scale and shift of a batch norm after."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptOps
from fusegrad.renderer.gpu import OpenCLRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from tests.rendering import rendered


def depthwise(x: Tensor, w: Tensor, scale: Tensor, stride: int) -> Tensor:
    return x.conv2d(w, padding=1, groups=x.shape[1], stride=stride) * scale + 0.5


def conv_ast(c: int, size: int, stride: int):
    x, w = Tensor.rand(1, c, size, size).realize(), Tensor.rand(c, 1, 3, 3).realize()
    items, _, _ = create_schedule([depthwise(x, w, Tensor.rand(1, c, 1, 1).realize(), stride).uop], [Device["CPU"]])
    return items[-1].ast  # the padded input is stored by a kernel before


@pytest.mark.parametrize("c, size, stride", [(136, 28, 1), (272, 14, 1), (24, 112, 2), (544, 7, 1), (112, 57, 2)])
def test_window_is_unrolled_and_the_row_left_to_the_compiler(avx512_target, c, size, stride):
    with Context(NUM_CPU_THREADS=2):
        info = lower_to_linear(conv_ast(c, size, stride), avx512_target)
    unrolled = sorted(o.amount for o in info.opts if o.op is OptOps.UNROLL)
    assert unrolled == [3, 3], info.opts
    assert not [o for o in info.opts if o.op is OptOps.UPCAST and o.axis == 3], "no upcast along the output row"
    # an even number of rows is walked in pairs, which share the loads of the input rows both windows cover
    assert [o for o in info.opts if o.op is OptOps.UPCAST] == ([] if size % 2 else [Opt(OptOps.UPCAST, 2, 2)])
    # the 9 weight loads of a channel stay scalars: a vector of them read lane by lane keeps GCC from vectorizing
    # the row's loop
    assert "fg_floatx" not in rendered(avx512_target, "k", info.lin)


def test_runs_of_loads_read_as_scalars_still_pack_without_a_loop_vectorizer():
    info = lower_to_linear(conv_ast(136, 28, 1), Device["CPU"].renderer)
    # OpenCL C (a work item per output) keeps the one vector load of a channel's weights
    assert "float4" in rendered(OpenCLRenderer(), "k", info.lin)


@pytest.mark.parametrize("c, size, stride", [(8, 28, 1), (5, 14, 2), (16, 7, 1), (3, 9, 2)])
def test_depthwise_values_equal_torch(c, size, stride):
    rng = np.random.default_rng(c * size + stride)
    xn = rng.standard_normal((1, c, size, size), dtype=np.float32)
    wn, sn = rng.standard_normal((c, 1, 3, 3), dtype=np.float32), rng.standard_normal((1, c, 1, 1), dtype=np.float32)
    got = depthwise(Tensor(xn), Tensor(wn), Tensor(sn), stride).numpy()
    ref = F.conv2d(torch.tensor(xn), torch.tensor(wn), padding=1, groups=c, stride=stride) * torch.tensor(sn) + 0.5
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)
