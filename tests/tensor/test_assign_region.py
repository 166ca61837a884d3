"""Writes into part of a realized buffer (setitem on storage, assign through a view, a KV cache row at a bound
Variable position) store only that part: one kernel whose output loops cover the slice, storing at the slice's place
in the buffer, checked against numpy; copy on write, in-place hazards and TinyJit replays keep their meaning."""

import numpy as np
import pytest

import fusegrad.engine.realize as realize
from fusegrad import GlobalCounters, Tensor, TinyJit, Variable
from fusegrad.codegen.lowerer import lower_kernel
from fusegrad.runtime.buffers import base_buffer, buffer_of, buffer_uop
from fusegrad.uop.ops import Ops, UOp


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def kernels(monkeypatch):
    """The ASTs of the kernels run from here on (each launch, compiled before or not)."""
    asts: list[UOp] = []
    get_runner = realize.get_runner
    monkeypatch.setattr(
        realize, "get_runner", lambda device, ast, *rest: asts.append(ast) or get_runner(device, ast, *rest)
    )
    return asts


def output_loop_size(ast: UOp) -> int:
    """Iterations of the output loops of a kernel lowered without opts (what it stores), times its stores."""
    lowered = lower_kernel(ast)
    loops = {u for u in lowered.toposort() if u.op is Ops.RANGE and u.arg[1] == "global"}
    trips = 1
    for r in loops:
        bound = r.src[0]
        trips *= bound.arg if bound.op is Ops.CONST else bound.vmax
    return trips * sum(1 for s in lowered.src if s.op is Ops.STORE)


def assert_region_store(ast: UOp, region_size: int, buffer_size: int) -> None:
    store = ast.src[0]
    assert store.src[0].op is not Ops.DEFINE_GLOBAL, "the store follows a view of its buffer"
    target = store.src[0]
    while target.op is not Ops.DEFINE_GLOBAL:
        target = target.src[0]
    assert target.arg[1] == buffer_size
    assert output_loop_size(ast) == region_size < buffer_size


# (shape, numpy index): slices with steps of one, ints, strided and negative steps, in 1-D .. 4-D
CONCRETE = [
    ((10,), np.s_[3:5]),
    ((10,), np.s_[7]),
    ((10,), np.s_[1:9:3]),
    ((10,), np.s_[8:0:-2]),
    ((5,), np.s_[::3]),  # the groups of 3 run past the dim: the pad completing the last is never stored to
    ((6, 7), np.s_[2:4, 1:6]),
    ((6, 7), np.s_[:, 3]),
    ((6, 7), np.s_[::2, ::-2]),
    ((6, 7), np.s_[1::2, ::-3]),
    ((3, 4, 5), np.s_[1, 1:3, ::2]),
    ((3, 4, 5), np.s_[..., 4]),
    ((2, 3, 16, 4), np.s_[:, :, 5:6]),
    ((2, 3, 16, 4), np.s_[1, ::2, 9:15:5, 1:3]),
]


@pytest.mark.parametrize("shape,index", CONCRETE, ids=[f"{s}-{i}" for s, i in CONCRETE])
def test_slice_write_matches_numpy_and_loops_over_the_slice(kernels, shape, index):
    a = rnd(*shape)
    t, ref = Tensor(a).realize(), a.copy()
    v = rnd(*ref[index].shape, seed=1)
    before = len(kernels)
    t[index] = Tensor(v).realize()
    ref[index] = v
    np.testing.assert_array_equal(t.numpy(), ref)
    writes = kernels[before : before + 1]
    assert len(writes) == 1
    assert_region_store(writes[0], max(ref[index].size, 1), ref.size)


def test_assign_through_views_writes_only_the_view(kernels):
    a = rnd(4, 6)
    t, ref = Tensor(a).realize(), a.copy()
    before = len(kernels)
    t.T[1:3].flip(0).assign(Tensor(rnd(2, 4, seed=2)))
    ref.T[1:3][::-1] = rnd(2, 4, seed=2)
    np.testing.assert_array_equal(t.numpy(), ref)
    assert_region_store(kernels[before], 8, 24)
    col = t[:, 2]
    col.assign(col * 10)  # reads the element it writes: no temporary
    ref[:, 2] *= 10
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6)


def test_write_reading_other_elements_of_its_buffer_goes_through_a_temporary():
    a = rnd(3, 5)
    t, ref = Tensor(a).realize(), a.copy()
    t[1:, 1:] = t[:-1, :-1] + 1  # overlapping: every element read before any is written
    ref[1:, 1:] = ref[:-1, :-1].copy() + 1
    t[0] = t[:, 0].sum() * Tensor.ones(5)  # a reduce over the column it partly writes
    ref[0] = ref[:, 0].sum()
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6)


@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_write_at_a_variable_position_compiles_once(kernels, ndim):
    shape = (2, 3, 12, 4)[4 - ndim :] if ndim > 1 else (12,)
    axis = max(ndim - 2, 0)  # the position axis: the third of four, like a KV cache
    cache, ref = Tensor.zeros(*shape).contiguous().realize(), np.zeros(shape, np.float32)
    pos = Variable("pos", 0, shape[axis] - 2)
    compiled = None
    for p in (0, 3, 4, 9, 10):
        row = rnd(*(2 if d == axis else n for d, n in enumerate(shape)), seed=p)
        window = tuple((pos.bind(p), pos.bind(p) + 2) if d == axis else None for d in range(ndim))
        before = len(kernels)
        cache.shrink(window).assign(Tensor(row))
        ref[tuple(slice(p, p + 2) if d == axis else slice(None) for d in range(ndim))] = row
        np.testing.assert_array_equal(cache.numpy(), ref)
        assert_region_store(kernels[before], row.size, ref.size)
        if compiled is None:
            compiled = GlobalCounters.compile_count
        assert GlobalCounters.compile_count == compiled, f"position {p} compiled a new kernel"


