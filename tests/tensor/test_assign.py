"""assign and the in-place operators: a lazy graph built before an assign keeps the old value (copy on write), an
assign nobody else reads stays in place, and training loops keep a constant number of live buffers."""

import gc

import numpy as np
import pytest
import torch

from fusegrad import GlobalCounters, Tensor
from fusegrad.helpers import Context
from fusegrad.nn.optim import SGD, Adam
from fusegrad.runtime.device import Buffer
from fusegrad.schedule import base_buffer, buffer_of


def _storage(t: Tensor) -> Buffer:
    return buffer_of[base_buffer(t.uop)]


def _realized(values) -> Tensor:
    return Tensor(np.array(values, dtype=np.float32)).contiguous().realize()


def test_lazy_graph_keeps_the_value_from_before_assign():
    b = _realized([3.0])
    y = b * 2
    b.assign(b + 100).realize()
    assert y.item() == 6.0 and b.item() == 103.0


@pytest.mark.parametrize(
    "op, torch_op",
    [
        (lambda t: t.__iadd__(100.0), lambda t: t.add_(100.0)),
        (lambda t: t.__isub__(1.5), lambda t: t.sub_(1.5)),
        (lambda t: t.__imul__(3.0), lambda t: t.mul_(3.0)),
        (lambda t: t.__itruediv__(4.0), lambda t: t.div_(4.0)),
    ],
    ids=["iadd", "isub", "imul", "idiv"],
)
def test_inplace_operator_keeps_lazy_readers(op, torch_op):
    start = [3.0, -2.0, 0.5]
    b = _realized(start)
    y, v = b * 2, b[0:2]
    op(b).realize()
    expected = torch_op(torch.tensor(start))
    np.testing.assert_array_equal(b.numpy(), expected.numpy())
    np.testing.assert_array_equal(y.numpy(), np.array(start, np.float32) * 2)
    np.testing.assert_array_equal(v.numpy(), np.array(start[0:2], np.float32))


def test_inplace_operator_on_int_tensor():
    b = Tensor(np.array([5, 7], np.int32)).contiguous().realize()
    y = b + 0
    b -= 2
    b.realize()
    assert b.tolist() == [3, 5] and y.tolist() == [5, 7]


def test_assign_without_readers_writes_in_place():
    b = _realized([1.0, 2.0])
    y = b * 2
    assert y.tolist() == [2.0, 4.0]
    del y
    storage = _storage(b)
    b.assign(b + 1).realize()
    b += 1
    b.realize()
    b.assign(b * 2)
    b.assign(b + 1)  # a chain: the first assign lands before the second is built
    b.realize()
    assert _storage(b) is storage and b.tolist() == [7.0, 9.0]


def test_assign_with_reader_copies_and_frees_old_storage_with_it():
    b = _realized([1.0, 2.0])
    y = b * 10
    gc.collect()  # garbage left by earlier tests must not be freed inside the measured window
    before = GlobalCounters.mem_used
    b.assign(b + 1).realize()
    assert GlobalCounters.mem_used == before + 8  # the old value lives on for y
    assert y.tolist() == [10.0, 20.0]
    del y
    gc.collect()
    assert GlobalCounters.mem_used == before and b.tolist() == [2.0, 3.0]


def test_realized_reader_no_longer_needs_old_value():
    b = _realized([1.0, 2.0])
    y = (b * 10).realize()
    storage = _storage(b)
    b.assign(b + 1).realize()
    assert _storage(b) is storage and y.tolist() == [10.0, 20.0] and b.tolist() == [2.0, 3.0]


def test_multiple_assigns_in_one_realize_keep_readers():
    a, b = _realized([1.0, 2.0]), _realized([10.0, 20.0])
    ya, yb = a + 0, b * 1
    a.assign(a + b)
    b.assign(b - a)  # reads a's new value (a's assign node)
    Tensor.realize(a, b)
    assert a.tolist() == [11.0, 22.0] and b.tolist() == [-1.0, -2.0]
    assert ya.tolist() == [1.0, 2.0] and yb.tolist() == [10.0, 20.0]


