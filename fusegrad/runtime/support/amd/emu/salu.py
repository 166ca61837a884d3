"""Scalar ALU semantics (SOP1/SOP2/SOPC/SOPK) on Python ints: name -> function(a, b, scc) -> (result, scc).

`None` for the SCC part leaves SCC as it was; 64-bit opcodes (`_b64`, `_i64`, `_u64`) get and give 64-bit values.
"""

from __future__ import annotations

M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


def s32(v: int) -> int:
    v &= M32
    return v - (1 << 32) if v >> 31 else v


def s64(v: int) -> int:
    v &= M64
    return v - (1 << 64) if v >> 63 else v


def _nz(v: int) -> int:
    return int(v != 0)


def _add_i32(a, b, _):
    r = s32(a) + s32(b)
    return r & M32, int(r != s32(r))


def _sub_i32(a, b, _):
    r = s32(a) - s32(b)
    return r & M32, int(r != s32(r))


def _bfe(a, b, signed, bits):
    off, width = b & (bits - 1), (b >> 16) & 0x7F
    v = (a >> off) & ((1 << width) - 1)
    if signed and width and v >> (width - 1) & 1:
        v -= 1 << width
    mask = M32 if bits == 32 else M64
    return v & mask, _nz(v & mask)


def _flbit_i32(a, b, _):
    v = s32(a)
    if v in (0, -1):
        return M32, None
    x = a if v >= 0 else ~a & M32
    return 32 - x.bit_length(), None


def _ff1(a, b, _):
    return ((a & -a).bit_length() - 1) & M32 if a else M32, None


def _brev(a, b, _):
    return int(f"{a & M32:032b}"[::-1], 2), None


def _logic(fn, mask):
    def op(a, b, _):
        r = fn(a, b) & mask
        return r, _nz(r)

    return op


def _cmp(fn, signed64=False):
    return lambda a, b, _: (None, int(fn(a, b)))


def _scmp(fn):
    return lambda a, b, _: (None, int(fn(s32(a), s32(b))))


