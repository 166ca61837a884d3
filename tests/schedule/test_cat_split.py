"""A large concatenation runs as one kernel per piece, each storing its piece into its slab of the output with no
bounds tests (schedule/cat_split.py); values equal numpy's exactly, forward and backward."""

import numpy as np
import pytest
import torch

from fusegrad import GlobalCounters, Tensor, TinyJit, dtypes
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.schedule.cat_split import MIN_SPLIT_SIZE
from fusegrad.uop.ops import Ops

# the six gradients of a 64-256-256-10 MLP, last layer first (a gradient bucket)
MLP_SHAPES = [(10,), (10, 256), (256,), (256, 256), (256,), (256, 64)]


def schedule_of(t: Tensor):
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return items


def test_mlp_bucket_is_one_ungated_copy_per_piece():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in MLP_SHAPES]
    ts = [Tensor(a).realize() for a in arrays]
    flat = Tensor.cat(*[t.flatten() for t in ts])
    items = schedule_of(flat)
    assert len(items) == len(MLP_SHAPES)
    assert not any(u.op in (Ops.WHERE, Ops.PAD) for it in items for u in it.ast.toposort())
    GlobalCounters.reset()
    out = flat.numpy()
    assert GlobalCounters.kernel_count == len(MLP_SHAPES)
    np.testing.assert_array_equal(out, np.concatenate([a.ravel() for a in arrays]))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cat_along_each_axis_of_computed_pieces(dim):
    rng = np.random.default_rng(dim + 5)
    shapes = [[16, 32, 24] for _ in range(3)]
    for s, extra in zip(shapes, (3, 17, 40)):
        s[dim] = extra
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    ta, tb, tc = Tensor(a), Tensor(b), Tensor(c)
    out = Tensor.cat(ta + 1, tb * 2, tc.exp(), dim=dim)
    assert out.numel() >= MIN_SPLIT_SIZE
    assert len(schedule_of(out)) == 3
    ref = np.concatenate([a + 1, b * 2, np.exp(c)], axis=dim)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=0)


def test_pieces_of_mixed_dtypes_and_reduces():
    rng = np.random.default_rng(2)
    x = rng.integers(-50, 50, (300, 40)).astype(np.int32)
    y = rng.standard_normal((200, 40)).astype(np.float32)
    z = rng.standard_normal((8, 64, 40)).astype(np.float32)
    out = Tensor.cat(Tensor(x), Tensor(y), Tensor(z).max(axis=0))  # int piece promoted to float, a reduce piece
    assert out.dtype == dtypes.float32
    ref = np.concatenate([x.astype(np.float32), y, z.max(axis=0)])
    np.testing.assert_array_equal(out.numpy(), ref)


def test_small_cat_stays_one_kernel():
    a, b = np.arange(10, dtype=np.float32), np.arange(7, dtype=np.float32)
    out = Tensor.cat(Tensor(a), Tensor(b))
    assert len(schedule_of(out)) == 1
    np.testing.assert_array_equal(out.numpy(), np.concatenate([a, b]))


def test_many_small_pieces_stay_one_kernel():
    # a stack of 64 rows of 128: 8192 elements, 128 per piece, where 64 launches would cost more than the tests
    rows = [np.full((1, 128), i, np.float32) for i in range(64)]
    out = Tensor.cat(*[Tensor(r) for r in rows])
    assert len(schedule_of(out)) == 1
    np.testing.assert_array_equal(out.numpy(), np.concatenate(rows))


def test_cat_used_by_more_math_is_not_split():
    # the kernel's value is the product, not the concatenation: one fused kernel as before
    a, b = np.ones((4096,), np.float32), np.full((4096,), 2.0, np.float32)
    out = Tensor.cat(Tensor(a), Tensor(b)) * 3
    assert len(schedule_of(out)) == 1
    np.testing.assert_array_equal(out.numpy(), np.concatenate([a, b]) * 3)


def test_cat_assigned_into_part_of_a_buffer():
    big = Tensor.zeros(3, 10000).contiguous().realize()
    a, b = np.arange(4000, dtype=np.float32), -np.arange(6000, dtype=np.float32)
    big[1].assign(Tensor.cat(Tensor(a), Tensor(b))).realize()
    ref = np.zeros((3, 10000), np.float32)
    ref[1] = np.concatenate([a, b])
    np.testing.assert_array_equal(big.numpy(), ref)


def test_cat_backward_matches_torch():
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in MLP_SHAPES]
    ts = [Tensor(a, requires_grad=True) for a in arrays]
    weight = rng.standard_normal(sum(a.size for a in arrays)).astype(np.float32)
    (Tensor.cat(*[t.flatten() for t in ts]) * Tensor(weight)).sum().backward()
    refs = [torch.tensor(a, requires_grad=True) for a in arrays]
    (torch.cat([r.flatten() for r in refs]) * torch.tensor(weight)).sum().backward()
    for t, r in zip(ts, refs):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-6, atol=0)


def test_jitted_cat_replays_with_new_inputs():
    rng = np.random.default_rng(4)

    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return Tensor.cat(a * 2, b).realize()

    for _ in range(4):
        a, b = rng.standard_normal((3000,)).astype(np.float32), rng.standard_normal((5000,)).astype(np.float32)
        np.testing.assert_array_equal(f(Tensor(a), Tensor(b)).numpy(), np.concatenate([a * 2, b]))


def test_a_buffer_in_several_pieces_and_a_cat_assigned_into_its_own_input():
    x = np.random.default_rng(5).standard_normal(5000).astype(np.float32)
    t = Tensor(x).realize()
    got = Tensor.cat(t, t.flip(0) * 2, t).numpy()
    np.testing.assert_array_equal(got, np.concatenate([x, x[::-1] * 2, x]))
    rolled = Tensor(x.copy()).realize()
    rolled.assign(Tensor.cat(rolled[1000:], rolled[:1000])).realize()  # each piece reads another piece's slab
    np.testing.assert_array_equal(rolled.numpy(), np.roll(x, -1000))
    kept = Tensor(x.copy()).realize()
    kept.assign(Tensor.cat(kept[:2500] * 2, kept[2500:] + 1)).realize()
    np.testing.assert_array_equal(kept.numpy(), np.concatenate([x[:2500] * 2, x[2500:] + 1]))
