"""EMULATED_DTYPES long/ulong: kernels hold 64-bit integers as pairs of 32-bit words, as a backend without 64-bit
integers would. A buffer of n int64 becomes one of 2n uint32 (low word first, the little-endian layout of the same
bytes), and every op computes on the words: add with carry, 32x32->64 products from 16-bit halves, shifts across
the words, a shift-subtract long division, and conversions to floats rounded once as the native casts round.

One rewrite with a pseudo-op: WORD(x, k) is word k (0 low, 1 high) of the 64-bit value x. The consumers of 64-bit
values (stores, casts, comparisons) are rewritten into expressions over WORDs of their sources, and each WORD is
pushed down through the op it reads until it reaches a load or a constant; no 64-bit node is left."""

from __future__ import annotations
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

WIDE = (dtypes.int64, dtypes.uint64)
U32, I32, F64, B = dtypes.uint32, dtypes.int32, dtypes.float64, dtypes.bool
Pair = tuple[UOp, UOp]  # (low word, high word), both uint32
MASK = 0xFFFFFFFF
FRESH_RANGE_IDS = 1 << 20  # added to a range's id for its copy (a max's second loop): above any lowerer's id


class WideIntError(NotImplementedError):
    """A 64-bit operation the word-pair emulation cannot express."""


def _c(v: int, dt: DType = U32) -> UOp:
    return UOp.const(dt, v & MASK if dt is U32 else v)


def _op(op: Ops, dt: DType, *src: UOp) -> UOp:
    return UOp(op, dt, src)


def _u(op: Ops, a: UOp, b: UOp | int) -> UOp:
    return _op(op, a.dtype, a, b if isinstance(b, UOp) else _c(b, a.dtype))


def _lt(a: UOp, b: UOp | int) -> UOp:
    return _op(Ops.CMPLT, B, a, b if isinstance(b, UOp) else _c(b, a.dtype))


def _eq(a: UOp, b: UOp | int) -> UOp:
    return _op(Ops.CMPEQ, B, a, b if isinstance(b, UOp) else _c(b, a.dtype))


def _where(c: UOp, a: UOp, b: UOp) -> UOp:
    return _op(Ops.WHERE, a.dtype, c, a, b)


def _not(x: UOp) -> UOp:
    return _op(Ops.CMPEQ, B, x, UOp.const(B, False))


def _pwhere(c: UOp, a: Pair, b: Pair) -> Pair:
    return _where(c, a[0], b[0]), _where(c, a[1], b[1])


def words(x: UOp) -> Pair:
    return UOp(Ops.WORD, U32, (x,), 0), UOp(Ops.WORD, U32, (x,), 1)


def const_pair(v: int) -> Pair:
    return _c(v), _c(v >> 32)


# ---- pair arithmetic (modulo 2**64)


def add(a: Pair, b: Pair) -> Pair:
    lo = _u(Ops.ADD, a[0], b[0])
    return lo, _u(Ops.ADD, _u(Ops.ADD, a[1], b[1]), _lt(lo, a[0]).cast(U32))


def neg(a: Pair) -> Pair:
    return add((_u(Ops.XOR, a[0], MASK), _u(Ops.XOR, a[1], MASK)), const_pair(1))


def _mulhi32(x: UOp, y: UOp) -> UOp:
    """The high word of the 64-bit product of two words, from products of 16-bit halves (none overflows a word)."""
    x0, x1, y0, y1 = _u(Ops.AND, x, 0xFFFF), _u(Ops.SHR, x, 16), _u(Ops.AND, y, 0xFFFF), _u(Ops.SHR, y, 16)
    p00, p01, p10, p11 = (_u(Ops.MUL, a, b) for a, b in ((x0, y0), (x0, y1), (x1, y0), (x1, y1)))
    mid = _u(Ops.ADD, _u(Ops.ADD, _u(Ops.SHR, p00, 16), _u(Ops.AND, p01, 0xFFFF)), _u(Ops.AND, p10, 0xFFFF))
    high = _u(Ops.ADD, _u(Ops.ADD, p11, _u(Ops.SHR, p01, 16)), _u(Ops.SHR, p10, 16))
    return _u(Ops.ADD, high, _u(Ops.SHR, mid, 16))


def mul(a: Pair, b: Pair) -> Pair:
    cross = _u(Ops.ADD, _u(Ops.MUL, a[0], b[1]), _u(Ops.MUL, a[1], b[0]))
    return _u(Ops.MUL, a[0], b[0]), _u(Ops.ADD, _mulhi32(a[0], b[0]), cross)


