"""A CDNA3 (gfx940/gfx942, and the gfx950 code LLVM emits for the same encodings) wave64 emulator for the
simulated MI350X: it decodes the code object's machine code from GPU memory and runs each wave's 64 lanes as
numpy vector operations, with memory through the GPU VM's page tables (see docs/amd-emulator.md)."""

from .decode import DecodeError, Inst, decode, decode_all
from .emulator import Emulator, EmulatorError

__all__ = ["DecodeError", "Emulator", "EmulatorError", "Inst", "decode", "decode_all"]
