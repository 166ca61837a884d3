"""Value ranges (vmin/vmax) of integer UOps and the simplification rules that use them."""

from __future__ import annotations
import math
from typing import Any
from fusegrad.dtype import dtypes
from fusegrad.uop.alu import cast_value, exec_alu
from fusegrad.uop.kernel import core as kernel_core
from fusegrad.uop.ops import GroupOp, Ops, UOp, symbolic_hooks
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def value_range(u: UOp) -> tuple[Any, Any]:
    """Inclusive bounds of the values u can take; the dtype's own bounds when nothing better is known."""
    dt = u.dtype
    if u.op is Ops.CONST:
        return (u.arg, u.arg)
    if u.op is Ops.RANGE:
        return (0, u.src[0].vmax - 1)
    if u.op is Ops.DEFINE_VAR:
        return (u.arg[1], u.arg[2])
    if u.op is Ops.BIND:
        return u.src[0].vmin, u.src[0].vmax  # the variable's range: what is proven holds for every value it takes
    if not (dtypes.is_int(dt) or dt is dtypes.bool):
        return (dt.min, dt.max)
    s = u.src
    if u.op is Ops.ADD:
        return _clamp(u, s[0].vmin + s[1].vmin, s[0].vmax + s[1].vmax)
    if u.op is Ops.NEG and dt is not dtypes.bool:
        return _clamp(u, -s[0].vmax, -s[0].vmin)
    if u.op is Ops.MUL:
        prods = [a * b for a in (s[0].vmin, s[0].vmax) for b in (s[1].vmin, s[1].vmax)]
        return _clamp(u, min(prods), max(prods))
    if u.op is Ops.IDIV and s[1].vmin > 0:
        # trunc division by a positive divisor is monotonic in the dividend
        lo, hi = s[0].vmin, s[0].vmax
        cands = [_trunc_div(x, d) for x in (lo, hi) for d in (s[1].vmin, s[1].vmax)]
        return (min(cands), max(cands))
    if u.op is Ops.MOD and s[1].vmin > 0:
        m = s[1].vmax - 1
        if s[0].vmin >= 0:
            return (0, min(s[0].vmax, m)) if s[0].vmax >= s[1].vmin else (s[0].vmin, s[0].vmax)
        return (-m if s[0].vmin < 0 else 0, m if s[0].vmax > 0 else 0)
    if u.op is Ops.MAX:
        return (max(s[0].vmin, s[1].vmin), max(s[0].vmax, s[1].vmax))
    if u.op is Ops.WHERE and s[0].op is Ops.CMPLT and s[0].src == (s[1], s[2]):
        # where(a < b, a, b) is min(a, b): an overlapping last tile's start stays below the axis's end
        return (min(s[1].vmin, s[2].vmin), min(s[1].vmax, s[2].vmax))
    if u.op is Ops.WHERE:
        if s[0].vmin == s[0].vmax:
            return (s[1].vmin, s[1].vmax) if s[0].vmin else (s[2].vmin, s[2].vmax)
        return (min(s[1].vmin, s[2].vmin), max(s[1].vmax, s[2].vmax))
    if u.op is Ops.CMPLT:
        if s[0].vmax < s[1].vmin:
            return (True, True)
        if s[0].vmin >= s[1].vmax:
            return (False, False)
        return (False, True)
    if u.op is Ops.CMPEQ or u.op is Ops.CMPNE:
        if s[0].vmax < s[1].vmin or s[0].vmin > s[1].vmax:
            return (u.op is Ops.CMPNE,) * 2
        if s[0].vmin == s[0].vmax == s[1].vmin == s[1].vmax:
            return (u.op is Ops.CMPEQ,) * 2
        return (False, True)
    if dt is dtypes.bool and u.op in (Ops.AND, Ops.OR) and all(x.dtype is dtypes.bool for x in s):
        return (exec_alu(u.op, dt, [s[0].vmin, s[1].vmin]), exec_alu(u.op, dt, [s[0].vmax, s[1].vmax]))
    if dt is dtypes.bool and u.op is Ops.NEG:
        return (not s[0].vmax, not s[0].vmin)
    if u.op is Ops.CAST and (dtypes.is_int(s[0].dtype) or s[0].dtype is dtypes.bool):
        return _clamp(u, int(s[0].vmin), int(s[0].vmax))
    return (dt.min, dt.max)


