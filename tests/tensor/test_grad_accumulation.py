"""backward() adds into every existing .grad, as tinygrad does, without keeping earlier steps' buffers alive."""

import gc

import numpy as np
import pytest
import torch

from fusegrad import GlobalCounters, Tensor
from fusegrad.nn import Linear
from fusegrad.runtime.buffers import Buffer


def _live_buffers() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Buffer)


def test_micro_batch_accumulation_over_four_batches_matches_torch():
    rng = np.random.default_rng(0)
    w_np, b_np = rng.standard_normal((3, 5), dtype=np.float32), rng.standard_normal(3, dtype=np.float32)
    batches = [rng.standard_normal((4, 5), dtype=np.float32) for _ in range(4)]
    layer = Linear(5, 3)
    layer.weight, layer.bias = Tensor(w_np), Tensor(b_np)  # requires_grad left None, as a tinygrad user writes it
    tw, tb = torch.tensor(w_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    for x_np in batches:
        layer(Tensor(x_np)).relu().square().sum().backward()
        ((torch.tensor(x_np) @ tw.T + tb).relu().square().sum()).backward()
    np.testing.assert_allclose(layer.weight.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.bias.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_backward_twice_adds_both_gradients():
    x = Tensor([1.0, 2.0, 3.0])
    x.sum().backward()
    x.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    y = Tensor([1.0, -2.0], requires_grad=False)  # asked for no gradient: none
    (y * 3).sum().backward()
    assert y.grad is None


@pytest.mark.slow
def test_reused_batch_grad_accumulates_and_memory_stays_flat():
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((16, 8), dtype=np.float32)
    x = Tensor(x_np)  # the batch: its .grad sums every step's gradient, which reads that step's weights
    w = Tensor(rng.standard_normal((8, 4), dtype=np.float32)).contiguous().realize()
    w_np, x_grad = w.numpy().astype(np.float64), np.zeros((16, 8))
    levels = {}
    for step in range(1, 101):
        w.grad = None
        (x @ w).relu().sum().backward()
        if step <= 4:
            x_grad += (x_np @ w_np > 0) @ w_np.T
            np.testing.assert_allclose(x.grad.numpy(), x_grad, rtol=1e-5, atol=1e-5)
            w_np -= 0.01 * x_np.T @ (x_np @ w_np > 0)
        w.assign(w - w.grad * 0.01).realize()
        if step in (10, 11, 100):
            levels[step] = (_live_buffers(), GlobalCounters.mem_used)
    assert levels[10] == levels[11] == levels[100]
