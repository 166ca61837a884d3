"""engine/realize.py: an eager schedule of several CPU kernels runs as one batch of the C graph runner, bound to each
run's own buffers."""

import gc
import weakref
import numpy as np
from fusegrad import GlobalCounters, Tensor
from fusegrad.runtime import cpu_graph
from fusegrad.runtime.buffers import base_buffer, buffer_of


def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_eager_schedule_runs_as_one_batch_on_each_runs_buffers(monkeypatch):
    batches = []
    run = cpu_graph.CPUGraph.__call__
    monkeypatch.setattr(cpu_graph.CPUGraph, "__call__", lambda self: (batches.append(self.count), run(self))[1])
    rng = np.random.default_rng(0)
    for _ in range(3):  # the first run plans and builds the batch, the others re-bind it to new buffers
        xn = rng.standard_normal((64, 40)).astype(np.float32)
        GlobalCounters.reset()
        got = Tensor(xn).softmax(-1).numpy()
        np.testing.assert_allclose(got, softmax_rows(xn), rtol=1e-5, atol=1e-7)
        assert GlobalCounters.kernel_count >= 2
    assert len(batches) == 3 and all(n >= 2 for n in batches)


def test_batch_keeps_no_buffer_of_its_first_run_alive():
    x = Tensor(np.ones((32, 16), np.float32)).softmax(-1).realize()
    first = weakref.ref(buffer_of[base_buffer(x.uop)])
    del x
    gc.collect()
    assert first() is None
    y = Tensor(np.full((32, 16), 2.0, np.float32)).softmax(-1).numpy()
    np.testing.assert_allclose(y, np.full((32, 16), 1 / 16), rtol=1e-6)