def test_assign_chain_before_realize():
    b = _realized([1.0])
    y0 = b * 1
    b.assign(b + 1)
    y1 = b * 1
    b.assign(b * 10)
    y2 = b * 1
    b.realize()
    assert (y0.item(), y1.item(), y2.item(), b.item()) == (1.0, 2.0, 20.0, 20.0)


def test_assign_reading_own_old_value_through_a_view():
    b = _realized([1.0, 2.0, 3.0])
    keep = b.flip(0)
    b.assign(b.flip(0) * 2).realize()
    assert b.tolist() == [6.0, 4.0, 2.0] and keep.tolist() == [3.0, 2.0, 1.0]


def test_lazy_view_and_detach_keep_old_value():
    b = _realized([[1.0, 2.0], [3.0, 4.0]])
    v, d, p = b[0:1], b.detach(), b.permute(1, 0)
    b.assign(b * 0).realize()
    assert v.tolist() == [[1.0, 2.0]] and d.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert p.tolist() == [[1.0, 3.0], [2.0, 4.0]] and b.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_view_realized_before_assign_keeps_old_value():
    b = _realized([1.0, 2.0, 3.0])
    v = b[1:].realize()  # a view of storage realizes to itself: it reads the old version
    b.assign(b * 10).realize()
    assert v.tolist() == [2.0, 3.0] and b.tolist() == [10.0, 20.0, 30.0]


def test_input_grad_read_after_step_uses_the_weights_before_the_step():
    rng = np.random.default_rng(4)
    x_np, w_np = rng.standard_normal((4, 3), dtype=np.float32), rng.standard_normal((3, 2), dtype=np.float32)
    x, w = Tensor(x_np), Tensor(w_np).contiguous().realize()
    opt = SGD([w], lr=0.5)
    with Context(TRAINING=1):
        opt.zero_grad()
        (x @ w).relu().sum().backward()
        opt.step()
    tx, tw = torch.tensor(x_np, requires_grad=True), torch.tensor(w_np, requires_grad=True)
    (tx @ tw).relu().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), (tw - 0.5 * tw.grad).detach().numpy(), rtol=1e-6)


def test_optimizer_state_reader_keeps_old_value():
    w = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True).contiguous().realize()
    opt = Adam([w], lr=0.1)
    m_view = opt.m[0] * 1
    loss = (w * w).sum()
    with Context(TRAINING=1):
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert m_view.tolist() == [0.0, 0.0]
    np.testing.assert_allclose(opt.m[0].numpy(), [0.2, 0.4], rtol=1e-6)


def test_adam_step_without_readers_stays_in_place():
    rng = np.random.default_rng(3)
    params = [
        Tensor(rng.standard_normal(s, dtype=np.float32)).contiguous().realize() for s in ((8, 16), (16,), (16, 4))
    ]
    x = Tensor(rng.standard_normal((32, 8), dtype=np.float32), requires_grad=False)  # x.grad would read the weights
    opt = Adam(params, lr=1e-3)
    storages = [_storage(p) for p in params]
    for _ in range(3):
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = ((x @ params[0] + params[1]).relu() @ params[2]).square().mean()
            loss.backward()
            del loss  # the grads are computed by the step itself, so nothing else reads the old weights
            opt.step()
    assert all(_storage(p) is s for p, s in zip(params, storages))


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_loss_read_after_step_is_the_loss_before_the_step(opt_name):
    rng = np.random.default_rng(0)
    x_np, y_np = rng.standard_normal((5, 6), dtype=np.float32), rng.standard_normal((5, 3), dtype=np.float32)
    w1, w2 = rng.standard_normal((6, 8), dtype=np.float32), rng.standard_normal((8, 3), dtype=np.float32)
    b1, b2 = rng.standard_normal(8, dtype=np.float32), rng.standard_normal(3, dtype=np.float32)
    params = [Tensor(a).contiguous().realize() for a in (w1, b1, w2, b2)]
    tparams = [torch.tensor(a, requires_grad=True) for a in (w1, b1, w2, b2)]
    opt = SGD(params, lr=0.1) if opt_name == "sgd" else Adam(params, lr=0.1)
    topt = torch.optim.SGD(tparams, lr=0.1) if opt_name == "sgd" else torch.optim.Adam(tparams, lr=0.1)
    x, y = Tensor(x_np), Tensor(y_np)
    for _ in range(3):
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = (((x @ params[0] + params[1]).relu() @ params[2] + params[3] - y) ** 2).mean()
            loss.backward()
            opt.step()
        topt.zero_grad()
        tx = torch.tensor(x_np)
        tloss = (((tx @ tparams[0] + tparams[1]).relu() @ tparams[2] + tparams[3] - torch.tensor(y_np)) ** 2).mean()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
        for p, tp in zip(params, tparams):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def _live_buffers() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Buffer)