def ult(a: Pair, b: Pair) -> UOp:
    return _op(Ops.OR, B, _lt(a[1], b[1]), _op(Ops.AND, B, _eq(a[1], b[1]), _lt(a[0], b[0])))


def lt(a: Pair, b: Pair, signed: bool) -> UOp:
    if not signed:
        return ult(a, b)
    ha, hb = a[1].cast(I32), b[1].cast(I32)
    return _op(Ops.OR, B, _lt(ha, hb), _op(Ops.AND, B, _eq(a[1], b[1]), _lt(a[0], b[0])))


def eq(a: Pair, b: Pair) -> UOp:
    return _op(Ops.AND, B, _eq(a[0], b[0]), _eq(a[1], b[1]))


def is_negative(a: Pair) -> UOp:
    return _lt(a[1].cast(I32), 0)


def shl(a: Pair, n: UOp) -> Pair:
    # both branches are computed: shift counts stay below 32, so neither branch shifts out of range
    s = _u(Ops.AND, n, 31)
    carried = _u(Ops.SHR, _u(Ops.SHR, a[0], 1), _u(Ops.XOR, s, 31))  # lo >> (32 - s), 0 when s is 0
    small = (_u(Ops.SHL, a[0], s), _u(Ops.OR, _u(Ops.SHL, a[1], s), carried))
    return _pwhere(_lt(n, 32), small, (_c(0), _u(Ops.SHL, a[0], s)))


def shr(a: Pair, n: UOp, signed: bool) -> Pair:
    s = _u(Ops.AND, n, 31)
    carried = _u(Ops.SHL, _u(Ops.SHL, a[1], 1), _u(Ops.XOR, s, 31))  # hi << (32 - s), 0 when s is 0
    low = _u(Ops.OR, _u(Ops.SHR, a[0], s), carried)
    if signed:
        hi = a[1].cast(I32)
        shifted, fill = _u(Ops.SHR, hi, s.cast(I32)).cast(U32), _u(Ops.SHR, hi, 31).cast(U32)
    else:
        shifted, fill = _u(Ops.SHR, a[1], s), _c(0)
    return _pwhere(_lt(n, 32), (low, shifted), (shifted, fill))


