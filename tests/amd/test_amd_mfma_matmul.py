"""Matmuls on the simulated GPU's matrix cores: a plain matmul with sizes that are multiples of 32 is rendered as an
LDS-tiled kernel of v_mfma_f32_32x32x* (renderer/llvmir_amdgpu_mfma.py) and the emulator runs it; results equal
numpy, for float32, float16 and bfloat16, on gfx950 and gfx942, and the capability turns it off."""

from __future__ import annotations

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.codegen.opt.matrix_tile import match_matmul
from fusegrad.helpers import AMD_LLVM
from fusegrad.runtime.support.amd.codeobj import parse_code_object, supported_targets
from fusegrad.runtime.support.amd.emu import decode_all
from fusegrad.runtime.support.amd.emu.elf import text

pytestmark = pytest.mark.usefixtures("simulated_amd")
_SUFFIX = {dtypes.float32: "f32", dtypes.float16: "f16", dtypes.bfloat16: "bf16"}
TOL = {dtypes.float32: 1e-5, dtypes.float16: 2e-3, dtypes.bfloat16: 1e-2}  # relative, of the output's dtype


@pytest.fixture
def device():
    from fusegrad.runtime.device import Device

    return Device["AMD"]


def _built(device, fn):
    before = len(device.built)
    out = fn()
    return out, device.built[before:]


def _instructions(prog) -> set[str]:
    addr, code = text(prog.elf)
    start = parse_code_object(prog.elf, prog.info.name).entry_offset - addr
    return {inst.name for _, inst in decode_all(code, start)}


def _rounded(x: np.ndarray, dt) -> np.ndarray:
    """x as the nearest values of dt (float64 for the reference)."""
    return Tensor(x).cast(dt).float().numpy().astype(np.float64)


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_matmul_on_the_matrix_cores_equals_numpy(device, monkeypatch, arch, dt):
    if arch not in supported_targets(AMD_LLVM.value):
        pytest.skip(f"the compiler in use (AMD_LLVM={AMD_LLVM.value!r}) does not know {arch}")
    monkeypatch.setattr(device, "arch", arch)
    monkeypatch.setattr(device.renderer, "arch", arch)
    rng = np.random.default_rng(7)
    m, k, n = (64, 96, 32) if arch == "gfx950" else (32, 64, 96)  # distinct shapes: each arch compiles its own
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    ta, tb = Tensor(a, device="AMD").cast(dt).realize(), Tensor(b, device="AMD").cast(dt).realize()
    out, progs = _built(device, lambda: (ta @ tb).numpy())
    (prog,) = progs
    assert "llvm.amdgcn.mfma.f32.32x32x" in prog.ir and prog.dims.local_size == (64, 1, 1)
    names = _instructions(prog)
    k = 2 if dt is dtypes.float32 else 16 if arch == "gfx950" else 8  # gfx950's 32x32x16 for 16-bit inputs
    assert f"v_mfma_f32_32x32x{k}_{_SUFFIX[dt]}" in names, sorted(names)
    # the tiles go through LDS (one wave per group: LLVM needs no s_barrier between its own LDS accesses)
    assert any(x.startswith("ds_read") for x in names) and any(x.startswith("ds_write") for x in names)
    assert prog.kd.group_segment >= 2 * 32 * 32 * dt.itemsize  # the A and B tiles in LDS
    want = _rounded(a, dt) @ _rounded(b, dt)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=TOL[dt], atol=TOL[dt] * np.abs(want).max())


def test_transposed_inputs(device):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((64, 32)).astype(np.float16), rng.standard_normal((64, 64)).astype(np.float16)
    ta, tb = Tensor(a, device="AMD").realize(), Tensor(b, device="AMD").realize()
    out, progs = _built(device, lambda: (ta.T @ tb.T).numpy())  # strides (1, 32) and (1, 64)
    assert len(progs) == 1 and "mfma" in progs[0].ir
    want = a.T.astype(np.float64) @ b.T.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


@pytest.mark.slow
def test_off_by_the_capability_and_for_sizes_off_the_tile(device, monkeypatch):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    on = device.renderer.capabilities
    monkeypatch.setattr(device.renderer, "capabilities", on.replace(matrix_cores=False))
    ta, tb = Tensor(a, device="AMD").realize(), Tensor(b * 2, device="AMD").realize()  # b * 2: not cached above
    out, progs = _built(device, lambda: (ta @ tb).numpy())
    assert progs and not any("mfma" in p.ir for p in progs)
    np.testing.assert_allclose(out, a @ (b * 2), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(device.renderer, "capabilities", on)
    c = Tensor(rng.standard_normal((33, 64)).astype(np.float32), device="AMD").realize()  # 33 rows: not a tile
    out, progs = _built(device, lambda: (c @ tb).numpy())
    assert progs and not any("mfma" in p.ir for p in progs)


def test_the_matcher_wants_a_plain_product_of_two_buffers():
    from fusegrad.codegen import lower_to_linear
    from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer
    from fusegrad.schedule import create_schedule

    def lin(t: Tensor):
        items, _, _ = create_schedule([t.uop], ["CPU"])
        return lower_to_linear(items[-1].ast, AMDGPURenderer(), opts=()).lin

    x, y = Tensor.rand(64, 32).realize(), Tensor.rand(32, 64).realize()
    mm = match_matmul(lin(x @ y))
    assert mm is not None and (mm.m, mm.n, mm.k) == (64, 64, 32) and mm.a.strides == (32, 1) and mm.b.strides == (64, 1)
    assert match_matmul(lin((x @ y).relu())) is None  # an epilogue: not plain
    assert match_matmul(lin(x.T @ x)) is None  # one buffer twice
    assert match_matmul(lin((x * 2).sum(1))) is None


# float32 in the fast run; the 16-bit dtypes emulate the same kernel shape more slowly, with the slow tests (CI)
@pytest.mark.parametrize(
    "dt",
    [
        pytest.param(dtypes.float32, marks=pytest.mark.slow),
        pytest.param(dtypes.float16, marks=pytest.mark.slow),
        pytest.param(dtypes.bfloat16, marks=pytest.mark.slow),
    ],
    ids=lambda d: d.name,
)
def test_the_python_twin_checks_a_matrix_core_kernel_within_its_dtype(device, dt):
    """AMD_SIM_TWIN=1 on an MFMA kernel: the twin sums in another order (and rounds float16 products), so C is
    compared within the output dtype's rounding relative to its magnitude, not to 1e-5."""
    from fusegrad.helpers import Context

    rng = np.random.default_rng(11)
    # a shape no other test builds: a kernel another test compiled first would not be built (and seen) here
    a, b = rng.standard_normal((32, 160)).astype(np.float32), rng.standard_normal((160, 32)).astype(np.float32)
    with Context(AMD_SIM_TWIN=1):
        ta, tb = Tensor(a, device="AMD").cast(dt).realize(), Tensor(b, device="AMD").cast(dt).realize()
        out, progs = _built(device, lambda: (ta @ tb).numpy())
    assert any(p.mfma is not None for p in progs)
    want = _rounded(a, dt) @ _rounded(b, dt)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=TOL[dt], atol=TOL[dt] * np.abs(want).max())
