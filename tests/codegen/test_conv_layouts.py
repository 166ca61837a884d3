"""Convolution forward layouts (tensor_ops/conv.py): a stride-1 conv with short output rows runs over the padded
input's flat positions (a small one as a matmul over its windows copied into columns), a strided one over its input's
stride phases. Values (forward, and the gradients of input,
weight and bias) equal torch's; the reduce kernels index without division and get a register tile along one long
contiguous axis."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import OptOps
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops
import fusegrad.tensor_ops.conv as conv_ops

CASES = [  # input shape, weight shape, conv2d kwargs: every one sums at least CONV_RELAYOUT_MIN_REDUCE products
    ((1, 16, 7, 7), (24, 16, 3, 3), {"padding": 1}),  # flat positions (ResNet's 7x7 stage)
    ((2, 8, 9, 6), (12, 8, 3, 3), {"padding": (2, 1), "dilation": (2, 1)}),  # flat, dilated
    ((1, 64, 5, 5), (32, 64, 1, 1), {}),  # flat 1x1: no position dropped
    ((2, 16, 5, 40), (8, 16, 3, 3), {"padding": 1}),  # flat: 40-wide rows are not whole 32-wide tiles
    ((1, 16, 6, 7), (8, 8, 3, 3), {"groups": 2, "padding": 1}),  # flat, grouped
    ((1, 8, 4, 5, 6), (6, 8, 2, 3, 3), {"padding": (1, 0, 1)}),  # flat, 3-D
    ((1, 64, 10, 10), (16, 64, 1, 1), {"stride": 2}),  # strided 1x1: one phase (a subsampled input)
    ((1, 3, 23, 21), (8, 3, 7, 7), {"stride": 2, "padding": 3}),  # a stem conv: 4 phases of 4x4 taps
    ((2, 8, 9, 9), (8, 8, 3, 3), {"stride": 2, "padding": 1}),  # 3x3 stride 2, odd input
    ((1, 24, 8, 11), (8, 12, 3, 2), {"stride": (2, 3), "groups": 2, "padding": (1, 0)}),  # mixed strides, grouped
    ((2, 16, 33, 33), (12, 8, 3, 3), {"groups": 2, "padding": 1}),  # grouped, wide rows: windowed, stored by group
    ((1, 16, 17), (4, 16, 5), {"stride": 3, "padding": 2}),  # 1-D strided
]


def run_case(xs, ws, kw, seed=0, view=None):
    rng = np.random.default_rng(seed)
    xn, wn = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    bn = rng.standard_normal(ws[0], dtype=np.float32)
    x, w, b = (Tensor(a, requires_grad=True).realize() for a in (xn, wn, bn))
    out = (view(x) if view else x).conv2d(w, b, **kw).relu()
    gn = rng.standard_normal(out.shape, dtype=np.float32)
    out.backward(Tensor(gn))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xn, wn, bn))
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(ws)]
    ref = conv(view(tx) if view else tx, tw, tb, **kw).relu()
    ref.backward(torch.tensor(gn))
    for ours, theirs in ((out, ref), (x.grad, tx.grad), (w.grad, tw.grad), (b.grad, tb.grad)):
        assert ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), atol=1e-4, rtol=1e-4)


@pytest.fixture(params=["fused", "stored"])
def padding_layout(request, monkeypatch):
    """fused: the padding read in place (a view the flat layout stores first); stored: every padded input stored."""
    monkeypatch.setattr(conv_ops, "CONV_PAD_REALIZE_SIZE", 2**30 if request.param == "fused" else 0)
    return request.param


@pytest.mark.parametrize("xs,ws,kw", CASES)
def test_relaid_conv_forward_and_backward_equal_torch(xs, ws, kw, padding_layout):
    run_case(xs, ws, kw)


def test_flat_conv_of_a_permuted_input_equals_torch():
    """An input read across its rows (a transposed view) is stored before its flat view."""
    run_case((1, 16, 7, 7), (8, 16, 3, 3), {"padding": 1}, view=lambda t: t.transpose(2, 3))


def forward_reduce_kernels(xs, ws, kw):
    x, w = Tensor.empty(*xs), Tensor.empty(*ws)
    items, _, _ = create_schedule([x.conv2d(w, **kw).uop], [Device["CPU"]])
    return [
        lower_to_linear(item.ast, Device["CPU"].renderer)
        for item in items
        if item.ast.op is Ops.SINK and any(u.op is Ops.REDUCE_AXIS for u in item.ast.toposort())
    ]


@pytest.mark.parametrize(
    "xs,ws,kw,positions",
    [
        ((1, 64, 7, 7), (64, 64, 3, 3), {"padding": 1}, 7 * 9 - 2),  # up to the last output's window
        ((1, 64, 7, 7), (64, 64, 1, 1), {}, 49),
        ((1, 64, 14, 14), (64, 64, 1, 1), {"stride": 2}, 49),  # one phase, then flat
        ((1, 64, 56, 56), (64, 64, 3, 3), {"padding": 1}, 58 * 55 + 56),  # 56-wide rows: not whole 32-wide tiles
        ((1, 64, 56, 56), (64, 64, 1, 1), {}, 56 * 56),
    ],
)
def test_short_rows_run_over_flat_positions_in_vector_tiles(xs, ws, kw, positions, monkeypatch):
    """The conv's one reduce kernel has the flat positions as its output's last axis, indexes without division, and
    gets a register tile of output channels x whole vectors of positions (small convs' window columns turned off)."""
    monkeypatch.setattr(conv_ops, "WINDOW_COLUMNS_MAX_POSITIONS", 0)
    (info,) = forward_reduce_kernels(xs, ws, kw)
    assert info.name.startswith(f"r_64_{positions}_"), info.name
    assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    lanes = Device["CPU"].renderer.capabilities.lanes(Tensor.empty(1).dtype)
    ups = {o.axis: o.amount for o in info.opts if o.op is OptOps.UPCAST}
    assert ups.get(2, 1) > 1 and ups.get(3, 1) >= lanes, info.opts  # (N, groups, channels, positions)


@pytest.mark.parametrize(
    "xs,ws,kw,name",
    [
        ((1, 60, 7, 7), (64, 60, 3, 3), {"padding": 1}, "r_64_49_540"),  # 7x7 outputs
        ((1, 20, 13, 13), (64, 20, 3, 3), {"padding": 1}, "r_64_169_180"),  # 13x13
        ((2, 12, 27, 27), (64, 12, 3, 3), {"padding": 1}, "r_2_64_729_108"),  # 27-wide rows, batch 2
    ],
)
def test_small_stride_1_convs_run_as_a_matmul_over_window_columns(xs, ws, kw, name):
    """A stride-1 conv of short rows, at most WINDOW_COLUMNS_MAX_POSITIONS outputs, at least
    WINDOW_COLUMNS_MIN_OUTPUTS output channels, at most STRIDE_1_COLUMNS_MAX column elements and input channels that
    form no CONV_CHANNEL_BLOCKs copies its stored
    padded input's windows into columns: its reduce kernel is one matmul (taps x channels by positions, no padding
    column computed), indexes without division and gets a register tile of output channels x vectors of positions;
    values and gradients equal torch's."""
    (info,) = forward_reduce_kernels(xs, ws, kw)
    assert info.name == name, info.name
    assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    lanes = Device["CPU"].renderer.capabilities.lanes(Tensor.empty(1).dtype)
    ups = [o.amount for o in info.opts if o.op is OptOps.UPCAST]
    assert len(ups) >= 2 and ups[0] > 1 and ups[1] >= lanes, info.opts
    run_case(xs, ws, kw, seed=4)


@pytest.mark.parametrize(
    "xs,ws,name",
    [
        ((1, 128, 14, 14), (32, 128, 3, 3), "r_32_222_16_3_3_8"),  # DenseNet's: too few outputs to share the copy
        ((1, 512, 28, 28), (64, 512, 3, 3), "r_64_838_64_3_3_8"),  # VGG-19's channels: too many columns
        ((1, 64, 7, 7), (64, 64, 3, 3), "r_64_61_8_3_3_8"),  # ResNet-50's at 7x7: channels in blocks
        ((1, 48, 13, 13), (64, 48, 3, 3), "r_64_193_6_3_3_8"),  # SqueezeNet's at 13x13: channels in blocks
    ],
)
def test_convs_with_few_outputs_many_columns_or_channel_blocks_keep_the_flat_layout(xs, ws, name):
    (info,) = forward_reduce_kernels(xs, ws, {"padding": 1})
    assert info.name == name, info.name


@pytest.mark.parametrize(
    "xs,ws,kw,name",
    [
        ((1, 24, 32, 32), (16, 24, 3, 3), {"padding": 1}, "r_16_32_32_3_3_3_8"),  # rows of whole tiles: windowed
        ((2, 16, 9, 9), (8, 16, 3, 3), {"padding": 1}, "r_2_8_97_2_3_3_8"),  # short rows: flat positions
        ((1, 32, 12, 12), (8, 32, 5, 5), {"padding": 2, "dilation": 1}, "r_8_188_4_5_5_8"),  # a 5x5 conv, flat
        ((1, 8, 9, 9), (8, 8, 3, 3), {"padding": 1}, "r_8_97_3_3_8"),  # one block: the channels as they are
        ((1, 20, 9, 9), (8, 20, 3, 3), {"padding": 1}, "r_8_97_3_3_20"),  # channels no block divides
    ],
)
def test_conv_over_taps_sums_its_channels_in_blocks(xs, ws, kw, name):
    """A conv over several taps with at least two CONV_CHANNEL_BLOCKs of input channels sums them block by block,
    each block's taps and channels in turn (reduce loops: blocks, taps, the block's channels), so a block's input
    rows and weights stay in L1 for all its taps; values and gradients equal torch's."""
    (info,) = forward_reduce_kernels(xs, ws, kw)
    assert info.name == name, info.name
    run_case(xs, ws, kw, seed=5)


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((2, 32, 9, 9), (12, 16, 3, 3), {"groups": 2, "padding": 1}),  # flat, 16 channels a group: two blocks each
        ((1, 48, 40, 40), (24, 16, 3, 3), {"groups": 3, "padding": 1}),  # windowed rows
        ((1, 32, 9, 9), (16, 16, 3, 3), {"groups": 2, "padding": 2, "dilation": 2}),  # dilated
    ],
)
def test_grouped_conv_with_channel_blocks_equals_torch(xs, ws, kw):
    """Each group's input channels are summed in blocks (the blocks split the per-group channels)."""
    run_case(xs, ws, kw, seed=9)


