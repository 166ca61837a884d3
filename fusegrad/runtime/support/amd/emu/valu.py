"""What each vector ALU opcode computes, on whole (64,) lane arrays: name -> (dest type, source types, function).

Semantics follow the ISA reference's per-opcode descriptions. numpy has no fused multiply-add: float32 FMA runs in
float64 (the product is exact there; the sum rounds twice, which differs from one rounding only at exact float32
midpoints), float64 FMA adds the product's exact error term (Dekker's two-product) after the sum.
"""

from __future__ import annotations

import numpy as np

F32, F64, U32, I32, U64 = np.float32, np.float64, np.uint32, np.int32, np.uint64
_SPLIT = 134217729.0  # 2^27 + 1


def fma32(a, b, c):
    return np.add(np.multiply(a, b, dtype=F64), c, dtype=F64).astype(F32)


def fma64(a, b, c):
    a, b, c = np.broadcast_arrays(np.asarray(a, F64), np.asarray(b, F64), np.asarray(c, F64))
    p = a * b
    ah = _SPLIT * a
    ah = ah - (ah - a)
    bh = _SPLIT * b
    bh = bh - (bh - b)
    al, bl = a - ah, b - bh
    err = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    s = c + p
    return np.where(np.isfinite(err) & np.isfinite(s), s + err, s)


def fma16(a, b, c):
    return (a.astype(F64) * b.astype(F64) + c.astype(F64)).astype(np.float16)


def _cvt_int(x, lo, hi, out):
    x = np.asarray(x, F64)
    return np.trunc(np.clip(np.where(np.isnan(x), 0, x), lo, hi)).astype(np.int64).astype(out)


def _fract(x, one_below):
    r = x - np.floor(x)
    return np.where(np.isinf(x), np.nan, np.minimum(r, one_below)).astype(x.dtype)


def _mul_legacy(a, b):
    return np.where((a == 0) | (b == 0), F32(0), a * b).astype(F32)


def _bfe_u(x, off, width):
    off, width = off & U32(31), width & U32(31)
    return ((x >> off) & ((U64(1) << width.astype(U64)) - U64(1)).astype(U32)).astype(U32)


def _bfe_i(x, off, width):
    off, width = (off & U32(31)).astype(np.int64), (width & U32(31)).astype(np.int64)
    v = (x.astype(np.int64) >> off) & ((np.int64(1) << width) - 1)
    sign = np.int64(1) << np.maximum(width - 1, 0)
    return np.where(width == 0, 0, (v ^ sign) - sign).astype(I32)


def _u24(x):
    return (x & U32(0xFFFFFF)).astype(np.int64)


def _i24(x):
    """The low 24 bits as a signed integer (the *_i24 multiplies)."""
    return ((x & U32(0xFFFFFF)).astype(np.int64) ^ 0x800000) - 0x800000


def _shift64(op):
    return lambda s, x: op(x, (s & U32(63)).astype(U64))


def _ldexp(x, e):
    return np.ldexp(x, np.clip(e.astype(np.int64), -2000, 2000).astype(np.int32)).astype(x.dtype)


def _frexp_mant(x):
    return np.where(np.isfinite(x), np.frexp(x)[0], x).astype(x.dtype)


def _frexp_exp(x):
    return np.where(np.isfinite(x), np.frexp(x)[1], 0).astype(I32)


def _perm(s0, s1, sel):
    both = (s0.astype(U64) << U64(32)) | s1.astype(U64)
    out = np.zeros(np.broadcast(s0, s1, sel).shape, U32)
    for i in range(4):
        b = (sel >> U32(8 * i)) & U32(0xFF)
        byte = ((both >> (np.minimum(b, 7).astype(U64) * U64(8))) & U64(0xFF)).astype(U32)
        sign_src = np.array([1, 3, 5, 7], U64)[np.clip(b.astype(np.int64) - 8, 0, 3)]
        sign = np.where((both >> (sign_src * U64(8) + U64(7))) & U64(1), U32(0xFF), U32(0)).astype(U32)
        byte = np.where(b >= 13, U32(0xFF), np.where(b == 12, U32(0), np.where(b >= 8, sign, byte)))
        out |= byte.astype(U32) << U32(8 * i)
    return out


