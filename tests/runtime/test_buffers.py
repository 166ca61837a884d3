"""Freed host buffers are cached by size and handed to the next allocation of that size (runtime/device.py)."""

import gc
import mmap
import os
import threading
import numpy as np
import pytest
from fusegrad import Context, Tensor, dtypes
from fusegrad.helpers import GlobalCounters
from fusegrad.runtime.device import HUGE_COLOR_STEP, HUGE_COLORS, HUGE_PAGE, HostAllocator, host_cache_limit
from fusegrad.schedule import base_buffer, buffer_of

cache = HostAllocator.cache


@pytest.fixture(autouse=True, scope="module")
def frozen_heap():
    # a full collection walks every object the earlier tests of a long run left (0.2-0.5 s each, twice a test here):
    # frozen after one collection, they are skipped, and each test's collections walk only what came since
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def empty_cache():
    gc.collect()
    cache.flush()
    yield
    gc.collect()
    cache.flush()


def buffer(t: Tensor):
    return buffer_of[base_buffer(t.uop)]


def test_freed_buffer_is_reused_for_same_size():
    a = Tensor(np.arange(4096, dtype=np.float32)).realize()
    x = (a * 2).realize()
    address, nbytes = buffer(x).address(), buffer(x).nbytes
    del x
    assert cache.sizes() == {nbytes: 1}
    y = (a * 3).realize()
    assert buffer(y).address() == address
    assert cache.sizes() == {}
    np.testing.assert_array_equal(y.numpy(), np.arange(4096, dtype=np.float32) * 3)


def test_reused_block_keeps_its_address_and_a_new_buffer_over_it_reads_its_own_values():
    from fusegrad.runtime.device import Buffer

    first = Buffer("CPU", 64, dtypes.float32).ensure_allocated()
    first.copyin(np.full(64, 7, np.float32))
    address = first.address()
    del first
    second = Buffer("CPU", 64, dtypes.float32).ensure_allocated()
    # the remembered address is the memory's own, and the buffer's writes reach the memory numpy sees
    assert second._address is not None and second._address[0] is second._mem
    assert second.address() == address == second._mem.ctypes.data
    second.copyin(np.arange(64, dtype=np.float32))
    np.testing.assert_array_equal(second.numpy(), np.arange(64, dtype=np.float32))
    other = Buffer("CPU", 32, dtypes.float32).ensure_allocated()  # another size: a block of its own
    assert other.address() == other._mem.ctypes.data != address


