"""Running machine code outside the simulator: one wave over a flat memory (a numpy byte array at GPU address 0,
identity-mapped), for instruction-level tests and the speed bench."""

from __future__ import annotations

import numpy as np

from .dispatch import _run_wave, run_dispatch
from .machine import EXEC, Machine
from .memory import PAGE, VMemory
from .program import ENDPGM, Program


class FlatMemory(VMemory):
    def __init__(self, nbytes: int):
        self.data = np.zeros(nbytes, np.uint8)

        def walk(va: int):
            if not 0 <= va < nbytes:
                raise IndexError(f"address {va:#x} is outside the flat memory's {nbytes} bytes")
            return va & ~(PAGE - 1), PAGE, False

        def read(va: int, n: int) -> bytes:
            walk(va)
            walk(va + n - 1)
            return self.data[va : va + n].tobytes()

        def write(va: int, data: bytes) -> None:
            walk(va)
            walk(va + len(data) - 1)
            self.data[va : va + len(data)] = np.frombuffer(data, np.uint8)

        super().__init__(self.data, walk, read, write)


def run_wave(
    code: bytes,
    sgprs: dict[int, int] | None = None,
    vgprs: dict[int, np.ndarray] | None = None,
    exec_mask: int = (1 << 64) - 1,
    memory: FlatMemory | None = None,
    machine: Machine | None = None,
    lds_bytes: int = 0,
) -> tuple[Machine, int]:
    """Run `code` (ending in s_endpgm) as one wave; the machine afterwards and the instructions executed."""
    m = machine or Machine()
    mem = memory or FlatMemory(PAGE)
    m.S[:] = 0
    m.V[:] = 0
    m.scc = 0
    for r, v in (sgprs or {}).items():
        m.S[r] = v & 0xFFFFFFFF
    for r, v in (vgprs or {}).items():
        m.V[:, r] = (
            np.asarray(v).astype(np.int64).astype(np.uint32)
            if np.asarray(v).dtype.kind in "iub"
            else (np.asarray(v, np.float32).view(np.uint32))
        )
    m.sset64(EXEC, exec_mask)
    m.exec_changed()
    m.lds = np.zeros(lds_bytes, np.uint8)
    padded = code + b"\0" * 16

    prog = Program(m, lambda off, n: padded[off : off + n], mem, mem.read)
    with np.errstate(all="ignore"):
        pc, steps = _run_wave(m, prog, 0)
    if pc != ENDPGM:
        raise RuntimeError(f"the wave stopped at a barrier (offset {pc:#x}), which one wave alone cannot pass")
    return m, steps


def run_workgroup(code: bytes, threads: int, lds_bytes: int, memory: FlatMemory | None = None) -> tuple[Machine, int]:
    """Run `code` as one workgroup of `threads` work-items (ceil(threads / 64) waves sharing an LDS of lds_bytes, a
    multiple of 512), started as a dispatch starts them: v0 holds each lane's work-item id; no user SGPRs."""
    m = Machine()
    mem = memory or FlatMemory(PAGE)
    padded = code + b"\0" * 16
    prog = Program(m, lambda off, n: padded[off : off + n], mem, mem.read)
    rsrc2 = (lds_bytes // 512) << 15
    with np.errstate(all="ignore"):
        steps, _ = run_dispatch(m, prog, rsrc2, [], (1, 1, 1), (threads, 1, 1))
    return m, steps
