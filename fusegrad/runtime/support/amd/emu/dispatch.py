"""Running one DISPATCH_DIRECT: workgroups over the grid, waves of 64 work-items in each, the initial register state
the COMPUTE_PGM_RSRC2 fields ask for (LLVM AMDGPUUsage, "Initial Kernel Execution State"), and barriers.

SGPRs start with the USER_SGPR count of COMPUTE_USER_DATA_* words, then the workgroup ids X/Y/Z that TGID_*_EN
enable. v0 holds the work-item ids packed as X | Y << 10 | Z << 20 (gfx90a and later). EXEC has one bit per
work-item the wave holds. The waves of a workgroup share its LDS and run in turn up to each s_barrier.
"""

from __future__ import annotations

import numpy as np

from .machine import EXEC, LANES, Machine
from .program import BARRIER, Program

MAX_STEPS = 200_000_000  # instructions per wave before the dispatch is called hung


class DispatchError(Exception):
    """A dispatch stopped: the message names the kernel, the offset and the reason."""


def rsrc2_fields(rsrc2: int) -> dict[str, int]:
    return {
        "scratch": rsrc2 & 1,
        "user_sgprs": rsrc2 >> 1 & 0x1F,
        "tgid": rsrc2 >> 7 & 7,
        "tg_size": rsrc2 >> 10 & 1,
        "tidig": rsrc2 >> 11 & 3,
        "lds_blocks": rsrc2 >> 15 & 0x1FF,
    }


class WaveState:
    def __init__(self, m: Machine):
        self.S = m.S.copy()
        self.V = m.V.copy()
        self.scc, self.pc = m.scc, 0

    def load(self, m: Machine) -> None:
        m.S[:] = self.S
        m.V[:] = self.V
        m.scc = self.scc
        m.exec_changed()

    def save(self, m: Machine, pc: int) -> None:
        self.S[:] = m.S
        self.V[:] = m.V
        self.scc, self.pc = m.scc, pc


def run_dispatch(m: Machine, program: Program, rsrc2: int, user_data: list[int], groups, block) -> tuple[int, int]:
    """Run every workgroup; the number of instructions executed (all waves) and of waves run."""
    fields = rsrc2_fields(rsrc2)
    if fields["scratch"]:
        raise DispatchError("the kernel needs scratch memory (COMPUTE_PGM_RSRC2.SCRATCH_EN), which is not set up")
    if fields["tg_size"]:
        raise DispatchError("the kernel asks for the TG_SIZE SGPR, which the emulator does not provide")
    threads = block[0] * block[1] * block[2]
    if threads == 0 or threads > 1024:
        raise DispatchError(f"workgroup size {block} is outside 1..1024 work-items")
    tid = np.arange(threads)
    packed = (tid % block[0]) | ((tid // block[0]) % block[1]) << 10 | (tid // (block[0] * block[1])) << 20
    nwaves = -(-threads // LANES)
    lds_bytes = max(fields["lds_blocks"] * 512, 0)
    n_user = fields["user_sgprs"]
    user = np.array(user_data[:n_user], np.uint32)

    def start(w: int, ids: tuple[int, int, int]) -> None:
        """Wave w of the workgroup at ids, in its initial state, in the register file."""
        m.S[:] = 0
        m.V[:] = 0
        m.scc = 0
        m.S[:n_user] = user
        n = n_user
        for axis, gid in enumerate(ids):
            if fields["tgid"] >> axis & 1:
                m.S[n] = gid
                n += 1
        lanes = packed[w * LANES : (w + 1) * LANES]
        m.V[: len(lanes), 0] = lanes
        m.sset64(EXEC, (1 << len(lanes)) - 1)
        m.exec_changed()

    steps = 0
    for gz in range(groups[2]):
        for gy in range(groups[1]):
            for gx in range(groups[0]):
                m.lds = np.zeros(lds_bytes, np.uint8)
                steps += _run_group(m, program, nwaves, lambda w: start(w, (gx, gy, gz)))  # noqa: B023
    return steps, groups[0] * groups[1] * groups[2] * nwaves


def _run_group(m: Machine, program: Program, nwaves: int, start) -> int:
    """Each wave runs until it ends or reaches an s_barrier; the waves at a barrier go on once every wave still
    running is there. A wave alone (the others ended) passes its barriers without being swapped out."""
    waiting: list[WaveState] = []
    steps = 0
    for w in range(nwaves):
        start(w)
        pc, n = _run_wave(m, program, 0)
        steps += n
        if pc == BARRIER:
            if nwaves == 1:
                steps += _run_alone(m, program)
                continue
            st = WaveState(m)
            st.pc = m.resume  # type: ignore[attr-defined]
            waiting.append(st)
    while len(waiting) > 1:
        live, waiting = waiting, []
        for st in live:
            st.load(m)
            pc, n = _run_wave(m, program, st.pc)
            steps += n
            if pc == BARRIER:
                st.save(m, m.resume)  # type: ignore[attr-defined]
                waiting.append(st)
    if waiting:
        waiting[0].load(m)
        m.resume = waiting[0].pc  # type: ignore[attr-defined]
        steps += _run_alone(m, program)
    return steps


def _run_alone(m: Machine, program: Program) -> int:
    """The only running wave of its workgroup, from the barrier it stopped at to its end."""
    steps, pc = 0, BARRIER
    while pc == BARRIER:
        pc, n = _run_wave(m, program, m.resume)  # type: ignore[attr-defined]
        steps += n
    return steps


def _run_wave(m: Machine, program: Program, pc: int) -> tuple[int, int]:
    table, compile_at = program.table, program.compile
    steps = last = 0
    while pc >= 0:
        try:
            fn = table[pc]
        except KeyError:
            fn = compile_at(pc)
        last = pc
        try:
            pc = fn()
        except Exception:
            program.fault_pc = last  # where the wave stopped, for the dispatch's error message
            raise
        steps += 1
        if steps > MAX_STEPS:
            raise DispatchError(f"a wave ran {MAX_STEPS} instructions without ending (last at offset {last:#x})")
    if pc == BARRIER:
        m.resume = last + 4  # type: ignore[attr-defined]
    return pc, steps
