"""The pack_weight_panels pass (schedule/panels.py): which matmuls read their weight in panels, and that the values
do not change."""

import numpy as np
import pytest

import fusegrad.schedule.panels as panels_pass
from fusegrad.engine.realize import panel_columns
from fusegrad.schedule import panel_target
from fusegrad.tensor import Tensor
from fusegrad.uop.ops import Ops


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(panels_pass, "PANEL_MIN_ROWS", 1)
    monkeypatch.setattr(panels_pass, "PANEL_MIN_MACS", 1)
    return panel_columns("CPU")


def kernels(*roots: Tensor) -> list:
    return [i.ast for i in Tensor.schedule_linear(*roots) if i.ast.op is Ops.SINK]


def copies(asts: list) -> int:
    """Kernels that store a weight in panels: its (k, n/panel, panel) view permuted to (n/panel, k, panel)."""
    return sum(1 for a in asts if (v := a.src[0].src[1]).op is Ops.PERMUTE and v.arg == (1, 0, 2))


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_the_target_decides(any_size):
    assert panel_target(["CPU"]).columns(4) == any_size
    assert panel_target(["CPU"]).columns(8) == any_size // 2
    assert panel_target(["PYTHON"]) is None  # its renderer has no register tiles
    assert panel_target(["CPU", "PYTHON"]) is None  # one device at a time
    assert panel_target([("CPU:0", "CPU:1")]) is None


def test_a_matmul_and_its_transposed_weight_pack_once(any_size):
    x, w = rand(5, 7), rand(7, 2 * any_size, seed=1)
    out = Tensor(x).realize() @ Tensor(w).realize()
    assert copies(kernels(out)) == 1
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)
    # x @ W.T: the front end's contiguous Wᵀ is not copied again, the panels are read from W's view
    wt = Tensor(np.ascontiguousarray(w.T)).realize()
    out = Tensor(x).realize() @ wt.T
    asts = kernels(out)
    assert len(asts) == 2 and copies(asts) == 1
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)


def test_a_sum_read_twice_is_not_rewritten(any_size):
    """A matmul whose sum another node reads besides its view would otherwise be computed twice."""
    x, w = Tensor(rand(4, 3)).realize(), Tensor(rand(3, 2 * any_size, seed=1)).realize()
    summed = (x.reshape(4, 1, 3) * w.T.reshape(1, 2 * any_size, 3)).sum(-1, keepdim=True)
    out = summed.reshape(4, 2 * any_size) + summed.max()
    assert copies(kernels(out)) == 0
    want = x.numpy() @ w.numpy()
    np.testing.assert_allclose(out.numpy(), want + want.max(), rtol=1e-5, atol=1e-5)


def test_one_weight_two_matmuls_one_copy(any_size):
    w = Tensor(rand(6, 2 * any_size, seed=1)).realize()
    a, b = Tensor(rand(3, 6)).realize(), Tensor(rand(5, 6, seed=2)).realize()
    ya, yb = a @ w, b @ w
    assert copies(kernels(ya, yb)) == 1  # the packed weight is one node: one kernel writes it
    np.testing.assert_allclose(ya.numpy(), a.numpy() @ w.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(yb.numpy(), b.numpy() @ w.numpy(), rtol=1e-5, atol=1e-5)


def test_a_matmul_reading_an_earlier_packed_matmul_packs_too(any_size):
    """The second matmul's sum is rebuilt over the first's rewritten output: still read by one node, so it packs."""
    n = 2 * any_size
    x, w1, w2 = Tensor(rand(4, n)).realize(), Tensor(rand(n, n, seed=4)).realize(), Tensor(rand(n, n, seed=3)).realize()
    out = (x @ w1).relu() @ w2
    assert copies(kernels(out)) == 2
    want = np.maximum(x.numpy() @ w1.numpy(), 0) @ w2.numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_packed_matmul_kept_for_a_later_realize_is_not_computed_again(any_size):
    """The panels' sum is a new node ((..., n/panel, panel) viewed as (..., n)): the buffer it is kept in is recorded
    for the caller's matmul too, so a later realize reading the matmul reads that buffer (a model whose every layer
    realized its KV cache recomputed all earlier layers' matmuls)."""
    n = 2 * any_size
    x, w = Tensor(rand(8, n)).realize(), Tensor(rand(n, n, seed=5)).realize()
    y = x @ w
    first, second = y.relu() @ w, y.max()  # the second matmul reads y from a buffer
    assert copies(kernels(first)) == 1
    first.realize()
    asts = kernels(second)
    assert len(asts) == 1 and copies(asts) == 0  # only the max: y is read from the kept buffer
    want = x.numpy() @ w.numpy()
    np.testing.assert_allclose(first.numpy(), np.maximum(want, 0) @ w.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(second.numpy(), want.max(), rtol=1e-5)


def test_narrow_vectors_take_panels_from_smaller_matmuls():
    """8-lane tiles (AVX2) alias in L1 at smaller sizes than 16-lane ones: their matmuls take panels from 2^23
    multiply-adds, 128 x 768 x 2048 (a LLaMA chunk's gate projection) included."""
    narrow, wide = panels_pass.PanelTarget(32), panels_pass.PanelTarget(64)
    assert narrow.min_macs() <= 128 * 128 * 512 < wide.min_macs()
    assert 128 * 768 * 2048 >= narrow.min_macs() and 64 * 256 * 256 < narrow.min_macs()