def range_sources(u: UOp) -> tuple[UOp, ...]:
    """The sources value_range reads the range of (UOp caches ranges sources first, without recursion)."""
    if u.op in (Ops.RANGE, Ops.BIND):
        return u.src[:1]
    if u.op in (Ops.CONST, Ops.DEFINE_VAR) or not (dtypes.is_int(u.dtype) or u.dtype is dtypes.bool):
        return ()
    return u.src if u.op in GroupOp.ALU or u.op is Ops.CAST else ()


def _clamp(u: UOp, lo: Any, hi: Any) -> tuple[Any, Any]:
    # a range that could wrap around the dtype is unknown
    return (lo, hi) if u.dtype.min <= lo and hi <= u.dtype.max else (u.dtype.min, u.dtype.max)


def _is_intlike(u: UOp) -> bool:
    return dtypes.is_int(u.dtype) or u.dtype is dtypes.bool


def fold_constants(alu: UOp) -> UOp | None:
    if not all(s.op is Ops.CONST for s in alu.src):
        return None
    vals = [s.arg for s in alu.src]
    if alu.op is Ops.WHERE:
        return alu.src[1] if vals[0] else alu.src[2]
    return UOp.const(alu.dtype, exec_alu(alu.op, alu.dtype, vals))


def fold_by_range(x: UOp) -> UOp | None:
    """An integer node whose range is one value is that value."""
    if x.op is Ops.CONST or x.op is Ops.DEFINE_VAR or not _is_intlike(x):
        return None
    if x.op not in GroupOp.ALU and x.op is not Ops.CAST:
        return None
    return UOp.const(x.dtype, x.vmin) if x.vmin == x.vmax else None


def linear_terms(x: UOp, *, negations: bool = False, constant_left: bool = False) -> tuple[list[tuple[int, UOp]], int]:
    """x as sum(coef * term) + const: sums and products with a constant on the right are flattened, every other node
    is a term (left-to-right order, duplicates kept; an explicit stack, as a sum can be long). negations: an integer
    NEG is flattened too (the signed terms of flipped indices). constant_left: so is a product with the constant on
    the left (sizes as users write them, `2 * v`; the simplifier's rules see constants moved right already)."""
    terms: list[tuple[int, UOp]] = []
    const = 0
    stack: list[tuple[int, UOp]] = [(1, x)]
    while stack:
        k, u = stack.pop()
        if u.op is Ops.CONST:
            const += k * u.arg
        elif u.op is Ops.ADD:
            stack.extend(((k, u.src[1]), (k, u.src[0])))
        elif u.op is Ops.MUL and u.src[1].op is Ops.CONST:
            stack.append((k * u.src[1].arg, u.src[0]))
        elif constant_left and u.op is Ops.MUL and u.src[0].op is Ops.CONST:
            stack.append((k * u.src[0].arg, u.src[1]))
        elif negations and u.op is Ops.NEG and dtypes.is_int(u.dtype):
            stack.append((-k, u.src[0]))
        else:
            terms.append((k, u))
    return terms, const


def build_sum(terms: list[tuple[int, UOp]], const: int, like: UOp) -> UOp:
    out: UOp | None = None
    for k, t in terms:
        if k == 0:
            continue
        term = t if k == 1 else t * UOp.const(like.dtype, k)
        out = term if out is None else out + term
    if out is None:
        return UOp.const(like.dtype, const)
    return out + UOp.const(like.dtype, const) if const != 0 else out


