"""exp, exp2, log, log2, sin, cos and pow as plain float arithmetic, for targets whose compiler has no float64 math
(LLVM's amdgcn backend lowers no float64 libm call) or whose float32 sin/cos do not reduce large arguments (amdgcn's
v_sin_f32 takes turns and is exact only within a few hundred of them).

The methods are the textbook ones. exp: x = k ln2 + r with ln2 split in two (Cody-Waite) so k ln2 is exact, e^r
from its Taylor series (|r| <= ln2/2), and 2^k put in by two exponent-field multiplies so a subnormal result rounds
once. log: x = 2^e m with m in [sqrt(1/2), sqrt(2)) read from the bits (a subnormal scaled by 2^54 first), and
ln m = 2 atanh(f), f = (m-1)/(m+1), from the odd series. sin/cos: x = k pi/2 + r, r in [-pi/4, pi/4], then the
Taylor series of sin or cos by the quadrant k mod 4. Below 2^19, pi/2 in three parts of 33, 33 and 53 bits
(Cody-Waite); above, x 2/pi mod 4 from 2/pi's bits in 24-bit chunks: each chunk times a 26- or 27-bit half of x
is an exact float64 product, and its value mod 4 is exact too (a Payne-Hanek reduction without integer tables).
log2 and pow(x, y) = 2^(y log2|x|) carry log2 x and the product in double-double (hi + lo, with Knuth's exact sum
and Dekker's exact product), so a large exponent keeps its fractional bits; pow has C's special cases. The
constants are computed here from integer series.

Accuracy, float64, against numpy (tests/codegen/test_float_math.py): exp, exp2, log, log2 and pow within 2 ulp over
the normal range, a subnormal result within one step; sin/cos within ~2e-16 absolute below 2^19 and 4e-15 up to the
largest double. A float32 sin/cos goes through the float64 path and rounds once."""

from __future__ import annotations
import functools
import math
from fractions import Fraction
from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

F64, U64, B = dtypes.float64, dtypes.uint64, dtypes.bool
TRANSCENDENTAL = (Ops.EXP, Ops.EXP2, Ops.LOG, Ops.LOG2, Ops.SIN, Ops.COS, Ops.POW)


# ---- constants, from integer arithmetic with guard bits


