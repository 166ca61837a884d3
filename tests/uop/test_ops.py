"""The IR: hash-consing, pattern matching, graph_rewrite and the symbolic simplifier (fuzzed with hypothesis)."""

import pytest
from hypothesis import given, settings, strategies as st
from fusegrad.dtype import dtypes
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, RewriteLoopError, UPat, graph_rewrite
from fusegrad.uop.symbolic import simplify, sym_eval


def rng(size: int, axis: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, size),), (axis, "global"))


def test_hash_consing_gives_same_object():
    a = UOp.const(dtypes.int32, 3) + UOp.const(dtypes.int32, 4)
    b = UOp.const(dtypes.int32, 3) + UOp.const(dtypes.int32, 4)
    assert a is b
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.bool, True)


def test_hash_consing_keeps_tuple_args_of_other_types_apart():
    # a tuple of ints and strings is its own key; one with a bool or a float in the same place is another node
    args = [(1, "CPU", 16), (True, "CPU", 16), (1.0, "CPU", 16), (1, "CPU", 16.0), ("1", "CPU", 16)]
    nodes = [UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), a) for a in args]
    assert len({id(n) for n in nodes}) == len(args)
    assert UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, "CPU", 16)) is nodes[0]


def test_alu_shape_of_equal_shapes_and_error_naming_mismatched_ones():
    a = UOp(Ops.RESHAPE, dtypes.float32, (UOp.const(dtypes.float32, 2.0),), (3, 4))
    b = UOp(Ops.RESHAPE, dtypes.float32, (UOp.const(dtypes.float32, 5.0),), (3, 4))
    assert (a + b).shape == (3, 4) and (a + b).alu(Ops.WHERE, a, b).shape == (3, 4)
    c = UOp(Ops.RESHAPE, dtypes.float32, (UOp.const(dtypes.float32, 5.0),), (4, 3))
    with pytest.raises(ValueError, match=r"mismatched shapes \[\(3, 4\), \(4, 3\)\]"):
        _ = (a + c).shape


def test_pattern_matcher_commutative_and_named():
    x = rng(10, 0)
    pm = PatternMatcher([(UPat.var("x") * 2, lambda x: x + x)])
    assert graph_rewrite(x * 2, pm) is x + x
    assert graph_rewrite(UOp.const(dtypes.int32, 2) * x, pm) is x + x
    same = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a"))), lambda a: a * 2)])
    assert graph_rewrite(x + x, same) is x * 2
    assert graph_rewrite(x + rng(3, 1), same) is x + rng(3, 1)


def test_graph_rewrite_top_down_and_context():
    x = rng(10, 0)
    seen = []

    def record(ctx, n):
        ctx.append(n.op)
        return None

    pm = PatternMatcher([(UPat(name="n"), record)])
    graph_rewrite(x + 1, pm, ctx=seen, bottom_up=False)
    assert seen[0] is Ops.ADD  # the root is visited before its sources
    seen.clear()
    graph_rewrite(x + 1, pm, ctx=seen, bottom_up=True)
    assert seen[-1] is Ops.ADD


def test_graph_rewrite_loop_raises_instead_of_hanging():
    x = rng(10, 0)
    flip = PatternMatcher([(UPat(Ops.ADD, name="a"), lambda a: UOp(Ops.ADD, a.dtype, a.src[::-1]))])
    with pytest.raises(RewriteLoopError):
        graph_rewrite(x + rng(5, 1), flip)
    grow = PatternMatcher([(UPat(Ops.ADD, name="a"), lambda a: a + 1)])
    with pytest.raises(RewriteLoopError):
        graph_rewrite(x + 1, grow)


