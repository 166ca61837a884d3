"""The schedule cache (fusegrad/schedule/cache.py): a graph of a known structure re-binds the planned schedule to
its own buffers and constants; everything else about a realize (values, copy on write, kept values) stays the same."""

import numpy as np
import pytest
from fusegrad import Context, Tensor
from fusegrad.helpers import GlobalCounters
from fusegrad.nn.optim import SGD
from fusegrad.schedule import create_schedule
from fusegrad.schedule.cache import GraphShape, ScheduleCacheStats
from fusegrad.uop.ops import UOp

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_new_inputs_reuse_the_schedule_and_match_numpy():
    def step(x_np, w_np, scale):
        x, w = Tensor(x_np).realize(), Tensor(w_np).realize()
        return ((x * scale + 1.25).relu() @ w).sum(axis=1).numpy()

    step(f32(8, 5), f32(5, 3), 0.5)
    hits = ScheduleCacheStats.hits
    for scale in (0.75, -2.0, 3.5):
        x_np, w_np = f32(8, 5), f32(5, 3)
        np.testing.assert_allclose(
            step(x_np, w_np, scale), (np.maximum(x_np * scale + 1.25, 0) @ w_np).sum(axis=1), rtol=1e-5, atol=1e-5
        )
    assert ScheduleCacheStats.hits >= hits + 3


@pytest.mark.parametrize("const_dtype", ["float", "float16"])
def test_new_constants_compile_no_new_kernels(const_dtype):
    x_np = f32(16)
    x = Tensor(x_np).realize() if const_dtype == "float" else Tensor(x_np).half().realize()
    (x * 0.3 + 0.7).realize()
    compiled = GlobalCounters.compile_count
    for a, b in ((0.25, 0.5), (1.5, -3.0), (7.0, 0.125), (2.0, 2.0)):
        got = (x * a + b).numpy().astype(np.float32)
        want = (x_np * a + b) if const_dtype == "float" else (x_np.astype(np.float16) * np.float16(a) + np.float16(b))
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=3e-3 if const_dtype != "float" else 1e-6)
    assert GlobalCounters.compile_count == compiled


def test_equal_and_different_constants_are_told_apart():
    # two equal constants share one kernel argument; the same structure with different ones must not reuse that
    x_np = f32(10)
    x = Tensor(x_np).realize()
    np.testing.assert_allclose((x * 0.5 + 0.5).numpy(), x_np * 0.5 + 0.5, rtol=1e-6)
    np.testing.assert_allclose((x * 0.5 + 0.25).numpy(), x_np * 0.5 + 0.25, rtol=1e-6)
    np.testing.assert_allclose((x * 3.0 + 3.0).numpy(), x_np * 3.0 + 3.0, rtol=1e-6)


def test_same_buffer_twice_is_not_two_buffers():
    a_np, b_np = f32(6), f32(6)
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    np.testing.assert_allclose((a * b + a).numpy(), a_np * b_np + a_np, rtol=1e-6)
    np.testing.assert_allclose((a * a + b).numpy(), a_np * a_np + b_np, rtol=1e-6)
    np.testing.assert_allclose((b * a + a).numpy(), b_np * a_np + a_np, rtol=1e-6)


def test_shapes_dtypes_devices_and_views_change_the_schedule():
    x_np = f32(4, 6)
    cases = [
        (lambda: Tensor(x_np).realize(), lambda x: x * 2.5 + 1.5, x_np * 2.5 + 1.5),
        (lambda: Tensor(x_np[:, :4]).realize(), lambda x: x * 2.5 + 1.5, x_np[:, :4] * 2.5 + 1.5),
        (lambda: Tensor(x_np.astype(np.float64)).realize(), lambda x: x * 2.5 + 1.5, x_np * 2.5 + 1.5),
        (lambda: Tensor(x_np, device="PYTHON").realize(), lambda x: x * 2.5 + 1.5, x_np * 2.5 + 1.5),
        (lambda: Tensor(x_np).realize(), lambda x: x.T * 2.5 + 1.5, x_np.T * 2.5 + 1.5),
        (lambda: Tensor(x_np).realize(), lambda x: x[1:] * 2.5 + 1.5, x_np[1:] * 2.5 + 1.5),
        (lambda: Tensor(x_np).realize(), lambda x: x[:-1] * 2.5 + 1.5, x_np[:-1] * 2.5 + 1.5),
        (lambda: Tensor(x_np).realize(), lambda x: x.flip(0) * 2.5 + 1.5, x_np[::-1] * 2.5 + 1.5),
        (lambda: Tensor(x_np).realize(), lambda x: (x * 2.5 + 1.5).sum(0), (x_np * 2.5 + 1.5).sum(0)),
        (lambda: Tensor(x_np).realize(), lambda x: (x * 2.5 + 1.5).sum(1), (x_np * 2.5 + 1.5).sum(1)),
    ]
    for _ in range(2):  # the second round runs every case from the cache
        for make, fn, want in cases:
            out = fn(make())
            np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
            assert out.dtype == make().dtype


