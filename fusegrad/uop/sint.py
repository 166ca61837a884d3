"""Symbolic sizes: a dim is an int or an integer UOp over variables; these helpers keep ints ints and
keep symbolic dims in one canonical (simplified) form, so equal sizes are the same node."""

from __future__ import annotations
import weakref
from typing import Any, Iterable
from fusegrad.dtype import DType, dtypes
from fusegrad.uop.ops import GroupOp, Ops, UOp, symbolic_hooks
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from fusegrad.uop.symbolic import linear_terms, pm_symbolic, sym_eval

sint = int | UOp

# sizes written by users (`10 - vb`) negate: as a coefficient of -1 the simplifier's linear terms cancel them
pm_sizes = PatternMatcher(
    [(UPat(Ops.NEG, src=(UPat.var("x"),), name="n"), lambda n, x: x * -1 if dtypes.is_int(n.dtype) else None)]
)
pm_canonical = pm_symbolic + pm_sizes
# symbolic size -> its canonical form (None when it is canonical already); shapes ask for the same sizes again and again
_canonical_memo: weakref.WeakKeyDictionary[UOp, Any] = weakref.WeakKeyDictionary()


def Variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.weakint, multiple_of: int = 1) -> UOp:
    """A named symbolic integer with inclusive range [min_val, max_val]; `.bind(value)` gives a bound variable."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"Variable needs a non-empty str name, got {name!r}")
    for what, v in (("min_val", min_val), ("max_val", max_val), ("multiple_of", multiple_of)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"Variable {name!r}: {what} must be an int, got {v!r}")
    if not 0 <= min_val <= max_val < 2**31:
        raise ValueError(f"Variable {name!r} needs 0 <= min_val <= max_val < 2**31, got [{min_val}, {max_val}]")
    if multiple_of < 1:
        raise ValueError(f"Variable {name!r}: multiple_of must be >= 1, got {multiple_of}")
    if dtype is not dtypes.weakint and not dtypes.is_int(dtype):
        raise TypeError(f"Variable {name!r} is an integer, got dtype {dtype!r}")
    # kernels compute sizes and indices in int32 (int64 for huge buffers); a weak int variable is an int32 there
    return UOp(Ops.DEFINE_VAR, dtypes.int32, (), (name, min_val, max_val, multiple_of))


def is_sym(x: Any) -> bool:
    return isinstance(x, UOp)


def canonical(x: sint) -> sint:
    """x simplified; a symbolic value that folds to a constant becomes a plain int."""
    if not isinstance(x, UOp):
        return x
    if (done := _canonical_memo.get(x, x)) is not x:
        return x if done is None else done
    terms, const = linear_terms(x, negations=True, constant_left=True)
    if all(t.op in (Ops.BIND, Ops.DEFINE_VAR) for _, t in terms):  # linear over variables (no //, %, max)
        out = _build_linear(terms, const, x)
    else:
        out = graph_rewrite(x, pm_canonical)
        out = out.arg if out.op is Ops.CONST else out
    _canonical_memo[x] = None if out is x else out  # None: x is canonical (a value of x itself would keep it alive)
    if isinstance(out, UOp):
        _canonical_memo[out] = None
    return out


def _leaf_order(u: UOp) -> tuple:
    var = u.src[0] if u.op is Ops.BIND else u
    return (var.arg, u.src[1].arg if u.op is Ops.BIND else -1)


def _build_linear(terms: list[tuple[int, UOp]], const: int, like: UOp) -> sint:
    """The one form of a linear size: variables in name order times their summed coefficients, then the constant;
    the simplifier leaves it as it is (this is the fast path of `canonical`: shapes are built on every tensor op)."""
    merged: dict[UOp, int] = {}
    for k, leaf in terms:
        merged[leaf] = merged.get(leaf, 0) + k
    out: UOp | None = None
    for leaf in sorted((t for t, k in merged.items() if k), key=_leaf_order):
        k = merged[leaf]
        term = leaf if k == 1 else leaf * UOp.const(like.dtype, k)
        out = term if out is None else out + term
    if out is None:
        return const
    return out + UOp.const(like.dtype, const) if const else out


def _uop(x: sint, like: UOp) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(like.dtype, x)


def sadd(a: sint, b: sint) -> sint:
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return a + b
    like = a if isinstance(a, UOp) else b
    return canonical(_uop(a, like) + _uop(b, like))  # type: ignore[arg-type]


def ssub(a: sint, b: sint) -> sint:
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return a - b
    like = a if isinstance(a, UOp) else b
    # a + b*-1: the simplifier's linear terms see b's coefficient, so (x + 1) - x folds to 1
    return canonical(_uop(a, like) + _uop(b, like) * -1)  # type: ignore[arg-type]


def smul(a: sint, b: sint) -> sint:
    if not isinstance(a, UOp) and not isinstance(b, UOp):
        return a * b
    if isinstance(a, int) and a in (0, 1) or isinstance(b, int) and b in (0, 1):
        return (a if b == 1 else b) if 1 in (a, b) else 0
    like = a if isinstance(a, UOp) else b
    # the symbolic factor first: constants stay on the right, where the simplifier's rules look for them
    x, y = (a, b) if isinstance(a, UOp) else (b, a)
    return canonical(_uop(x, like) * _uop(y, like))  # type: ignore[arg-type]


def sprod(xs: Iterable[sint]) -> sint:
    out: sint = 1
    for x in xs:
        out = smul(out, x)
    return out


def smax(x: sint) -> int:
    """The largest value x can take."""
    return x.vmax if isinstance(x, UOp) else x


def smin(x: sint) -> int:
    return x.vmin if isinstance(x, UOp) else x


def binds_of(x: Any) -> list[UOp]:
    """The BIND nodes below x (a UOp, or a tuple of dims / pairs holding some)."""
    out: dict[UOp, None] = {}
    stack = [x]
    while stack:
        v = stack.pop()
        if isinstance(v, UOp):
            out.update((n, None) for n in v.toposort() if n.op is Ops.BIND)
        elif isinstance(v, tuple):
            stack.extend(v)
    return list(out)


def bound_value(x: sint) -> int:
    """x's value under the values its variables are bound to (AssertionError naming a variable that is not bound)."""
    if not isinstance(x, UOp):
        return x
    env: dict[UOp, Any] = {}
    for n in x.toposort(gate=lambda u: u.op is not Ops.BIND):
        if n.op is Ops.BIND:
            env[n] = n.src[1].arg
        elif n.op is Ops.DEFINE_VAR:
            raise AssertionError(f"Variable {n.arg[0]!r} in {sym_str(x)} is not bound to a value; use .bind(value)")
    return sym_eval(x, env)


