"""The AMD device: buffers in VRAM through the GPU VM, uploads through SDMA, kernels on the compute queue.

Kernels are LLVM IR for amdgcn-amd-amdhsa (renderer/llvmir_amdgpu.py), compiled to a code object for AMD_ARCH (gfx950
by default) by llvmlite's LLVM in-process, or by the installed LLVM's tools with AMD_LLVM=external.
`AMD_SIM=1` runs everything on the simulated MI350X VF, whose command processor executes each dispatch's machine
code in the CDNA3 wave emulator over simulated VRAM; `AMD_SIM_TWIN=1` also runs the kernel's PYTHON-device twin after
it and compares every buffer. The AMD parts sit behind a small interface (`AmdAllocator`,
`AmdProgram`, `AmdDevice`) shaped like the other devices', so a later device-interface rewrite maps onto it.
"""

from __future__ import annotations

import atexit
import collections
import struct
import threading
import warnings
from typing import Any

import numpy as np

from fusegrad.dtype import dtypes, to_numpy_dtype
from fusegrad.helpers import AMD_ARCH, AMD_LLVM, AMD_MFMA, AMD_PCI, AMD_SIM, AMD_SIM_TWIN, DEBUG
from fusegrad.runtime.device import Buffer
from fusegrad.runtime.ops_python import PythonProgram
from fusegrad.runtime.support.amd import pm4
from fusegrad.runtime.support.amd.errors import AMDError, GPUFault
from fusegrad.runtime.support.amd.codeobj import compile_ir, load_image, parse_code_object, pick_target
from fusegrad.runtime.support.amd.gpu import AMDGPU
from fusegrad.runtime.support.amd.ipregs import sh_register
from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer
from fusegrad.runtime.support.amd.memory import MiB
from fusegrad.runtime.support.amd.simgpu import SimDispatch, SimFault

SIM_VRAM_MIB = 4096  # enough for tests; the simulated VRAM is a sparse mapping either way
SIM_WAIT_S = 600.0
CODE_ALIGN = 256  # COMPUTE_PGM_LO holds the code address >> 8
LDS_GRANULE = 512  # bytes per unit of COMPUTE_PGM_RSRC2.LDS_SIZE on gfx9


def open_pci():
    """The PCI function DEV=AMD uses: the simulator (AMD_SIM=1), AMD_PCI, or the first AMD GPU function."""
    from fusegrad.runtime.support.amd import SysfsPCIDevice, list_functions, open_sim, read_function
    from fusegrad.runtime.support.amd.cli import check_access

    if AMD_SIM.value:
        return open_sim(vram_mib=SIM_VRAM_MIB)
    address = AMD_PCI.value or next((f.address for f in list_functions()), None)
    if not address:
        raise RuntimeError("DEV=AMD found no AMD GPU function in sysfs; set AMD_PCI=0000:83:00.0 or AMD_SIM=1")
    check_access(read_function(address), force=False, vfio=False)  # refuses a bound function or a non-root caller
    return SysfsPCIDevice(address)


class AmdAllocator:
    """VRAM blocks mapped into the GPU VM; the host sees each through BAR0 as a numpy array."""

    def __init__(self, gpu: AMDGPU, lock: threading.RLock):
        self.gpu, self.lock = gpu, lock
        self.blocks: dict[int, tuple[int, int]] = {}  # host address of the view -> (paddr, va)
        self.shadows: dict[tuple[int, int], np.ndarray] = {}  # (host address, size) of outside memory -> our block
        self.pending: collections.deque[int] = collections.deque()  # freed blocks not yet unmapped

    def alloc(self, nbytes: int) -> np.ndarray:
        with self.lock:
            self.reclaim()
            paddr, va = self.gpu.alloc_mapped(max(nbytes, 1))
            mem = np.frombuffer(self.gpu.bar, np.uint8, max(nbytes, 1), paddr)
            self.blocks[mem.ctypes.data] = (paddr, va)
            return mem

    def va(self, mem: np.ndarray) -> int:
        """The GPU address of a block of ours; host memory given to a buffer (scheduler constants, from_blob) is
        uploaded to a shadow block first, on every call, since its owner may change it."""
        if (block := self.blocks.get(mem.ctypes.data)) is not None:
            return block[1]
        shadow = self.shadows.get((mem.ctypes.data, mem.nbytes))
        if shadow is None:
            shadow = self.shadows[mem.ctypes.data, mem.nbytes] = self.alloc(mem.nbytes)
        self.copyin(shadow, mem)
        return self.blocks[shadow.ctypes.data][1]

    def free(self, mem: np.ndarray) -> None:
        # called by finalizers, possibly in the middle of a submission on this thread: only queue the block here
        self.pending.append(mem.ctypes.data)

    def reclaim(self) -> None:
        """Unmap the blocks freed since the last call, invalidate the TLBs once, then give their VRAM back."""
        freed = []
        while self.pending:
            if (block := self.blocks.pop(self.pending.popleft(), None)) is not None:
                freed.append(block)
        if not freed or self.gpu.dev.closed:
            return
        for _, va in freed:
            self.gpu.vm.unmap(va)
        self.gpu.flush_tlb()
        for paddr, _ in freed:
            self.gpu.dev.memory.free(paddr)

    def copyin(self, mem: np.ndarray, data: np.ndarray) -> None:
        """Host -> VRAM through SDMA from a host staging buffer (sim), else through the BAR."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        with self.lock:
            stage = self.gpu.staging(raw.nbytes)
            if stage is None:
                mem[: raw.nbytes] = raw
                return
            view, va = stage
            view[: raw.nbytes] = raw.tobytes()
            self.gpu.run_sdma([pm4.sdma_copy(self.va(mem), va, raw.nbytes)])


MFMA_RTOL = {dtypes.float32: 1e-4, dtypes.float16: 4e-3, dtypes.bfloat16: 3e-2}


def _as_float(a: np.ndarray, dt) -> np.ndarray:
    """A buffer's values as float32 (bfloat16 is stored as its uint16 bits)."""
    if dt is dtypes.bfloat16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


