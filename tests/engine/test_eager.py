"""engine/eager.py: an eager op on realized tensors whose one-kernel schedule the leaf-op memo holds launches straight
from its first run's program, into an output that reuses the previous output's memory when that died; values,
counters, DEBUG lines and TinyJit captures stay those of the general path."""

import gc
import numpy as np
import pytest
from fusegrad import Context, GlobalCounters, Tensor, TinyJit
from fusegrad.runtime.buffers import base_buffer, buffer_of
from fusegrad.runtime.device import HostAllocator

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_repeated_eager_ops_match_numpy_and_count_every_launch():
    x_np, y_np = f32(16), f32(16)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for _ in range(3):  # planned, then served by the memo's launch
        np.testing.assert_allclose((x + y).realize().numpy(), x_np + y_np, rtol=1e-6)
    kernels, mem, ops = GlobalCounters.kernel_count, GlobalCounters.global_mem, GlobalCounters.global_ops
    outs = [(x * y).realize() for _ in range(4)]  # kept alive: four distinct outputs
    for out in outs:
        np.testing.assert_allclose(out.numpy(), x_np * y_np, rtol=1e-6)
    assert len({id(buffer_of[base_buffer(o.uop)]) for o in outs}) == 4
    assert GlobalCounters.kernel_count == kernels + 4
    assert GlobalCounters.global_mem == mem + 4 * 3 * 16 * 4  # output and two inputs, float32
    assert GlobalCounters.global_ops > ops
    for a, b in ((y, x), (x, x)):  # other argument orders get their own kernels' results
        for _ in range(3):
            np.testing.assert_allclose((a - b).realize().numpy(), a.numpy() - b.numpy(), rtol=1e-6)


def test_an_output_dies_and_the_next_one_reuses_its_memory():
    x_np = f32(16)
    x = Tensor(x_np).realize()
    for _ in range(3):
        (x + x).realize()
    before = GlobalCounters.mem_used
    first = (x + x).realize()
    address = buffer_of[base_buffer(first.uop)].address()
    assert GlobalCounters.mem_used == before + 64
    del first
    assert GlobalCounters.mem_used == before  # the memory counts as used only while a buffer holds it
    second = (x + x).realize()
    assert buffer_of[base_buffer(second.uop)].address() == address
    np.testing.assert_allclose(second.numpy(), x_np * 2, rtol=1e-6)


def test_a_view_of_a_dead_output_keeps_its_values():
    x_np = f32(16)
    x = Tensor(x_np).realize()
    for _ in range(3):
        (x * x).realize()
    out = (x * x).realize()
    view = buffer_of[base_buffer(out.uop)].host_view()  # outlives the buffer: its memory must not be reused
    del out
    y = Tensor(x_np + 1).realize()
    for _ in range(3):
        np.testing.assert_allclose((y * y).realize().numpy(), (x_np + 1) ** 2, rtol=1e-6)
        np.testing.assert_allclose((x * x).realize().numpy(), x_np**2, rtol=1e-6)
    np.testing.assert_allclose(view, x_np**2, rtol=1e-6)


def test_lru_cache_mb_0_keeps_no_spare_output():
    x = Tensor(f32(16)).realize()
    for _ in range(3):
        (x + x).realize()
    with Context(LRU_CACHE_MB=0):
        (x + x).realize()  # takes the spare block and keeps none
        gc.collect()
        assert HostAllocator.cache.sizes() == {} and HostAllocator.cache.nbytes == 0
        np.testing.assert_allclose((x + x).realize().numpy(), x.numpy() * 2, rtol=1e-6)


def test_debug_2_prints_each_eager_launch(capsys):
    x = Tensor(f32(16)).realize()
    for _ in range(3):
        (x + x).realize()
    capsys.readouterr()
    with Context(DEBUG=2):
        for _ in range(2):
            (x + x).realize()
    assert len([ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("*** CPU")]) == 2


def test_tinyjit_captures_an_eager_op_served_by_the_memo():
    x_np, y_np = f32(16), f32(16)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for _ in range(3):
        (x + y).realize()
    step = TinyJit(lambda a, b: (a + b).realize())
    for i in range(4):
        a, b = Tensor(x_np + i).realize(), Tensor(y_np).realize()
        np.testing.assert_allclose(step(a, b).numpy(), x_np + i + y_np, rtol=1e-6)
    assert len(step.captured.launches) == 1


def test_global_counters_reset_keeps_memory_in_use():
    x = Tensor(f32(16)).realize()
    for _ in range(3):
        (x + x).realize()
    kept = (x + x).realize()
    assert GlobalCounters.kernel_count > 0 and GlobalCounters.time_sum_s > 0
    used, per_device = GlobalCounters.mem_used, dict(GlobalCounters.mem_used_per_device)
    GlobalCounters.reset()
    assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (0, 0, 0)
    assert (GlobalCounters.time_sum_s, GlobalCounters.compile_count) == (0.0, 0)
    assert GlobalCounters.mem_used == used and GlobalCounters.mem_used_per_device == per_device
    (x + x).realize()
    assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_mem == 2 * 64  # the output and x, one argument
    del kept


