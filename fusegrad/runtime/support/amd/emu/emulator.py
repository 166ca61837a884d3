"""The emulator the simulated command processor calls for a DISPATCH_DIRECT: fetches code through the VM, keeps
compiled programs by code address (re-checked against the code pages on every dispatch), and runs the grid."""

from __future__ import annotations

import time

import numpy as np

from .decode import DecodeError
from .dispatch import DispatchError, run_dispatch
from .lds import LDSFault
from .machine import Machine
from .memory import PAGE, VMemory
from .program import Program, Unimplemented


class EmulatorError(Exception):
    """The dispatch stopped on an instruction the emulator does not implement, or another emulator limit."""


class Emulator:
    def __init__(self, walk, read, write, vram):
        self.m = Machine()
        self.read = read
        self.mem = VMemory(np.frombuffer(vram, np.uint8), walk, read, write)
        self.programs: dict[int, tuple[dict[int, bytes], Program]] = {}
        self.instructions = 0  # executed, over all dispatches (for the speed bench)
        self.waves = 0  # run, over all dispatches
        self.last_dispatch: tuple[tuple[int, int, int], tuple[int, int, int], int] | None = None  # grid, block, waves
        self.seconds = 0.0

    def _program(self, entry: int) -> Program:
        cached = self.programs.get(entry)
        if cached is not None:
            pages, prog = cached
            if all(self.read(va, PAGE) == data for va, data in pages.items()):
                return prog
        pages: dict[int, bytes] = {}

        def fetch(offset: int, n: int) -> bytes:
            va = entry + offset
            out = b""
            page = va & ~(PAGE - 1)
            while len(out) < n:
                if page not in pages:
                    if out:  # the next page holds no code: stop at what the first one gives
                        try:
                            pages[page] = self.read(page, PAGE)
                        except Exception:
                            break
                    else:
                        pages[page] = self.read(page, PAGE)
                data = pages[page]
                start = va - page if not out else 0
                out += data[start:]
                page += PAGE
            return out[:n]

        prog = Program(self.m, fetch, self.mem, self.read)
        self.programs[entry] = (pages, prog)
        return prog

    def where(self, entry: int) -> str:
        cached = self.programs.get(entry)
        return cached[1].where() if cached else "before the first instruction"

    def run(self, entry: int, name: str, rsrc2: int, user_data: list[int], groups, block) -> None:
        prog = self._program(entry)
        prog.fault_pc = None
        start = time.perf_counter()
        try:
            prog.inst_at(0)  # the first instruction fetch: unmapped code faults here, before any wave starts
            with np.errstate(all="ignore"):
                steps, waves = run_dispatch(self.m, prog, rsrc2, user_data, groups, block)
        except (Unimplemented, DecodeError, DispatchError, LDSFault) as e:
            raise EmulatorError(f"kernel {name or 'at ' + hex(entry)}: {e}") from e
        self.seconds += time.perf_counter() - start
        self.instructions += steps
        self.waves += waves
        self.last_dispatch = (tuple(groups), tuple(block), waves)