SOP: dict[str, object] = {
    "s_mov_b32": lambda a, b, _: (a, None),
    "s_mov_b64": lambda a, b, _: (a, None),
    "s_movk_i32": lambda a, b, _: (s32(a << 16) >> 16 & M32, None),
    "s_cmov_b32": lambda a, b, scc: ((a if scc else None), None),
    "s_cmov_b64": lambda a, b, scc: ((a if scc else None), None),
    "s_cselect_b32": lambda a, b, scc: (a if scc else b, None),
    "s_cselect_b64": lambda a, b, scc: (a if scc else b, None),
    "s_not_b32": lambda a, b, _: (~a & M32, _nz(~a & M32)),
    "s_not_b64": lambda a, b, _: (~a & M64, _nz(~a & M64)),
    "s_brev_b32": _brev,
    "s_abs_i32": lambda a, b, _: (abs(s32(a)) & M32, _nz(abs(s32(a)) & M32)),
    "s_sext_i32_i8": lambda a, b, _: ((a & 0xFF) - ((a & 0x80) << 1) & M32, None),
    "s_sext_i32_i16": lambda a, b, _: ((a & 0xFFFF) - ((a & 0x8000) << 1) & M32, None),
    "s_flbit_i32": _flbit_i32,
    "s_flbit_i32_b32": lambda a, b, _: ((32 - a.bit_length()) if a else M32, None),
    "s_ff1_i32_b32": _ff1,
    "s_ff1_i32_b64": _ff1,
    "s_bcnt1_i32_b32": lambda a, b, _: (bin(a).count("1"), _nz(a)),
    "s_bcnt1_i32_b64": lambda a, b, _: (bin(a).count("1"), _nz(a)),
    "s_add_u32": lambda a, b, _: ((a + b) & M32, (a + b) >> 32),
    "s_sub_u32": lambda a, b, _: ((a - b) & M32, int(b > a)),
    "s_addc_u32": lambda a, b, scc: ((a + b + scc) & M32, (a + b + scc) >> 32),
    "s_subb_u32": lambda a, b, scc: ((a - b - scc) & M32, int(b + scc > a)),
    "s_add_i32": _add_i32,
    "s_sub_i32": _sub_i32,
    "s_addk_i32": lambda a, b, _: _add_i32(a, s32(b << 16) >> 16, 0),
    "s_mulk_i32": lambda a, b, _: ((s32(a) * (s32(b << 16) >> 16)) & M32, None),
    "s_mul_i32": lambda a, b, _: ((s32(a) * s32(b)) & M32, None),
    "s_mul_hi_u32": lambda a, b, _: ((a * b) >> 32, None),
    "s_mul_hi_i32": lambda a, b, _: (((s32(a) * s32(b)) >> 32) & M32, None),
    "s_min_i32": lambda a, b, _: (a if s32(a) <= s32(b) else b, int(s32(a) <= s32(b))),
    "s_min_u32": lambda a, b, _: (min(a, b), int(a <= b)),
    "s_max_i32": lambda a, b, _: (a if s32(a) >= s32(b) else b, int(s32(a) >= s32(b))),
    "s_max_u32": lambda a, b, _: (max(a, b), int(a >= b)),
    "s_absdiff_i32": lambda a, b, _: (abs(s32(a) - s32(b)) & M32, _nz(abs(s32(a) - s32(b)) & M32)),
    "s_lshl_b32": lambda a, b, _: ((a << (b & 31)) & M32, _nz((a << (b & 31)) & M32)),
    "s_lshl_b64": lambda a, b, _: ((a << (b & 63)) & M64, _nz((a << (b & 63)) & M64)),
    "s_lshr_b32": lambda a, b, _: (a >> (b & 31), _nz(a >> (b & 31))),
    "s_lshr_b64": lambda a, b, _: (a >> (b & 63), _nz(a >> (b & 63))),
    "s_ashr_i32": lambda a, b, _: ((s32(a) >> (b & 31)) & M32, _nz(s32(a) >> (b & 31))),
    "s_ashr_i64": lambda a, b, _: ((s64(a) >> (b & 63)) & M64, _nz(s64(a) >> (b & 63))),
    "s_lshl1_add_u32": lambda a, b, _: (((a << 1) + b) & M32, ((a << 1) + b) >> 32),
    "s_lshl2_add_u32": lambda a, b, _: (((a << 2) + b) & M32, ((a << 2) + b) >> 32),
    "s_lshl3_add_u32": lambda a, b, _: (((a << 3) + b) & M32, ((a << 3) + b) >> 32),
    "s_lshl4_add_u32": lambda a, b, _: (((a << 4) + b) & M32, ((a << 4) + b) >> 32),
    "s_bfm_b32": lambda a, b, _: ((((1 << (a & 31)) - 1) << (b & 31)) & M32, None),
    "s_bfe_u32": lambda a, b, _: _bfe(a, b, False, 32),
    "s_bfe_i32": lambda a, b, _: _bfe(a, b, True, 32),
    "s_bfe_u64": lambda a, b, _: _bfe(a, b, False, 64),
    "s_bfe_i64": lambda a, b, _: _bfe(a, b, True, 64),
    "s_pack_ll_b32_b16": lambda a, b, _: ((a & 0xFFFF) | (b & 0xFFFF) << 16, None),
    "s_pack_lh_b32_b16": lambda a, b, _: ((a & 0xFFFF) | (b & 0xFFFF0000), None),
    "s_pack_hh_b32_b16": lambda a, b, _: ((a >> 16) | (b & 0xFFFF0000), None),
    "s_bitcmp0_b32": lambda a, b, _: (None, int(not a >> (b & 31) & 1)),
    "s_bitcmp1_b32": lambda a, b, _: (None, a >> (b & 31) & 1),
    "s_bitcmp0_b64": lambda a, b, _: (None, int(not a >> (b & 63) & 1)),
    "s_bitcmp1_b64": lambda a, b, _: (None, a >> (b & 63) & 1),
    "s_cmp_eq_u64": _cmp(lambda a, b: a == b),
    "s_cmp_lg_u64": _cmp(lambda a, b: a != b),
}
for _w, _m in (("b32", M32), ("b64", M64)):
    SOP[f"s_and_{_w}"] = _logic(lambda a, b: a & b, _m)
    SOP[f"s_or_{_w}"] = _logic(lambda a, b: a | b, _m)
    SOP[f"s_xor_{_w}"] = _logic(lambda a, b: a ^ b, _m)
    SOP[f"s_andn2_{_w}"] = _logic(lambda a, b: a & ~b, _m)
    SOP[f"s_orn2_{_w}"] = _logic(lambda a, b: a | ~b, _m)
    SOP[f"s_nand_{_w}"] = _logic(lambda a, b: ~(a & b), _m)
    SOP[f"s_nor_{_w}"] = _logic(lambda a, b: ~(a | b), _m)
    SOP[f"s_xnor_{_w}"] = _logic(lambda a, b: ~(a ^ b), _m)
_CONDS = {
    "eq": lambda a, b: a == b,
    "lg": lambda a, b: a != b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
}
for _c, _f in _CONDS.items():
    SOP[f"s_cmp_{_c}_u32"] = _cmp(_f)
    SOP[f"s_cmp_{_c}_i32"] = _scmp(_f)
    SOP[f"s_cmpk_{_c}_u32"] = _cmp(_f)
    SOP[f"s_cmpk_{_c}_i32"] = (lambda f: lambda a, b, _: (None, int(f(s32(a), s32(b << 16) >> 16))))(_f)
# x_saveexec_b64: sdst = EXEC, EXEC = op(src, EXEC), SCC = EXEC != 0 (the compiler wires the EXEC side)
SAVEEXEC = {
    "s_and_saveexec_b64": lambda s, e: s & e,
    "s_or_saveexec_b64": lambda s, e: s | e,
    "s_xor_saveexec_b64": lambda s, e: s ^ e,
    "s_andn2_saveexec_b64": lambda s, e: s & ~e,
    "s_orn2_saveexec_b64": lambda s, e: s | ~e,
    "s_andn1_saveexec_b64": lambda s, e: ~s & e,
    "s_nand_saveexec_b64": lambda s, e: ~(s & e),
    "s_nor_saveexec_b64": lambda s, e: ~(s | e),
    "s_xnor_saveexec_b64": lambda s, e: ~(s ^ e),
}


def is_wide(name: str) -> bool:
    return name.endswith(("_b64", "_i64", "_u64")) and not name.startswith(("s_bitcmp0_b64", "s_bitcmp1_b64"))
