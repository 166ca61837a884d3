"""Register tiles of convs: the last block of row tiles (TILE) may overlap the one before it and recompute its tiles,
by at most 1/MAX_BLOCK_OVERLAP of them (8 row tiles in blocks of 7 computed 14); a reduce over one loop (a 1x1 conv)
with long output rows is tiled one vector wide. Values equal torch's whatever the tiles."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import OptOps
from fusegrad.dtype import dtypes
from fusegrad.codegen.opt.heuristic import MAX_BLOCK_OVERLAP, MIN_WIDE_COLUMNS, _block_size
from fusegrad.runtime.device import Device
import fusegrad.tensor_ops.conv as conv_ops
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops


@pytest.mark.parametrize(
    "tiles, most, exact, want",
    [(8, 7, False, 4), (16, 3, False, 2), (125, 2, False, 2), (6, 3, False, 3), (13, 4, True, 1), (12, 5, True, 4)],
)
def test_block_size_keeps_the_overlap_small(tiles, most, exact, want):
    assert _block_size(tiles, most, exact) == want


def test_block_size_overlap_bound_for_every_size():
    for tiles in range(1, 200):
        for most in range(1, 65):
            amount = _block_size(tiles, most, False)
            assert 1 <= amount <= max(most, 1)
            if amount > 1:
                assert (-(-tiles // amount) * amount - tiles) * MAX_BLOCK_OVERLAP <= tiles


def _tile_opts(t: Tensor):
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    opts = [lower_to_linear(item.ast, Device["CPU"].renderer).opts for item in items]
    return [o for os in opts for o in os if o.op is OptOps.TILE]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cin, cout, hw", [(16, 64, 23), (32, 128, 13)])
def test_conv_row_blocks_overlap_little_and_equal_torch(threads, cin, cout, hw):
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((1, cin, hw, hw)), rng.standard_normal((cout, cin, 3, 3)), rng.standard_normal(cout)
    x, w, b = (a.astype(np.float32) for a in (x, w, b))
    with Context(NUM_CPU_THREADS=threads):
        y = Tensor(x).conv2d(Tensor(w), Tensor(b), padding=1)
        for tile in _tile_opts(y):
            tiles = cout // 8  # the conv's 8-row register tiles of output channels
            assert (-(-tiles // tile.amount) * tile.amount - tiles) * MAX_BLOCK_OVERLAP <= tiles, tile
        got = y.numpy()
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _col_upcasts(t: Tensor) -> list[int]:
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    reduces = [item for item in items if any(u.op is Ops.REDUCE_AXIS for u in item.ast.toposort())]
    opts = lower_to_linear(reduces[-1].ast, Device["CPU"].renderer).opts
    return [o.amount for o in opts if o.op is OptOps.UPCAST][1:]  # after the rows' upcast


@pytest.mark.parametrize("cin, cout, hw, k", [(64, 16, 55, 1), (512, 64, 13, 1), (64, 64, 14, 3), (256, 32, 7, 1)])
def test_one_axis_reduce_tiles_one_vector_of_long_rows_and_equal_torch(cin, cout, hw, k, monkeypatch):
    """A 1x1 conv (its reduce one loop) over rows longer than MIN_WIDE_COLUMNS outputs gets a tile one vector wide; a
    3x3 conv (taps and channels, small convs' window columns turned off) and a 7x7 output's 49-wide rows keep two
    vectors."""
    monkeypatch.setattr(conv_ops, "WINDOW_COLUMNS_MAX_POSITIONS", 0)
    width = Device["CPU"].renderer.capabilities.lanes(dtypes.float32)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, cin, hw, hw)).astype(np.float32), rng.standard_normal((cout, cin, k, k))
    w = w.astype(np.float32)
    y = Tensor(x).conv2d(Tensor(w), padding=k // 2)
    cols = _col_upcasts(y)
    wide = k == 1 and hw * hw > MIN_WIDE_COLUMNS
    if width == 16:  # the sizes above are chosen for 16-lane vectors (AVX-512)
        assert cols == ([width] if wide else [2 * width]), cols
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=k // 2).numpy()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