def fold_divmod(d: UOp, x: UOp, c: UOp) -> UOp | None:
    """(sum of k*t) // c and % c with every part non-negative: each k splits into q*c + r, the q*t parts leave the
    division, and what remains is dropped from // (or kept whole by %) when its range is below c."""
    cv = c.arg
    if cv <= 0 or x.vmin < 0:
        return None
    terms, const = linear_terms(x)
    if not terms or any(t.vmin < 0 for _, t in terms):
        return None
    moved = [(k // cv, t) for k, t in terms if k // cv != 0]
    keep = [(k % cv, t) for k, t in terms if k % cv != 0]
    moved_const, rest_const = const // cv, const % cv
    rest = build_sum(keep, rest_const, x)
    if rest.vmin < 0:
        return None
    changed = bool(moved) or moved_const != 0 or any(k >= cv for k, _ in terms)
    if d.op is Ops.MOD:
        if rest.vmax < cv:
            return rest
        return rest % c if changed else None
    if rest.vmax < cv:
        return build_sum(moved, moved_const, x)
    return build_sum(moved + [(1, rest // c)], moved_const, x) if changed else None


def reorder_const_add(x: UOp, c1: UOp, y: UOp) -> UOp | None:
    """(x + c) + y -> (x + y) + c keeps constants outermost so they meet and fold."""
    return None if y.op is Ops.CONST else (x + y) + c1


def combine_like_terms(a: UOp) -> UOp | None:
    terms, const = linear_terms(a)
    merged: dict[UOp, int] = {}
    for k, t in terms:
        merged[t] = merged.get(t, 0) + k
    if len(merged) == len(terms):
        return None
    return build_sum([(k, t) for t, k in merged.items()], const, a)


_INT = (
    dtypes.int8,
    dtypes.int16,
    dtypes.int32,
    dtypes.int64,
    dtypes.uint8,
    dtypes.uint16,
    dtypes.uint32,
    dtypes.uint64,
)
_x, _y, _c1, _c2 = UPat.var("x"), UPat.var("y"), UPat.cvar("c1"), UPat.cvar("c2")
_ix = UPat.var("x", dtype=_INT)

pm_symbolic = PatternMatcher(
    [
        (UPat(GroupOp.ALU, name="alu"), fold_constants),
        (
            UPat(Ops.CAST, src=(UPat(Ops.CONST, name="c"),), name="cast"),
            lambda cast, c: UOp.const(cast.dtype, cast_value(c.arg, cast.dtype)),
        ),
        (UPat(GroupOp.ALU | {Ops.CAST}, name="x"), fold_by_range),
        # identities (x*0 only for ints: inf*0 is nan; x+0 only for ints: -0.0+0 is +0.0)
        (_ix + 0, lambda x: x),
        (_x * 1, lambda x: x),
        (_ix * 0, lambda x: x.const_like(0)),
        (_x // 1, lambda x: x),
        (_ix % 1, lambda x: x.const_like(0)),
        (UPat(Ops.MUL, src=[_x, UPat.const(None, 1.0)]), lambda x: x if dtypes.is_float(x.dtype) else None),
        (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(_x,)),)), lambda x: x),
        (UPat(Ops.CAST, name="c", src=(_x,)), lambda c, x: x if c.dtype == x.dtype else None),
        # constants move right and re-associate
        (UPat(Ops.ADD, src=(UPat.cvar("c1"), _x)), lambda c1, x: x + c1 if x.op is not Ops.CONST else None),
        (UPat(Ops.MUL, src=(UPat.cvar("c1"), _x)), lambda c1, x: x * c1 if x.op is not Ops.CONST else None),
        (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(_ix, _c1)), _c2)), lambda x, c1, c2: x + (c1.arg + c2.arg)),
        (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(_ix, _c1)), _c2)), lambda x, c1, c2: x * (c1.arg * c2.arg)),
        (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(_ix, _c1)), _y)), reorder_const_add),
        (UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(_ix, _c1)), _c2)), lambda x, c1, c2: x * c2 + (c1.arg * c2.arg)),
        (UPat(Ops.ADD, dtype=_INT, name="a"), combine_like_terms),
        # division and modulo folding with value ranges
        (UPat((Ops.IDIV, Ops.MOD), name="d", src=(_ix, _c1)), lambda d, x, c1: fold_divmod(d, x, c1)),
        (
            UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(_ix, _c1)), _c2)),
            lambda x, c1, c2: x // (c1.arg * c2.arg) if x.vmin >= 0 and c1.arg > 0 and c2.arg > 0 else None,
        ),
        (
            UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(_ix, _c1)), _c2)),
            lambda x, c1, c2: x % c2 if x.vmin >= 0 and c2.arg > 0 and c1.arg % c2.arg == 0 else None,
        ),
        (
            UPat(Ops.IDIV, src=(UPat(Ops.MUL, src=(_ix, _c1)), _c2)),
            lambda x, c1, c2: x * (c1.arg // c2.arg) if c2.arg != 0 and c1.arg % c2.arg == 0 else None,
        ),
        (
            UPat(Ops.MOD, src=(UPat(Ops.MUL, src=(_ix, _c1)), _c2)),
            lambda x, c1, c2: x.const_like(0) if c2.arg != 0 and c1.arg % c2.arg == 0 else None,
        ),
        # an integer compared with itself (gcc would also warn about the tautology); floats keep x == x as a NaN test
        (UPat(Ops.CMPEQ, src=(_ix, _ix)), lambda x: UOp.const(dtypes.bool, True)),
        (UPat((Ops.CMPNE, Ops.CMPLT), src=(_ix, _ix)), lambda x: UOp.const(dtypes.bool, False)),
        # boolean algebra and selects
        (UPat(Ops.AND, dtype=dtypes.bool, src=[_x, UPat.const(dtypes.bool, True)]), lambda x: x),
        (UPat(Ops.AND, dtype=dtypes.bool, src=[_x, UPat.const(dtypes.bool, False)]), lambda x: x.const_like(False)),
        (UPat(Ops.OR, dtype=dtypes.bool, src=[_x, UPat.const(dtypes.bool, False)]), lambda x: x),
        (UPat(Ops.OR, dtype=dtypes.bool, src=[_x, UPat.const(dtypes.bool, True)]), lambda x: x.const_like(True)),
        (UPat(Ops.AND, dtype=dtypes.bool, src=(_x, _x)), lambda x: x),
        (UPat(Ops.WHERE, src=(UPat.var(), _x, _x)), lambda x: x),
        # x + c < k  ->  x < k - c, so pad/shrink bounds meet the ranges they test
        (UPat(Ops.CMPLT, src=(UPat(Ops.ADD, src=(_ix, _c1)), _c2)), lambda x, c1, c2: x < (c2.arg - c1.arg)),
    ]
)


