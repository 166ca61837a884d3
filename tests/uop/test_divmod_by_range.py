"""Division and modulo folded by value range (uop/symbolic.py pm_divmod_by_range): simplified expressions evaluate
like the originals for every value of their loops, and the flipped-index case folds away completely."""

import itertools

from hypothesis import given, settings, strategies as st

from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.symbolic import simplify, sym_eval


def loop(i: int, size: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, size),), (i, "global"))


@settings(max_examples=100, deadline=None)
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


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=2, max_size=3),
    coefs=st.lists(st.integers(1, 40), min_size=3, max_size=3),
    const=st.integers(0, 40),
    divisor=st.integers(2, 32),
    outer=st.integers(1, 4),
)
def test_divmod_by_a_factor_and_recombined_splits_evaluate_like_the_original(sizes, coefs, const, divisor, outer):
    loops = [loop(i, s) for i, s in enumerate(sizes)]
    x = UOp.const(dtypes.int32, const)
    for k, r in zip(coefs, loops):
        x = x + r * k
    c = UOp.const(dtypes.int32, divisor)
    # a split index put back together, scaled: outer*(x % c) + outer*c*(x // c) is outer*x
    joined = (x % c) * outer + (x // c) * (outer * divisor) + loops[0]
    for expr in (x // c, x % c, (x // c) % 3, joined):
        simple = simplify(expr)
        for values in itertools.product(*(range(s) for s in sizes)):
            env = dict(zip(loops, values))
            assert sym_eval(simple, env) == sym_eval(expr, env), (expr, simple, env)


def test_pool_window_index_folds_to_the_flat_index():
    """A 2x2 pool's backward reads the pooled rows through (h, w) -> (h // 2, h % 2, w // 2, w % 2) of the flattened
    index w + 8*h: put back together, it is the flat index again, with no division left."""
    h, w = loop(0, 8), loop(1, 8)
    x = w + h * 8
    split = (x % 2) + ((x // 2) % 4) * 2 + ((x // 8) % 2) * 8 + ((x // 16) % 4) * 16
    simple = simplify(split)
    assert not [u for u in simple.toposort() if u.op in (Ops.IDIV, Ops.MOD)], simple
    assert simplify((w + h * 8) // 16) is simplify(h // 2)
    for vh, vw in itertools.product(range(8), range(8)):
        assert sym_eval(simple, {h: vh, w: vw}) == vw + 8 * vh


def test_split_index_recombines_when_it_can_be_negative():
    """A cat piece reads its input at gidx - offset, negative where the piece's gate is off: truncated division and
    remainder still give (x % c) + (x // c) * c == x for every sign, so the split folds away there too."""
    g = loop(0, 1000)
    for offset, c in ((300, 256), (16640, 64), (7, 3)):
        x = g - offset
        expr = (x % c) + (x // c) * c
        simple = simplify(expr)
        assert not [u for u in simple.toposort() if u.op in (Ops.IDIV, Ops.MOD)], simple
        for vg in range(0, 1000, 7):
            assert sym_eval(simple, {g: vg}) == sym_eval(expr, {g: vg}) == vg - offset


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 300), coef=st.integers(1, 40), const=st.integers(0, 100), divisor=st.integers(2, 64))
def test_one_scaled_loop_and_a_constant_fold_like_the_original(size, coef, const, divisor):
    i = loop(0, size)
    x = i * coef + const
    for expr in (x // divisor, x % divisor, (x % divisor) // 4):
        simple = simplify(expr)
        for v in range(size):
            assert sym_eval(simple, {i: v}) == sym_eval(expr, {i: v}), (expr, simple, v)


def test_an_upcast_lanes_offset_leaves_the_division():
    """An 8-lane upcast of k in a 4-bit dequantization reads byte (8*g + lane) % 32 + (8*g + lane) // 64 * 32: the
    lane's constant comes out of the division, so the lanes are one contiguous run the renderer can pack."""
    g = loop(0, 96)
    for lane in range(8):
        k = g * 8 + lane
        assert simplify(k // 32) is simplify(g // 4)
        rem = simplify(k % 32)
        offset = [s.arg for s in rem.src if s.op is Ops.CONST] if rem.op is Ops.ADD else [0]
        assert offset == [lane] and not [u for u in rem.toposort() if u.op is Ops.IDIV], rem
        for v in range(96):
            assert sym_eval(rem, {g: v}) == (8 * v + lane) % 32


def test_a_huge_divisor_folds_without_walking_its_factors():
    """A randint over 2**41 values divides by 2**40: the factors tried are those shared with a coefficient, not every
    number below the divisor (that walk never ended)."""
    i = loop(0, 1000)
    for expr in ((i * 2**20) // 2**40, (i * 6 + 1) % (3 * 2**38), (i * 2**30 + 5) // 2**40):
        simple = simplify(expr)
        for v in (0, 1, 999):
            assert sym_eval(simple, {i: v}) == sym_eval(expr, {i: v})