def test_write_of_a_variable_length_prefix():
    n = Variable("n", 1, 8)
    src = rnd(8, 3, seed=5)
    for value in (1, 5, 8):
        t, ref = Tensor.zeros(8, 3).contiguous().realize(), np.zeros((8, 3), np.float32)
        t[: n.bind(value)] = Tensor(src)[: n.bind(value)]
        ref[:value] = src[:value]
        np.testing.assert_array_equal(t.numpy(), ref)


def region_write(base: UOp, values: np.ndarray) -> list[UOp]:
    """[an assign of values into rows 1..2 of base (4, 5)]: the list holds the only reference to the graph."""
    rows = UOp(Ops.SHRINK, base.dtype, (UOp(Ops.RESHAPE, base.dtype, (base,), (4, 5)),), ((1, 3), (0, 5)))
    return [UOp(Ops.ASSIGN, base.dtype, (rows, Tensor(values).realize().uop))]


def test_region_assign_copies_on_write_while_a_lazy_graph_reads_the_old_value():
    """An assign into part of a buffer whose old value a live graph still reads writes a copy: the old elements
    carried over, the region written, the reader unchanged. With no reader left it writes in place."""
    a, rows = rnd(4, 5), rnd(2, 5, seed=1)
    old = base_buffer(Tensor(a).realize().uop)
    assert old is not None
    buf, reader = buffer_of[old], Tensor(old) * 2  # the reader lazily computes from this version of the storage
    roots = region_write(old, rows)
    del old
    (result,) = realize.realize_uops(roots, ["CPU"], 1)
    written = base_buffer(result)
    assert written is not None and buffer_of[written] is not buf  # a copy: the old storage kept for the reader
    want = a.copy()
    want[1:3] = rows
    np.testing.assert_array_equal(buffer_of[written].numpy().reshape(4, 5), want)
    np.testing.assert_array_equal(buf.numpy().reshape(4, 5), a)
    np.testing.assert_allclose(reader.numpy().reshape(4, 5), a * 2, rtol=1e-6)
    del reader, roots, result, written
    roots = region_write(buffer_uop(buf), rows * 3)
    (result,) = realize.realize_uops(roots, ["CPU"], 1)
    assert buffer_of[base_buffer(result)] is buf  # nobody reads the old value: in place
    want = a.copy()
    want[1:3] = rows * 3
    np.testing.assert_array_equal(buf.numpy().reshape(4, 5), want)


def test_setitem_still_refuses_a_lazy_reader_and_a_realized_one_keeps_its_values():
    a = rnd(6)
    t = Tensor(a).realize()
    lazy = t * 3
    with pytest.raises(RuntimeError, match="unrealized graph"):
        t[2:4] = 0.0
    lazy.realize()
    t[2:4] = 0.0
    np.testing.assert_allclose(lazy.numpy(), a * 3, rtol=1e-6)
    want = a.copy()
    want[2:4] = 0
    np.testing.assert_array_equal(t.numpy(), want)


def test_reads_before_the_write_run_before_it():
    a = rnd(5)
    t = Tensor(a).realize()
    before = (t[1:3] * 2).contiguous().realize()
    t[1:3] = Tensor([0.0, 0.0])
    np.testing.assert_allclose(before.numpy(), a[1:3] * 2, rtol=1e-6)


def test_jitted_decode_loop_replays_one_capture_writing_one_row(kernels):
    max_len, d = 16, 8
    cache_k = Tensor.zeros(1, 2, max_len, d).contiguous().realize()
    cache_v = Tensor.zeros(1, 2, max_len, d).contiguous().realize()
    ref_k, ref_v = np.zeros((1, 2, max_len, d), np.float32), np.zeros((1, 2, max_len, d), np.float32)
    start = Variable("start_pos", 0, max_len - 1)

    @TinyJit
    def step(q, k, v, sp):
        cache_k.shrink((None, None, (sp, sp + 1), None)).assign(k)
        cache_v.shrink((None, None, (sp, sp + 1), None)).assign(v)
        keys, values = cache_k[:, :, : sp + 1], cache_v[:, :, : sp + 1]
        return ((q @ keys.transpose(2, 3)).softmax(-1) @ values).contiguous()

    compiled = None
    for p in range(8):
        q, k, v = (rnd(1, 2, 1, d, seed=3 * p + i) for i in range(3))
        got = step(Tensor(q), Tensor(k), Tensor(v), start.bind(p)).numpy()
        ref_k[:, :, p], ref_v[:, :, p] = k[:, :, 0], v[:, :, 0]
        s = q @ ref_k[:, :, : p + 1].transpose(0, 1, 3, 2)
        e = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(got, (e / e.sum(-1, keepdims=True)) @ ref_v[:, :, : p + 1], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(cache_k.numpy(), ref_k)
        if p == 2:
            compiled = GlobalCounters.compile_count
        elif compiled is not None:
            assert GlobalCounters.compile_count == compiled, f"position {p} compiled a new kernel"
    assert step.cnt == 8
    writes = [a for a in kernels if a.src[0].src[0].op is not Ops.DEFINE_GLOBAL]
    assert writes and all(output_loop_size(a) == 2 * d for a in writes)
