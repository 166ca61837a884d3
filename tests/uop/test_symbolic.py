"""The linear-form decomposer (uop/symbolic.py linear_terms) in its three uses: the simplifier's plain terms, the
signed terms of flipped indices (negations flattened) and symbolic sizes (negations and constants on either side
of a product flattened, variables only). The tables pin what each use returned before they shared one function."""

import pytest

from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.sint import Variable, canonical, sym_str
from fusegrad.uop.symbolic import linear_terms

a, b, c = Variable("a", 0, 10), Variable("b", 0, 10), Variable("c", 1, 8)
five = UOp.const(dtypes.int32, 5)

EXPRESSIONS = {
    "const": five,
    "var": a,
    "sum": a + b,
    "diff": a - b,
    "const_right": a * 3,
    "const_left": 3 * a,
    "nested": (a + b) * 2 + 1,
    "right_nested": a + (b + (c + 4)),
    "duplicates": a + a + b * 2 + b,
    "product": a * b + a,
    "idiv": a // 3 + 2,
    "mod": a % 4 + a,
    "negated_sum": -(a + 2 * b),
    "negated_multiple": -(b * 3),
    "rsub": 10 - a,
    "double_negation": -(-a),
    "negated_sum_and_multiple": -(a + b * 2) + c * 5,
    "const_product": five * five,
    "bound": a.bind(3) + 1,
    "mixed": 2 * (a - b) * 3 - (a % 4) * 2,
}

# (coefficient, term) in left-to-right order, duplicates kept, and the constant
PLAIN = {
    "const": ([], 5),
    "var": ([(1, a)], 0),
    "sum": ([(1, a), (1, b)], 0),
    "diff": ([(1, a), (1, -b)], 0),
    "const_right": ([(3, a)], 0),
    "const_left": ([(1, 3 * a)], 0),
    "nested": ([(2, a), (2, b)], 1),
    "right_nested": ([(1, a), (1, b), (1, c)], 4),
    "duplicates": ([(1, a), (1, a), (2, b), (1, b)], 0),
    "product": ([(1, a * b), (1, a)], 0),
    "idiv": ([(1, a // 3)], 2),
    "mod": ([(1, a % 4), (1, a)], 0),
    "negated_sum": ([(1, -(a + 2 * b))], 0),
    "negated_multiple": ([(1, -(b * 3))], 0),
    "rsub": ([(1, -a)], 10),
    "double_negation": ([(1, -(-a))], 0),
    "negated_sum_and_multiple": ([(1, -(a + b * 2)), (5, c)], 0),
    "const_product": ([], 25),
    "bound": ([(1, a.bind(3))], 1),
    "mixed": ([(3, 2 * (a - b)), (1, -((a % 4) * 2))], 0),
}

SIGNED = {
    **PLAIN,
    "diff": ([(1, a), (-1, b)], 0),
    "negated_sum": ([(-1, a), (-1, 2 * b)], 0),
    "negated_multiple": ([(-3, b)], 0),
    "rsub": ([(-1, a)], 10),
    "double_negation": ([(1, a)], 0),
    "negated_sum_and_multiple": ([(-1, a), (-2, b), (5, c)], 0),
    "mixed": ([(3, 2 * (a - b)), (-2, a % 4)], 0),
}

# variable -> summed coefficient, or None when a term is not a variable
SIZES = {
    "const": ({}, 5),
    "var": ({a: 1}, 0),
    "sum": ({a: 1, b: 1}, 0),
    "diff": ({a: 1, b: -1}, 0),
    "const_right": ({a: 3}, 0),
    "const_left": ({a: 3}, 0),
    "nested": ({a: 2, b: 2}, 1),
    "right_nested": ({a: 1, b: 1, c: 1}, 4),
    "duplicates": ({a: 2, b: 3}, 0),
    "product": None,
    "idiv": None,
    "mod": None,
    "negated_sum": ({a: -1, b: -2}, 0),
    "negated_multiple": ({b: -3}, 0),
    "rsub": ({a: -1}, 10),
    "double_negation": ({a: 1}, 0),
    "negated_sum_and_multiple": ({a: -1, b: -2, c: 5}, 0),
    "const_product": ({}, 25),
    "bound": ({a.bind(3): 1}, 1),
    "mixed": None,
}

CANONICAL = {
    "const": 5,
    "var": "a",
    "sum": "(a+b)",
    "diff": "(a+(b*-1))",
    "const_right": "(a*3)",
    "const_left": "(a*3)",
    "nested": "(((a*2)+(b*2))+1)",
    "right_nested": "(((a+b)+c)+4)",
    "duplicates": "((a*2)+(b*3))",
    "product": "((a*b)+a)",
    "idiv": "((a//3)+2)",
    "mod": "((a%4)+a)",
    "negated_sum": "((a*-1)+(b*-2))",
    "negated_multiple": "(b*-3)",
    "rsub": "((a*-1)+10)",
    "double_negation": "a",
    "negated_sum_and_multiple": "(((a*-1)+(b*-2))+(c*5))",
    "const_product": 25,
    "bound": "(a+1)",
    "mixed": "(((a+(b*-1))*6)+((a%4)*-2))",
}


def size_form(x: UOp) -> tuple[dict[UOp, int], int] | None:
    terms, const = linear_terms(x, negations=True, constant_left=True)
    if any(t.op not in (Ops.BIND, Ops.DEFINE_VAR) for _, t in terms):
        return None
    merged: dict[UOp, int] = {}
    for k, t in terms:
        merged[t] = merged.get(t, 0) + k
    return merged, const


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_plain_terms(name: str):
    assert linear_terms(EXPRESSIONS[name]) == PLAIN[name]


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_signed_terms(name: str):
    assert linear_terms(EXPRESSIONS[name], negations=True) == SIGNED[name]


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_size_form(name: str):
    assert size_form(EXPRESSIONS[name]) == SIZES[name]


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_canonical_size(name: str):
    out = canonical(EXPRESSIONS[name])
    assert (out if isinstance(out, int) else sym_str(out)) == CANONICAL[name]


def test_negated_constant_is_the_constant():
    # the signed decomposition once kept -(5) as the term (-1, 5): the same value, and no caller looks at constant
    # terms (the simplifier folds -(5) before its division rules see it; a loop's stride ignores constants)
    assert linear_terms(-five, negations=True) == ([], -5)
    assert linear_terms(-five) == ([(1, -five)], 0)
    assert size_form(-five) == ({}, -5)


def test_long_sum_does_not_recurse():
    x = a
    for _ in range(5000):
        x = x + b
    terms, const = linear_terms(x, negations=True)
    assert len(terms) == 5001 and const == 0