@pytest.mark.parametrize("width", [32, 64])
def test_rows_of_whole_tiles_keep_the_row_layout(width):
    """A conv whose output rows are whole 32-wide tiles keeps its rows (no crop pass)."""
    (info,) = forward_reduce_kernels((1, 16, width, width), (16, 16, 3, 3), {"padding": 1})
    assert info.name.startswith(f"r_16_{width}_{width}_2_3_3_8"), info.name


def test_strided_stem_conv_runs_stride_1_over_phases_in_vector_tiles():
    """A 7x7 stride-2 conv (ResNet's first) reads four phases of its input as channels: its reduce kernel walks
    4x4 taps of 12 channels along contiguous rows, in a register tile, without division."""
    (info,) = forward_reduce_kernels((1, 3, 64, 64), (16, 3, 7, 7), {"stride": 2, "padding": 3})
    assert info.name.startswith("r_16_32_32_4_4_12"), info.name
    assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    assert any(o.op is OptOps.UPCAST and o.axis == 3 and o.amount >= 8 for o in info.opts), info.opts


SHORT_LARGE_CASES = [  # sum 16 to 63 products: relaid only when the conv is large (values checked with a small one)
    # a 3-channel 3x3 stride-2 stem: its windows copied into columns, 27 products each
    ((1, 3, 20, 18), (8, 3, 3, 3), {"stride": 2, "padding": 1}, "r_8_10_9_3_3_3", "r_8_90_27"),
    # a grouped 1x1 conv of few channels per group: flat positions, the groups as an axis
    ((1, 64, 9, 9), (64, 16, 1, 1), {"groups": 4}, "r_64_9_9_16", "r_4_16_81_16"),
    ((2, 2, 9, 9), (4, 2, 3, 3), {"padding": 1}, "r_2_4_9_9_3_3_2", "r_2_4_97_3_3_2"),  # a 2-channel 3x3 conv: flat
]