# ---- division and modulo folded by value range (kept apart from the rules above). Indices of flipped or transposed
# views (a convolution's input gradient reads its kernel flipped and its channels swapped per group) are sums with
# negated terms, which fold_divmod leaves alone: here each coefficient is split into a multiple of the divisor and the
# nearest remainder (negative when nearer), and the division folds when the remainders' range, shifted by a multiple
# of the divisor, fits in one quotient.


def fold_divmod_by_range(d: UOp, x: UOp, c: UOp) -> UOp | None:
    """x // c and x % c for x >= 0 and c > 0 when x = c*Q + R with R's range inside one multiple of c: Q + m and
    R - c*m, with no division left."""
    cv = c.arg
    if cv <= 0 or x.vmin < 0:
        return None
    terms, const = linear_terms(x, negations=True)
    moved, rest = [], []
    for k, t in terms:
        q, r = divmod(k, cv)
        if 2 * r > cv:
            q, r = q + 1, r - cv
        if q:
            moved.append((q, t))
        if r:
            rest.append((r, t))
    if not rest and not moved:
        return None
    rest_sum = build_sum(rest, 0, x)
    lo, hi = rest_sum.vmin, rest_sum.vmax
    if lo <= x.dtype.min or hi >= x.dtype.max:  # a range that is not known
        return None
    m = (lo + const) // cv
    if hi + const - cv * m >= cv:
        return None
    return build_sum(moved, m, x) if d.op is Ops.IDIV else build_sum(rest, const - cv * m, x)