@pytest.mark.slow
def test_raw_assign_training_loop_keeps_memory_constant():
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((16, 8), dtype=np.float32))
    w = Tensor(rng.standard_normal((8, 4), dtype=np.float32)).contiguous().realize()
    w_np = w.numpy().astype(np.float64)
    levels = {}
    for step in range(1, 101):
        w.grad = None
        (x @ w).relu().sum().backward()
        w.assign(w - w.grad * 0.01).realize()
        if step in (10, 100):
            levels[step] = (_live_buffers(), GlobalCounters.mem_used)
        if step <= 3:  # the update itself is right: d sum(relu(xw)) / dw = x^T (xw > 0)
            w_np -= 0.01 * x.numpy().T @ (x.numpy() @ w_np > 0)
            np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-5, atol=1e-6)
    assert levels[10] == levels[100]


def test_adam_training_loop_keeps_memory_constant():
    rng = np.random.default_rng(2)
    layers = [
        Tensor(rng.standard_normal(s, dtype=np.float32) * 0.3).contiguous().realize()
        for s in ((10, 16), (16,), (16, 4), (4,))
    ]
    x, y = (
        Tensor(rng.standard_normal((32, 10), dtype=np.float32)).realize(),
        Tensor(rng.integers(0, 4, 32).astype(np.int32)),
    )
    opt = Adam(layers, lr=1e-3)
    levels, losses = {}, []
    for step in range(1, 101):
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = ((x @ layers[0] + layers[1]).relu() @ layers[2] + layers[3]).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
        if step in (10, 100):
            levels[step] = (_live_buffers(), GlobalCounters.mem_used)
    assert levels[10] == levels[100]
    assert losses[-1] < losses[0]


def test_a_pending_assign_of_a_dead_tensor_is_forgotten_and_never_mistaken_for_a_live_one():
    from fusegrad import tensor as tensor_module

    b = _realized([1.0, 2.0])
    gone = _realized([5.0])
    gone.assign(gone + 1)  # pending, never realized: its tensor dies with it
    key = id(gone)
    del gone
    gc.collect()
    live = [_realized([float(i)]) for i in range(64)]  # some may take the dead tensor's id
    b.assign(b * 3).realize()
    assert b.tolist() == [3.0, 6.0]
    assert key not in tensor_module._pending_assigns  # dropped by the realize's scan
    assert all(t.tolist() == [float(i)] for i, t in enumerate(live))
    # a pending assign reached through another tensor's graph still lands in its own tensor
    c = _realized([10.0])
    c.assign(c + 1)
    d = c * 2
    assert d.item() == 22.0 and c.item() == 11.0


@pytest.mark.parametrize("rows", [9, 33, 129])
def test_in_place_add_of_a_matmul_with_rows_no_tile_divides(rows):
    # the kernel reads the storage it stores into: a last row tile overlapping the one before would add twice
    rng = np.random.default_rng(rows)
    a0, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((rows, 8), (rows, 4), (4, 8)))
    a = Tensor(a0).contiguous().realize()
    a += Tensor(b) @ Tensor(c)
    np.testing.assert_allclose(a.numpy(), a0 + b @ c, atol=1e-5, rtol=1e-5)
    region = Tensor(a0).contiguous().realize()  # the same through setitem of a row range
    region[2:] = region[2:] + Tensor(b[2:]) @ Tensor(c)
    np.testing.assert_allclose(region.numpy()[2:], (a0 + b @ c)[2:], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(region.numpy()[:2], a0[:2])
