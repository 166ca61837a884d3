"""Division and modulo folded by value range (uop/symbolic.py pm_divmod_by_range): simplified expressions evaluate
like the originals for every value of their loops, and the flipped-index case folds away completely."""

import itertools

from hypothesis import given, settings, strategies as st

from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.symbolic import simplify, sym_eval


def loop(i: int, size: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, size),), (i, "global"))


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    coefs=st.lists(st.integers(-30, 30), min_size=3, max_size=3),
    const=st.integers(0, 200),
    divisor=st.integers(1, 13),
    negate=st.booleans(),
)
def test_simplified_divmod_evaluates_like_the_original(sizes, coefs, const, divisor, negate):
    loops = [loop(i, s) for i, s in enumerate(sizes)]
    x = UOp.const(dtypes.int32, const)
    for k, r in zip(coefs, loops):
        x = x + (-(r * k) if negate else r * k)
    for op in (Ops.IDIV, Ops.MOD):
        expr = UOp(op, dtypes.int32, (x, UOp.const(dtypes.int32, divisor)))
        simple = simplify(expr)
        for values in itertools.product(*(range(s) for s in sizes)):
            env = dict(zip(loops, values))
            assert sym_eval(simple, env) == sym_eval(expr, env), (expr, simple, env)


def test_flipped_and_transposed_index_folds_without_division():
    a, b, c = loop(0, 3), loop(1, 3), loop(2, 2)
    # (2 - a) + 3*(2 - b) + 9*c: a flipped 3x3 kernel tap, then split back into (c, row, column)
    flat = (UOp.const(dtypes.int32, 2) - a) + (UOp.const(dtypes.int32, 2) - b) * 3 + c * 9
    parts = [simplify(flat % 3), simplify((flat // 3) % 3), simplify(flat // 9)]
    for p in parts:
        assert not [u for u in p.toposort() if u.op in (Ops.IDIV, Ops.MOD)], p
    for va, vb, vc in itertools.product(range(3), range(3), range(2)):
        env = {a: va, b: vb, c: vc}
        assert [sym_eval(p, env) for p in parts] == [2 - va, 2 - vb, vc]
