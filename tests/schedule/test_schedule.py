"""Fusion: how many kernels each pattern of issue 2 costs, with values checked against numpy."""

import numpy as np
import pytest
from fusegrad import GlobalCounters, Tensor


def run_counting(fn, *arrays):
    tensors = [Tensor(a).realize() for a in arrays]
    GlobalCounters.reset()
    out = fn(*tensors).realize()
    count = GlobalCounters.kernel_count
    return out.numpy(), count


@pytest.fixture
def mats():
    rng = np.random.default_rng(1)
    return [rng.standard_normal((8, 16), dtype=np.float32) for _ in range(3)]


def test_elementwise_into_reduce_is_one_kernel(mats):
    a, b, c = mats
    out, n = run_counting(lambda a, b, c: ((a * b + c).relu()).sum(axis=1), a, b, c)
    assert n == 1
    np.testing.assert_allclose(out, np.maximum(a * b + c, 0).sum(axis=1), rtol=1e-5, atol=1e-6)


def test_matmul_is_one_kernel(mats):
    a, b, _ = mats
    out, n = run_counting(lambda a, b: a @ b.T, a, b)
    assert n == 1
    np.testing.assert_allclose(out, a @ b.T, rtol=1e-5, atol=1e-5)


def test_matmul_epilogue_fuses(mats):
    a, b, c = mats
    bias = c[0, :8].copy()
    out, n = run_counting(lambda a, b, bias: (a @ b.T).relu() + bias, a, b, bias)
    assert n == 1
    np.testing.assert_allclose(out, np.maximum(a @ b.T, 0) + bias, rtol=1e-5, atol=1e-5)


def test_subtract_broadcast_max_at_most_two(mats):
    x = mats[0]
    out, n = run_counting(lambda x: x - x.max(axis=1, keepdim=True), x)
    assert n <= 2
    np.testing.assert_allclose(out, x - x.max(axis=1, keepdims=True))


def test_softmax_from_primitives_at_most_three(mats):
    x = mats[0]

    def softmax(x):
        e = (x - x.max(axis=-1, keepdim=True)).exp()
        return e / e.sum(axis=-1, keepdim=True)

    out, n = run_counting(softmax, x)
    assert n <= 3
    ref = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out, ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_reduce_used_twice_is_computed_once(mats):
    x = mats[0]

    # s is read by two different broadcasts: it must be loaded from one buffer, not reduced twice per element
    def f(x):
        s = x.sum(axis=1, keepdim=True)
        return x * s + s.permute(1, 0).sum() * x

    out, n = run_counting(f, x)
    s = x.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out, x * s + s.sum() * x, rtol=1e-4)
    assert n <= 3


def test_movement_ops_cost_no_kernel(mats):
    x = mats[0]
    out, n = run_counting(lambda x: x.T.reshape(4, 32)[1:, ::2].flip(0).pad(((1, 1), (0, 0))) * 2, x)
    assert n == 1
    np.testing.assert_allclose(out, np.pad(np.flip(x.T.reshape(4, 32)[1:, ::2], 0), ((1, 1), (0, 0))) * 2)


def test_nested_reduce_fuses(mats):
    x = mats[0]
    out, n = run_counting(lambda x: x.sum(axis=1).max(), x)
    assert n == 1
    np.testing.assert_allclose(out, x.sum(axis=1).max(), rtol=1e-5)


def test_realized_value_is_not_recomputed(mats):
    x = Tensor(mats[0]).realize()
    s = x.sum()
    s.realize()
    GlobalCounters.reset()
    (x.sum() + 1).realize()  # the same graph node: its value is already in a buffer
    assert GlobalCounters.kernel_count == 1


def test_assign_in_place_sees_new_values_and_old_views_stay_consistent():
    a = Tensor(np.arange(6, dtype=np.float32)).realize()
    before = (a * 1).realize()
    a.assign(a + 10).realize()
    np.testing.assert_array_equal(a.numpy(), np.arange(6) + 10)
    np.testing.assert_array_equal(before.numpy(), np.arange(6))
    np.testing.assert_array_equal((a * 1).numpy(), np.arange(6) + 10)  # not the cached pre-assign value
    a.assign(a.flip(0)).realize()  # reads other elements of the target: goes through a temporary
    np.testing.assert_array_equal(a.numpy(), (np.arange(6) + 10)[::-1])


def test_kernel_whose_loads_simplify_away_still_gets_every_buffer():
    a = np.array([-7, 7, 100], dtype=np.int32)
    np.testing.assert_array_equal((Tensor(a) % 1).numpy(), np.zeros(3, np.int32))
    np.testing.assert_array_equal((Tensor(a) * 0 + 5).numpy(), np.full(3, 5, np.int32))