def sym_repr(x: UOp) -> str:
    """repr of a variable or symbolic size: its formula, with each bound variable's value."""
    binds = ", ".join(f"{n.src[0].arg[0]}={n.src[1].arg}" for n in binds_of(x))
    if x.op is Ops.DEFINE_VAR:
        return f"Variable({x.arg[0]!r}, {x.arg[1]}, {x.arg[2]})"
    return f"<{sym_str(x)}{' with ' + binds if binds else ''}>"


def shape_str(shape: tuple) -> str:
    """A shape as Python prints a tuple, symbolic sizes by their formula."""
    return "(" + ", ".join(sym_str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


_SYM = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.MAX: "max"}


def sym_str(x: sint) -> str:
    """A readable form of a size: a variable is its name, an expression its formula."""
    if not isinstance(x, UOp):
        return str(x)
    names: dict[UOp, str] = {}
    for n in x.toposort():
        if n.op is Ops.CONST:
            names[n] = str(n.arg)
        elif n.op is Ops.DEFINE_VAR:
            names[n] = n.arg[0]
        elif n.op is Ops.BIND:
            names[n] = names[n.src[0]]
        elif n.op is Ops.NEG:
            names[n] = f"-{names[n.src[0]]}"
        elif n.op is Ops.CAST:
            names[n] = names[n.src[0]]
        elif n.op in _SYM and len(n.src) == 2:
            a, b = (names[s] for s in n.src)
            names[n] = f"max({a}, {b})" if n.op is Ops.MAX else f"({a}{_SYM[n.op]}{b})"
        elif n.op in GroupOp.ALU:
            names[n] = f"{n.op.name.lower()}({', '.join(names[s] for s in n.src)})"
        else:
            names[n] = n.op.name
    return names[x]


__all__ = ["Variable", "sint", "is_sym", "canonical", "sadd", "ssub", "smul", "sprod", "smax", "smin", "binds_of"]


symbolic_hooks.sym_repr, symbolic_hooks.sym_str, symbolic_hooks.variable = sym_repr, sym_str, Variable
symbolic_hooks.sadd, symbolic_hooks.ssub = sadd, ssub
