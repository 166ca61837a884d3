"""DEV=AMD kernels run as real GPU kernels in the emulator: the global loops on workgroups and wave64 work-items (the
dims codegen/gpu_dims.py gives the CL and CUDA devices), the work-items past a loop's end masked off, and split
reductions combined across the waves of a workgroup in LDS between s_barriers; results against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.dtype import to_numpy_dtype

SENTINEL = 0xAB


pytestmark = pytest.mark.usefixtures("simulated_amd")


def _device():
    from fusegrad.runtime.device import Device

    return Device["AMD"]


def _last_dispatch():
    return _device().pci.sim.gpu.emu.last_dispatch


def test_an_elementwise_kernel_runs_many_workgroups_of_two_waves():
    x = np.linspace(-4, 4, 1000, dtype=np.float32)
    got = (Tensor(x, device="AMD") * 2 + 1).numpy()
    np.testing.assert_allclose(got, x * 2 + 1, rtol=1e-6, atol=1e-6)
    grid, block, waves = _last_dispatch()
    assert (grid, block, waves) == ((8, 1, 1), (128, 1, 1), 16)  # 1000 work-items in 8 groups of two wave64s


def test_work_items_past_the_end_store_nothing(monkeypatch):
    """1000 outputs launch 1024 work-items: the last 24 would store into the 96 bytes after the buffer (still in its
    mapped page, so no VM fault would catch them); those bytes keep the sentinel they were filled with."""
    dev = _device()
    x = Tensor(np.arange(1000, dtype=np.float32), device="AMD").realize()
    tails: list[tuple[int, int]] = []
    alloc = dev.gpu.alloc_mapped

    def alloc_with_sentinel(nbytes, **kw):
        paddr, va = alloc(nbytes, **kw)
        end = paddr + -(-nbytes // 4096) * 4096
        dev.gpu.bar[paddr + nbytes : end] = bytes([SENTINEL]) * (end - paddr - nbytes)
        tails.append((paddr + nbytes, end))
        return paddr, va

    monkeypatch.setattr(dev.gpu, "alloc_mapped", alloc_with_sentinel)
    got = (x * 3).numpy()
    np.testing.assert_array_equal(got, np.arange(1000, dtype=np.float32) * 3)
    assert _last_dispatch()[:2] == ((8, 1, 1), (128, 1, 1))
    assert any(end - start == 96 for start, end in tails)  # the output buffer's tail
    for start, end in tails:
        assert bytes(dev.gpu.bar[start:end]) == bytes([SENTINEL]) * (end - start), "a masked work-item stored"


def test_two_global_loops_use_two_dimensions_of_the_grid():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 1)).astype(np.float32), rng.standard_normal((1, 5)).astype(np.float32)
    got = (Tensor(a, device="AMD") * Tensor(b, device="AMD") + 1).numpy()
    np.testing.assert_allclose(got, a * b + 1, rtol=1e-6, atol=1e-6)
    grid, block, waves = _last_dispatch()
    assert block[0] > 1 and block[1] > 1 and grid[1] > 1  # work-item ids x and y, workgroup ids along y
    assert waves == grid[0] * grid[1] * grid[2] * -(-block[0] * block[1] * block[2] // 64) and waves > 1


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64])
def test_a_split_reduction_combines_two_waves_in_lds(dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 1000)) * 50).astype(to_numpy_dtype(dtype))
    t = Tensor(x, device="AMD")
    np.testing.assert_array_equal(t.max(1).numpy(), x.max(1))
    prog = _device().built[-1]
    assert prog.dims.grouped is not None and prog.kd.group_segment >= 128 * x.itemsize
    assert _last_dispatch() == ((1, 4, 1), (128, 1, 1), 8)  # a group of 128 lanes (two waves) per output row
    np.testing.assert_allclose(t.sum(1).numpy(), x.sum(1), rtol=1e-6)
    np.testing.assert_allclose((t * 2).sum(1).numpy(), x.sum(1) * 2, rtol=1e-6)


@pytest.mark.slow  # the emulator runs every wave of a matmul and its gradient: CI
def test_a_matmul_and_its_gradient_on_the_grid():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((70, 33)).astype(np.float32), rng.standard_normal((33, 90)).astype(np.float32)
    ta, tb = Tensor(a, device="AMD", requires_grad=True), Tensor(b, device="AMD", requires_grad=True)
    out = ta @ tb
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    np.testing.assert_allclose(ta.grad.numpy(), np.ones((70, 90), np.float32) @ b.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ np.ones((70, 90), np.float32), rtol=1e-4, atol=1e-4)