def test_copy_on_write_decided_per_call():
    # the same assign with and without a live lazy reader of the old value: one structure, two plans
    for round_ in range(3):
        w_np = f32(5)
        w = Tensor(w_np).realize()
        held = w * 2 if round_ != 1 else None
        w.assign(w + 1.0).realize()
        np.testing.assert_allclose(w.numpy(), w_np + 1, rtol=1e-6)
        if held is not None:
            np.testing.assert_allclose(held.numpy(), w_np * 2, rtol=1e-6)


def test_training_steps_match_uncached_steps():
    def train(cache: int) -> list[np.ndarray]:
        local = np.random.default_rng(1)
        w1, w2 = local.standard_normal((6, 8)).astype(np.float32), local.standard_normal((8, 3)).astype(np.float32)
        p1, p2 = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
        opt = SGD([p1, p2], lr=0.05, momentum=0.9)
        with Context(SCHEDULE_CACHE=cache, TRAINING=1):
            for _ in range(4):
                x = Tensor(local.standard_normal((4, 6)).astype(np.float32))
                y = Tensor(local.integers(0, 3, 4).astype(np.int32))
                opt.zero_grad()
                loss = (x @ p1).relu().matmul(p2).sparse_categorical_crossentropy(y)
                loss.backward()
                opt.step()
                loss.item()
        return [p1.numpy(), p2.numpy()]

    for cached, planned in zip(train(1), train(0)):
        np.testing.assert_array_equal(cached, planned)


def test_kept_intermediate_is_reused_after_a_cached_realize():
    # an intermediate a realize keeps is read back (not recomputed) by a later graph, also from a cached plan
    for _ in range(3):
        x_np = f32(8, 8)
        x = Tensor(x_np).realize()
        s = x.exp().sum(axis=1, keepdim=True)
        out = x.exp() / s
        lazy_s = s * 1.0
        out.realize()
        np.testing.assert_allclose(lazy_s.numpy(), np.exp(x_np).sum(axis=1, keepdims=True), rtol=1e-5)


def _visits(monkeypatch, roots: list[Tensor]) -> int:
    count = [0]
    toposort = UOp.toposort

    def counted(self, gate=None):
        out = toposort(self, gate)
        count[0] += len(out)
        return out

    monkeypatch.setattr(UOp, "toposort", counted)
    create_schedule([t.uop for t in roots], [t.device for t in roots])
    shape = GraphShape([t.uop for t in roots], [t.device for t in roots])
    monkeypatch.setattr(UOp, "toposort", toposort)
    return count[0] + shape.visits


def _chain(n: int) -> list[Tensor]:
    out = Tensor(f32(16)).realize()
    for i in range(n):
        out = out * 1.01 if i % 2 else out + 0.5
    return [out]


def _reduce_chain(n: int) -> list[Tensor]:
    out = Tensor(f32(16)).realize()
    for _ in range(n):
        out = (out - out.max() * 0.5).contiguous()
    return [out]


def _many_assigns(n: int) -> list[Tensor]:
    g = Tensor(f32(4)).realize()
    params = [Tensor(f32(4)).realize() for _ in range(n)]
    return [p.assign(p - g * 0.1) for p in params]