@pytest.mark.parametrize(
    "expr, expected",
    [
        (lambda i, j: (i * 4 + j) // 4, lambda i, j: i),
        (lambda i, j: (i * 4 + j) % 4, lambda i, j: j),
        (lambda i, j: i + 0, lambda i, j: i),
        (lambda i, j: i * 1, lambda i, j: i),
        (lambda i, j: i * 0, lambda i, j: UOp.const(dtypes.int32, 0)),
        (lambda i, j: i // 1, lambda i, j: i),
        (lambda i, j: i % 1, lambda i, j: UOp.const(dtypes.int32, 0)),
        (lambda i, j: (i + 3) + 5, lambda i, j: i + 8),
        (lambda i, j: j // 4, lambda i, j: UOp.const(dtypes.int32, 0)),
        (lambda i, j: j % 4, lambda i, j: j),
        (lambda i, j: (i * 8 + j * 2) // 2, lambda i, j: i * 4 + j),
        (lambda i, j: (i * 4 + j) // 4 * 4 + (i * 4 + j) % 4, lambda i, j: i * 4 + j),
    ],
)
def test_simplifier_identities(expr, expected):
    i, j = rng(10, 0), rng(4, 1)
    assert simplify(expr(i, j)) is simplify(expected(i, j))


# ---- fuzz: a random integer expression over ranged variables evaluates like its simplification
OPS = ["add", "mul", "div", "mod", "neg", "max", "lt", "where"]


@st.composite
def expressions(draw, depth=0):
    variables = draw(st.just(None))
    del variables
    if depth > 3 or draw(st.booleans()) and depth > 0:
        if draw(st.booleans()):
            return ("const", draw(st.integers(-8, 8)))
        return ("var", draw(st.integers(0, 2)))
    op = draw(st.sampled_from(OPS))
    if op == "neg":
        return (op, draw(expressions(depth + 1)))
    if op == "where":
        return (op, draw(expressions(depth + 1)), draw(expressions(depth + 1)), draw(expressions(depth + 1)))
    if op in ("div", "mod"):
        return (op, draw(expressions(depth + 1)), ("const", draw(st.integers(1, 9))))
    return (op, draw(expressions(depth + 1)), draw(expressions(depth + 1)))


def build(tree, variables):
    kind = tree[0]
    if kind == "const":
        return UOp.const(dtypes.int32, tree[1])
    if kind == "var":
        return variables[tree[1]]
    args = [build(t, variables) for t in tree[1:]]
    if kind == "add":
        return args[0] + args[1]
    if kind == "mul":
        return args[0] * args[1]
    if kind == "div":
        return args[0] // args[1]
    if kind == "mod":
        return args[0] % args[1]
    if kind == "neg":
        return -args[0]
    if kind == "max":
        return args[0].maximum(args[1])
    if kind == "lt":
        return (args[0] < args[1]).cast(dtypes.int32)
    return (args[0] < UOp.const(dtypes.int32, 0)).where(args[1], args[2])


@pytest.mark.slow  # 300 random expressions, 6 s: CI (the README's test line stays under 10 minutes cold)
@settings(max_examples=300, deadline=None)
@given(expressions(), st.lists(st.integers(1, 12), min_size=3, max_size=3), st.data())
def test_fuzz_simplified_expression_evaluates_like_original(tree, sizes, data):
    variables = [rng(s, k) for k, s in enumerate(sizes)]
    expr = build(tree, variables)
    simple = simplify(expr)
    for _ in range(8):
        env = {v: data.draw(st.integers(0, s - 1)) for v, s in zip(variables, sizes)}
        assert sym_eval(simple, env) == sym_eval(expr, env), (tree, env)
        assert simple.vmin <= sym_eval(expr, env) <= simple.vmax


# deeper than Python's default recursion limit (1000): every walk below must keep its own stack
DEEP = 5_000


def deep_chain(depth: int = DEEP) -> tuple[UOp, UOp]:
    i = rng(10, 0)
    chain = i
    for _ in range(depth):
        chain = UOp(Ops.ADD, dtypes.int32, (chain, UOp.const(dtypes.int32, 1)))
    return i, chain


def test_graph_rewrite_deep_graph_bottom_up_and_top_down():
    i, chain = deep_chain()
    assert simplify(chain) is i + DEEP
    to_max = PatternMatcher([(UPat(Ops.ADD, name="a"), lambda a: UOp(Ops.MAX, a.dtype, a.src))])
    top = graph_rewrite(chain, to_max, bottom_up=False)
    assert [u.op for u in top.toposort()].count(Ops.MAX) == DEEP
    assert sym_eval(top, {i: 7}) == 7


def test_graph_rewrite_growth_on_deep_graph_raises():
    x = UOp(Ops.BUFFER, dtypes.float32, (), (0, "CPU", 1))
    # each NEG becomes SQRT(NEG(x * 1)) with a new, deeper x * 1: a top-down walk would never finish
    grow = PatternMatcher(
        [(UPat(Ops.NEG, name="n"), lambda n: UOp(Ops.SQRT, n.dtype, (UOp(Ops.NEG, n.dtype, (n.src[0] * 1.0,)),)))]
    )
    with pytest.raises(RewriteLoopError):
        graph_rewrite(UOp(Ops.NEG, dtypes.float32, (x,)), grow, bottom_up=False)


def test_deep_chain_shape_value_range_repr_and_pickle():
    import pickle

    i, chain = deep_chain()
    assert (chain.vmin, chain.vmax) == (DEEP, 9 + DEEP)
    x = UOp(Ops.BUFFER, dtypes.float32, (), (0, "CPU", 6))
    y = UOp(Ops.RESHAPE, dtypes.float32, (x,), (2, 3))
    for _ in range(DEEP + 1):
        y = UOp(Ops.NEG, dtypes.float32, (UOp(Ops.PERMUTE, dtypes.float32, (y,), (1, 0)),))
    assert y.shape == (3, 2)  # asked first at the top: each shape needs the one below
    lines = repr(chain).splitlines()
    assert len(lines) == 2 * DEEP + 2  # each ADD, RANGE, its bound; the constant 1 once, then DEEP - 1 references
    assert max(len(ln) for ln in lines) < 200
    assert pickle.loads(pickle.dumps(chain)) is chain
    assert pickle.loads(pickle.dumps(y)) is y


def test_hash_consing_sweeps_dead_entries_and_rebuilds_dead_nodes():
    import gc
    from fusegrad.uop.ops import UOpMeta

    base = UOp(Ops.CONST, dtypes.int32, (), 123457)
    made = [UOp(Ops.ADD, dtypes.int32, (base, UOp(Ops.CONST, dtypes.int32, (), 10**9 + i))) for i in range(1000)]
    before = len(UOpMeta.cache)
    del made
    gc.collect()
    UOpMeta.sweep()
    # every dead node's entry is gone (the adds and their constants among them), every live one stays
    assert all(r() is not None for r in UOpMeta.cache.values())
    assert len(UOpMeta.cache) <= before - 2000
    assert UOp(Ops.CONST, dtypes.int32, (), 123457) is base
    assert UOpMeta.sweep_at >= 2 * len(UOpMeta.cache)
    # a node made again after its entry was swept (or while a dead entry holds its key) is one live object again
    again = UOp(Ops.ADD, dtypes.int32, (base, UOp(Ops.CONST, dtypes.int32, (), 5)))
    assert UOp(Ops.ADD, dtypes.int32, (base, UOp(Ops.CONST, dtypes.int32, (), 5))) is again
    dead_key_node = UOp(Ops.CONST, dtypes.int32, (), 999331)
    del dead_key_node
    gc.collect()
    revived = UOp(Ops.CONST, dtypes.int32, (), 999331)
    assert revived.arg == 999331 and UOp(Ops.CONST, dtypes.int32, (), 999331) is revived


def test_a_dead_nodes_entry_leaves_the_hash_consing_table_when_it_dies():
    # dead entries left for a sweep outlived the young GC generations and brought on full collections
    from fusegrad.uop.ops import UOpMeta, _drop_dead_entry

    node = UOp(Ops.CONST, dtypes.int32, (), 99173)
    ref = next(r for r in UOpMeta.cache.values() if r() is node)
    del node  # no gc.collect: the reference count alone frees it
    assert ref.key not in UOpMeta.cache
    # a callback that runs late, after a live node took the key again, leaves the live node's entry alone
    again = UOp(Ops.CONST, dtypes.int32, (), 99173)
    _drop_dead_entry(ref)
    assert UOpMeta.cache[ref.key]() is again
    assert UOp(Ops.CONST, dtypes.int32, (), 99173) is again


def test_elementwise_ops_of_equal_tensors_match_numpy_and_keep_shapes():
    import numpy as np
    from fusegrad import Tensor

    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    x, y = Tensor(a), Tensor(b)
    np.testing.assert_allclose((x + y).numpy(), a + b)
    np.testing.assert_allclose((x * y - y).numpy(), a * b - b, rtol=1e-6)
    np.testing.assert_allclose((2.5 - x).numpy(), 2.5 - a)
    np.testing.assert_array_equal((x < y).numpy(), a < b)
    assert (x * y).shape == (3, 4) and (x * y).uop.shape == (3, 4)
    # other dtypes and shapes still promote and broadcast
    np.testing.assert_allclose((x + Tensor(np.arange(4, dtype=np.int32))).numpy(), a + np.arange(4))


def test_a_nodes_holders_are_one_reference_until_a_second_tensor_holds_it():
    import numpy as np
    import torch
    from fusegrad import Tensor

    x = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = x * 3.0
    assert [r() for r in y.uop.holder_refs()] == [y] and not isinstance(y.uop.holders, list)
    z = Tensor(y.uop)  # a second tensor on the same node: both are found from the graph
    assert {id(r()) for r in z.uop.holder_refs()} == {id(y), id(z)}
    (y * z).sum().backward()
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    ty = tx * 3.0
    ty.retain_grad()
    (ty * ty).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_allclose(y.grad.numpy(), (2 * ty).detach().numpy())  # each holder gets d/dnode
    np.testing.assert_allclose(z.grad.numpy(), (2 * ty).detach().numpy())


def test_a_dead_holders_place_is_taken_by_the_next_tensor_on_the_node():
    # a TinyJit replay returns a new tensor on the same node each call: the list of holders must not grow with them
    import numpy as np
    from fusegrad import Tensor
    from fusegrad.tensor import tensor_of_uop

    x = Tensor(np.arange(3, dtype=np.float32)).realize()
    u = x.uop
    for _ in range(40):
        t = tensor_of_uop(u, x.device)
        assert {id(r()) for r in u.holder_refs() if r() is not None} == {id(x), id(t)}
        del t
    assert len(u.holder_refs()) == 2
    kept = [Tensor(u) for _ in range(3)]  # live holders keep their places
    assert {id(r()) for r in u.holder_refs() if r() is not None} == {id(x), *map(id, kept)}
    y = Tensor(np.ones(2, np.float32))
    node = y.uop
    del y
    z = tensor_of_uop(node, "CPU")  # the only holder died: the reference alone again, the new one's
    assert node.holders is z._ref


def test_a_dead_readers_place_is_taken_by_the_next_node_on_a_buffer():
    # an eager loop makes and drops one node on x's buffer per op: its list of readers must not grow with them
    import numpy as np
    from fusegrad import Tensor

    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    u = x.uop
    for i in range(40):
        np.testing.assert_array_equal((x + i).realize().numpy(), np.arange(4) + i)
    assert len(u._readers) <= 2, len(u._readers)
    lazy = [x * 2, x - 1]  # live readers are found
    assert {id(t.uop) for t in lazy} <= {id(r) for r in u.live_readers()}


def _views_of_a_buffer() -> dict[str, UOp]:
    from fusegrad.runtime.buffers import Buffer, buffer_uop
    from fusegrad.uop.sint import Variable

    b = buffer_uop(Buffer("CPU", 12, dtypes.float32))
    rows = UOp(Ops.RESHAPE, b.dtype, (b,), (3, 4))
    return {
        "buffer": b,
        "reshaped": rows,
        "reshaped_twice": UOp(Ops.RESHAPE, b.dtype, (rows,), (12, 1)),
        "permuted": UOp(Ops.PERMUTE, b.dtype, (rows,), (1, 0)),
        "shrunk": UOp(Ops.SHRINK, b.dtype, (b,), ((0, 6),)),
        "symbolic_larger": UOp(Ops.RESHAPE, b.dtype, (b,), (Variable("v", 1, 20).bind(12),)),
        "const": UOp.const(dtypes.float32, 1.0),
    }


@pytest.mark.parametrize(
    "name, contiguous",
    [
        ("buffer", True),
        ("reshaped", True),
        ("reshaped_twice", True),
        ("permuted", False),
        ("shrunk", False),
        ("symbolic_larger", True),
        ("const", False),
    ],
)
def test_is_contiguous_view(name: str, contiguous: bool):
    from fusegrad.uop.ops import is_contiguous_view

    assert is_contiguous_view(_views_of_a_buffer()[name]) is contiguous


def test_is_realized_multi_needs_every_shard_a_reshaped_buffer():
    from fusegrad import Tensor
    from fusegrad.uop.multi import is_realized_multi

    sharded = Tensor.arange(8).shard(("CPU", "CPU:1"), 0).realize()
    assert is_realized_multi(sharded.uop)
    assert is_realized_multi(sharded.reshape(2, 4).uop) is False  # a view of a MULTI, not a MULTI
    assert is_realized_multi((sharded + 1).uop) is False
    lazy = Tensor.arange(8).shard(("CPU", "CPU:1"), 0)
    assert lazy.uop.op is Ops.MULTI and is_realized_multi(lazy.uop) is False


def test_new_buffer_node_is_the_node_uop_gives_for_its_parts():
    """UOpMeta.new_buffer (a realize's new version) hash-conses like UOp(): the node UOp() makes of the same parts is
    that node, its entry leaves the table when it dies, and a live node with the arg gets the buffer."""
    import gc
    from fusegrad.runtime.buffers import next_buffer_id
    from fusegrad.runtime.device import Buffer
    from fusegrad.uop.ops import UOpMeta

    buf, other = Buffer("CPU", 4, dtypes.float32), Buffer("CPU", 4, dtypes.float32)
    arg = (next_buffer_id(), "CPU", 4)
    node = UOpMeta.new_buffer(dtypes.float32, arg, buf)
    assert UOp(Ops.BUFFER, dtypes.float32, (), arg) is node and node.buffer is buf and node.shape == (4,)
    assert UOpMeta.new_buffer(dtypes.float32, arg, other) is node and node.buffer is other
    key = next(k for k, r in UOpMeta.cache.items() if r() is node)
    del node
    gc.collect()
    assert key not in UOpMeta.cache