def udivmod(a: Pair, b: Pair) -> tuple[Pair, Pair]:
    """Shift-subtract long division, one quotient bit a step; a zero divisor gives 0 and 0, as the native ops do."""
    q, r = [_c(0), _c(0)], const_pair(0)
    for i in reversed(range(64)):
        out = _u(Ops.SHR, r[1], 31)  # the bit shifted out: r was at least 2**63, so r << 1 | bit is past b
        bit = _u(Ops.AND, _u(Ops.SHR, a[i // 32], i % 32), 1)
        r = (_u(Ops.OR, _u(Ops.SHL, r[0], 1), bit), _u(Ops.OR, _u(Ops.SHL, r[1], 1), _u(Ops.SHR, r[0], 31)))
        take = _op(Ops.OR, B, _eq(out, 1), _not(ult(r, b)))
        r = _pwhere(take, add(r, neg(b)), r)
        q[i // 32] = _u(Ops.OR, q[i // 32], _u(Ops.SHL, take.cast(U32), i % 32))
    zero = eq(b, const_pair(0))
    return _pwhere(zero, const_pair(0), (q[0], q[1])), _pwhere(zero, const_pair(0), r)


def divmod_pair(a: Pair, b: Pair, signed: bool) -> tuple[Pair, Pair]:
    """C's truncating division: the quotient's sign is the operands' signs combined, the remainder's is a's."""
    if not signed:
        return udivmod(a, b)
    na, nb = is_negative(a), is_negative(b)
    q, r = udivmod(_pwhere(na, neg(a), a), _pwhere(nb, neg(b), b))
    return _pwhere(_op(Ops.CMPNE, B, na, nb), neg(q), q), _pwhere(na, neg(r), r)


# ---- conversions


def from_value(x: UOp) -> Pair:
    """The words of a narrower integer, bool or float converted to a 64-bit integer (floats truncate toward 0)."""
    dt = x.dtype
    if dtypes.is_float(dt):
        t = _op(Ops.TRUNC, F64, x.cast(F64))
        y = _op(Ops.MUL, F64, t, _c(2.0**-32, F64))
        high = _op(Ops.ADD, F64, _op(Ops.TRUNC, F64, y), _op(Ops.NEG, F64, _lt(y, _op(Ops.TRUNC, F64, y)).cast(F64)))
        low = _op(Ops.ADD, F64, t, _op(Ops.NEG, F64, _op(Ops.MUL, F64, high, _c(2.0**32, F64))))  # exact, in [0, 2**32)
        return low.cast(U32), _where(_lt(high, _c(0.0, F64)), high.cast(I32).cast(U32), high.cast(U32))
    if dt is B or dtypes.is_unsigned(dt):
        return x.cast(U32), _c(0)
    return x.cast(U32), _where(_lt(x, 0), _c(MASK), _c(0))


def to_float64(a: Pair, signed: bool) -> UOp:
    # the high word times 2**32 is exact, the low word is exact: their sum rounds once, as the native cast rounds
    high = (a[1].cast(I32) if signed else a[1]).cast(F64)
    return _op(Ops.ADD, F64, _op(Ops.MUL, F64, high, _c(2.0**32, F64)), a[0].cast(F64))


def to_value(a: Pair, dt: DType, signed: bool) -> UOp:
    """The 64-bit value converted to dt (narrower integers keep the low bits, floats round to nearest even)."""
    if dt is B:
        return _op(Ops.CMPNE, B, _u(Ops.OR, a[0], a[1]), _c(0))
    if not dtypes.is_float(dt):
        return a[0].cast(dt)
    if dt is not dtypes.float32:
        return to_float64(a, signed).cast(dt)  # float64 itself; half overflows long before float64 rounds
    # past 2**53 the float64 sum would round before float32 does: fold the low 12 bits into one sticky bit (below
    # float32's rounding bit, which is at bit 29 or higher there), so the sum is exact and float32 rounds once
    high = a[1].cast(I32) if signed else a[1]
    big = _lt(_c(2**21 - 1, high.dtype), high)
    if signed:
        big = _op(Ops.OR, B, big, _lt(high, -(2**21)))
    sticky = _where(_op(Ops.CMPNE, B, _u(Ops.AND, a[0], 0xFFF), _c(0)), _c(0x800), _c(0))
    low = _where(big, _u(Ops.OR, _u(Ops.AND, a[0], ~0xFFF), sticky), a[0])
    return to_float64((low, a[1]), signed).cast(dt)


# ---- the rewrite


def _wide_buffer(g: UOp) -> UOp:
    index, size = g.arg
    if size * 2 >= 2**31:
        raise WideIntError(f"EMULATED_DTYPES: a {g.dtype} buffer of {size} elements needs 64-bit indexing")
    return UOp(Ops.DEFINE_GLOBAL, U32, (), (index, size * 2))


def _word_index(idx: UOp, k: int) -> UOp:
    return _op(Ops.ADD, idx.dtype, _op(Ops.MUL, idx.dtype, idx, _c(2, idx.dtype)), _c(k, idx.dtype))


def _reduce(x: UOp) -> Pair:
    value, ranges = x.src[0], x.src[1:]
    lo, hi = words(value)
    if x.arg is Ops.ADD:
        # the low words' sum needs more than 32 bits: sum slices of them narrow enough that no slice's sum overflows
        trips = prod(r.src[0].vmax for r in ranges)
        width = max(w for w in range(1, 17) if trips * ((1 << w) - 1) < 2**32 or w == 1)
        if trips * ((1 << width) - 1) >= 2**32:
            raise WideIntError(f"EMULATED_DTYPES: a {x.dtype} sum of {trips} terms is too long to emulate")
        total = (_c(0), UOp(Ops.REDUCE, U32, (hi, *ranges), Ops.ADD))
        for shift in range(0, 32, width):
            part = UOp(Ops.REDUCE, U32, (_u(Ops.AND, _u(Ops.SHR, lo, shift), (1 << width) - 1), *ranges), Ops.ADD)
            total = add(total, shl((part, _c(0)), _c(shift)))
        return total
    if x.arg is Ops.MAX:
        # the largest high word first, then the largest low word among the terms with that high word (second loop)
        signed = x.dtype is dtypes.int64
        key = hi.cast(I32) if signed else hi
        top = UOp(Ops.REDUCE, key.dtype, (key, *ranges), Ops.MAX)
        fresh = {r: r.replace(arg=(r.arg[0] + FRESH_RANGE_IDS, r.arg[1])) for r in ranges}
        again = graph_rewrite(value, PatternMatcher([(UPat(Ops.RANGE, name="r"), lambda r: fresh.get(r))]))
        lo2, hi2 = words(again)
        key2 = hi2.cast(I32) if signed else hi2
        low = UOp(Ops.REDUCE, U32, (_where(_eq(key2, top), lo2, _c(0)), *fresh.values()), Ops.MAX)
        return low, top.cast(U32)
    raise WideIntError(f"EMULATED_DTYPES: a {x.arg.name} reduce over {x.dtype} is not emulated")


def pair_of(x: UOp) -> Pair:
    """The words of a 64-bit node, as expressions over the WORDs of its sources."""
    signed = x.dtype is dtypes.int64
    if x.op is Ops.CONST:
        return const_pair(int(x.arg))
    if x.op is Ops.LOAD:
        g = _wide_buffer(x.src[0])
        return tuple(UOp(Ops.LOAD, U32, (g, _word_index(x.src[1], k), *x.src[2:])) for k in (0, 1))  # type: ignore
    if x.op in (Ops.CAST, Ops.BITCAST):
        src = x.src[0]
        if src.dtype in WIDE:
            return words(src)
        if x.op is Ops.BITCAST:
            raise WideIntError(f"EMULATED_DTYPES: a bitcast from {src.dtype} to {x.dtype} is not emulated")
        return from_value(src)
    if x.op is Ops.REDUCE:
        return _reduce(x)
    if x.op is Ops.WHERE:
        return _pwhere(x.src[0], words(x.src[1]), words(x.src[2]))
    if x.op is Ops.NEG:
        return neg(words(x.src[0]))
    if x.op in (Ops.SHL, Ops.SHR):
        n = words(x.src[1])[0]
        return shl(words(x.src[0]), n) if x.op is Ops.SHL else shr(words(x.src[0]), n, signed)
    if x.op in GroupOp.Binary and x.op not in GroupOp.Comparison:
        a, b = words(x.src[0]), words(x.src[1])
        if x.op is Ops.ADD:
            return add(a, b)
        if x.op is Ops.MUL:
            return mul(a, b)
        if x.op is Ops.MAX:
            return _pwhere(lt(a, b, signed), b, a)
        if x.op in (Ops.IDIV, Ops.MOD):
            return divmod_pair(a, b, signed)[x.op is Ops.MOD]
        if x.op in (Ops.AND, Ops.OR, Ops.XOR):
            return _u(x.op, a[0], b[0]), _u(x.op, a[1], b[1])
    raise WideIntError(f"EMULATED_DTYPES: {x.op.name} in {x.dtype} is not emulated")


def _store_words(s: UOp) -> tuple[UOp, ...]:
    g, idx, value = s.src
    if g.dtype not in WIDE:
        return (s,)
    wide = _wide_buffer(g)
    return tuple(UOp(Ops.STORE, dtypes.void, (wide, _word_index(idx, k), w)) for k, w in enumerate(words(value)))


def _compare(c: UOp) -> UOp | None:
    a, b = c.src
    if a.dtype not in WIDE:
        return None
    if c.op is Ops.CMPLT:
        return lt(words(a), words(b), a.dtype is dtypes.int64)
    same = eq(words(a), words(b))
    return same if c.op is Ops.CMPEQ else _not(same)


def _convert(c: UOp) -> UOp | None:
    x = c.src[0]
    if x.dtype not in WIDE or c.dtype in WIDE:
        return None
    if c.op is Ops.BITCAST:
        raise WideIntError(f"EMULATED_DTYPES: a bitcast from {x.dtype} to {c.dtype} is not emulated")
    return to_value(words(x), c.dtype, x.dtype is dtypes.int64)


def _sink(s: UOp) -> UOp | None:
    if not any(st.op is Ops.STORE and st.src[0].dtype in WIDE for st in s.src):
        return None
    return s.replace(src=tuple(w for st in s.src for w in _store_words(st)))


pm_wide_words = PatternMatcher(
    [
        (UPat(Ops.WORD, src=(UPat(name="x"),), name="w"), lambda w, x: pair_of(x)[w.arg]),
        (UPat(GroupOp.Comparison, name="c"), _compare),
        (UPat((Ops.CAST, Ops.BITCAST), name="c"), _convert),
        (UPat(Ops.SINK, name="s"), _sink),
    ]
)


def emulate_wide_ints(kernel: UOp) -> UOp:
    """The kernel with every int64/uint64 value held as two uint32 words (see the module's docstring)."""
    if not any(u.dtype in WIDE for u in kernel.toposort()):
        return kernel
    kernel = graph_rewrite(kernel, pm_wide_words)
    if left := next((u for u in kernel.toposort() if u.dtype in WIDE), None):
        raise WideIntError(f"EMULATED_DTYPES: {left.op.name} in {left.dtype} is not emulated")
    return kernel


def wide_param(u: UOp) -> UOp:
    """A kernel parameter as the emulation gives it: a buffer of 64-bit ints is a buffer of twice as many words."""
    return _wide_buffer(u) if u.op is Ops.DEFINE_GLOBAL and u.dtype in WIDE else u