@pytest.mark.parametrize("build", [_chain, _reduce_chain, _many_assigns])
def test_scheduling_visits_grow_linearly(monkeypatch, build):
    small, large = _visits(monkeypatch, build(100)), _visits(monkeypatch, build(1000))
    assert large <= 11 * small, f"node visits grew from {small} to {large} for 10x the graph"


def test_random_draws_reuse_one_kernel():
    # the call number of the random stream is data, so a dropout mask per step compiles and plans once
    Tensor.manual_seed(3)
    first = [Tensor.rand(64).numpy() for _ in range(2)]
    compiled, hits = GlobalCounters.compile_count, ScheduleCacheStats.hits
    more = [Tensor.rand(64).numpy() for _ in range(3)]
    assert GlobalCounters.compile_count == compiled
    assert ScheduleCacheStats.hits >= hits + 3
    draws = first + more
    assert all(not np.array_equal(a, b) for i, a in enumerate(draws) for b in draws[i + 1 :])
    assert all(((d >= 0) & (d < 1)).all() for d in draws)
    Tensor.manual_seed(3)
    np.testing.assert_array_equal(Tensor.rand(64).numpy(), first[0])


def test_one_op_on_buffers_reuses_the_walk_of_an_earlier_graph():
    from fusegrad.schedule.cache import graph_shape

    x_np, y_np = f32(16), f32(16)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for a, b in ((x, y), (x, x), (y, x), (x, y)):
        for _ in range(2):  # the second graph of each form comes from the memo
            root = (a * b).uop
            fast, walked = graph_shape([root], ["CPU"]), GraphShape([root], ["CPU"])
            for field in ("key", "nodes", "buffers", "versions", "version_slot", "consts", "const_slot"):
                assert getattr(fast, field) == getattr(walked, field), field
    np.testing.assert_allclose((x * y).numpy(), x_np * y_np)
    np.testing.assert_allclose((y * x).numpy(), x_np * y_np)


def test_leaf_op_memo_keeps_no_buffer_alive_and_follows_new_versions():
    import gc
    import weakref
    from fusegrad.runtime.buffers import buffer_of

    x_np = f32(16)
    x = Tensor(x_np).realize()
    np.testing.assert_allclose((x + x).numpy(), x_np * 2)
    dead = weakref.ref(buffer_of[x.uop])
    del x
    gc.collect()
    assert dead() is None
    y = Tensor(x_np).realize()
    np.testing.assert_allclose((y + y).numpy(), x_np * 2)
    y.assign(Tensor(x_np * 3)).realize()  # y's node is a new version: the memo must not serve the old one
    np.testing.assert_allclose((y + y).numpy(), x_np * 6)
    np.testing.assert_allclose((y + y).numpy(), x_np * 6)


def test_leaf_template_fast_path_serves_only_its_own_structure():
    """An eager op on realized tensors re-binds its template straight from the leaf-op memo: other inputs, shapes,
    dtypes, devices, ops and argument orders get their own schedules and the right values."""
    from fusegrad.schedule.cache import _leaf_op_shapes

    x_np, y_np = f32(16), f32(16)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for _ in range(3):
        np.testing.assert_allclose((x + y).realize().numpy(), x_np + y_np)
    assert any(entry[4] is not None for entry in _leaf_op_shapes.values())  # the template is remembered
    hits = ScheduleCacheStats.hits
    np.testing.assert_allclose((x + y).realize().numpy(), x_np + y_np)
    assert ScheduleCacheStats.hits > hits
    z_np = f32(16)
    z = Tensor(z_np).realize()  # new input buffer
    np.testing.assert_allclose((x + z).realize().numpy(), x_np + z_np)
    np.testing.assert_allclose((z - x).realize().numpy(), z_np - x_np)  # other op
    np.testing.assert_allclose((y + x).realize().numpy(), y_np + x_np)  # other order
    np.testing.assert_allclose((x + x).realize().numpy(), x_np * 2)  # one buffer twice
    a_np, b_np = f32(4, 8), f32(4, 8)
    np.testing.assert_allclose(
        (Tensor(a_np).realize() + Tensor(b_np).realize()).realize().numpy(), a_np + b_np
    )  # shape
    i_np = np.arange(16, dtype=np.int32)
    xi, yi = Tensor(i_np).realize(), Tensor(i_np * 3).realize()
    for _ in range(2):
        np.testing.assert_array_equal((xi + yi).realize().numpy(), i_np * 4)  # dtype
    xp, yp = Tensor(x_np, device="PYTHON").realize(), Tensor(y_np, device="PYTHON").realize()
    for _ in range(2):
        out = (xp + yp).realize()
        np.testing.assert_allclose(out.numpy(), x_np + y_np)  # device
        assert out.device == "PYTHON"
    with Context(NUM_CPU_THREADS=1):
        np.testing.assert_allclose((x + y).realize().numpy(), x_np + y_np)
    x.assign(Tensor(y_np)).realize()  # a new version of x's storage: a new source node
    np.testing.assert_allclose((x + y).realize().numpy(), y_np * 2)
    with Context(SCHEDULE_CACHE=0):
        np.testing.assert_allclose((x + y).realize().numpy(), y_np * 2)