@pytest.mark.parametrize("xs,ws,kw,small,large", SHORT_LARGE_CASES)
def test_short_reduce_of_a_large_conv_is_relaid_and_equals_torch(xs, ws, kw, small, large, monkeypatch):
    (windowed,) = forward_reduce_kernels(xs, ws, kw)  # a small conv keeps the windowed layout
    assert windowed.name == small, windowed.name
    monkeypatch.setattr(conv_ops, "CONV_RELAYOUT_LARGE_OUTPUT", 1)  # as if it were large
    (info,) = forward_reduce_kernels(xs, ws, kw)
    assert info.name == large, info.name
    assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    run_case(xs, ws, kw, seed=3)


@pytest.mark.parametrize(
    "xs,ws,kw,name",
    [
        ((1, 3, 224, 224), (24, 3, 3, 3), {"stride": 2, "padding": 1}, "r_24_12544_27"),  # ShuffleNet's stem
        ((1, 136, 28, 28), (136, 34, 1, 1), {"groups": 4}, "r_4_34_784_34"),  # its grouped 1x1 conv at 28x28
    ],
)
def test_short_reduce_of_a_large_conv_runs_in_vector_tiles(xs, ws, kw, name):
    """A conv summing 16 to 63 products per output with at least CONV_RELAYOUT_LARGE_OUTPUT outputs gets the long-
    reduce layouts: window columns, flat positions, the groups as an axis; a register tile, no division."""
    (info,) = forward_reduce_kernels(xs, ws, kw)
    assert info.name.startswith(name), info.name
    assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    assert any(o.op is OptOps.UPCAST and o.amount >= 8 for o in info.opts), info.opts


