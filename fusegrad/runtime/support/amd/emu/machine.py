"""One wave64's architectural state as numpy arrays: SGPRs, VGPRs (lane-major, so a register pair is one 64-bit
view per lane), EXEC/VCC/SCC/M0, and the operand views instructions are compiled against.

The register file is reused by every wave the emulator runs (a wave's state is swapped in and out whole), so an
instruction compiled once keeps views into it. SGPR numbers follow the ISA's operand encoding: s0-s101, then
FLAT_SCRATCH (102-103), XNACK_MASK (104-105), VCC (106-107), TTMP0-15 (108-123), M0 (124), EXEC (126-127).
"""

from __future__ import annotations

import functools

import numpy as np

LANES = 64
NUM_SGPRS, NUM_VGPRS = 128, 512  # 256 architectural VGPRs + 256 AGPRs (gfx90a+ unified register file)
VCC, M0, EXEC = 106, 124, 126
LITERAL = 255
VGPR_BASE = 256
NP = {"u32": np.uint32, "i32": np.int32, "f32": np.float32, "u64": np.uint64, "i64": np.int64, "f64": np.float64}
NP |= {"u16": np.uint16, "i16": np.int16, "f16": np.float16, "b32": np.uint32, "b64": np.uint64, "b16": np.uint16}
WIDE = frozenset({"u64", "i64", "f64", "b64"})
HALF = frozenset({"u16", "i16", "f16", "b16"})
FLOATS = frozenset({"f16", "f32", "f64"})
_SHIFTS = np.arange(LANES, dtype=np.uint64)
# inline float constants (operand codes 240-248) as float32 / float64 / float16 bit patterns
_INLINE_F = {240: 0.5, 241: -0.5, 242: 1.0, 243: -1.0, 244: 2.0, 245: -2.0, 246: 4.0, 247: -4.0}
INV_2PI = {"f32": 0x3E22F983, "f64": 0x3FC45F306DC9C882, "f16": 0x3118}


class Unsupported(Exception):
    """An operand or modifier the emulator does not model (becomes an 'unimplemented' dispatch error)."""


@functools.lru_cache(maxsize=4096)
def mask_of(value: int) -> np.ndarray:
    """A 64-bit lane mask as 64 booleans (read-only: masks repeat, so they are made once)."""
    mask = ((np.uint64(value & 0xFFFFFFFFFFFFFFFF) >> _SHIFTS) & np.uint64(1)).astype(bool)
    mask.flags.writeable = False
    return mask


def bits_of(mask: np.ndarray) -> int:
    return int(np.packbits(mask, bitorder="little").view("<u8")[0])


def inline_constant(code: int, ty: str, literal: int | None) -> int:
    """The bit pattern an inline constant or literal has as an operand of type ty, or raise for other codes."""
    width = 64 if ty in WIDE else 16 if ty in HALF else 32
    if 128 <= code <= 208:
        v = code - 128 if code <= 192 else 192 - code
        return v & ((1 << width) - 1)
    if code in _INLINE_F:
        kind = {16: "f16", 32: "f32", 64: "f64"}[width]
        if ty not in FLOATS and width != 64:  # a float constant as a 32/16-bit integer operand: float32/16 bits
            kind = "f32" if width != 16 else "f16"  # (a 64-bit operand of any type gets the float64 bits)
        return int(
            np.array(_INLINE_F[code], NP[kind]).view({"f16": np.uint16, "f32": np.uint32, "f64": np.uint64}[kind])
        )
    if code == 248:
        return INV_2PI["f64" if width == 64 else "f16" if width == 16 else "f32"]
    if code == LITERAL:
        if literal is None:
            raise Unsupported("literal operand without a literal dword")
        if ty == "f64":
            return literal << 32  # a 64-bit float literal gives the high half
        if ty in ("i64",) and literal >> 31:
            return literal | 0xFFFFFFFF00000000
        return literal & ((1 << width) - 1)
    raise Unsupported(f"operand code {code}")


class Machine:
    """The register file and the per-wave scalar state."""

    def __init__(self):
        self.S = np.zeros(NUM_SGPRS + 2, np.uint32)
        self.V = np.zeros((LANES, NUM_VGPRS + 2), np.uint32)
        self.scc = 0
        self.mode = 0x3F0  # MODE register: round to nearest, denormals on (what LLVM's kernels assume)
        self.exec_mask = np.ones(LANES, bool)
        self.exec_full = True
        self.lds = np.zeros(0, np.uint8)
        self._views: dict[tuple, np.ndarray] = {}

    # -- EXEC -----------------------------------------------------------------------------------------------------
    def exec_bits(self) -> int:
        return int(self.S[EXEC]) | int(self.S[EXEC + 1]) << 32

    def exec_changed(self) -> None:
        self.exec_mask = mask_of(self.exec_bits())
        self.exec_full = bool(self.exec_mask.all())

    def sget64(self, r: int) -> int:
        return int(self.S[r]) | int(self.S[r + 1]) << 32

    def sset64(self, r: int, v: int) -> None:
        self.S[r] = v & 0xFFFFFFFF
        self.S[r + 1] = (v >> 32) & 0xFFFFFFFF

    # -- views ----------------------------------------------------------------------------------------------------
    def vview(self, reg: int, ty: str) -> np.ndarray:
        """VGPR `reg` (0-511) as a (64,) array of ty; 64-bit types span reg and reg+1, 16-bit ones its low half."""
        key = ("v", reg, ty)
        if (view := self._views.get(key)) is None:
            if ty in WIDE:
                view = self.V[:, reg : reg + 2].view(NP[ty])[:, 0]
            elif ty in HALF:
                view = self.V.view(np.uint16)[:, 2 * reg].view(NP[ty])
            else:
                view = self.V[:, reg].view(NP[ty])
            self._views[key] = view
        return view

    def vhigh16(self, reg: int, ty: str) -> np.ndarray:
        return self.V.view(np.uint16)[:, 2 * reg + 1].view(NP[ty])

    def sview(self, reg: int, ty: str) -> np.ndarray:
        """SGPR `reg` as a (1,) array of ty, broadcast against the lanes."""
        key = ("s", reg, ty)
        if (view := self._views.get(key)) is None:
            if ty in WIDE:
                view = self.S[reg : reg + 2].view(NP[ty])
            elif ty in HALF:
                view = self.S[reg : reg + 1].view(np.uint16)[:1].view(NP[ty])
            else:
                view = self.S[reg : reg + 1].view(NP[ty])
            self._views[key] = view
        return view

    def source(self, code: int, ty: str, literal: int | None = None) -> np.ndarray:
        """A VALU source operand (9-bit code) as an array of ty: a live register view or a constant."""
        if code >= VGPR_BASE:
            return self.vview(code - VGPR_BASE, ty)
        if code <= EXEC + 1 and code != 125:
            return self.sview(code, ty)
        bits = inline_constant(code, ty, literal)
        raw = {16: np.uint16, 32: np.uint32, 64: np.uint64}[64 if ty in WIDE else 16 if ty in HALF else 32]
        return np.array([bits], raw).view(NP[ty])