def test_shapes_recorded_by_an_eager_training_step_are_the_inferred_ones(monkeypatch):
    """The nodes of a training step record their shapes when built (gradients take their source's): a step asks no
    shape that has to be inferred, and each recorded shape is the one inference gives."""
    from fusegrad import nn
    from fusegrad.nn.optim import SGD
    from fusegrad.uop import ops

    l1, l2 = nn.Linear(12, 8), nn.Linear(8, 3)
    opt = SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1)
    x, y = Tensor(f32(5, 12)).realize(), Tensor(np.array([0, 2, 1, 1, 0], np.int32)).realize()
    inferred = []
    infer = ops._infer_shape

    def step():
        opt.zero_grad()
        loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
        loss.backward()
        updates = opt.schedule_step()  # what opt.step() realizes, seen before it does
        nodes = ops.UOp(ops.Ops.SINK, src=tuple(t.uop for t in updates)).toposort()
        Tensor.realize(*updates, *[p.grad for p in opt.params])
        return loss.item(), nodes

    with Context(TRAINING=1):
        for _ in range(5):  # planned, then re-bound: later steps plan nothing (planning asks every shape)
            step()
        monkeypatch.setattr(ops, "_infer_shape", lambda u: inferred.append(u.op) or infer(u))
        losses = [step()[0] for _ in range(2)]
        assert inferred == [], inferred
        _, nodes = step()
    for u in nodes:
        if hasattr(u, "_shape"):
            assert infer(u) == u._shape, u.op
    assert losses[1] < losses[0]


def test_a_repeated_eager_op_launches_through_the_runners_packed_call():
    """An eager op called in a loop (PACK_AFTER times; a script's few ops never ask for the runner's build) launches
    through the runner's one-argument entry with a table of addresses: rewritten when an output is still held (new
    memory), kept when the output's spare block comes back; the values are numpy's either way."""
    import gc as gc_module

    from fusegrad.engine.eager import EagerLaunch
    from fusegrad.runtime import cpu_runner
    from fusegrad.runtime.cpu_graph import PackedLaunch

    assert cpu_runner.graph_library() is not None, "the runner builds where the CPU device compiles"

    def launches() -> list:
        return [o for o in gc_module.get_objects() if type(o) is EagerLaunch]

    gc_module.collect()  # an earlier test's dead graph with a pending index check (a cycle) takes eager ops elsewhere
    before = {id(o): o for o in launches()}  # held: a launch freed meanwhile would leave its id to a new one
    x_np, y_np = f32(63), f32(63)  # a size no other test gives an eager op: its own launch
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for _ in range(3):
        (x * y).realize()
    (mine,) = [o for o in launches() if id(o) not in before and o.size == 63]
    assert mine.packed is None  # a few ops: no packed call asked for yet
    for _ in range(EagerLaunch.PACK_AFTER):  # a loop: now worth it
        (x * y).realize()
    assert type(mine.packed) is PackedLaunch
    held = [(x * y).realize() for _ in range(3)]  # each output new memory: the table rewritten each time
    for out in held:
        np.testing.assert_allclose(out.numpy(), x_np * y_np, rtol=1e-6)
    for _ in range(3):  # outputs dying at once: the spare block, the same table
        np.testing.assert_allclose((x * y).realize().numpy(), x_np * y_np, rtol=1e-6)
        np.testing.assert_allclose((x + y).realize().numpy(), x_np + y_np, rtol=1e-6)


def test_a_check_pending_in_another_graph_leaves_eager_ops_their_fast_path():
    """An index check waiting in some other lazy graph (or a dead one the collector has not reached) is not an eager
    op's: the op on realized buffers still launches through its EagerLaunch, and the pending check still runs."""
    import gc as gc_module

    from fusegrad.engine.checks import index_checks
    from fusegrad.engine.eager import EagerLaunch

    with Context(CHECK_OOB=1):
        x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
        pending = x.gather(1, Tensor([[0, 3], [1, 2], [2, 9]]).realize())  # lazy, and out of range
    assert len(index_checks) > 0
    a_np, b_np = f32(61), f32(61)  # a size no other test gives an eager op: its own launch
    a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
    for _ in range(3):
        np.testing.assert_allclose((a * b).realize().numpy(), a_np * b_np, rtol=1e-6)
    assert [o for o in gc_module.get_objects() if type(o) is EagerLaunch and o.size == 61]
    with pytest.raises(IndexError):
        pending.realize()


