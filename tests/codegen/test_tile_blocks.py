"""Blocks of row tiles (TILE) of a register-tiled conv or matmul: the last block may overlap the one before it and
recompute its tiles, by at most 1/MAX_BLOCK_OVERLAP of them (8 row tiles in blocks of 7 computed 14); values equal
torch's whatever the blocks."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import OptOps
from fusegrad.codegen.opt.heuristic import MAX_BLOCK_OVERLAP, _block_size
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule


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