class _TwinBuffer:
    """What a PYTHON program reads: a buffer's memory, found by the GPU's own path (kernarg pointer -> page tables)."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def host_view(self) -> np.ndarray:
        return self.array


class AmdProgram:
    def __init__(self, device: AmdDevice, info: Any):
        self.device, self.info = device, info
        self.params = sorted((u for u in info.lin if u.op.name == "DEFINE_GLOBAL"), key=lambda u: u.arg[0])
        self.dims = device.renderer.launch_dims(info.lin)  # the grid the renderer mapped the loops onto
        self.mfma = device.renderer.matmul(info.lin)  # on the matrix cores (the twin check allows for the sum order)
        self.ir = ir = device.renderer.render(info.name, info.lin, info.packs)  # kept: the decoder tests rebuild it
        if DEBUG >= 4:
            print(ir)
        self.elf = compile_ir(ir, device.arch, AMD_LLVM.value)
        self.kd = parse_code_object(self.elf, info.name)
        if self.kd.private_segment:
            raise RuntimeError(
                f"kernel {info.name} needs {self.kd.private_segment} bytes of scratch per work-item; DEV=AMD sets up "
                "no scratch (COMPUTE_TMPRING_SIZE 0) yet"
            )
        image = load_image(self.elf)
        gpu = device.gpu
        with device.lock:
            self.image_paddr, self.image_va = gpu.alloc_mapped(len(image), executable=True)
            gpu.bar[self.image_paddr : self.image_paddr + len(image)] = image
            self.kernarg_paddr, self.kernarg_va = gpu.alloc_mapped(max(8 * len(self.params), 8))
        self.code_va = self.image_va + self.kd.entry_offset
        if self.code_va % CODE_ALIGN:
            raise RuntimeError(f"kernel {info.name}: code entry {self.code_va:#x} is not {CODE_ALIGN}-byte aligned")
        if (register := getattr(device.pci, "register_kernel", None)) is not None:
            entry = image[self.kd.entry_offset : self.kd.entry_offset + 256]
            check = None
            if AMD_SIM_TWIN.value:
                twin = PythonProgram(info.lin, info.outer_size)
                check = lambda d, emulate: self._check_twin(twin, d, emulate)  # noqa: E731
            register(self.code_va, entry, check, self.kd.kernarg_user_sgpr, name=info.name, compare=True)

    def _twin_buffers(self, d: SimDispatch) -> list[np.ndarray]:
        pointers = d.kernarg_pointers(len(self.params))
        bufs = []
        for u, va in zip(self.params, pointers):
            dt = np.dtype(to_numpy_dtype(u.dtype))
            n = u.arg[1]
            bufs.append(np.frombuffer(d.view(va, max(n * dt.itemsize, 1)), dt, n))
        return bufs

    def _check_twin(self, twin: PythonProgram, d: SimDispatch, emulate) -> None:
        """Run the emulator, then the twin on the same inputs; every buffer must agree (NaNs where NaNs are)."""
        bufs = self._twin_buffers(d)
        before = [b.copy() for b in bufs]
        emulate()
        emulated = [b.copy() for b in bufs]
        for b, old in zip(bufs, before):
            b[:] = old
        twin([_TwinBuffer(b) for b in bufs])  # type: ignore[arg-type]
        for i, (b, got) in enumerate(zip(bufs, emulated)):
            exact = b.dtype.kind not in "fc"
            rtol, atol = 1e-5, 1e-6
            if self.mfma is not None and i == 0:  # sums in another order (exact products): within the dtype's
                exact, rtol = False, MFMA_RTOL[self.mfma.out]  # rounding, relative to the output's magnitude
                got, b = _as_float(got, self.mfma.out), _as_float(b, self.mfma.out)
                atol = rtol * float(np.nanmax(np.abs(b), initial=0.0))
            same = np.array_equal(b, got) if exact else np.allclose(got, b, rtol=rtol, atol=atol, equal_nan=True)
            if not same:
                close = np.isclose(got, b, rtol=rtol, atol=atol, equal_nan=True)
                bad = int(np.flatnonzero(~close if not exact else got != b)[0])
                msg = (
                    f"kernel {self.info.name}: the emulator and the PYTHON twin disagree on buffer {i} at element "
                    f"{bad}: {got[bad]!r} vs {b[bad]!r}"
                )
                bufs[i][:] = emulated[i]  # the device keeps what the machine code computed
                d.gpu.dispatch_errors.append(msg)
                raise SimFault(msg)
            bufs[i][:] = emulated[i]

    def __call__(self, buffers: list[Buffer]) -> None:
        if len(buffers) != len(self.params):
            raise RuntimeError(f"kernel {self.info.name} takes {len(self.params)} buffers, got {len(buffers)}")
        dev, gpu = self.device, self.device.gpu
        with dev.lock:
            dev.allocator.reclaim()
            vas = [dev.allocator.va(b.ensure_allocated()._mem) for b in buffers]  # type: ignore[arg-type]
            struct.pack_into(f"<{len(vas)}Q", gpu.bar, self.kernarg_paddr, *vas)
            kd, sh = self.kd, lambda name: sh_register(name).dword  # noqa: E731
            user = sh("COMPUTE_USER_DATA_0") + kd.kernarg_user_sgpr
            # the CP, not the descriptor, sizes a workgroup's LDS: RSRC2.LDS_SIZE in 512-byte granules (gfx9)
            rsrc2 = kd.rsrc2 & ~(0x1FF << 15) | -(-kd.group_segment // LDS_GRANULE) << 15
            self._launch(
                [
                    pm4.acquire_mem(),
                    pm4.set_sh_reg(sh("COMPUTE_PGM_LO"), self.code_va >> 8, self.code_va >> 40),
                    pm4.set_sh_reg(sh("COMPUTE_PGM_RSRC1"), kd.rsrc1, rsrc2),
                    pm4.set_sh_reg(sh("COMPUTE_TMPRING_SIZE"), 0),
                    pm4.set_sh_reg(user, self.kernarg_va, self.kernarg_va >> 32),
                    pm4.set_sh_reg(sh("COMPUTE_START_X"), 0, 0, 0, *self.dims.local_size),  # START_*, NUM_THREAD_*
                    # workgroups per dimension; COMPUTE_SHADER_EN | FORCE_START_AT_000
                    pm4.dispatch_direct(*self.dims.groups, 1 | 1 << 2),
                ]
            )

    def _launch(self, packets: list[list[int]]) -> None:
        """Run the packets; a fault names this kernel (and the simulator's diagnosis), and the queue is reset so
        the next kernel runs."""
        gpu = self.device.gpu
        try:
            gpu.run_compute(packets)
        except GPUFault as e:
            sim = getattr(self.device.pci, "sim", None)
            detail = (
                f"; the simulator reports: {sim.gpu.dispatch_errors[-1]}" if sim and sim.gpu.dispatch_errors else ""
            )
            if sim:
                sim.gpu.dispatch_errors.clear()
            gpu.reset_compute_queue()
            raise GPUFault(f"kernel {self.info.name}: {e}{detail}") from e


class AmdDevice:
    def __init__(self, name: str):
        self.device = name
        self.pci = open_pci()
        # the simulator emulates every instruction: a long kernel may take minutes where the GPU takes microseconds
        self.gpu = AMDGPU(self.pci, wait_s=SIM_WAIT_S if AMD_SIM.value else 10.0)
        self.lock = threading.RLock()
        self.arch = pick_target(AMD_ARCH.value, AMD_LLVM.value)
        self.allocator = AmdAllocator(self.gpu, self.lock)
        caps = AMDGPURenderer.capabilities.replace(matrix_cores=bool(AMD_MFMA.value))
        self.renderer, self.compiler = AMDGPURenderer(caps, self.arch), None
        self.built: list[AmdProgram] = []  # every program compiled, in order (the decoder tests read their code)
        atexit.register(self.close)  # teardown takes a short access window; the PF should not have to time it out

    def close(self) -> None:
        with self.lock:
            try:
                self.gpu.close()
            except AMDError as e:  # at exit there is no one to raise to; the PF's timer reclaims what is left
                warnings.warn(f"DEV=AMD teardown failed: {type(e).__name__}: {e}", stacklevel=1)
            finally:
                self.pci.close()

    def build(self, info: Any) -> AmdProgram:
        prog = AmdProgram(self, info)
        self.built.append(prog)
        return prog

    def synchronize(self) -> None:
        pass  # every submission waits for its signal


__all__ = ["AmdDevice", "AmdAllocator", "AmdProgram", "MiB"]