def test_template_keeps_programs_per_noopt_and_counts_every_launch():
    """A template's launch memo holds the engine's programs per NOOPT (and BEAM, EMULATED_DTYPES): switching NOOPT gets
    the other program, and every re-bound run adds its kernels, operations and bytes to GlobalCounters."""
    from fusegrad.schedule.cache import _leaf_op_shapes

    x_np, y_np = f32(33), f32(33)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for _ in range(2):
        np.testing.assert_allclose((x * y).realize().numpy(), x_np * y_np)
    with Context(NOOPT=1):
        np.testing.assert_allclose((x * y).realize().numpy(), x_np * y_np)
    memos = [
        e[4].launch_memo for e in _leaf_op_shapes.values() if e[4] is not None and e[4].kernels[0][2][0][0] == "new"
    ]
    assert any((1, 0, "") in m and (0, 0, "") in m for m in memos)  # (NOOPT, BEAM, EMULATED_DTYPES)
    kernels, mem = GlobalCounters.kernel_count, GlobalCounters.global_mem
    for _ in range(3):
        (x * y).realize()
    assert GlobalCounters.kernel_count == kernels + 3
    assert GlobalCounters.global_mem == mem + 3 * 3 * 33 * 4  # output and two inputs, float32


def _assign_step(w: Tensor, x: Tensor) -> Tensor:
    """An update like an optimizer's (w pending an assign); returns its step value as a second lazy root."""
    g = (x * w).relu() + x.sum() * 0.5
    w.assign(w - g * 0.1)
    return g * 2.0


