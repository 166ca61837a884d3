"""The eager launch of a CPU kernel split over threads: through the C runner's workers (`fg_run_one`), or the Python
pool where the runner does not build."""

import os
import threading
import numpy as np
import pytest
from fusegrad import Context, Tensor
from fusegrad.runtime import cpu_runner, ops_cpu

# 64 x 8192 elements: enough work (>= 2 * MIN_OPS_PER_THREAD) for the outer loop of 64 rows to be split
SHAPE = (64, 8192)


def recording_launcher(calls: list):
    real = ops_cpu.split_launcher()
    assert real is not None, "the C runner builds where the CPU device compiles"

    def launch(fn, nargs, args, bounds, chunks, threads):
        calls.append((nargs, [bounds[i] for i in range(chunks + 1)]))
        return real(fn, nargs, args, bounds, chunks, threads)

    return lambda: launch


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_split_kernel_values_match_numpy(monkeypatch, threads):
    calls: list = []
    monkeypatch.setattr(ops_cpu, "split_launcher", recording_launcher(calls))
    rng = np.random.default_rng(threads)
    a, b = rng.standard_normal(SHAPE).astype(np.float32), rng.standard_normal(SHAPE).astype(np.float32)
    with Context(NUM_CPU_THREADS=threads):
        got = (Tensor(a) * 2 + Tensor(b).exp()).numpy()
    np.testing.assert_allclose(got, a * 2 + np.exp(b), rtol=1e-5, atol=1e-6)
    if threads == 1:
        assert calls == []  # one chunk: a direct call, no workers
    else:
        # one chunk per thread, or several equal ones each (64 rows divide by 2 and 32, not by 3), cover the 64 rows
        # exactly once, in order
        assert len(calls) == 1
        nargs, bounds = calls[0]
        chunks = len(bounds) - 1
        pieces = range(2, ops_cpu.CPUProgram.PIECES_PER_THREAD + 1)
        assert nargs >= 3 and (chunks == threads if SHAPE[0] % threads else chunks in {threads * k for k in pieces})
        assert bounds[0] == 0 and bounds[-1] == SHAPE[0] and bounds == sorted(bounds)
        assert chunks == threads or len({b - a for a, b in zip(bounds, bounds[1:])}) == 1


def test_split_reduce_kernel_values_match_numpy(monkeypatch):
    calls: list = []
    monkeypatch.setattr(ops_cpu, "split_launcher", recording_launcher(calls))
    a = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    with Context(NUM_CPU_THREADS=3):
        got = Tensor(a).sum(axis=1).numpy()
    np.testing.assert_allclose(got, a.sum(axis=1), rtol=1e-4, atol=1e-3)
    assert calls and all(len(bounds) == 4 for _, bounds in calls)


def test_python_pool_when_the_runner_does_not_build(monkeypatch):
    monkeypatch.setattr(cpu_runner, "graph_library", lambda: None)  # as where no C compiler builds the runner
    submitted = []
    real = ops_cpu.thread_pool(2)

    class Counting:
        def submit(self, *args):
            submitted.append(args)
            return real.submit(*args)

    monkeypatch.setattr(ops_cpu, "thread_pool", lambda workers=1: Counting())
    a = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    with Context(NUM_CPU_THREADS=3):
        got = (Tensor(a) - 3).numpy()
    np.testing.assert_array_equal(got, a - 3)
    assert len(submitted) == 2  # three chunks: two on the pool, one on the launching thread


def test_kernel_with_more_arguments_than_the_runner_switches_on_uses_the_python_pool(monkeypatch):
    monkeypatch.setattr(ops_cpu, "MAX_C_SPLIT_ARGS", 2)
    used_c = []
    monkeypatch.setattr(ops_cpu, "split_launcher", lambda: used_c.append(1))
    a, b = np.ones(SHAPE, np.float32), np.full(SHAPE, 2, np.float32)
    with Context(NUM_CPU_THREADS=2):
        got = (Tensor(a) + Tensor(b)).numpy()  # output and two inputs: three buffers
    np.testing.assert_array_equal(got, a + b)
    assert used_c == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_splits_correctly():
    a = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    with Context(NUM_CPU_THREADS=2):
        np.testing.assert_array_equal((Tensor(a) + 1).numpy(), a + 1)  # the parent's workers have started
        pid = os.fork()
        if pid == 0:  # the child: no worker survives a fork; the runner starts its own
            ok = np.array_equal((Tensor(a) * 3).numpy(), a * 3)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# a kernel that records which thread ran each chunk; a chunk run by any thread but the launching one sleeps 20 ms
RECORDING_KERNEL = """
#define _GNU_SOURCE
#include <unistd.h>
#include <sys/syscall.h>
long long launcher_tid = 0;
long long current_tid(void) { return (long long)syscall(SYS_gettid); }
void record(long long *tids, long long start, long long end) {
  for (long long i = start; i < end; i++) tids[i] = current_tid();
  if (current_tid() != launcher_tid) usleep(20000);
}
"""


