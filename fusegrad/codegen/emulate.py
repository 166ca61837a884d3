"""EMULATED_DTYPES: kernels hold half, bfloat16 and fp8 values as their bit patterns in uint16/uint8, as a backend
without those types would, and convert them with integer and float32 arithmetic that rounds like the native casts.

Runs after decompose, where every narrow-float op already computes in float32: what is left of a narrow float are its
loads, stores, constants, casts and bitcasts. Two rewrites: the first turns each cast from or to an emulated dtype
into the decoder or encoder over a BITCAST between the dtype and its bits; the second gives the buffers, loads and
constants the bits' dtype and drops the BITCASTs that now join two nodes of the same dtype."""

from __future__ import annotations
import functools
from fusegrad.lazy_numpy import np
from fusegrad.dtype import FP8_FORMATS, DType, dtypes, float_to_fp8, np_f32_to_bf16
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from fusegrad.codegen.emulate_wide import WIDE, emulate_wide_ints, wide_param

# the names EMULATED_DTYPES takes, and the dtypes they emulate (64-bit ints: codegen/emulate_wide.py)
EMULATABLE: dict[str, DType] = {
    "half": dtypes.float16,
    "float16": dtypes.float16,
    "bfloat16": dtypes.bfloat16,
    "fp8e4m3": dtypes.fp8e4m3,
    "fp8e5m2": dtypes.fp8e5m2,
    "fp8e4m3fnuz": dtypes.fp8e4m3fnuz,
    "fp8e5m2fnuz": dtypes.fp8e5m2fnuz,
    "long": dtypes.int64,
    "int64": dtypes.int64,
    "ulong": dtypes.uint64,
    "uint64": dtypes.uint64,
}
U8, U16, U32, I32, F32, F64, B = (
    dtypes.uint8,
    dtypes.uint16,
    dtypes.uint32,
    dtypes.int32,
    dtypes.float32,
    dtypes.float64,
    dtypes.bool,
)


@functools.cache
def emulated_dtypes(value: str) -> frozenset:
    """The dtypes an EMULATED_DTYPES value names; an unknown name raises ValueError naming it."""
    names = [x.strip() for x in value.split(",") if x.strip()]
    if bad := [n for n in names if n not in EMULATABLE]:
        known = ", ".join(EMULATABLE)
        raise ValueError(f"EMULATED_DTYPES={value!r}: unknown dtype {bad[0]!r} (known: {known})")
    return frozenset(EMULATABLE[n] for n in names)


def storage(dt: DType) -> DType:
    return U16 if dt.itemsize == 2 else U8


def _c(dt: DType, v) -> UOp:
    return UOp.const(dt, v)


def _op(op: Ops, dt: DType, *src: UOp) -> UOp:
    return UOp(op, dt, src)


def _and(x: UOp, m: int) -> UOp:
    return _op(Ops.AND, x.dtype, x, _c(x.dtype, m))


def _or(x: UOp, y: UOp) -> UOp:
    return _op(Ops.OR, x.dtype, x, y)


def _shr(x: UOp, n: int) -> UOp:
    return _op(Ops.SHR, x.dtype, x, _c(x.dtype, n))


def _shl(x: UOp, n: int) -> UOp:
    return _op(Ops.SHL, x.dtype, x, _c(x.dtype, n))


def _add(x: UOp, y: UOp | int) -> UOp:
    return _op(Ops.ADD, x.dtype, x, y if isinstance(y, UOp) else _c(x.dtype, y))


def _lt(x: UOp, y: UOp | int | float) -> UOp:
    return _op(Ops.CMPLT, B, x, y if isinstance(y, UOp) else _c(x.dtype, y))


def _eq(x: UOp, y: int) -> UOp:
    return _op(Ops.CMPEQ, B, x, _c(x.dtype, y))


def _where(c: UOp, a: UOp, b: UOp) -> UOp:
    return _op(Ops.WHERE, a.dtype, c, a, b)


def _bits(f: UOp) -> UOp:
    return _op(Ops.BITCAST, U32, f)


def _float(u: UOp) -> UOp:
    return _op(Ops.BITCAST, F32, u)


# ---- decoders: bits (uint16/uint8) -> float32, exact


def _half_to_f32(h: UOp) -> UOp:
    h = h.cast(U32)
    sign, mag = _shl(_and(h, 0x8000), 16), _and(h, 0x7FFF)
    normal = _add(_shl(mag, 13), 0x38000000)  # exponent rebiased by 127 - 15
    # inf; a NaN keeps its payload and is quiet, as the hardware conversions make it
    special = _or(_shl(mag, 13), _where(_lt(_c(U32, 0x7C00), mag), _c(U32, 0x7FC00000), _c(U32, 0x7F800000)))
    sub = _op(Ops.MUL, F32, mag.cast(F32), _c(F32, 2.0**-24))  # exact: fewer than 11 bits
    body = _where(_lt(mag, 0x400), _bits(sub), _where(_lt(mag, 0x7C00), normal, special))
    return _float(_or(body, sign))