def _numpy_step(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    g = np.maximum(x * w, 0) + x.sum() * x.dtype.type(0.5)
    return w - g * x.dtype.type(0.1), g * x.dtype.type(2)


def test_numbering_in_the_readers_order_tells_structures_apart():
    """A realize with pending assigns numbers its graph in the copy-on-write check's order (no second walk): the
    same nodes, buffers and versions as the walk's; equal structures get one key, another pattern of buffers (x
    twice) or another shape another key; a graph where a node stands for a realized value is walked instead."""
    from fusegrad.engine.copy_on_write import OldVersionReaders

    def shapes(roots: list[UOp]) -> tuple[GraphShape, GraphShape]:
        devices = ["CPU"] * len(roots)
        return GraphShape(roots, devices, OldVersionReaders(roots, 1).order), GraphShape(roots, devices)

    keys = []
    for n, same in ((6, False), (6, False), (6, True), (7, False)):
        w = Tensor(f32(n)).realize()
        x = w if same else Tensor(f32(n)).realize()
        second = _assign_step(w, x)
        ordered, walked = shapes([w.uop, second.uop])
        assert set(ordered.nodes) == set(walked.nodes) and len(ordered.nodes) == len(walked.nodes)
        assert set(map(id, ordered.buffers)) == set(map(id, walked.buffers))
        assert set(ordered.versions) == set(walked.versions) and set(ordered.consts) == set(walked.consts)
        keys.append(ordered.key)
    assert keys[0] == keys[1] and len({keys[1], keys[2], keys[3]}) == 3
    # the sum s is kept by an earlier realize (its lazy reader lives): the graph reads its value, and is walked
    w, x = Tensor(f32(6)).realize(), Tensor(f32(6)).realize()
    s = x.exp().sum()
    (x.exp() / s).realize()
    lazy = s * 1.0
    w.assign(w + lazy)
    assert any(u.realized_ref is not None and u.op.name != "BUFFER" for u in w.uop.toposort())
    ordered, walked = shapes([w.uop])
    for field in ("key", "nodes", "buffers", "versions", "consts"):
        assert getattr(ordered, field) == getattr(walked, field), field


def test_assign_steps_with_readers_rebind_correctly():
    """Steps of assigns realized with copy on write asked (pending assigns: the order-numbered path): a hit re-binds
    to this step's buffers after the input was written in place, and freed and its memory reused, with and without
    a lazy reader of the old weights; other shapes and dtypes miss. Every value equals numpy's."""
    hits = ScheduleCacheStats.hits
    w_np, x_np = f32(16), f32(16)
    w, x = Tensor(w_np).realize(), Tensor(x_np).realize()
    for step in range(8):
        if step == 3:
            x_np = f32(16)
            x.assign(Tensor(x_np)).realize()  # the input written in place
        if step == 5:
            del x  # freed: its memory may serve this step's buffers
            x_np = f32(16)
            x = Tensor(x_np).realize()
        held = w * 1.0 if step % 2 else None  # a lazy reader of the old weights: that assign copies on write
        second = _assign_step(w, x)
        Tensor.realize(w, second)
        new_w, want_second = _numpy_step(w_np, x_np)
        np.testing.assert_allclose(w.numpy(), new_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(second.numpy(), want_second, rtol=1e-5, atol=1e-6)
        if held is not None:
            np.testing.assert_allclose(held.numpy(), w_np, rtol=1e-5, atol=1e-6)
        w_np = new_w
    assert ScheduleCacheStats.hits >= hits + 4
    for shape, dtype in (((4, 4), np.float32), ((16,), np.float16)):
        w_np, x_np = f32(*shape).astype(dtype), f32(*shape).astype(dtype)
        w, x = Tensor(w_np).realize(), Tensor(x_np).realize()
        second = _assign_step(w, x)
        Tensor.realize(w, second)
        new_w, want_second = _numpy_step(w_np, x_np)
        tol = 1e-5 if dtype == np.float32 else 1e-2
        np.testing.assert_allclose(w.numpy(), new_w.astype(np.float32), rtol=tol, atol=tol)
        np.testing.assert_allclose(second.numpy(), want_second.astype(np.float32), rtol=tol, atol=tol)


def test_readers_order_keys_tell_which_buffer_feeds_which_input():
    """Two updates that differ only in which input a source reads (a * b + a, a * b + b), realized with pending
    assigns (the order-numbered path) one after the other, each several times: neither takes the other's template."""
    for _ in range(3):
        for pick in (0, 1):
            a_np, b_np, w_np = f32(8), f32(8), f32(8)
            a, b, w = Tensor(a_np).realize(), Tensor(b_np).realize(), Tensor(w_np).realize()
            other = w * 2.0  # a lazy reader of the old w, realized with the assign
            w.assign(w + a * b + (a, b)[pick])
            Tensor.realize(w, other)
            np.testing.assert_allclose(w.numpy(), w_np + a_np * b_np + (a_np, b_np)[pick], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(other.numpy(), w_np * 2, rtol=1e-6)


def test_an_order_missing_a_root_is_walked():
    """The copy-on-write check's order covers its own roots: a realize that schedules more (the index checks' extremes
    before the roots) walks its graph instead, and numbers it as the walk does."""
    from fusegrad.engine.copy_on_write import OldVersionReaders

    w, x = Tensor(f32(6)).realize(), Tensor(f32(6)).realize()
    second = _assign_step(w, x)
    extra = (x * 4.0).uop
    order = OldVersionReaders([w.uop], 1).order
    ordered, walked = (
        GraphShape([extra, w.uop, second.uop], ["CPU"] * 3, order),
        GraphShape([extra, w.uop, second.uop], ["CPU"] * 3),
    )
    for field in ("key", "nodes", "buffers", "versions", "consts"):
        assert getattr(ordered, field) == getattr(walked, field), field