def run_recording_kernel(chunks: int, threads: int) -> list[int]:
    """Thread id per chunk of `chunks` one-element chunks launched through fg_run_one on `threads` threads, with the
    launching thread's own id first."""
    import ctypes
    from fusegrad.runtime.device import Device

    lib = Device["CPU"].compiler.load(RECORDING_KERNEL, "record")
    lib.current_tid.restype = ctypes.c_longlong
    me = lib.current_tid()
    ctypes.c_longlong.in_dll(lib, "launcher_tid").value = me
    tids = (ctypes.c_longlong * chunks)()
    bounds = (ctypes.c_longlong * (chunks + 1))(*range(chunks + 1))
    fn = ctypes.cast(lib.record, ctypes.c_void_p).value
    ops_cpu.split_launcher()(fn, 1, (ctypes.c_void_p * 1)(ctypes.addressof(tids)), bounds, chunks, threads)
    return [me, *tids]


def test_chunks_go_to_whichever_thread_is_free():
    me, *tids = run_recording_kernel(chunks=8, threads=2)
    # a worker's chunk takes 20 ms, the launching thread's none: it takes the chunks the worker cannot
    assert tids.count(me) >= 6 and len(set(tids)) <= 2


def test_a_launch_uses_at_most_its_thread_count():
    run_recording_kernel(chunks=4, threads=4)  # three workers exist from here on
    me, *tids = run_recording_kernel(chunks=8, threads=2)
    assert len(set(tids)) <= 2 and me in tids


def test_chunk_bounds_split_evenly_into_pieces_per_thread():
    big = ops_cpu.CPUProgram.MIN_OPS_PER_THREAD * 64

    def bounds(outer: int, ops: int, threads: int) -> list[int]:
        program = ops_cpu.CPUProgram.__new__(ops_cpu.CPUProgram)
        program.outer_size, program.ops = outer, ops
        return program.chunk_bounds(threads)

    huge = ops_cpu.CPUProgram.MIN_OPS_PER_FINE_PIECE * 32
    assert ops_cpu.CPUProgram.PIECES_PER_THREAD == 16
    assert bounds(64, huge, 2) == list(range(0, 65, 2))  # 16 pieces per thread
    assert bounds(16, huge, 2) == list(range(17))  # 16 rows: 8 pieces per thread, the most that divide them
    assert bounds(12, huge, 2) == list(range(13))  # 12 rows: 6 pieces per thread
    # beyond 4 pieces per thread each keeps MIN_OPS_PER_FINE_PIECE
    assert bounds(64, ops_cpu.CPUProgram.MIN_OPS_PER_THREAD * 16, 2) == list(range(0, 65, 8))
    assert bounds(64, ops_cpu.CPUProgram.MIN_OPS_PER_FINE_PIECE * 16, 2) == list(range(0, 65, 4))
    assert bounds(4, big, 2) == [0, 1, 2, 3, 4]
    assert bounds(7, big, 2) == [0, 3, 7]  # uneven halves stay one chunk per thread
    assert bounds(16, ops_cpu.CPUProgram.MIN_OPS_PER_THREAD * 4, 2) == [0, 4, 8, 12, 16]  # each piece keeps its minimum
    assert bounds(16, big, 1) == [0, 16]


def test_split_launches_from_two_python_threads_back_to_back():
    """Workers that spin for the next kernel and callers that spin for their helpers: many split launches in a row
    from two threads at once (eager ops, each kernel waiting its turn at the runner) still compute every element."""
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2)]
    errors: list = []

    def work(a: np.ndarray) -> None:
        try:
            x = Tensor(a).realize()
            for i in range(30):
                np.testing.assert_allclose((x * i + 1).numpy(), a * i + 1, rtol=1e-6, atol=1e-6)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(a,)) for a in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("threads", [1, 2])
def test_a_replays_packed_batch_call_splits_and_matches_numpy(threads):
    """A TinyJit replay runs each batch through the runner's one-argument entry (its tables in a struct): a copy, a
    split elementwise kernel and a reduction in one batch give numpy's values on one thread and on two."""
    from fusegrad import TinyJit
    from fusegrad.engine.jit_program import GraphStep

    with Context(NUM_CPU_THREADS=threads):
        step = TinyJit(lambda x, y: ((x * 2 + y.exp()).sum(axis=1) + x[:, :4].sum(axis=1)).realize())
        rng = np.random.default_rng(7)
        for i in range(4):
            a, b = rng.standard_normal(SHAPE).astype(np.float32), rng.standard_normal(SHAPE).astype(np.float32)
            got = step(Tensor(a), Tensor(b)).numpy()
            want = (a * 2 + np.exp(b)).sum(axis=1) + a[:, :4].sum(axis=1)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert any(type(s) is GraphStep for s in step.captured.steps)