@pytest.mark.parametrize(
    "xs,ws,kw,name",
    [
        ((1, 128, 56, 56), (128, 128, 3, 3), {"stride": 2, "padding": 1}, "r_128_784_1152"),  # ResNet-50's stages
        ((1, 64, 14, 14), (128, 64, 3, 3), {"stride": 2, "padding": 1}, "r_128_49_576"),
        ((2, 16, 9, 12), (32, 16, 3, 3), {"stride": 2}, "r_2_32_20_144"),  # batch 2
    ],
)
def test_strided_conv_whose_phases_waste_products_runs_as_a_matmul_over_window_columns(xs, ws, kw, name):
    """A strided conv whose phases would multiply zeros for many taps (a 3x3 stride 2: 16 for 9) copies each output's
    window into a column and runs a plain matmul of the weight as it is over them: one long axis of positions in a
    register tile, no division, no per-call copy of the weight into phases."""
    x, w = Tensor.empty(*xs), Tensor.empty(*ws)
    items, _, _ = create_schedule([x.conv2d(w, **kw).uop], [Device["CPU"]])
    weight = w.uop.base.buffer
    reading_weight = [i for i in items if i.ast.op is Ops.SINK and any(b is weight for b in i.buffers)]
    assert len(reading_weight) == 1, "the matmul reads the weight as it is: no copy of it into phases"
    (info,) = forward_reduce_kernels(xs, ws, kw)
    assert info.name.startswith(name), info.name
    assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    lanes = Device["CPU"].renderer.capabilities.lanes(Tensor.empty(1).dtype)
    ups = {o.axis: o.amount for o in info.opts if o.op is OptOps.UPCAST}
    assert ups.get(2, 1) > 1 and ups.get(3, 1) >= min(lanes, 8), info.opts  # (N, groups, channels, positions)


@pytest.mark.parametrize(
    "xs,ws,kw,names",
    [
        ((1, 512, 14, 14), (512, 512, 3, 3), {"stride": 2, "padding": 1}, ["r_18_512_49_256", "r_512_49_18"]),
        ((1, 1024, 14, 14), (256, 1024, 1, 1), {}, ["r_4_256_196_256", "r_256_196_4"]),  # ResNet-50's 1x1 at 14x14
        ((2, 1024, 3, 5), (8, 1024, 1, 1), {}, ["r_2_4_8_15_256", "r_2_8_15_4"]),  # batch 2
    ],
)
def test_long_reduce_of_a_one_tap_conv_sums_chunks_then_the_partials(xs, ws, kw, names):
    """A stored one-tap conv (window columns, a 1x1 over flat positions) summing at least CONV_CHUNKED_REDUCE_MIN
    inputs per output sums chunks of CONV_REDUCE_CHUNK into partials stored chunk-major, then the partials: the
    first kernel's loops walk the chunks outermost, so one chunk of the columns stays in L2 for every tile."""
    assert [info.name for info in forward_reduce_kernels(xs, ws, kw)] == names


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((1, 1024, 5, 5), (16, 1024, 1, 1), {}),  # a 1x1 conv: 4 chunks
        ((1, 256, 9, 9), (8, 256, 3, 3), {"stride": 2, "padding": 1}),  # window columns: 2304 in 9 chunks
    ],
)
def test_chunked_reduce_forward_and_backward_equal_torch(xs, ws, kw):
    run_case(xs, ws, kw, seed=6)


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((1, 128, 14, 14), (256, 128, 1, 1), {"stride": 2}),  # ResNet-50's downsampling shortcut
        ((1, 64, 9, 12), (32, 64, 1, 3), {"stride": (2, 1), "padding": (0, 1)}),  # strided only along the 1-tap dim
    ],
)
def test_strided_conv_whose_weight_is_its_one_phase_reads_it_in_place(xs, ws, kw):
    """A strided conv whose taps are all phase 0 (a 1x1 kernel, or stride 1 along the longer taps) reads its weight
    as it is: copying it into phases would only copy it (ResNet-50's 2048x1024 shortcut weight, every call: 0.7 ms)."""
    x, w = Tensor.empty(*xs), Tensor.empty(*ws)
    items, _, _ = create_schedule([x.conv2d(w, **kw).uop], [Device["CPU"]])
    weight = w.uop.base.buffer
    reading_weight = [i for i in items if i.ast.op is Ops.SINK and any(b is weight for b in i.buffers)]
    assert len(reading_weight) == 1 and any(u.op is Ops.REDUCE_AXIS for u in reading_weight[0].ast.toposort())
    run_case(xs, ws, kw, seed=11)