def _shared_factors(cv: int, coefficients: list[int], most: int = 1 << 12) -> list[int]:
    """The factors g > 1 of cv that divide some coefficient, largest first (a factor dividing none leaves nothing to
    move out of the division); of a gcd past most**2 only the gcd and its factors up to most (a randint's division
    by 2**40 is not walked factor by factor)."""
    found: set[int] = set()
    for k in coefficients:
        g = math.gcd(cv, k)
        found.add(g)
        for f in range(2, min(math.isqrt(g), most) + 1):
            if g % f == 0:
                found.update((f, g // f))
    return sorted((g for g in found if g > 1), reverse=True)


def fold_divmod_by_factor(d: UOp, x: UOp, c: UOp) -> UOp | None:
    """x // c and x % c for x >= 0 when, for a factor g of c, the terms whose coefficients g does not divide (with the
    constant) stay in [0, g): x // c = (x's multiples of g, over g) // (c / g), and x % c = that % (c / g) * g plus
    the rest. A pool's window split of a flattened row index: (w + 8*h) // 16 is h // 2 for w < 8."""
    cv = c.arg
    if cv <= 1 or x.vmin < 0:
        return None
    terms, const = linear_terms(x)
    if not terms or any(t.vmin < 0 for _, t in terms):
        return None
    for g in _shared_factors(cv, [k for k, _ in terms]):
        big = [(k // g, t) for k, t in terms if k % g == 0]
        small = [(k, t) for k, t in terms if k % g]
        # one term and a constant (an upcast lane's offset) too: (8*i + 3) % 32 is i % 4 * 8 + 3, (8*i) // 32 is i // 4
        if not big or any(k < 0 for k, _ in small):
            continue
        rest = build_sum(small, const % g, x)
        if rest.vmin < 0 or rest.vmax >= g:
            continue
        top = build_sum(big, const // g, x)
        if d.op is Ops.IDIV:
            return top if g == cv else top // (cv // g)
        return rest if g == cv else (top % (cv // g)) * g + rest
    return None


def recombine_divmod(a: UOp) -> UOp | None:
    """k * (x % c) + k*c * (x // c) -> k * x: a split index put back together (a window's position within and across
    windows). Division and remainder both truncate, so this holds for a negative x too (a cat piece's gated index)."""
    terms, const = linear_terms(a)
    found = {(t.src[0], t.src[1].arg): k for k, t in terms if t.op is Ops.MOD and t.src[1].op is Ops.CONST}
    if not found:
        return None
    for (x, cv), k in found.items():
        if cv <= 0:
            continue
        for i, (kq, tq) in enumerate(terms):
            if tq.op is Ops.IDIV and tq.src[0] is x and tq.src[1].op is Ops.CONST and tq.src[1].arg == cv:
                if kq == k * cv:
                    rest = [(kk, tt) for j, (kk, tt) in enumerate(terms) if j != i]
                    rest = [
                        (kk, x) if tt.op is Ops.MOD and tt.src[0] is x and tt.src[1].arg == cv else (kk, tt)
                        for kk, tt in rest
                    ]
                    return build_sum(rest, const, a)
    return None


pm_divmod_by_range = PatternMatcher(
    [
        (UPat((Ops.IDIV, Ops.MOD), name="d", src=(_ix, _c1)), lambda d, x, c1: fold_divmod_by_range(d, x, c1)),
        (UPat((Ops.IDIV, Ops.MOD), name="d", src=(_ix, _c1)), lambda d, x, c1: fold_divmod_by_factor(d, x, c1)),
        (UPat(Ops.ADD, dtype=_INT, name="a"), recombine_divmod),
    ]
)
pm_symbolic = pm_symbolic + pm_divmod_by_range


def simplify(u: UOp) -> UOp:
    return graph_rewrite(u, pm_symbolic)


def sym_eval(u: UOp, env: dict[UOp, Any]) -> Any:
    """Evaluate an expression graph with Python semantics; env gives values of RANGE / DEFINE_VAR leaves."""
    vals: dict[UOp, Any] = {}
    for n in u.toposort(gate=lambda x: x not in env):  # a leaf given a value (a BIND) is not looked into
        if n in env:
            vals[n] = env[n]
        elif n.op is Ops.CONST:
            vals[n] = n.arg
        elif n.op is Ops.CAST:
            vals[n] = cast_value(vals[n.src[0]], n.dtype)
        elif n.op in GroupOp.ALU:
            vals[n] = exec_alu(n.op, n.dtype, [vals[s] for s in n.src])
        else:
            raise ValueError(f"sym_eval cannot evaluate {n.op}")
    return vals[u]


__all__ = ["value_range", "range_sources", "pm_symbolic", "simplify", "sym_eval", "math"]


symbolic_hooks.range_sources, symbolic_hooks.value_range = range_sources, value_range
kernel_core.simplify = simplify  # what UOp.simplify() runs
