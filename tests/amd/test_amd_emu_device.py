"""DEV=AMD on the simulator executes the kernels' machine code: results against numpy, the PYTHON twin as an oracle
(AMD_SIM_TWIN=1), a kernel storing outside its buffer faults with the kernel and address named, the device goes on."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.helpers import Context
from fusegrad.runtime import ops_amd
from fusegrad.runtime.support.amd.errors import GPUFault


pytestmark = pytest.mark.usefixtures("simulated_amd")


def _emu():
    from fusegrad.runtime.device import Device

    return Device["AMD"].pci.sim.gpu.emu


def test_kernels_run_as_machine_code_in_the_emulator():
    before = _emu().instructions
    x = np.linspace(-3, 3, 37, dtype=np.float32)
    got = (Tensor(x, device="AMD").exp() * 2 - Tensor(x, device="AMD").sigmoid()).numpy()
    np.testing.assert_allclose(got, np.exp(x) * 2 - 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
    assert _emu().instructions - before > 20  # the kernels' instructions ran one by one
    assert _emu().last_dispatch == ((1, 1, 1), (64, 1, 1), 1)  # 37 work-items: one wave64, 27 lanes masked off


def test_the_python_twin_agrees_with_the_emulator_per_dispatch():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    with Context(AMD_SIM_TWIN=1):
        ta, tb = Tensor(a, device="AMD"), Tensor(b, device="AMD")
        out = ((ta @ tb).relu().sum(1) + (ta - 1).abs().max()).numpy()
    np.testing.assert_allclose(out, np.maximum(a @ b, 0).sum(1) + np.abs(a - 1).max(), rtol=1e-5, atol=1e-5)


class _BadKernargs:
    """struct, except that the kernarg segment's first pointer (the output buffer) lands 1 TiB past any mapping."""

    def __getattr__(self, name):
        return getattr(struct, name)

    @staticmethod
    def pack_into(fmt, buf, offset, *values):
        return struct.pack_into(fmt, buf, offset, values[0] + (1 << 40), *values[1:])


def test_a_kernel_that_stores_outside_its_buffer_faults_and_the_device_goes_on(monkeypatch):
    x = Tensor(np.arange(8, dtype=np.float32), device="AMD").realize()
    monkeypatch.setattr(ops_amd, "struct", _BadKernargs())
    with pytest.raises(GPUFault, match=r"kernel E_\w+: VM fault on the GC hub at page 0x1[0-9a-f]{7}000.*global_store"):
        (x + 5).realize()
    monkeypatch.setattr(ops_amd, "struct", struct)
    np.testing.assert_array_equal((x * 3).numpy(), np.arange(8, dtype=np.float32) * 3)
