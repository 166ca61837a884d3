"""DEV=AMD on the simulated MI350X VF gives the CPU backend's results (kernels compiled for amdgcn, run by twins)."""

from __future__ import annotations
import numpy as np
import pytest
from fusegrad import Tensor


pytestmark = pytest.mark.usefixtures("simulated_amd")


def test_elementwise_example():
    assert ((Tensor([1.0, 2, 3], device="AMD") + 1) * 2).tolist() == [4.0, 6.0, 8.0]


def test_matmul_and_reduction_match_cpu():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    got = (Tensor(a, device="AMD") @ Tensor(b, device="AMD")).numpy()
    want = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-5)
    x = Tensor(a, device="AMD")
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.max().numpy(), a.max())


def test_half_inputs_match_cpu():
    a = np.linspace(-2, 2, 12, dtype=np.float16)
    got = (Tensor(a, device="AMD") * 3 + 1).numpy()
    np.testing.assert_array_equal(got, (Tensor(a, device="CPU") * 3 + 1).numpy())


def _mlp_step(device: str, x: np.ndarray, y: np.ndarray, w1: np.ndarray, w2: np.ndarray):
    t1, t2 = Tensor(w1, device=device, requires_grad=True), Tensor(w2, device=device, requires_grad=True)
    out = (Tensor(x, device=device) @ t1).relu() @ t2
    loss = ((out - Tensor(y, device=device)) ** 2).mean()
    loss.backward()
    new1, new2 = t1 - t1.grad * 0.1, t2 - t2.grad * 0.1
    return loss.numpy(), new1.numpy(), new2.numpy()


def test_one_mlp_training_step_matches_cpu():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    w1, w2 = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
    for got, want in zip(_mlp_step("AMD", x, y, w1, w2), _mlp_step("CPU", x, y, w1, w2)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_copies_to_the_device_go_through_sdma_and_freed_buffers_are_unmapped():
    from fusegrad.runtime.device import Device

    dev = Device["AMD"]
    trace = dev.pci.sim.gpu.trace
    before = len(trace)
    x = np.arange(1000, dtype=np.float32)
    t = Tensor(x, device="CPU").to("AMD")
    np.testing.assert_array_equal((t * 3).numpy(), x * 3)
    assert any("COPY_LINEAR" in line for line in trace[before:]), "the upload did not go through SDMA"
    unmapped: list[int] = []
    unmap = dev.gpu.vm.unmap
    dev.gpu.vm.unmap = lambda va: unmapped.append(va) or unmap(va)
    try:
        del t
        import gc

        gc.collect()
        assert len(dev.allocator.pending) >= 2  # freed by the finalizers, not yet unmapped (no submission from gc)
        (Tensor([1.0], device="AMD") + 1).realize()  # the next launch unmaps what was freed, with one TLB flush
    finally:
        del dev.gpu.vm.unmap
    assert len(unmapped) >= 2  # the launch reclaimed both (what it freed itself waits for the next one)
    assert any("WRITE_DATA GC.VM_INVALIDATE_ENG17_REQ" in line for line in trace[before:])