def _bf16_to_f32(b: UOp) -> UOp:
    return _float(_shl(b.cast(U32), 16))


def _fp8_to_f32(b: UOp, dt: DType) -> UOp:
    f = FP8_FORMATS[dt]
    m, bias = f.mantissa_bits, f.bias
    b = b.cast(U32)
    mag, e = _and(b, 0x7F), _shr(_and(b, 0x7F), m)
    sign = _shl(_and(b, 0x80), 24)
    normal = _add(_shl(mag, 23 - m), (127 - bias) << 23)
    sub = _bits(_op(Ops.MUL, F32, _and(b, (1 << m) - 1).cast(F32), _c(F32, 2.0 ** (1 - bias - m))))
    value = _or(_where(_eq(e, 0), sub, normal), sign)
    top = (1 << (7 - m)) - 1
    if f.fnuz:
        nan = _eq(b, 0x80)
    elif f.has_inf:
        nan = _op(Ops.AND, B, _eq(e, top), _op(Ops.CMPNE, B, _and(b, (1 << m) - 1), _c(U32, 0)))
        value = _where(_eq(mag, top << m), _or(_c(U32, 0x7F800000), sign), value)
    else:
        nan = _eq(mag, f.nan_bits)
    return _float(_where(nan, _or(_c(U32, 0x7FC00000), sign), value))


# ---- encoders: float32 -> bits, rounded to nearest even as the native casts round


def _f32_to_half(x: UOp) -> UOp:
    u = _bits(x)
    sign, a = _and(_shr(u, 16), 0x8000), _and(u, 0x7FFFFFFF)
    nan = _or(_c(U32, 0x7E00), _and(_shr(a, 13), 0x3FF))
    # below 2**-14 the result is a multiple of 2**-24: scaled, + 2**23 rounds it to an integer in float32
    scaled = _op(Ops.MUL, F32, _float(a), _c(F32, 2.0**24))
    sub = _add(_bits(_op(Ops.ADD, F32, scaled, _c(F32, 2.0**23))), -0x4B000000)
    normal = _add(_shr(_add(_add(a, 0xFFF), _and(_shr(a, 13), 1)), 13), -0x1C000)
    body = _where(_lt(a, 0x38800000), sub, _where(_lt(a, 0x477FF000), normal, _c(U32, 0x7C00)))
    return _or(_where(_lt(_c(U32, 0x7F800000), a), nan, body), sign).cast(U16)


def _f32_to_bf16(x: UOp) -> UOp:
    u = _bits(x)
    rounded = _shr(_add(_add(u, 0x7FFF), _and(_shr(u, 16), 1)), 16)
    return _where(_op(Ops.CMPNE, B, x, x), _c(U32, 0x7FC0), rounded).cast(U16)


def _f32_to_fp8(x: UOp, dt: DType) -> UOp:
    f = FP8_FORMATS[dt]
    m, bias, min_e = f.mantissa_bits, f.bias, 1 - f.bias
    u = _bits(x)
    sign, a = _and(_shr(u, 24), 0x80), _and(u, 0x7FFFFFFF)
    # the quantum of a's binade (of the subnormals below 2**min_e): adding 2**23 quanta rounds to it in float32
    # (binades past 2**20 all overflow: capped there, so that the quantum's exponent stays a float32 exponent)
    e = _op(Ops.MAX, U32, _shr(a, 23), _c(U32, min_e + 127))
    e = _where(_lt(e, 127 + 20), e, _c(U32, 127 + 20))
    big = _float(_shl(_add(e, 23 - m), 23))
    r = _op(Ops.ADD, F32, _op(Ops.ADD, F32, _float(a), big), _op(Ops.NEG, F32, big))
    rb = _bits(r)
    sub = _op(Ops.MUL, F32, r, _c(F32, 2.0 ** (m - min_e))).cast(U32)
    normal = _add(_and(_shr(rb, 23 - m), (1 << m) - 1), _shl(_add(_shr(rb, 23), bias - 127), m))
    bits = _where(_lt(r, 2.0**min_e), sub, normal)
    over = _c(U32, 0x7C if f.has_inf else f.max_bits)
    bits = _where(_lt(_c(F32, f.max_value), r), over, bits)
    inf = _eq(a, 0x7F800000)
    if f.fnuz:
        out = _where(_eq(bits, 0), _c(U32, 0), _or(bits, sign))
        out = _where(_op(Ops.OR, B, _lt(_c(U32, 0x7F800000), a), inf), _c(U32, 0x80), out)
    else:
        out = _where(inf, _c(U32, 0x7C if f.has_inf else f.nan_bits), bits)
        out = _or(_where(_lt(_c(U32, 0x7F800000), a), _c(U32, f.nan_bits), out), sign)
    return out.cast(U8)