def test_assigns_run_after_every_kernel_that_reads_the_old_value():
    # like an optimizer step realized in the "wrong" order: w's update must still read the old m. Adam's update reads
    # the moments' old buffers while their own assigns overwrite them: ordered, not copied through a temporary
    w = Tensor(np.ones(4, np.float32)).realize()
    m = Tensor(np.full(4, 2.0, np.float32)).realize()
    old_m = m * 1
    m.assign(m * 3)
    upd = w.assign(w + old_m)
    GlobalCounters.reset()
    Tensor.realize(m, upd)
    assert GlobalCounters.kernel_count == 2  # no temporary and copy for w
    np.testing.assert_array_equal(m.numpy(), np.full(4, 6.0))
    np.testing.assert_array_equal(w.numpy(), np.full(4, 3.0))


def test_assigns_that_read_each_others_old_values_go_through_a_temporary():
    # a swap: each assign needs the other's old value, so one goes through a temporary
    a, b = Tensor(np.arange(4, dtype=np.float32)).realize(), Tensor(np.arange(4, 8, dtype=np.float32)).realize()
    old_a, old_b = a * 1, b * 1
    Tensor.realize(a.assign(old_b + 0), b.assign(old_a + 0))
    np.testing.assert_array_equal(a.numpy(), np.arange(4, 8))
    np.testing.assert_array_equal(b.numpy(), np.arange(4))
    # and a rotation of three
    x, y, z = (Tensor(np.full(2, v, np.float32)).realize() for v in (1, 2, 3))
    ox, oy, oz = x * 1, y * 1, z * 1
    Tensor.realize(x.assign(oy + 0), y.assign(oz + 0), z.assign(ox + 0))
    assert [t.numpy()[0] for t in (x, y, z)] == [2, 3, 1]


def test_assigns_reading_each_other_only_through_a_realized_root_need_no_temporary():
    # an optimizer step: the moment's update reads the gradient (a root of the same realize), which reads the old
    # weight; the weight's update reads the old moment. The gradient's kernel runs first, so no cycle is left
    w = Tensor(np.full(4, 3.0, np.float32)).realize()
    m = Tensor(np.full(4, 2.0, np.float32)).realize()
    old_m, g = m * 1, w * 2
    m.assign(m * 0.5 + g)
    upd = w.assign(w - old_m)
    GlobalCounters.reset()
    Tensor.realize(m, upd, g)
    assert GlobalCounters.kernel_count == 3
    np.testing.assert_array_equal(g.numpy(), np.full(4, 6.0))
    np.testing.assert_array_equal(m.numpy(), np.full(4, 7.0))
    np.testing.assert_array_equal(w.numpy(), np.full(4, 1.0))


def test_assign_reading_a_root_that_reads_the_target_shifted_writes_in_place():
    # a weight's update reads its gradient, which reads the weight at other elements (a matmul): the gradient is a
    # root of the same realize, computed first, so the update reads its buffer and may overwrite the weight in place
    wn = np.arange(4, dtype=np.float32)
    w = Tensor(wn).realize()
    g = w.flip(0) * 2
    upd = w.assign(w - g)
    GlobalCounters.reset()
    Tensor.realize(upd, g)
    assert GlobalCounters.kernel_count == 2
    np.testing.assert_array_equal(w.numpy(), wn - 2 * wn[::-1])
    np.testing.assert_array_equal(g.numpy(), 2 * wn[::-1])


def test_assigns_reading_each_other_through_a_realized_view_keep_both_old_values():
    # w's update reads m through a view that is realized too: a view is m's own buffer, not a kernel that runs first,
    # so the two assigns (m's reads w's old value) still form a cycle and one goes through a temporary
    w = Tensor(np.full((2, 2), 3.0, np.float32)).realize()
    m = Tensor(np.full(4, 2.0, np.float32)).realize()
    view, old_w = m.reshape(2, 2), w * 1
    upd_w = w.assign(w - view)
    upd_m = m.assign(m + old_w.reshape(4))
    Tensor.realize(upd_w, upd_m, view)
    np.testing.assert_array_equal(w.numpy(), np.full((2, 2), 1.0))
    np.testing.assert_array_equal(m.numpy(), np.full(4, 5.0))


def test_equal_graphs_realize_into_separate_buffers():
    m, v = Tensor.zeros(3).contiguous().realize(), Tensor.zeros(3).contiguous().realize()
    a, b = Tensor.ones(3) * 2, Tensor.ones(3) * 2
    Tensor.realize(a, b)
    c = (Tensor.ones(3) * 2).realize()
    m.assign(m + 1).realize()
    a.assign(a + 1).realize()
    assert v.tolist() == [0, 0, 0] and m.tolist() == [1, 1, 1]
    assert b.tolist() == [2, 2, 2] and c.tolist() == [2, 2, 2] and a.tolist() == [3, 3, 3]


