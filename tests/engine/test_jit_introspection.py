"""tinygrad's public introspection below Tensor: UOp.variable, uop.base / is_realized / buffer, TinyJit's
captured.jit_cache and free_intermediates, and GlobalCounters advanced by replays as by eager runs."""

import gc

import numpy as np

from fusegrad import GlobalCounters, Tensor, TinyJit
from fusegrad.uop.ops import Ops, UOp

rng = np.random.default_rng(0)


def test_uop_variable_builds_a_bindable_variable():
    v = UOp.variable("n", 1, 10)
    assert v.op is Ops.DEFINE_VAR and (v.vmin, v.vmax) == (1, 10)
    t = Tensor.arange(10)[: v.bind(4)]
    assert t.shape[0].unbind()[1] == 4 and t.sum().item() == 6
    assert UOp.variable("n", 1, 10) is v  # the same name and range: the same node, as Variable gives


def test_uop_base_is_realized_and_buffer():
    a = Tensor(np.arange(6, dtype=np.float32)).reshape(2, 3)
    assert a.uop.base.op is Ops.BUFFER and a.uop.base is a.uop.src[0]
    lazy = a + 1
    assert not lazy.uop.is_realized and lazy.uop.base is lazy.uop
    lazy.realize()
    assert lazy.uop.is_realized and lazy.uop.buffer.size == 6
    np.testing.assert_array_equal(lazy.uop.buffer.numpy().reshape(2, 3), a.numpy() + 1)
    assert a.uop.buffer is a.uop.base.buffer
    view = lazy.permute(1, 0)  # a view of realized storage: realized, with the storage's buffer
    assert view.uop.is_realized and view.uop.buffer is lazy.uop.buffer


def _step_and_weights():
    w1, w2 = (
        Tensor(rng.standard_normal((32, 64), dtype=np.float32)),
        Tensor(rng.standard_normal((64, 8), dtype=np.float32)),
    )

    @TinyJit
    def step(x):
        return ((x @ w1).relu() @ w2).relu().sum(axis=1).realize()

    return step, w1.numpy(), w2.numpy()


def _ref(x, w1, w2):
    return np.maximum(np.maximum(x @ w1, 0) @ w2, 0).sum(axis=1)


def test_jit_cache_lists_the_captured_calls_with_program_and_buffers():
    step, w1, w2 = _step_and_weights()
    xs = [rng.standard_normal((16, 32), dtype=np.float32) for _ in range(3)]
    for x in xs:
        step(Tensor(x))
    cache = step.captured.jit_cache
    assert len(cache) >= 2  # at least the two matmuls
    assert all(ei.prg is not None and ei.prg.program is not None for ei in cache if ei.prg is not None)
    assert all(len(ei.bufs) >= 2 and all(b.size > 0 for b in ei.bufs) for ei in cache)
    # replays advance the counters by what the step launches, as eager runs do
    before = (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem)
    out = step(Tensor(xs[0]))
    assert GlobalCounters.kernel_count - before[0] == len(cache)
    ops = sum(ei.prg.info.ops_estimate for ei in cache if ei.prg is not None)
    assert ops > 0 and GlobalCounters.global_ops - before[1] == ops
    assert GlobalCounters.global_mem - before[2] == sum(b.nbytes for ei in cache for b in ei.bufs)
    np.testing.assert_allclose(out.numpy(), _ref(xs[0], w1, w2), rtol=1e-4, atol=1e-3)