def _f64_to_f32_odd(x: UOp) -> UOp:
    """float64 -> float32 rounded to odd: a second rounding to a narrower format then rounds as once from float64."""
    f = x.cast(F32)
    u = _bits(f)
    inexact = _op(Ops.AND, B, _op(Ops.CMPNE, B, f.cast(F64), x), _op(Ops.CMPEQ, B, f, f))
    away = _lt(
        _op(Ops.MAX, F64, x, _op(Ops.NEG, F64, x)), _op(Ops.MAX, F64, f.cast(F64), _op(Ops.NEG, F64, f.cast(F64)))
    )
    fixed = _where(away, _add(u, 0xFFFFFFFF), _add(u, 1))
    return _float(_where(_op(Ops.AND, B, inexact, _eq(_and(u, 1), 0)), fixed, u))


def decode(bits: UOp, dt: DType) -> UOp:
    if dt is dtypes.float16:
        return _half_to_f32(bits)
    return _bf16_to_f32(bits) if dt is dtypes.bfloat16 else _fp8_to_f32(bits, dt)


def encode(x: UOp, dt: DType) -> UOp:
    if dt is dtypes.float16:
        return _f32_to_half(x)
    return _f32_to_bf16(x) if dt is dtypes.bfloat16 else _f32_to_fp8(x, dt)


def const_bits(value, dt: DType) -> int:
    if dt is dtypes.float16:
        return int(np.array(value, np.float16).view(np.uint16))
    if dt is dtypes.bfloat16:
        return int(np_f32_to_bf16(np.array([value], np.float32))[0])
    return int(float_to_fp8(float(value), dt))


def _cast_from(c: UOp, x: UOp, emulated: frozenset) -> UOp | None:
    if x.dtype not in emulated or c.dtype is x.dtype:
        return None
    value = decode(UOp(Ops.BITCAST, storage(x.dtype), (x,)), x.dtype)
    if c.dtype in emulated:
        return UOp(Ops.BITCAST, c.dtype, (encode(value, c.dtype),))
    return value.cast(c.dtype)


def _cast_to(c: UOp, x: UOp, emulated: frozenset) -> UOp | None:
    if c.dtype not in emulated or x.dtype in emulated:
        return None
    if x.dtype is F64 and c.dtype is not dtypes.bfloat16:  # bfloat16 goes through float32 natively too
        x32 = _f64_to_f32_odd(x)
    else:
        x32 = x.cast(F32)
    return UOp(Ops.BITCAST, c.dtype, (encode(x32, c.dtype),))


def _cast_rules(emulated: frozenset) -> PatternMatcher:
    return PatternMatcher(
        [
            (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), lambda c, x: _cast_from(c, x, emulated)),
            (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), lambda c, x: _cast_to(c, x, emulated)),
        ]
    )


def _retype(u: UOp, emulated: frozenset) -> UOp | None:
    """Sources first: buffers, loads and constants of an emulated dtype take its bits' dtype; a BITCAST to one
    becomes one to the bits, and a BITCAST whose source has its own dtype by now is that source."""
    if u.op is Ops.BITCAST and u.src[0].dtype is u.dtype:
        return u.src[0]
    if u.dtype not in emulated:
        return None
    if u.op is Ops.CONST:
        return UOp.const(storage(u.dtype), const_bits(u.arg, u.dtype))
    if u.op in (Ops.DEFINE_GLOBAL, Ops.LOAD, Ops.BITCAST):
        return UOp(u.op, storage(u.dtype), u.src, u.arg)
    raise NotImplementedError(f"EMULATED_DTYPES: no rule for {u.op} in {u.dtype}")


def _retype_rules(emulated: frozenset) -> PatternMatcher:
    return PatternMatcher([(UPat(name="u"), lambda u: _retype(u, emulated))])


def emulated_param(u: UOp, emulated: frozenset) -> UOp:
    """A kernel parameter as the emulation gives it: a buffer of an emulated dtype is a buffer of its bits."""
    if u.op is Ops.DEFINE_GLOBAL and u.dtype in WIDE and u.dtype in emulated:
        return wide_param(u)
    return UOp(u.op, storage(u.dtype), u.src, u.arg) if u.op is Ops.DEFINE_GLOBAL and u.dtype in emulated else u


def emulate_dtypes(kernel: UOp, emulated: frozenset) -> UOp:
    """The kernel with every value of an emulated dtype held as its bits (see the module's docstring)."""
    if emulated & set(WIDE):
        kernel = emulate_wide_ints(kernel)
    if not (emulated := emulated - set(WIDE)) or not {u.dtype for u in kernel.toposort()} & emulated:
        return kernel
    kernel = graph_rewrite(kernel, _cast_rules(emulated))
    return graph_rewrite(kernel, _retype_rules(emulated))