def _med3(a, b, c):
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def _fmed3(a, b, c):
    return np.fmax(np.fmin(a, b), np.fmin(np.fmax(a, b), c))


def _ffbh_u32(x):
    n = np.full(x.shape, 0xFFFFFFFF, U32)
    nz = x != 0
    n[nz] = (31 - np.floor(np.log2(x[nz].astype(F64)))).astype(U32)
    return n


def _ffbh_i32(x):
    """Leading bits equal to the sign bit, counted from bit 31; -1 when every bit is the sign (0 and -1)."""
    x = np.atleast_1d(x).astype(U32)
    return _ffbh_u32(np.where(x >> U32(31), ~x, x).astype(U32))


def _ffbl_b32(x):
    """Trailing zeros (the lowest set bit's position); -1 when x is 0."""
    x = np.atleast_1d(x).astype(U32)
    low = (x & (~x + U32(1))).astype(U32)
    return np.where(x == 0, U32(0xFFFFFFFF), (31 - _ffbh_u32(low)).astype(U32)).astype(U32)


def _bfrev(x):
    x = x.astype(U32)
    out = np.zeros_like(x)
    for i in range(32):
        out |= ((x >> U32(i)) & U32(1)) << U32(31 - i)
    return out


def _dot4_i8(a, b, c):
    av, bv = a.astype(U32).view(np.int8).reshape(-1, 4), b.astype(U32).view(np.int8).reshape(-1, 4)
    prods = (av.astype(np.int64) * bv.astype(np.int64)).sum(axis=1)
    return (c.astype(np.int64) + prods).astype(I32)


def _trig(fn):
    return lambda x: fn(x.astype(F64) * (2 * np.pi)).astype(x.dtype)


def _u32(x):
    return x.astype(U32)