def _walks(monkeypatch) -> list:
    """GraphShape walks made from now on (each realize the leaf-op memo does not serve makes one)."""
    from fusegrad.schedule import cache

    walks: list = []
    real = cache.GraphShape.__init__

    def counted(self, *args, **kwargs):
        walks.append(args[0])
        real(self, *args, **kwargs)

    monkeypatch.setattr(cache.GraphShape, "__init__", counted)
    return walks


@pytest.mark.parametrize(
    "name, op, ref",
    [
        ("x - y", lambda x, y: x - y, lambda x, y: x - y),
        ("x * 2", lambda x, y: x * 2, lambda x, y: x * 2),
        ("x + 1 - y", lambda x, y: x + 1 - y, lambda x, y: x + 1 - y),
        ("relu", lambda x, y: x.relu(), lambda x, y: np.maximum(x, 0)),
        ("sum", lambda x, y: (x * y).sum(), lambda x, y: (x * y).sum()),
        ("max of a view", lambda x, y: x.reshape(4, 4).max(1), lambda x, y: x.reshape(4, 4).max(1)),
        ("x - x", lambda x, y: x - x, lambda x, y: x - x),
    ],
)
def test_small_graphs_over_realized_tensors_are_served_by_the_memo(monkeypatch, name, op, ref):
    """Eager ops whose graph is a few nodes over realized tensors and constants (`x - y` is ADD(x, NEG(y)), `x * 2`
    reads a constant): after the first, no graph walk, and the values of the general path."""
    x_np, y_np = f32(16), f32(16)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    np.testing.assert_allclose(op(x, y).realize().numpy(), ref(x_np, y_np), rtol=1e-6)  # planned
    walks = _walks(monkeypatch)
    for _ in range(3):
        np.testing.assert_allclose(op(x, y).realize().numpy(), ref(x_np, y_np), rtol=1e-6)
    assert walks == [], f"{name}: the memo did not serve it"


def test_a_small_graph_with_another_constant_or_other_tensors_gets_its_own_values(monkeypatch):
    x_np, y_np = f32(16), f32(16)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for c in (2.0, 3.0, -0.0, 2.0):  # the constant is part of the memo's key
        np.testing.assert_array_equal((x * c).realize().numpy(), x_np * np.float32(c))
    for a, b, a_np, b_np in ((x, y, x_np, y_np), (y, x, y_np, x_np), (x, x, x_np, x_np)):
        for _ in range(2):
            np.testing.assert_array_equal((a - b).realize().numpy(), a_np - b_np)
    y.assign(Tensor(x_np * 4)).realize()  # a new version of y: a new leaf, so a new key
    np.testing.assert_array_equal((x - y).realize().numpy(), x_np - x_np * 4)


def test_an_inner_node_computed_already_sends_the_graph_down_the_general_path(monkeypatch):
    """-y realized by itself: the same NEG node (hash-consed) in `x + -y` stands for its stored value, which only the
    general path's walk reads; the memo must not serve a graph with it."""
    x_np, y_np = f32(16), f32(16)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()
    for _ in range(2):
        (x - y).realize()
    neg = -y
    node = neg.uop  # held, so `-y` below is this node, which the realize marks as computed
    neg.realize()
    assert (-y).uop is node and node.realized_ref is not None
    walks = _walks(monkeypatch)
    np.testing.assert_array_equal((x + -y).realize().numpy(), x_np - y_np)
    np.testing.assert_array_equal((x - y).realize().numpy(), x_np - y_np)
    assert len(walks) == 2


def test_a_small_graph_leaves_nothing_alive_that_makes_an_assign_copy(monkeypatch):
    """The memo keeps no node: after `(b * 10).realize()` an assign to b writes its storage in place."""
    b = Tensor(np.array([1.0, 2.0], np.float32)).realize()
    for _ in range(3):
        y = (b * 10).realize()
    storage = buffer_of[base_buffer(b.uop)]
    b.assign(b + 1).realize()
    assert buffer_of[base_buffer(b.uop)] is storage
    assert y.tolist() == [10.0, 20.0] and b.tolist() == [2.0, 3.0]


def test_a_long_eager_chain_is_not_spelled_to_its_bottom():
    """The memo gives a graph up after MAX_FORM_NODES nodes: a chain of 5,000 ops realizes (the spelling once recursed
    down the whole chain and raised RecursionError) and equals numpy."""
    x_np = f32(16)
    out = Tensor(x_np).realize()
    ref = x_np.astype(np.float64)
    for i in range(5000):
        out, ref = (out * 1.0001, ref * 1.0001) if i % 2 else (out + 0.001, ref + 0.001)
    np.testing.assert_allclose(out.realize().numpy(), ref, rtol=1e-4, atol=1e-3)  # 5,000 float32 roundings
