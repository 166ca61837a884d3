"""The eager launch of a CPU kernel split over threads: through the C runner's workers (`fg_run_one`), or the Python
pool where the runner does not build."""

import os
import numpy as np
import pytest
from fusegrad import Context, Tensor
from fusegrad.runtime import cpu_graph, ops_cpu

# 64 x 8192 elements: enough work (>= 2 * MIN_OPS_PER_THREAD) for the outer loop of 64 rows to be split
SHAPE = (64, 8192)


def recording_launcher(calls: list):
    real = ops_cpu.split_launcher()
    assert real is not None, "the C runner builds where the CPU device compiles"

    def launch(fn, nargs, args, bounds, chunks):
        calls.append((nargs, [bounds[i] for i in range(chunks + 1)]))
        return real(fn, nargs, args, bounds, chunks)

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
        # NUM_CPU_THREADS chunks cover the 64 rows exactly once, in order
        assert len(calls) == 1
        nargs, bounds = calls[0]
        assert nargs >= 3 and len(bounds) == threads + 1
        assert bounds[0] == 0 and bounds[-1] == SHAPE[0] and bounds == sorted(bounds)


def test_split_reduce_kernel_values_match_numpy(monkeypatch):
    calls: list = []
    monkeypatch.setattr(ops_cpu, "split_launcher", recording_launcher(calls))
    a = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    with Context(NUM_CPU_THREADS=3):
        got = Tensor(a).sum(axis=1).numpy()
    np.testing.assert_allclose(got, a.sum(axis=1), rtol=1e-4, atol=1e-3)
    assert calls and all(len(bounds) == 4 for _, bounds in calls)


def test_python_pool_when_the_runner_does_not_build(monkeypatch):
    monkeypatch.setattr(cpu_graph, "graph_library", lambda: None)  # as where no C compiler builds the runner
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