def test_free_intermediates_drops_memory_and_the_next_replay_allocates_it_again():
    step, w1, w2 = _step_and_weights()
    xs = [rng.standard_normal((16, 32), dtype=np.float32) for _ in range(4)]
    outs = [step(Tensor(x)).numpy() for x in xs[:3]]
    gc.collect()
    before = GlobalCounters.mem_used
    step.captured.free_intermediates()
    gc.collect()
    freed = before - GlobalCounters.mem_used
    assert freed >= 16 * 64 * 4  # the hidden activation at least
    out = step(Tensor(xs[3])).numpy()
    gc.collect()
    assert GlobalCounters.mem_used >= before - 16 * 4 * 2  # allocated again (less this call's own input and output)
    for x, o in zip(xs, outs + [out]):
        np.testing.assert_allclose(o, _ref(x, w1, w2), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(step(Tensor(xs[0])).numpy(), outs[0], rtol=1e-6)


def test_replays_of_the_same_arguments_follow_new_inputs_values_and_freed_memory():
    """The replay's prebuilt per-step calls (made after the first replay) must follow every change: other input
    buffers, new values in the same buffers, a Variable's new value, and intermediates freed and allocated again."""
    from fusegrad import Context, Variable

    w = rng.standard_normal((4, 4)).astype(np.float32)
    tw = Tensor(w).realize()
    v = Variable("k", 1, 4)
    with Context(JIT=2):  # every launch a Python step of its own
        step = TinyJit(lambda x, k: ((x @ tw).relu() * k).contiguous())
        step_plain = TinyJit(lambda x: ((x @ tw).relu() + 1).contiguous())
        a, b = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
        ta, tb = Tensor(a).realize(), Tensor(b).realize()
        outs = []
        for i in range(8):
            x, t = (a, ta) if i % 3 else (b, tb)
            k = 1 + i % 4
            out = step(t, v.bind(k))
            np.testing.assert_allclose(out.numpy(), np.maximum(x @ w, 0) * k, rtol=1e-5, atol=1e-6)
            plain = step_plain(t)
            np.testing.assert_allclose(plain.numpy(), np.maximum(x @ w, 0) + 1, rtol=1e-5, atol=1e-6)
            outs.append(plain)
            if i == 4:
                step_plain.captured.free_intermediates()
        assert len({id(o) for o in outs}) == len(outs)  # a fresh Tensor per call, over the step's output buffer
        ta.assign(Tensor(b)).realize()  # new values in the same input buffer
        np.testing.assert_allclose(step_plain(ta).numpy(), np.maximum(b @ w, 0) + 1, rtol=1e-5, atol=1e-6)


def test_steady_replays_of_one_argument_count_and_read_its_buffer_and_freed_memory():
    """Calls with the very same tensor run the capture's prebuilt calls alone (the steady path): they still advance
    the counters, read what the input's buffer holds now, and follow intermediates freed and allocated again."""
    step, w1, w2 = _step_and_weights()
    x_np = rng.standard_normal((16, 32), dtype=np.float32)
    x = Tensor(x_np).realize()
    for _ in range(3):
        step(x)
    cache = step.captured.jit_cache
    before = GlobalCounters.kernel_count
    for _ in range(4):
        out = step(x)
    assert GlobalCounters.kernel_count - before == 4 * len(cache)
    np.testing.assert_allclose(out.numpy(), _ref(x_np, w1, w2), rtol=1e-4, atol=1e-3)
    other = rng.standard_normal((16, 32), dtype=np.float32)
    x.uop.buffer.copyin(other)  # new values in the same buffer, the same node
    np.testing.assert_allclose(step(x).numpy(), _ref(other, w1, w2), rtol=1e-4, atol=1e-3)
    step.captured.free_intermediates()
    np.testing.assert_allclose(step(x).numpy(), _ref(other, w1, w2), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(step(x).numpy(), _ref(other, w1, w2), rtol=1e-4, atol=1e-3)


def test_steady_calls_hand_back_a_returned_tensor_only_when_nobody_holds_or_changed_it():
    """A call repeated with the same tensor may return a tensor it returned before, but only one its caller let go of
    unchanged: a tensor still held, or given requires_grad, a gradient or an attribute, is never handed out again."""
    step, w1, w2 = _step_and_weights()
    x_np = rng.standard_normal((16, 32), dtype=np.float32)
    x = Tensor(x_np).realize()
    want = _ref(x_np, w1, w2)
    outs = [step(x) for _ in range(6)]  # all held: six different tensors, each with the values
    assert len({id(o) for o in outs}) == 6
    for o in outs:
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-4, atol=1e-3)
    del outs
    first = id(step(x))  # dropped at once: its object may come back
    again = step(x)
    assert id(again) == first and again.requires_grad is None and again.grad is None
    again.requires_grad, again.note = True, "mine"
    del again
    fresh = step(x)
    assert fresh.requires_grad is None and not hasattr(fresh, "note")
    fresh.grad = Tensor(np.ones(16, np.float32))  # a tensor where None was: compared by identity, not elementwise
    del fresh
    assert step(x).grad is None
    loss = step(x)
    for _ in range(4):  # `loss = step(x)`: the previous one is still held while the next call runs
        prev, loss = loss, step(x)
        assert loss is not prev
        np.testing.assert_allclose(loss.numpy(), want, rtol=1e-4, atol=1e-3)
        del prev


def test_steady_calls_follow_other_inputs_freed_memory_and_settings():
    """The repeated-call path stops at anything that changes what a call must do: another tensor, the same tensor
    assigned new values, intermediates freed, JIT=0 and DEBUG=2."""
    from fusegrad import Context

    step, w1, w2 = _step_and_weights()
    a_np, b_np = (rng.standard_normal((16, 32), dtype=np.float32) for _ in range(2))
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    for _ in range(4):
        np.testing.assert_allclose(step(a).numpy(), _ref(a_np, w1, w2), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(step(b).numpy(), _ref(b_np, w1, w2), rtol=1e-4, atol=1e-3)
    for _ in range(3):
        np.testing.assert_allclose(step(a).numpy(), _ref(a_np, w1, w2), rtol=1e-4, atol=1e-3)
    step.captured.free_intermediates()
    np.testing.assert_allclose(step(a).numpy(), _ref(a_np, w1, w2), rtol=1e-4, atol=1e-3)
    assert all(b.is_allocated for la in step.captured.jit_cache for b in la.bufs)  # the call allocated them again
    a.assign(Tensor(b_np)).realize()
    np.testing.assert_allclose(step(a).numpy(), _ref(b_np, w1, w2), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(step(a).numpy(), _ref(b_np, w1, w2), rtol=1e-4, atol=1e-3)
    cnt = step.cnt
    with Context(JIT=0):
        np.testing.assert_allclose(step(a).numpy(), _ref(b_np, w1, w2), rtol=1e-4, atol=1e-3)
    assert step.cnt == cnt + 1
    before = GlobalCounters.kernel_count
    with Context(DEBUG=2):
        step(a)
    assert GlobalCounters.kernel_count - before == len(step.captured.jit_cache)


def test_steady_calls_of_two_arguments_check_each_in_its_place():
    """The repeated-call path of a two-argument step: the same two tensors again replay; the two swapped, or one
    replaced, go through the checks and compute with the tensors given."""
    sub = TinyJit(lambda p, q: (p - 2 * q).realize())
    p_np, q_np = rng.standard_normal(16, dtype=np.float32), rng.standard_normal(16, dtype=np.float32)
    p, q = Tensor(p_np).realize(), Tensor(q_np).realize()
    for _ in range(4):
        np.testing.assert_allclose(sub(p, q).numpy(), p_np - 2 * q_np, rtol=1e-6)
    np.testing.assert_allclose(sub(q, p).numpy(), q_np - 2 * p_np, rtol=1e-6)
    np.testing.assert_allclose(sub(q, p).numpy(), q_np - 2 * p_np, rtol=1e-6)
    r = Tensor(r_np := rng.standard_normal(16, dtype=np.float32)).realize()
    np.testing.assert_allclose(sub(p, r).numpy(), p_np - 2 * r_np, rtol=1e-6)
    np.testing.assert_allclose(sub(p, r).numpy(), p_np - 2 * r_np, rtol=1e-6)
    np.testing.assert_allclose(sub(p, q).numpy(), p_np - 2 * q_np, rtol=1e-6)
