"""Lane accumulators (issue 9, the 16M sum): a reduce kernel whose last output axis is 2..MAX_LANE_VECTORS vectors of
lanes read as contiguous rows (a split sum's partial kernel, a column sum of a narrow matrix) upcasts the whole axis,
so each row is added into independent vector accumulators in one pass; values match numpy float64 within the blocked
sum's bound and the NOOPT kernel."""

import numpy as np
import pytest

import fusegrad.engine.realize as realize
from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptOps
from fusegrad.codegen.opt.heuristic import MAX_LANE_VECTORS
from fusegrad.schedule import create_schedule
from fusegrad.runtime.device import Device


def vector_bytes() -> int:
    return Device["CPU"].renderer.capabilities.vector_bytes


WIDTH = vector_bytes() // 4  # float32 lanes per vector


def opts_of(t: Tensor) -> tuple[Opt, ...]:
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return lower_to_linear(items[-1].ast, Device["CPU"].renderer).opts


@pytest.mark.parametrize("vectors", range(2, MAX_LANE_VECTORS + 1))
def test_narrow_column_sum_upcasts_every_lane(vectors):
    cols = vectors * WIDTH
    assert opts_of(Tensor.empty(4096, cols).sum(0)) == (Opt(OptOps.UPCAST, 0, cols),)
    assert opts_of(Tensor.empty(8, 512, cols).sum(1)) == (Opt(OptOps.UPCAST, 1, cols),)


def test_lanes_not_chosen_where_they_do_not_fit_or_do_not_apply():
    wide = (MAX_LANE_VECTORS + 1) * WIDTH
    assert Opt(OptOps.UPCAST, 0, wide) not in opts_of(Tensor.empty(4096, wide).sum(0))
    # not a whole number of vectors: the column upcasts of tile_opts
    assert Opt(OptOps.UPCAST, 0, 2 * WIDTH + 1) not in opts_of(Tensor.empty(4096, 2 * WIDTH + 1).sum(0))
    # a row sum walks each output's own contiguous row: nothing to upcast
    assert opts_of(Tensor.empty(2 * WIDTH, 4096).sum(1)) == ()
    # a transposed input is not read as rows of lanes
    cols = 2 * WIDTH
    assert Opt(OptOps.UPCAST, 0, cols) not in opts_of(Tensor.empty(cols, 4096).T.sum(0))
    # integers keep the old choice (only float sums are blocked and vector-accumulated here)
    assert Opt(OptOps.UPCAST, 0, cols) not in opts_of(Tensor.empty(4096, cols, dtype="int32").sum(0))


@pytest.mark.parametrize("rows", [1, 7, 257, 40961])
@pytest.mark.parametrize("vectors", [2, MAX_LANE_VECTORS])
def test_lane_column_sums_match_float64_and_noopt(rows, vectors):
    x = np.random.default_rng(rows).uniform(-1, 3, (rows, vectors * WIDTH)).astype(np.float32)
    ref = x.astype(np.float64).sum(0)
    out = Tensor(x).sum(0).numpy()
    # the blocked sum's bound: a few ulps per level of blocks of at most 256 values (test_reduce_accuracy)
    bound = 8 * np.finfo(np.float32).eps * np.abs(x.astype(np.float64)).sum(0) + 1e-30
    assert np.all(np.abs(out - ref) <= bound), np.max(np.abs(out - ref) / bound)
    realize._runners.clear()  # compile again without opts, not reuse the optimized kernel
    with Context(NOOPT=1):
        np.testing.assert_allclose(Tensor(x).sum(0).numpy(), out, rtol=1e-6, atol=1e-6)
    realize._runners.clear()
    mean = Tensor(x).mean(0).numpy()
    np.testing.assert_allclose(mean, ref / rows, rtol=1e-6)