def _atan_inv(n: int, bits: int) -> int:
    """atan(1/n) * 2^bits (Gregory's series, truncated)."""
    total, term, k, sign = 0, (1 << bits) // n, 1, 1
    while term:
        total += sign * (term // k)
        term //= n * n
        k, sign = k + 2, -sign
    return total


@functools.cache
def _pi_fixed(bits: int) -> int:
    """pi * 2^bits (Machin: pi = 16 atan(1/5) - 4 atan(1/239)), good to a few units of the last place."""
    g = bits + 16
    return (16 * _atan_inv(5, g) - 4 * _atan_inv(239, g)) >> 16


def _ln2_fixed(bits: int) -> int:
    """ln 2 * 2^bits (ln 2 = 2 atanh(1/3))."""
    g, total, k = bits + 16, 0, 1
    term = (1 << g) // 3
    while term:
        total += term // k
        term //= 9
        k += 2
    return (2 * total) >> 16


def _leading_bits(v: Fraction, bits: int) -> float:
    """v's leading `bits` significant bits (truncated) as a float: a product with a small integer stays exact."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    scale = Fraction(2) ** (bits - 1 - e)
    return float(Fraction(int(v * scale)) / scale)


_BITS = 1300
_PI = Fraction(_pi_fixed(_BITS), 1 << _BITS)
_LN2 = Fraction(_ln2_fixed(_BITS), 1 << _BITS)
LN2, LOG2E, PI_2, TWO_OVER_PI = float(_LN2), float(1 / _LN2), float(_PI / 2), float(2 / _PI)
LN2_HI = _leading_bits(_LN2, 32)  # k * LN2_HI is exact for |k| < 2^20
LN2_LO = float(_LN2 - Fraction(LN2_HI))
LOG2E_LO = float(1 / _LN2 - Fraction(LOG2E))
PIO2_1 = _leading_bits(_PI / 2, 33)  # k * PIO2_i is exact for |k| < 2^20
PIO2_2 = _leading_bits(_PI / 2 - Fraction(PIO2_1), 33)
PIO2_3 = float(_PI / 2 - Fraction(PIO2_1) - Fraction(PIO2_2))
CODY_WAITE_LIMIT = 2.0**19
# 2/pi in 24-bit chunks: 2/pi = sum_j c_j 2^(-24(j+1)); 46 chunks cover the largest double's fractional bits
_TWO_OVER_PI = (2 << (24 * 46 + _BITS)) // _pi_fixed(_BITS)
CHUNKS = tuple((_TWO_OVER_PI >> (24 * (45 - j))) & 0xFFFFFF for j in range(46))
F32_CHUNKS = 8  # a float32 is below 2^128: 8 chunks reach its fractional bits


# ---- small builders


def _c(v: float) -> UOp:
    return UOp.const(F64, v)


def _u(v: int) -> UOp:
    return UOp.const(U64, v)


def _bits(x: UOp) -> UOp:
    return UOp(Ops.BITCAST, U64, (x,))


def _float(b: UOp) -> UOp:
    return UOp(Ops.BITCAST, F64, (b,))


def _horner(x: UOp, coeffs: list[float]) -> UOp:
    """coeffs[0] + x (coeffs[1] + x (...)), coefficients lowest first."""
    acc = _c(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


def _trunc(x: UOp) -> UOp:
    return x.alu(Ops.TRUNC)


def _round(x: UOp) -> UOp:
    """Nearest integer, halves away from zero."""
    return _trunc(x + (x < 0.0).where(_c(-0.5), _c(0.5)))


def _isnan(x: UOp) -> UOp:
    return x.ne(x)


def _abs(x: UOp) -> UOp:
    return _float(_bits(x) & _u((1 << 63) - 1))


def _negative(x: UOp) -> UOp:
    """x's sign bit (true for -0.0)."""
    return _bits(x).alu(Ops.SHR, _u(63)).ne(_u(0))


def _pow2(k: UOp) -> UOp:
    """2^k for an integral float k in [-1022, 1023], built in the exponent field."""
    return _float((k + 1023.0).cast(U64).alu(Ops.SHL, _u(52)))


_FACT = [float(Fraction(1, math.factorial(n))) for n in range(24)]


# ---- error-free sums and products (Knuth, Dekker)


def _split(a: UOp) -> tuple[UOp, UOp]:
    """a = hi + lo, hi with 26 significant bits, lo with at most 27: by masking, not Veltkamp's a * (2^27 + 1),
    which a compiler contracting a*b - c into an fma (gcc's default) would break."""
    hi = _float(_bits(a) & _u(~((1 << 27) - 1) & ((1 << 64) - 1)))
    return hi, a - hi


def _two_prod(a: UOp, b: UOp) -> tuple[UOp, UOp]:
    """(p, e) with p = a*b rounded and p + e = a*b exactly (Dekker)."""
    p = a * b
    (ah, al), (bh, bl) = _split(a), _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _two_sum(a: UOp, b: UOp) -> tuple[UOp, UOp]:
    """(s, e) with s = a+b rounded and s + e = a+b exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


# ---- exp, exp2


def _scaled_exp(k: UOp, r: UOp) -> UOp:
    """e^r 2^k for |r| <= ln2/2 (+ rounding) and integral |k| <= 1200; 2^k in two halves, so the product rounds
    once, to a subnormal or to inf, only at the last multiply."""
    p = _horner(r, _FACT[:15])  # the next term, r^15/15!, is below 1e-19
    k1 = _trunc(k * 0.5)
    return p * _pow2(k1) * _pow2(k - k1)


def _clamp(x: UOp, lim: float) -> UOp:
    """x within [-lim, lim]; NaN as 0 (the callers put NaN back), so no cast sees it."""
    return _isnan(x).where(_c(0.0), x.maximum(-lim).alu(Ops.NEG).maximum(-lim).alu(Ops.NEG))


def exp2(x: UOp) -> UOp:
    xc = _clamp(x, 1100.0)
    k = _round(xc)
    return _isnan(x).where(x, _scaled_exp(k, (xc - k) * LN2))  # xc - k is exact


def exp(x: UOp) -> UOp:
    xc = _clamp(x, 800.0)
    k = _round(xc * LOG2E)
    return _isnan(x).where(x, _scaled_exp(k, (xc - k * LN2_HI) - k * LN2_LO))


# ---- log, log2


def _exponent_mantissa(x: UOp) -> tuple[UOp, UOp]:
    """(e, m) with x = 2^e m, m in [sqrt(1/2), sqrt(2)), for finite x > 0 (garbage, never poison, elsewhere)."""
    sub = x < 2.0**-1022
    a = sub.where(x * 2.0**54, x)
    b = _bits(a)
    e = (b.alu(Ops.SHR, _u(52)) & _u(0x7FF)).cast(F64) - sub.where(_c(1023.0 + 54), _c(1023.0))
    m = _float((b & _u((1 << 52) - 1)) | _u(1023 << 52))  # in [1, 2)
    big = _c(2.0**0.5) < m
    return big.where(e + 1.0, e), big.where(m * 0.5, m)


def _atanh_series(s: UOp) -> UOp:
    """(atanh(f) - f) / f^3 for s = f^2 <= 0.03: 1/3 + s/5 + s^2/7 + ..., to s^10 (the rest is below 1e-19)."""
    return _horner(s, [1.0 / (2 * n + 3) for n in range(11)])


def _log_parts(x: UOp) -> tuple[UOp, UOp]:
    """(e, ln m) with x = 2^e m as in _exponent_mantissa; ln m = 2 atanh f, f = (m-1)/(m+1), |f| <= 0.172."""
    e, m = _exponent_mantissa(x)
    f = (m - 1.0) * (m + 1.0).alu(Ops.RECIPROCAL)
    s = f * f
    two_f = f * 2.0
    return e, two_f + two_f * s * _atanh_series(s)


def _log2_dd(x: UOp) -> tuple[UOp, UOp]:
    """log2 x as an unevaluated sum hi + lo, good to ~2^-100 relative, for finite x > 0: pow's y log2 x keeps its
    fractional bits even when the integer part is large."""
    e, m = _exponent_mantissa(x)
    num, den = m - 1.0, m + 1.0
    den_lo = m - (den - 1.0)  # m + 1 = den + den_lo exactly
    f = num.alu(Ops.FDIV, den)
    p, p_lo = _two_prod(f, den)
    f_lo = (((num - p) - p_lo) - f * den_lo).alu(Ops.FDIV, den)  # f + f_lo = (m-1)/(m+1) to ~2^-106
    ln_hi, ln_lo = _two_sum(f * 2.0, f * 2.0 * (f * f) * _atanh_series(f * f))
    ln_lo = ln_lo + f_lo * 2.0
    t_hi, t_lo = _two_prod(ln_hi, _c(LOG2E))
    t_lo = t_lo + (ln_hi * LOG2E_LO + ln_lo * LOG2E)
    hi, lo = _two_sum(e, t_hi)
    return hi, lo + t_lo


def _log_edges(x: UOp, v: UOp) -> UOp:
    """C's edges: log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN stays NaN."""
    v = (x < 0.0).where(_c(float("nan")), v)
    v = x.eq(0.0).where(_c(float("-inf")), v)
    v = x.eq(float("inf")).where(x, v)
    return _isnan(x).where(x, v)


def log2(x: UOp) -> UOp:
    hi, lo = _log2_dd(x)  # ln m * log2(e) rounded once more would cost up to 3 ulp near 1
    return _log_edges(x, hi + lo)


def log(x: UOp) -> UOp:
    e, lnm = _log_parts(x)
    return _log_edges(x, e * LN2_HI + (lnm + e * LN2_LO))


# ---- sin, cos


def _mod4(t: UOp) -> UOp:
    """t mod 4 for t >= 0, exact."""
    return t - _trunc(t * 0.25) * 4.0


def _quarter_turns(a: UOp, chunks: int, halves: bool) -> UOp:
    """a 2/pi mod 4 for finite a >= 0, from `chunks` chunks of 2/pi; halves: a has more than 26 bits (a float64)."""
    # a float64 as hi + lo, 26 and at most 27 significant bits: each part times a chunk is exact
    parts = list(_split(a)) if halves else [a]
    acc = _c(0.0)
    for j in reversed(range(chunks)):  # the small terms first
        shift = min(24 * j, 1000)  # the part scaled down and the chunk up, so neither leaves the float range
        chunk = _c(float(Fraction(CHUNKS[j]) * Fraction(2) ** (shift - 24 * (j + 1))))
        for p in parts:
            acc = _mod4(acc + _mod4(p * 2.0**-shift * chunk))
    return acc


def _reduce(a: UOp, chunks: int, halves: bool) -> tuple[UOp, UOp]:
    """(r, n): a = (4i + n) pi/2 + r with |r| <= pi/4 (+ rounding), n in 0..3 as a float, for finite a >= 0."""
    small = a < CODY_WAITE_LIMIT
    k = _round(small.where(a, _c(0.0)) * TWO_OVER_PI)
    r_small = ((a - k * PIO2_1) - k * PIO2_2) - k * PIO2_3
    y = _quarter_turns(small.where(_c(CODY_WAITE_LIMIT), a), chunks, halves)
    q = _round(y)
    r_big = (y - q) * PI_2
    r, k = small.where(r_small, r_big), small.where(k, q)
    return r, _mod4(k)


def _sin_cos_poly(r: UOp) -> tuple[UOp, UOp]:
    r2 = r * r
    s = r * _horner(r2, [(-1) ** n * _FACT[2 * n + 1] for n in range(10)])  # to r^19: the rest is below 1e-21
    c = _horner(r2, [(-1) ** n * _FACT[2 * n] for n in range(11)])  # to r^20
    return s, c


def _sin_or_cos(x: UOp, cos: bool, chunks: int, halves: bool) -> UOp:
    finite = _abs(x) < float("inf")
    a = finite.where(_abs(x), _c(0.0))
    r, n = _reduce(a, chunks, halves)
    s, c = _sin_cos_poly(r)
    if cos:
        n = _mod4(n + 1.0)  # cos x = sin(x + pi/2)
    v = (n < 2.0).where(_c(1.0), _c(-1.0)) * (n.eq(0.0) | n.eq(2.0)).where(s, c)
    if not cos:  # sin is odd: the sign of x, -0 included
        v = _negative(x).where(v.alu(Ops.NEG), v)
    return finite.where(v, _c(float("nan")))


# ---- pow


def pow_(x: UOp, y: UOp) -> UOp:
    """C's pow: 2^(y log2|x|) with the product in double-double, the sign of an odd integer y put back for a negative
    x (-0 and -inf included), NaN for a finite negative x and a non-integer y, 1 for y = 0 or x = 1 (NaN or not), and
    1 for (-1) ** +-inf."""
    ax = _abs(x)
    regular = (0.0 < ax) & (ax < float("inf"))
    l_hi, l_lo = _log2_dd(regular.where(ax, _c(1.0)))
    l_hi = regular.where(l_hi, _log_edges(ax, _c(0.0)))  # +-inf or NaN for 0, inf and NaN
    z_hi, z_lo = _two_prod(y, l_hi)
    z_lo = z_lo + y * l_lo
    z_lo = (_abs(z_hi) < 1100.0).where(z_lo, _c(0.0))  # also drops the NaN of an inf's split
    zc = _clamp(z_hi, 1100.0)
    k = _round(zc)
    r = _isnan(z_hi).where(z_hi, _scaled_exp(k, ((zc - k) + z_lo) * LN2))
    integral = _trunc(y).eq(y)
    half = y * 0.5
    odd = integral & _trunc(half).ne(half)
    neg = _negative(x)
    r = (neg & odd).where(r.alu(Ops.NEG), r)
    r = (neg & (ax < float("inf")) & ax.ne(0.0) & (integral.alu(Ops.CMPEQ, UOp.const(B, False)))).where(
        _c(float("nan")), r
    )
    one = y.eq(0.0) | x.eq(1.0) | (ax.eq(1.0) & _abs(y).eq(float("inf")))
    return one.where(_c(1.0), r)


# ---- the rewrite


def _f64_math(u: UOp) -> UOp | None:
    if u.dtype is not F64:
        return None
    x = u.src[0]
    if u.op is Ops.POW:
        return pow_(x, u.src[1])
    if u.op in (Ops.SIN, Ops.COS):
        return _sin_or_cos(x, u.op is Ops.COS, len(CHUNKS), halves=True)
    return {Ops.EXP: exp, Ops.EXP2: exp2, Ops.LOG: log, Ops.LOG2: log2}[u.op](x)


def _f32_sin_cos(u: UOp) -> UOp | None:
    """float32 sin/cos through the float64 reduction and series, rounded once to float32."""
    if u.dtype is not dtypes.float32:
        return None
    return _sin_or_cos(u.src[0].cast(F64), u.op is Ops.COS, F32_CHUNKS, halves=False).cast(dtypes.float32)


pm_float64_math = PatternMatcher([(UPat(TRANSCENDENTAL, name="u"), _f64_math)])
pm_float32_sin = PatternMatcher([(UPat((Ops.SIN, Ops.COS), name="u"), _f32_sin_cos)])


def decompose_math(kernel: UOp, float64_math: bool, sin_reduction: bool) -> UOp:
    """The kernel with the math its target lacks written out: float64 transcendentals where float64_math is off,
    float32 sin/cos where sin_reduction is off."""
    if not float64_math:
        kernel = graph_rewrite(kernel, pm_float64_math)
    if not sin_reduction:
        kernel = graph_rewrite(kernel, pm_float32_sin)
    return kernel