def test_huge_buffers_are_reused_and_start_at_a_color_of_their_huge_page():
    a = Tensor(np.arange(HUGE_PAGE // 4 + 3, dtype=np.float32)).realize()
    x = (a + 1).realize()
    address = buffer(x).address()
    assert address % HUGE_PAGE % HUGE_COLOR_STEP == 0 and address % HUGE_PAGE < HUGE_COLORS * HUGE_COLOR_STEP
    assert address % 64 == 0
    del x
    y = (a - 1).realize()
    assert buffer(y).address() == address
    np.testing.assert_array_equal(y.numpy(), np.arange(HUGE_PAGE // 4 + 3, dtype=np.float32) - 1)


def test_huge_blocks_ask_for_huge_pages_over_whole_pages_only(monkeypatch):
    advice = []

    class RecordingMap(mmap.mmap):
        def madvise(self, *args):
            advice.append(args)
            return super().madvise(*args)

    monkeypatch.setattr(mmap, "mmap", RecordingMap)
    nbytes = 3 * HUGE_PAGE + 100
    for _ in range(HUGE_COLORS):  # each color once: the last huge page the block fills whole is the last advised
        advice.clear()
        block = HostAllocator._fresh(nbytes)
        block[:] = 7
        color = block.ctypes.data % HUGE_PAGE
        assert color % HUGE_COLOR_STEP == 0 and color < HUGE_COLORS * HUGE_COLOR_STEP and block.nbytes == nbytes
        assert len(advice) == 1
        option, start, length = advice[0]
        whole = np.frombuffer(block.base, np.uint8)
        assert option == mmap.MADV_HUGEPAGE and (whole.ctypes.data + start) % HUGE_PAGE == 0
        assert length == (color + nbytes) // HUGE_PAGE * HUGE_PAGE == 3 * HUGE_PAGE
        assert whole[start + color : start + color + 4].tolist() == [7, 7, 7, 7]


def test_huge_blocks_in_turn_start_at_different_colors():
    # two blocks an operation reads together (MPI's reduction, an elementwise kernel) do not share cache sets
    colors = {HostAllocator._fresh(HUGE_PAGE + 64).ctypes.data % HUGE_PAGE for _ in range(HUGE_COLORS)}
    assert len(colors) == HUGE_COLORS


def test_different_sizes_are_not_mixed():
    a, b = Tensor.arange(1000, dtype=dtypes.float32).realize(), Tensor.arange(1001, dtype=dtypes.float32).realize()
    x = (a * 2).realize()
    address = buffer(x).address()
    del x
    y = (b * 2).realize()
    assert buffer(y).address() != address
    assert cache.sizes() == {4000: 1}
    z = (a.cast(dtypes.int32) + 1).realize()  # same byte size, other dtype: the block serves it
    assert buffer(z).address() == address
    np.testing.assert_array_equal(y.numpy(), np.arange(1001, dtype=np.float32) * 2)
    np.testing.assert_array_equal(z.numpy(), np.arange(1000, dtype=np.int32) + 1)


def _poisoned_alloc(real_alloc):
    def alloc(self, nbytes):
        mem = real_alloc(self, nbytes)
        mem[:] = 0xFF  # NaN in every float, -1 in every signed int, True in bool: whatever a previous user left
        return mem

    return alloc


def _setitem(x: Tensor, value: float) -> Tensor:
    x = x.contiguous()
    x[1:3] = value  # writes part of a buffer that already holds values: the rest must survive
    return x


def _np_setitem(x: np.ndarray, value: float) -> np.ndarray:
    x = x.copy()
    x[1:3] = value
    return x


def _grad_of_square(x: Tensor) -> Tensor:
    x.requires_grad = True
    (x * x).sum().backward()
    return x.grad


OPS = [
    ("add", lambda x, y: x + y, lambda x, y: x + y),
    ("relu_fma", lambda x, y: (x * y + 1).relu(), lambda x, y: np.maximum(x * y + 1, 0)),
    ("sum_axis0", lambda x, y: x.sum(0), lambda x, y: x.sum(0)),
    ("sum_all", lambda x, y: (x * y).sum(), lambda x, y: (x * y).sum()),
    ("max_axis1", lambda x, y: x.max(1), lambda x, y: x.max(1)),
    ("mean_keepdim", lambda x, y: x.mean(1, keepdim=True), lambda x, y: x.mean(1, keepdims=True)),
    ("matmul", lambda x, y: x @ y.T, lambda x, y: x @ y.T),
    ("cumsum", lambda x, y: x.cumsum(1), lambda x, y: x.cumsum(1)),
    ("argmax", lambda x, y: x.argmax(1), lambda x, y: x.argmax(1)),
    ("where", lambda x, y: (x > 0).where(x, y), lambda x, y: np.where(x > 0, x, y)),
    ("pad", lambda x, y: x.pad(((1, 2), (0, 3))), lambda x, y: np.pad(x, ((1, 2), (0, 3)))),
    ("cat", lambda x, y: x.cat(y, dim=1), lambda x, y: np.concatenate([x, y], 1)),
    ("gather", lambda x, y: x[[2, 0, 5]], lambda x, y: x[[2, 0, 5]]),
    ("compare_bool", lambda x, y: x < y, lambda x, y: x < y),
    ("int_cast", lambda x, y: (x * 10).cast(dtypes.int32) + 3, lambda x, y: (x * 10).astype(np.int32) + 3),
    ("softmax", lambda x, y: x.softmax(1), lambda x, y: np.exp(x) / np.exp(x).sum(1, keepdims=True)),
    ("contiguous_T", lambda x, y: x.T.contiguous(), lambda x, y: np.ascontiguousarray(x.T)),
    ("zeros", lambda x, y: Tensor.zeros(*x.shape) + 0, lambda x, y: np.zeros_like(x)),
    ("setitem", lambda x, y: _setitem(x, 5.0), lambda x, y: _np_setitem(x, 5.0)),
    ("grad", lambda x, y: _grad_of_square(x), lambda x, y: 2 * x),
]


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("name,fg_op,np_op", OPS, ids=[o[0] for o in OPS])
def test_values_correct_whatever_the_memory_held(monkeypatch, device, name, fg_op, np_op):
    # every block handed out, fresh or reused, starts as garbage: no kernel, copy or loader may rely on zeroed memory
    monkeypatch.setattr(HostAllocator, "alloc", _poisoned_alloc(HostAllocator.alloc))
    rng = np.random.default_rng(len(name))
    xn, yn = rng.standard_normal((6, 37), dtype=np.float32), rng.standard_normal((6, 37), dtype=np.float32)
    for _ in range(2):  # the second round runs on blocks the first one freed
        with Context(DEV=device):
            result = fg_op(Tensor(xn), Tensor(yn))
            assert result.device == device
            got = result.numpy()
        np.testing.assert_allclose(got, np_op(xn, yn), rtol=1e-5, atol=1e-5)


def test_values_correct_when_blocks_are_reused(monkeypatch):
    rng = np.random.default_rng(1)
    xn, yn = rng.standard_normal((6, 37), dtype=np.float32), rng.standard_normal((6, 37), dtype=np.float32)
    taken = []
    real_take = cache.take_addressed  # what take() and a buffer's allocation both ask

    def counting_take(nbytes, limit):
        block = real_take(nbytes, limit)
        taken.append(block is not None)
        return block

    monkeypatch.setattr(cache, "take_addressed", counting_take)
    for _ in range(3):
        for _, fg_op, np_op in OPS:
            got = fg_op(Tensor(xn), Tensor(yn)).numpy()
            np.testing.assert_allclose(got, np_op(xn, yn), rtol=1e-5, atol=1e-5)
    assert sum(taken) > len(OPS)


def test_buffer_in_a_reference_cycle_gives_its_memory_back_when_collected():
    from fusegrad.runtime.device import Buffer

    before, cached = GlobalCounters.mem_used, cache.sizes().get(4004, 0)
    buf = Buffer("CPU", 1001, dtypes.float32).ensure_allocated()
    buf.myself = buf  # only the cycle collector can free it
    assert GlobalCounters.mem_used == before + 4004
    del buf
    gc.collect()
    assert GlobalCounters.mem_used == before
    assert cache.sizes().get(4004, 0) == cached + 1  # back in the allocator's cache for the next buffer of its size


def test_mem_used_counts_live_buffers_only():
    a = Tensor(np.ones(10000, np.float32)).realize()
    a.numpy()  # a numpy-made buffer is allocated on first use
    before = GlobalCounters.mem_used
    x = (a * 2).realize()
    assert GlobalCounters.mem_used == before + 40000
    for k in range(5):
        x = (x + k).realize()  # each step frees the previous one
    assert GlobalCounters.mem_used == before + 40000
    del x
    assert GlobalCounters.mem_used == before
    assert cache.nbytes >= 40000


def _give_back(sizes):
    allocator = HostAllocator()
    blocks = [allocator.alloc(n) for n in sizes]
    while blocks:
        allocator.free(blocks.pop(0))


def test_lru_bound_evicts_least_recently_freed():
    kib = 1024
    with Context(LRU_CACHE_MB=1):
        _give_back([400 * kib, 401 * kib, 402 * kib])
        assert cache.sizes() == {401 * kib: 1, 402 * kib: 1}
        assert cache.nbytes <= 1 << 20
        _give_back([2 << 20])  # larger than the whole bound: never kept
        assert cache.sizes() == {401 * kib: 1, 402 * kib: 1}
    with Context(LRU_CACHE_MB=0):
        a = Tensor(np.ones(1000, np.float32)).realize()
        del a
        _give_back([4096])
        HostAllocator().alloc(1)  # a lowered bound applies at the next allocation
        assert cache.sizes() == {} and cache.nbytes == 0


def test_bad_lru_cache_mb_is_refused_by_name():
    with Context(LRU_CACHE_MB=-5), pytest.raises(ValueError, match="LRU_CACHE_MB=-5"):
        (Tensor(np.ones(8, np.float32)) + 1).realize()


def test_failed_allocation_flushes_cache_and_retries(monkeypatch):
    _give_back([1 << 20, 3 << 20])
    assert cache.nbytes == 4 << 20
    real_fresh = HostAllocator._fresh
    failures = []

    def fail_once(nbytes):
        if not failures:
            failures.append(nbytes)
            raise MemoryError("simulated")
        return real_fresh(nbytes)

    monkeypatch.setattr(HostAllocator, "_fresh", staticmethod(fail_once))
    t = (Tensor.arange(5000, dtype=dtypes.float32) * 2).realize()
    assert failures == [20000]
    assert cache.nbytes == 0
    np.testing.assert_array_equal(t.numpy(), np.arange(5000, dtype=np.float32) * 2)


def test_allocation_failing_after_flush_names_the_size(monkeypatch):
    def always_fail(nbytes):
        raise MemoryError("simulated")

    monkeypatch.setattr(HostAllocator, "_fresh", staticmethod(always_fail))
    before = GlobalCounters.mem_used
    with pytest.raises(MemoryError, match="cannot allocate 28000 bytes"):
        (Tensor.arange(7000, dtype=dtypes.float32) + 1).realize()
    assert GlobalCounters.mem_used == before


def test_view_that_outlives_its_buffer_keeps_its_memory():
    a = Tensor(np.arange(3000, dtype=np.float32)).realize()
    x = (a * 2).realize()
    kept = buffer(x).host_view()  # a numpy view of the buffer itself, no copy
    del x
    y = (a * 5).realize()
    assert buffer(y).address() != kept.ctypes.data
    np.testing.assert_array_equal(kept, np.arange(3000, dtype=np.float32) * 2)
    np.testing.assert_array_equal(y.numpy(), np.arange(3000, dtype=np.float32) * 5)


def test_external_and_const_buffers_are_never_cached():
    host = np.arange(64, dtype=np.float32)
    t = Tensor.from_blob(host.ctypes.data, (64,), dtype=dtypes.float32)
    doubled = (t * 2).realize()  # kept alive: the only 256-byte buffer that dies below is the external one
    lifted = (doubled * 3.25).realize()  # 3.25 lives in a one-element const buffer
    del t
    gc.collect()
    assert cache.sizes() == {}
    np.testing.assert_array_equal(lifted.numpy(), host * 2 * 3.25)
    host[:] = 7  # the caller's memory is still the caller's
    assert (host == 7).all()


def test_disk_buffers_are_never_cached(tmp_path):
    path = tmp_path / "data.bin"
    np.arange(256, dtype=np.float32).tofile(path)
    t = Tensor(path, dtype=dtypes.float32)
    np.testing.assert_array_equal(t.numpy(), np.arange(256, dtype=np.float32))
    sizes_before = cache.sizes()
    del t
    gc.collect()
    assert cache.sizes() == sizes_before


def test_give_back_while_the_lock_is_held_is_filed_on_release():
    allocator = HostAllocator()
    mem = allocator.alloc(12345)
    with cache._held():  # a gc finalizer running inside a cache operation of this very thread
        allocator.free(mem)
        assert cache.nbytes == 0
    del mem
    assert cache.sizes() == {12345: 1}


def test_concurrent_frees_keep_the_cache_consistent():
    def churn(seed):
        rng = np.random.default_rng(seed)
        allocator = HostAllocator()
        for _ in range(300):
            blocks = [allocator.alloc(int(n)) for n in rng.integers(1, 64, 4) * 1024]
            for block in blocks:
                block[:] = seed
            while blocks:
                allocator.free(blocks.pop())

    threads = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    sizes = cache.sizes()
    assert sum(size * count for size, count in sizes.items()) == cache.nbytes > 0


def test_default_bound_is_an_eighth_of_physical_memory():
    with Context(LRU_CACHE_MB=-1):
        assert host_cache_limit() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8
    with Context(LRU_CACHE_MB=3):
        assert host_cache_limit() == 3 << 20