VALU: dict[str, tuple[str, tuple[str, ...], object]] = {
    "v_mov_b32": ("u32", ("u32",), lambda a: a),
    "v_mov_b64": ("u64", ("u64",), lambda a: a),
    "v_not_b32": ("u32", ("u32",), np.invert),
    "v_bfrev_b32": ("u32", ("u32",), _bfrev),
    "v_ffbh_u32": ("u32", ("u32",), _ffbh_u32),
    "v_ffbh_i32": ("u32", ("u32",), _ffbh_i32),
    "v_ffbl_b32": ("u32", ("u32",), _ffbl_b32),
    "v_bcnt_u32_b32": ("u32", ("u32", "u32"), lambda a, b: np.bitwise_count(a).astype(U32) + b),
    # float32 arithmetic
    "v_add_f32": ("f32", ("f32", "f32"), np.add),
    "v_sub_f32": ("f32", ("f32", "f32"), np.subtract),
    "v_subrev_f32": ("f32", ("f32", "f32"), lambda a, b: b - a),
    "v_mul_f32": ("f32", ("f32", "f32"), np.multiply),
    "v_mul_legacy_f32": ("f32", ("f32", "f32"), _mul_legacy),
    "v_min_f32": ("f32", ("f32", "f32"), np.fmin),
    "v_max_f32": ("f32", ("f32", "f32"), np.fmax),
    "v_fma_f32": ("f32", ("f32", "f32", "f32"), fma32),
    "v_fmac_f32": ("f32", ("f32", "f32", "f32"), fma32),  # src2 is the destination (bound by the compiler)
    "v_fmamk_f32": ("f32", ("f32", "f32", "f32"), lambda a, k, b: fma32(a, k, b)),
    "v_fmaak_f32": ("f32", ("f32", "f32", "f32"), fma32),
    "v_min3_f32": ("f32", ("f32", "f32", "f32"), lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    "v_max3_f32": ("f32", ("f32", "f32", "f32"), lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_med3_f32": ("f32", ("f32", "f32", "f32"), _fmed3),
    "v_exp_f32": ("f32", ("f32",), np.exp2),
    "v_log_f32": ("f32", ("f32",), np.log2),
    "v_rcp_f32": ("f32", ("f32",), lambda a: F32(1) / a),
    "v_rcp_iflag_f32": ("f32", ("f32",), lambda a: F32(1) / a),
    "v_rsq_f32": ("f32", ("f32",), lambda a: F32(1) / np.sqrt(a)),
    "v_sqrt_f32": ("f32", ("f32",), np.sqrt),
    "v_sin_f32": ("f32", ("f32",), _trig(np.sin)),
    "v_cos_f32": ("f32", ("f32",), _trig(np.cos)),
    "v_trunc_f32": ("f32", ("f32",), np.trunc),
    "v_ceil_f32": ("f32", ("f32",), np.ceil),
    "v_floor_f32": ("f32", ("f32",), np.floor),
    "v_rndne_f32": ("f32", ("f32",), np.rint),
    "v_fract_f32": ("f32", ("f32",), lambda a: _fract(a, F32(0.99999994))),
    "v_ldexp_f32": ("f32", ("f32", "i32"), _ldexp),
    "v_frexp_mant_f32": ("f32", ("f32",), _frexp_mant),
    "v_frexp_exp_i32_f32": ("i32", ("f32",), _frexp_exp),
    # float64
    "v_add_f64": ("f64", ("f64", "f64"), np.add),
    "v_mul_f64": ("f64", ("f64", "f64"), np.multiply),
    "v_min_f64": ("f64", ("f64", "f64"), np.fmin),
    "v_max_f64": ("f64", ("f64", "f64"), np.fmax),
    "v_fma_f64": ("f64", ("f64", "f64", "f64"), fma64),
    "v_fmac_f64": ("f64", ("f64", "f64", "f64"), fma64),
    "v_ldexp_f64": ("f64", ("f64", "i32"), _ldexp),
    "v_rcp_f64": ("f64", ("f64",), lambda a: 1.0 / a),
    "v_rsq_f64": ("f64", ("f64",), lambda a: 1.0 / np.sqrt(a)),
    "v_sqrt_f64": ("f64", ("f64",), np.sqrt),
    "v_trunc_f64": ("f64", ("f64",), np.trunc),
    "v_ceil_f64": ("f64", ("f64",), np.ceil),
    "v_floor_f64": ("f64", ("f64",), np.floor),
    "v_rndne_f64": ("f64", ("f64",), np.rint),
    "v_fract_f64": ("f64", ("f64",), lambda a: _fract(a, np.nextafter(1.0, 0.0))),
    "v_frexp_mant_f64": ("f64", ("f64",), _frexp_mant),
    "v_frexp_exp_i32_f64": ("i32", ("f64",), _frexp_exp),
    # float16 (results zero the high half, as GFX9 16-bit VALU ops do)
    "v_add_f16": ("f16", ("f16", "f16"), np.add),
    "v_sub_f16": ("f16", ("f16", "f16"), np.subtract),
    "v_subrev_f16": ("f16", ("f16", "f16"), lambda a, b: b - a),
    "v_mul_f16": ("f16", ("f16", "f16"), np.multiply),
    "v_max_f16": ("f16", ("f16", "f16"), np.fmax),
    "v_min_f16": ("f16", ("f16", "f16"), np.fmin),
    "v_fma_f16": ("f16", ("f16", "f16", "f16"), fma16),
    "v_rcp_f16": ("f16", ("f16",), lambda a: np.float16(1) / a),
    "v_sqrt_f16": ("f16", ("f16",), np.sqrt),
    "v_trunc_f16": ("f16", ("f16",), np.trunc),
    "v_floor_f16": ("f16", ("f16",), np.floor),
    "v_ceil_f16": ("f16", ("f16",), np.ceil),
    "v_rndne_f16": ("f16", ("f16",), np.rint),
    "v_max3_f16": ("f16", ("f16", "f16", "f16"), lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_min3_f16": ("f16", ("f16", "f16", "f16"), lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    # conversions
    "v_cvt_f32_f16": ("f32", ("f16",), lambda a: a.astype(F32)),
    "v_cvt_f16_f32": ("f16", ("f32",), lambda a: a.astype(np.float16)),
    "v_cvt_f32_f64": ("f32", ("f64",), lambda a: a.astype(F32)),
    "v_cvt_f64_f32": ("f64", ("f32",), lambda a: a.astype(F64)),
    "v_cvt_f32_i32": ("f32", ("i32",), lambda a: a.astype(F32)),
    "v_cvt_f32_u32": ("f32", ("u32",), lambda a: a.astype(F32)),
    "v_cvt_f64_i32": ("f64", ("i32",), lambda a: a.astype(F64)),
    "v_cvt_f64_u32": ("f64", ("u32",), lambda a: a.astype(F64)),
    "v_cvt_i32_f32": ("i32", ("f32",), lambda a: _cvt_int(a, -(2**31), 2**31 - 1, I32)),
    "v_cvt_u32_f32": ("u32", ("f32",), lambda a: _cvt_int(a, 0, 2**32 - 1, U32)),
    "v_cvt_i32_f64": ("i32", ("f64",), lambda a: _cvt_int(a, -(2**31), 2**31 - 1, I32)),
    "v_cvt_u32_f64": ("u32", ("f64",), lambda a: _cvt_int(a, 0, 2**32 - 1, U32)),
    "v_cvt_u16_f16": ("u16", ("f16",), lambda a: _cvt_int(a, 0, 65535, np.uint16)),
    "v_cvt_i16_f16": ("i16", ("f16",), lambda a: _cvt_int(a, -32768, 32767, np.int16)),
    "v_cvt_f16_u16": ("f16", ("u16",), lambda a: a.astype(np.float16)),
    "v_cvt_f16_i16": ("f16", ("i16",), lambda a: a.astype(np.float16)),
    **{
        f"v_cvt_f32_ubyte{i}": ("f32", ("u32",), (lambda i: lambda a: ((a >> U32(8 * i)) & U32(255)).astype(F32))(i))
        for i in range(4)
    },
    "v_cvt_pkrtz_f16_f32": ("u32", ("f32", "f32"), None),  # handled by the compiler (round toward zero)
    "v_pack_b32_f16": ("u32", ("u16", "u16"), lambda a, b: a.astype(U32) | (b.astype(U32) << U32(16))),
    # 32-bit integer
    "v_add_u32": ("u32", ("u32", "u32"), np.add),
    "v_sub_u32": ("u32", ("u32", "u32"), np.subtract),
    "v_subrev_u32": ("u32", ("u32", "u32"), lambda a, b: b - a),
    "v_mul_lo_u32": ("u32", ("u32", "u32"), np.multiply),
    "v_mul_hi_u32": ("u32", ("u32", "u32"), lambda a, b: ((a.astype(U64) * b.astype(U64)) >> U64(32)).astype(U32)),
    "v_mul_hi_i32": (
        "i32",
        ("i32", "i32"),
        lambda a, b: ((a.astype(np.int64) * b.astype(np.int64)) >> np.int64(32)).astype(I32),
    ),
    "v_mul_u32_u24": ("u32", ("u32", "u32"), lambda a, b: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF))),
    "v_mul_hi_u32_u24": ("u32", ("u32", "u32"), lambda a, b: (_u24(a) * _u24(b) >> 32).astype(U32)),
    "v_mul_i32_i24": ("u32", ("u32", "u32"), lambda a, b: (_i24(a) * _i24(b)).astype(U32)),
    "v_mul_hi_i32_i24": ("u32", ("u32", "u32"), lambda a, b: (_i24(a) * _i24(b) >> 32).astype(U32)),
    "v_mad_u32_u24": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (_u24(a) * _u24(b) + c).astype(U32)),
    "v_mad_i32_i24": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (_i24(a) * _i24(b) + c.view(I32)).astype(U32)),
    "v_mad_u32_u16": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (a & U32(0xFFFF)) * (b & U32(0xFFFF)) + c),
    "v_min_i32": ("i32", ("i32", "i32"), np.minimum),
    "v_max_i32": ("i32", ("i32", "i32"), np.maximum),
    "v_min_u32": ("u32", ("u32", "u32"), np.minimum),
    "v_max_u32": ("u32", ("u32", "u32"), np.maximum),
    "v_lshrrev_b32": ("u32", ("u32", "u32"), lambda s, x: x >> (s & U32(31))),
    "v_ashrrev_i32": ("i32", ("u32", "i32"), lambda s, x: x >> (s & U32(31)).astype(I32)),
    "v_lshlrev_b32": ("u32", ("u32", "u32"), lambda s, x: x << (s & U32(31))),
    "v_and_b32": ("u32", ("u32", "u32"), np.bitwise_and),
    "v_or_b32": ("u32", ("u32", "u32"), np.bitwise_or),
    "v_xor_b32": ("u32", ("u32", "u32"), np.bitwise_xor),
    "v_xnor_b32": ("u32", ("u32", "u32"), lambda a, b: ~(a ^ b)),
    "v_bfe_u32": ("u32", ("u32", "u32", "u32"), _bfe_u),
    "v_bfe_i32": ("i32", ("i32", "u32", "u32"), _bfe_i),
    "v_bfi_b32": ("u32", ("u32", "u32", "u32"), lambda m, a, b: (m & a) | (~m & b)),
    "v_alignbit_b32": (
        "u32",
        ("u32", "u32", "u32"),
        lambda a, b, s: (((a.astype(U64) << U64(32)) | b.astype(U64)) >> (s & U32(31)).astype(U64)).astype(U32),
    ),
    "v_perm_b32": ("u32", ("u32", "u32", "u32"), _perm),
    "v_lshl_add_u32": ("u32", ("u32", "u32", "u32"), lambda a, s, c: (a << (s & U32(31))) + c),
    "v_add_lshl_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, s: (a + b) << (s & U32(31))),
    "v_add3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: a + b + c),
    "v_lshl_or_b32": ("u32", ("u32", "u32", "u32"), lambda a, s, c: (a << (s & U32(31))) | c),
    "v_and_or_b32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (a & b) | c),
    "v_or3_b32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: a | b | c),
    "v_xad_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (a ^ b) + c),
    "v_min3_i32": ("i32", ("i32", "i32", "i32"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_i32": ("i32", ("i32", "i32", "i32"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_med3_i32": ("i32", ("i32", "i32", "i32"), _med3),
    "v_med3_u32": ("u32", ("u32", "u32", "u32"), _med3),
    "v_dot4c_i32_i8": ("i32", ("u32", "u32", "i32"), _dot4_i8),
    # 16-bit integer
    "v_add_u16": ("u16", ("u16", "u16"), np.add),
    "v_sub_u16": ("u16", ("u16", "u16"), np.subtract),
    "v_mul_lo_u16": ("u16", ("u16", "u16"), np.multiply),
    "v_lshlrev_b16": ("u16", ("u16", "u16"), lambda s, x: x << (s & np.uint16(15))),
    "v_lshrrev_b16": ("u16", ("u16", "u16"), lambda s, x: x >> (s & np.uint16(15))),
    "v_ashrrev_i16": ("i16", ("u16", "i16"), lambda s, x: x >> (s & np.uint16(15)).astype(np.int16)),
    "v_max_u16": ("u16", ("u16", "u16"), np.maximum),
    "v_max_i16": ("i16", ("i16", "i16"), np.maximum),
    "v_min_u16": ("u16", ("u16", "u16"), np.minimum),
    "v_min_i16": ("i16", ("i16", "i16"), np.minimum),
    "v_max3_i16": ("i16", ("i16", "i16", "i16"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_i16": ("i16", ("i16", "i16", "i16"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_u16": ("u16", ("u16", "u16", "u16"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_u16": ("u16", ("u16", "u16", "u16"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    # the VI forms GFX9 keeps as _legacy: the same math, the result's high half zeroed (as every 16-bit result here)
    "v_mad_legacy_u16": ("u16", ("u16", "u16", "u16"), lambda a, b, c: a * b + c),
    "v_mad_legacy_i16": ("i16", ("i16", "i16", "i16"), lambda a, b, c: a * b + c),
    "v_mad_u16": ("u16", ("u16", "u16", "u16"), lambda a, b, c: a * b + c),
    "v_mad_i16": ("i16", ("i16", "i16", "i16"), lambda a, b, c: a * b + c),
    # 64-bit integer
    "v_lshlrev_b64": ("u64", ("u32", "u64"), _shift64(np.left_shift)),
    "v_lshrrev_b64": ("u64", ("u32", "u64"), _shift64(np.right_shift)),
    "v_ashrrev_i64": ("i64", ("u32", "i64"), lambda s, x: x >> (s & U32(63)).astype(np.int64)),
    "v_lshl_add_u64": ("u64", ("u64", "u32", "u64"), lambda a, s, c: (a << (s & U32(7)).astype(U64)) + c),
}

_FLOAT_CMP = {
    "f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
    "lt": np.less,
    "eq": np.equal,
    "le": np.less_equal,
    "gt": np.greater,
    "lg": lambda a, b: (a < b) | (a > b),
    "ge": np.greater_equal,
    "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
    "u": lambda a, b: np.isnan(a) | np.isnan(b),
    "nge": lambda a, b: ~(a >= b),
    "nlg": lambda a, b: ~((a < b) | (a > b)),
    "ngt": lambda a, b: ~(a > b),
    "nle": lambda a, b: ~(a <= b),
    "neq": lambda a, b: ~(a == b),
    "nlt": lambda a, b: ~(a < b),
    "tru": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
}
_INT_CMP = {
    "f": _FLOAT_CMP["f"],
    "lt": np.less,
    "eq": np.equal,
    "le": np.less_equal,
    "gt": np.greater,
    "ne": np.not_equal,
    "ge": np.greater_equal,
    "t": _FLOAT_CMP["tru"],
}


def _class(x, bits):
    x = np.asarray(x)
    neg = np.signbit(x)
    fin = np.isfinite(x)
    tiny = np.finfo(x.dtype).tiny
    ax = np.abs(x)
    kinds = [
        np.zeros(x.shape, bool),  # signalling NaN: numpy keeps no distinction; NaNs count as quiet
        np.isnan(x),
        np.isinf(x) & neg,
        fin & neg & (ax >= tiny),
        fin & neg & (ax < tiny) & (ax > 0),
        (x == 0) & neg,
        (x == 0) & ~neg,
        fin & ~neg & (ax < tiny) & (ax > 0),
        fin & ~neg & (ax >= tiny),
        np.isinf(x) & ~neg,
    ]
    out = np.zeros(np.broadcast(x, bits).shape, bool)
    for i, k in enumerate(kinds):
        out |= k & ((bits >> U32(i)) & U32(1)).astype(bool)
    return out


def compare(name: str) -> tuple[str, object] | None:
    """(source type, predicate) of a v_cmp/v_cmpx opcode."""
    parts = name.split("_")  # v, cmp|cmpx, cond, type
    if len(parts) != 4:
        return None
    cond, ty = parts[2], parts[3]
    if cond == "class":
        return ty, _class
    table = _FLOAT_CMP if ty[0] == "f" else _INT_CMP
    if cond not in table:
        return None
    return ty, table[cond]
