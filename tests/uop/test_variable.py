"""Variable at the UOp level: construction, bind/unbind, arithmetic and simplification with its range."""

import itertools

import pytest

from fusegrad import Variable
from fusegrad.dtype import dtypes
from fusegrad.schedule.variables import bound_vars
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.sint import bound_value, canonical, sadd, shape_str, smul, ssub, sym_str
from fusegrad.uop.symbolic import simplify, sym_eval


def test_construction_and_attributes():
    v = Variable("i", 1, 10)
    assert v.op is Ops.DEFINE_VAR and v.dtype is dtypes.int32
    assert (v.expr, v.vmin, v.vmax) == ("i", 1, 10)
    assert Variable("i", 1, 10) is v  # hash-consed: the same variable wherever it is built
    assert Variable("i", 1, 11) is not v and Variable("j", 1, 10) is not v
    assert repr(v) == "Variable('i', 1, 10)"


@pytest.mark.parametrize(
    "args, exc, match",
    [
        (("i", 5, 2), ValueError, r"\[5, 2\]"),
        (("i", -1, 2), ValueError, r"\[-1, 2\]"),
        (("i", 0, 2**31), ValueError, "2\\*\\*31"),
        (("i", 0.5, 2), TypeError, "min_val"),
        (("i", 0, True), TypeError, "max_val"),
        (("", 0, 2), TypeError, "name"),
    ],
)
def test_construction_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        Variable(*args)


def test_construction_dtype_and_multiple_of():
    with pytest.raises(TypeError, match="integer"):
        Variable("f", 0, 4, dtype=dtypes.float32)
    with pytest.raises(ValueError, match="multiple_of"):
        Variable("m", 0, 4, multiple_of=0)
    assert Variable("k", 0, 8, dtype=dtypes.int32).vmax == 8


def test_bind_and_unbind():
    v = Variable("i", 1, 10)
    for val in (1, 4, 10):
        b = v.bind(val)
        assert b.op is Ops.BIND and b.unbind() == (v, val)
        # a bound variable keeps the variable's range: what is proven about it holds for every value
        assert (b.vmin, b.vmax, b.expr) == (1, 10, "i")
    assert v.bind(4) is v.bind(4)
    assert repr(v.bind(4)) == "<i with i=4>"


@pytest.mark.parametrize("val, match", [(0, r"bound to 0, outside its range \[1, 10\]"), (11, r"11.*\[1, 10\]")])
def test_bind_out_of_range(val, match):
    with pytest.raises(AssertionError, match=match):
        Variable("i", 1, 10).bind(val)


def test_bind_errors():
    m = Variable("m", 0, 32, multiple_of=4)
    assert m.bind(8).unbind()[1] == 8
    with pytest.raises(AssertionError, match="6, not a multiple of 4"):
        m.bind(6)
    with pytest.raises(AssertionError, match="binds an int"):
        m.bind(4.0)
    with pytest.raises(AssertionError, match="unbind needs a bound variable"):
        m.unbind()
    with pytest.raises(AssertionError, match="only a Variable can be bound"):
        m.bind(4).bind(4)


def test_arithmetic_gives_symbolic_sizes():
    v = Variable("i", 1, 10)
    vb = v.bind(3)
    assert sym_str(vb * 4) == "(i*4)" and bound_value(vb * 4) == 12
    assert sym_str(vb + 1) == "(i+1)" and bound_value(vb + 1) == 4
    assert (sadd(vb, 1).vmin, sadd(vb, 1).vmax) == (2, 11)
    expr = smul(sadd(vb, 1), 4)  # (i+1)*4 -> i*4 + 4
    assert sym_str(expr) == "((i*4)+4)" and (expr.vmin, expr.vmax) == (8, 44) and bound_value(expr) == 16
    # canonical forms: equal sizes are one node, and sizes that cancel fold to ints
    assert sadd(vb, 1) is canonical(vb + 1)
    assert ssub(sadd(vb, 1), vb) == 1
    assert sadd(vb, 10 - vb) == 10  # `10 - vb` as users write it (a NEG) cancels too
    assert smul(smul(vb, 2), 2) is smul(vb, 4)
    assert smul(vb, 1) is vb and smul(vb, 0) == 0
    assert shape_str((4, vb + 1)) == "(4, (i+1))" and shape_str((vb,)) == "(i,)"


def test_bound_value_needs_bound_variables():
    v = Variable("i", 1, 10)
    with pytest.raises(AssertionError, match="'i' in \\(i\\+1\\) is not bound"):
        bound_value(v + 1)


def test_simplification_uses_variable_range():
    v = Variable("i", 0, 12)
    assert simplify((v + 3) // 16).arg == 0  # v + 3 < 16 for every v in range
    assert simplify(v % 16) is v
    assert simplify(v < 13).arg is True and simplify(v < 0).arg is False
    assert simplify((v * 4 + 2) // 4) is v
    assert simplify((v * 4 + 2) % 4).arg == 2
    assert simplify(v.bind(5) // 13).arg == 0  # a bound variable is simplified with the range, not its value
    w = Variable("w", 0, 100)
    assert simplify((w + 3) // 16).op is Ops.IDIV  # not provable over w's range: kept


def test_simplified_expressions_match_for_every_value():
    v, w = Variable("a", 0, 9), Variable("b", 1, 5)
    exprs = [
        (v * 6 + w * 3 + 4) // 3,
        (v * 6 + w * 3 + 4) % 3,
        ((v + 1) * 4 - v) // 2,
        (v * 8 + w) % 8,
        (v // 2) // 3,
        (v + w * 10 < 15),
        v.maximum(w * 2),
    ]
    for e in exprs:
        s = simplify(e)
        for a, b in itertools.product(range(0, 10), range(1, 6)):
            env = {v: a, w: b}
            assert sym_eval(s, env) == sym_eval(e, env), (e, a, b)


def test_bound_vars_of_a_graph():
    v, w = Variable("i", 1, 10), Variable("j", 0, 4)
    x = UOp(Ops.RESHAPE, dtypes.float32, (UOp.const(dtypes.float32, 1.0),), (1, 1))
    y = UOp(Ops.EXPAND, dtypes.float32, (x,), (v.bind(3) + 1, 2))
    z = UOp(Ops.SHRINK, dtypes.float32, (y,), ((0, 2), (w.bind(1), 2)))
    assert bound_vars([z]) == {v: 3, w: 1}
    clash = UOp(Ops.EXPAND, dtypes.float32, (x,), (v.bind(4), 2))
    with pytest.raises(ValueError, match="'i' is bound to both 3 and 4"):
        bound_vars([z, clash])