@pytest.mark.parametrize(
    "xs,ws,kw",
    [
        ((2, 5, 13, 10), (6, 5, 3, 3), {"stride": 2, "padding": 1}),
        ((1, 4, 9, 7), (3, 4, 3, 3), {"stride": (2, 3), "padding": (0, 1)}),
        ((1, 3, 7, 6, 8), (4, 3, 3, 3, 3), {"stride": 2, "padding": 1}),  # 3-D: 64 phase taps for 27
        ((2, 6, 21), (5, 6, 3), {"stride": 2}),  # 1-D
    ],
)
def test_window_columns_forward_and_backward_equal_torch(xs, ws, kw, padding_layout, monkeypatch):
    monkeypatch.setattr(conv_ops, "CONV_RELAYOUT_MIN_REDUCE", 1)  # small shapes take the large convs' layout
    run_case(xs, ws, kw, seed=7)


def test_short_reduce_keeps_the_windowed_conv():
    """A small conv summing fewer than CONV_RELAYOUT_MIN_REDUCE products per output keeps its one kernel."""
    (info,) = forward_reduce_kernels((4, 2, 7, 7), (8, 2, 3, 3), {"stride": 2})
    assert info.name == "r_4_8_3_3_3_3_2", info.name


@pytest.mark.parametrize("xs", [(1, 16, 7, 7), (1, 16, 40, 40)])
def test_grouped_conv_keeps_its_groups_axis_and_a_register_tile(xs):
    """A grouped conv's output is stored with the groups as an axis of their own: its channels per group are the
    register tile's rows (merged with the groups, the input's index would divide by the group's size)."""
    (info,) = forward_reduce_kernels(xs, (32, 8, 3, 3), {"groups": 2, "padding": 1})
    assert info.name.startswith("r_2_16_"), info.name
    assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    assert any(o.op is OptOps.UPCAST and o.axis == 2 and o.amount > 1 for o in info.opts), info.opts


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
def test_conv_output_is_stored_before_a_pool(pool):
    """A large conv output is stored before a max or average pool reads its windows: no kernel runs the conv's sum
    inside the pool's reduce (there it lost its register tile); values and gradients equal torch's."""
    rng = np.random.default_rng(5)
    xn, wn = (
        rng.standard_normal((1, 16, 32, 32), dtype=np.float32),
        rng.standard_normal((64, 16, 3, 3), dtype=np.float32),
    )
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    out = getattr(x.conv2d(w, padding=1).relu(), pool)(2)
    items, _, _ = create_schedule([out.uop], [Device["CPU"]])
    for item in items:
        assert sum(u.op is Ops.REDUCE_AXIS for u in item.ast.toposort()) <= 1
    gn = rng.standard_normal(out.shape, dtype=np.float32)
    out.backward(Tensor(gn))
    tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    ref = getattr(F, pool)(F.conv2d(tx, tw, padding=1).relu(), 2)
    ref.backward(torch.tensor(gn))
    for ours, theirs in ((out, ref), (x.grad, tx.grad), (w.grad, tw.grad)):
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), atol=1e-4, rtol=1e-4)