def test_reduce_read_under_a_growing_pad_is_computed_once(mats):
    """A padded element reads nothing, but a reduce fused below the pad would still run its loop there (the loads are
    gated, the loop is not): a matmul written into a window of a larger buffer (a KV-cache row) is its own kernel."""
    a, b, _ = mats
    from fusegrad.schedule import create_schedule
    from fusegrad.runtime.device import Device
    from fusegrad.uop.ops import Ops

    x, y = Tensor(a).realize(), Tensor(b).realize()
    padded = (x[:1] @ y.T).pad(((3, 60), (0, 0)))  # 1 row of 64 carries data
    items, _, _ = create_schedule([padded.uop], [Device["CPU"]])
    assert [any(u.op is Ops.REDUCE_AXIS for u in it.ast.toposort()) for it in items] == [True, False]
    np.testing.assert_allclose(padded.numpy(), np.pad(a[:1] @ b.T, ((3, 60), (0, 0))), rtol=1e-5, atol=1e-5)


def test_reduce_under_a_cat_is_computed_once_per_element(mats):
    a, b, c = mats
    out, n = run_counting(lambda a, b, c: (a @ b.T).cat(a @ c.T, dim=1), a, b, c)
    np.testing.assert_allclose(out, np.concatenate([a @ b.T, a @ c.T], 1), rtol=1e-5, atol=1e-5)
    assert n == 3


def test_gathered_mask_broadcast_over_many_scores_is_stored_once():
    """A gather keeps the loop of the kernel it is fused into scalar: a mask gathered from an input (an exported
    BERT's attention mask) and broadcast over heads and query rows is computed once into a buffer, and the softmax's
    kernels read it plainly (GATHER_RECOMPUTE_COST); values equal numpy's."""
    from fusegrad.schedule import create_schedule
    from fusegrad.runtime.device import Device
    from fusegrad.uop.ops import Ops

    rng = np.random.default_rng(3)
    keep, where = rng.integers(0, 2, 96), rng.integers(-96, 96, 64).astype(np.int32)
    sn = rng.standard_normal((8, 64, 64), dtype=np.float32)
    scores, table, index = Tensor(sn).realize(), Tensor(keep).realize(), Tensor(where).realize()
    mask = (table[index] != 0).where(0.0, -1e9)  # (64,): one per key
    probs = (scores + mask).softmax(-1)
    items, _, _ = create_schedule([probs.uop], [Device["CPU"]])
    gathers = [sum(u.op is Ops.GATHER for u in it.ast.toposort()) > 0 for it in items]
    assert sum(gathers) == 1 and len(items) > 1, gathers
    masked = sn + np.where(keep[where] != 0, 0.0, -1e9).astype(np.float32)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    np.testing.assert_allclose(probs.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_small_softmax_gradient_broadcast_into_two_matmuls_is_stored_once():
    """An MLP's softmax-cross-entropy gradient (64x10, a few ops an element with its exp) read by the two backward
    matmuls of the last layer, broadcast over 128 hidden units, is stored once (SMALL_VALUE_RECOMPUTE_LIMIT): only
    the softmax's sum and that store evaluate an exp, not the matmuls; the gradients equal numpy's."""
    from fusegrad.schedule import create_schedule
    from fusegrad.runtime.device import Device
    from fusegrad.uop.ops import Ops

    rng = np.random.default_rng(4)
    hn, wn = rng.standard_normal((64, 128), dtype=np.float32), rng.standard_normal((128, 10), dtype=np.float32)
    labels = rng.integers(0, 10, 64).astype(np.int32)
    h, w = Tensor(hn, requires_grad=True).realize(), Tensor(wn, requires_grad=True).realize()
    (h @ w).sparse_categorical_crossentropy(Tensor(labels)).backward()
    items, _, _ = create_schedule([h.grad.uop, w.grad.uop], [Device["CPU"]] * 2)
    with_exp = [it for it in items if any(u.op in (Ops.EXP, Ops.EXP2) for u in it.ast.toposort())]
    assert len(with_exp) == 2, [len(it.buffers) for it in with_exp]
    logits = hn @ wn
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(64), labels] -= 1
    dlogits = p / 64
    np.testing.assert_allclose(h.grad.numpy(), dlogits @ wn.T, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), hn.T @ dlogits, rtol=1e-4, atol=1e-6)
