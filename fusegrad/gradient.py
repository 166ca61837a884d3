"""Reverse-mode autodiff as one rule per primitive op over the tensor-level UOp graph.

Composite ops (softmax, conv, losses, ...) are built from these primitives, so their gradients come for free."""

from __future__ import annotations
import math
import weakref
from typing import Callable
from fusegrad.dtype import NARROW_FLOATS, dtypes
from fusegrad.uop.ops import GroupOp, Ops, UOp, device_of, view_over


def _full(like: UOp, value: float) -> UOp:
    """A constant broadcast to like's shape and dtype."""
    c = UOp.const(like.dtype, value)
    if not like.shape:
        return c
    return UOp(Ops.EXPAND, like.dtype, (UOp(Ops.RESHAPE, like.dtype, (c,), (1,) * len(like.shape)),), like.shape)


def _alu(op: Ops, *src: UOp) -> UOp:
    dtype = dtypes.bool if op in GroupOp.Comparison else src[-1].dtype
    return UOp(op, dtype, src)


def _reduce_sum(g: UOp, axes: tuple[int, ...]) -> UOp:
    if not axes:
        return g
    acc = dtypes.float32 if g.dtype in NARROW_FLOATS else g.dtype
    summed = UOp(Ops.REDUCE_AXIS, acc, (g.cast(acc),), (Ops.ADD, axes))
    return summed.cast(g.dtype)


def _expand(g: UOp, shape: tuple[int, ...]) -> UOp:
    return g if g.shape == shape else UOp(Ops.EXPAND, g.dtype, (g,), shape)


def _reduce_grad(node: UOp, g: UOp) -> tuple[UOp | None, ...]:
    x = node.src[0]
    op, axes = node.arg
    if op is Ops.ADD:
        return (_expand(g, x.shape),)
    out = _expand(node, x.shape)
    if op is Ops.MAX:
        # ties share the gradient equally, like torch's max reduction; a NaN maximum belongs to the NaN inputs
        nan_hit = _alu(Ops.AND, _alu(Ops.CMPNE, x, x), _alu(Ops.CMPNE, out, out))
        hit = _alu(Ops.OR, _alu(Ops.CMPEQ, x, out), nan_hit).cast(x.dtype)
        count = _expand(_reduce_sum(hit, axes), x.shape)
        return (_alu(Ops.MUL, _alu(Ops.FDIV, hit, count), _expand(g, x.shape)),)
    # product: exact with zeros (a single zero gets the product of the others, two or more zeros give 0 everywhere)
    is_zero = _alu(Ops.CMPEQ, x, _full(x, 0))
    nonzero = UOp(Ops.WHERE, x.dtype, (is_zero, _full(x, 1), x))
    prod_nz = _expand(UOp(Ops.REDUCE_AXIS, x.dtype, (nonzero,), (Ops.MUL, axes)), x.shape)
    zeros = _expand(_reduce_sum(is_zero.cast(x.dtype), axes), x.shape)
    no_zero = _alu(Ops.CMPEQ, zeros, _full(zeros, 0))
    one_zero_here = _alu(Ops.AND, _alu(Ops.CMPEQ, zeros, _full(zeros, 1)), is_zero)
    local = UOp(
        Ops.WHERE,
        x.dtype,
        (no_zero, _alu(Ops.FDIV, prod_nz, x), UOp(Ops.WHERE, x.dtype, (one_zero_here, prod_nz, _full(x, 0)))),
    )
    return (_alu(Ops.MUL, local, _expand(g, x.shape)),)


def _max_grad(node: UOp, g: UOp) -> tuple[UOp, UOp]:
    a, b = node.src
    a_wins = _alu(Ops.CMPLT, b, a).cast(g.dtype)
    tie = _alu(Ops.CMPEQ, a, b).cast(g.dtype)
    half_tie = _alu(Ops.MUL, tie, _full(tie, 0.5))
    ga = _alu(Ops.ADD, a_wins, half_tie)
    gb = _alu(Ops.ADD, _alu(Ops.ADD, _full(ga, 1), _alu(Ops.NEG, a_wins)), _alu(Ops.NEG, half_tie))
    return (_alu(Ops.MUL, g, ga), _alu(Ops.MUL, g, gb))


def _pow_grad(node: UOp, g: UOp) -> tuple[UOp, UOp]:
    a, b = node.src
    # d/da = b * a^(b-1); d/db = a^b * log(a), defined as 0 where a == 0 and b >= 0 (like torch: 0**-1 * log 0 = -inf)
    da = _alu(Ops.MUL, b, UOp(Ops.POW, a.dtype, (a, _alu(Ops.ADD, b, _full(b, -1)))))
    a_zero = _alu(Ops.CMPEQ, a, _full(a, 0))
    b_neg = _alu(Ops.CMPLT, b, _full(b, 0))
    zero_db = UOp(Ops.WHERE, dtypes.bool, (b_neg, _full(a_zero, False), a_zero))
    db = UOp(Ops.WHERE, a.dtype, (zero_db, _full(a, 0), _alu(Ops.MUL, node, UOp(Ops.LOG, a.dtype, (a,)))))
    b_zero = _alu(Ops.CMPEQ, b, _full(b, 0))
    da = UOp(Ops.WHERE, a.dtype, (b_zero, _full(a, 0), da))
    return (_alu(Ops.MUL, g, da), _alu(Ops.MUL, g, db))


def _multi_grad(node: UOp, g: UOp) -> tuple[UOp, ...]:
    """Each shard gets its slice of the (logical) gradient, copied to the shard's device."""
    axis, devices = node.arg
    out = []
    for i, (src, device) in enumerate(zip(node.src, devices)):
        if axis is None:
            part = g
        else:
            size = src.shape[axis]
            bounds = tuple((i * size, (i + 1) * size) if j == axis else (0, d) for j, d in enumerate(g.shape))
            part = UOp(Ops.SHRINK, g.dtype, (g,), bounds)
        out.append(UOp(Ops.COPY, g.dtype, (part,), device))
    return tuple(out)


def without_layout_copy(u: UOp) -> UOp:
    """u with a layout copy under its views (CONTIGUOUS "layout": a copy a matmul made only to tile its forward)
    replaced by the value it copies: equal values, and the gradients tile better reading the original layout."""
    base = u.peel(GroupOp.Movement)
    return view_over(u, base.src[0]) if base.op is Ops.CONTIGUOUS and base.arg == "layout" else u


# ops whose sources' gradients are built one by one: only those of sources on a path to a target are (the constant 0
# of a relu's or a picked log-probability's `where`, the count a mean divides by)
SOURCE_RULES: dict[Ops, tuple[Callable[[UOp, UOp], UOp] | None, ...]] = {
    Ops.MUL: (
        lambda n, g: _alu(Ops.MUL, g, without_layout_copy(n.src[1])),
        lambda n, g: _alu(Ops.MUL, g, without_layout_copy(n.src[0])),
    ),
    Ops.FDIV: (
        lambda n, g: _alu(Ops.FDIV, g, n.src[1]),
        lambda n, g: _alu(Ops.NEG, _alu(Ops.FDIV, _alu(Ops.MUL, g, n), n.src[1])),
    ),
    Ops.WHERE: (
        None,
        lambda n, g: UOp(Ops.WHERE, g.dtype, (n.src[0], g, _full(g, 0))),
        lambda n, g: UOp(Ops.WHERE, g.dtype, (n.src[0], _full(g, 0), g)),
    ),
}


def _inverse_permutation(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(range(len(order)), key=lambda i: order[i]))


# the other ops' rules: every source's gradient at once (SOURCE_RULES' ops are looked up there first)
GRAD_RULES: dict[Ops, Callable[[UOp, UOp], tuple[UOp | None, ...]]] = {
    Ops.ADD: lambda n, g: (g, g),
    Ops.NEG: lambda n, g: (_alu(Ops.NEG, g),),
    Ops.RECIPROCAL: lambda n, g: (_alu(Ops.NEG, _alu(Ops.MUL, g, _alu(Ops.MUL, n, n))),),
    Ops.SQRT: lambda n, g: (_alu(Ops.FDIV, g, _alu(Ops.MUL, n, _full(n, 2))),),
    Ops.EXP: lambda n, g: (_alu(Ops.MUL, g, n),),
    Ops.EXP2: lambda n, g: (_alu(Ops.MUL, g, _alu(Ops.MUL, n, _full(n, math.log(2)))),),
    Ops.LOG: lambda n, g: (_alu(Ops.FDIV, g, n.src[0]),),
    Ops.LOG2: lambda n, g: (_alu(Ops.FDIV, g, _alu(Ops.MUL, n.src[0], _full(n, math.log(2)))),),
    Ops.SIN: lambda n, g: (_alu(Ops.MUL, g, UOp(Ops.COS, n.dtype, n.src)),),
    Ops.COS: lambda n, g: (_alu(Ops.NEG, _alu(Ops.MUL, g, UOp(Ops.SIN, n.dtype, n.src))),),
    Ops.TRUNC: lambda n, g: (None,),
    Ops.MAX: _max_grad,
    Ops.POW: _pow_grad,
    Ops.CAST: lambda n, g: (g.cast(n.src[0].dtype),),
    Ops.RESHAPE: lambda n, g: (UOp(Ops.RESHAPE, g.dtype, (g,), n.src[0].shape),),
    Ops.PERMUTE: lambda n, g: (UOp(Ops.PERMUTE, g.dtype, (g,), _inverse_permutation(n.arg)),),
    Ops.EXPAND: lambda n, g: (
        _reduce_sum(g, tuple(i for i, (s, d) in enumerate(zip(n.src[0].shape, n.shape)) if s != d)),
    ),
    Ops.PAD: lambda n, g: (
        UOp(Ops.SHRINK, g.dtype, (g,), tuple((b, b + s) for (b, _), s in zip(n.arg, n.src[0].shape))),
    ),
    Ops.SHRINK: lambda n, g: (
        UOp(Ops.PAD, g.dtype, (g,), tuple((b, s - e) for (b, e), s in zip(n.arg, n.src[0].shape))),
    ),
    Ops.FLIP: lambda n, g: (UOp(Ops.FLIP, g.dtype, (g,), n.arg),),
    Ops.REDUCE_AXIS: _reduce_grad,
    Ops.CONTIGUOUS: lambda n, g: (UOp(Ops.CONTIGUOUS, g.dtype, (g,)) if n.arg == "backward" else g,),
    # the gradient goes back to the source's device (a multi-device source takes the logical gradient as is)
    Ops.COPY: lambda n, g: (UOp(Ops.COPY, g.dtype, (g,), d) if isinstance(d := device_of(n.src[0]), str) else g,),
    Ops.MULTI: _multi_grad,
}
NO_GRADIENT = (
    {Ops.DETACH, Ops.BITCAST, Ops.ASSIGN, Ops.BUFFER, Ops.CONST, Ops.ARANGE}
    | GroupOp.Comparison
    | {Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.IDIV, Ops.MOD}
)


# node -> (inputs, backward): a composite op's gradient reaches its inputs as backward(g) instead of through the
# transposes of the nodes between them (conv: the transpose of its windowed view needs per-element division, the
# transposed convolution does not). Weak keys: an entry lives as long as its node.
_composite_gradients: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], Callable[[UOp], tuple[UOp, ...]]]] = (
    weakref.WeakKeyDictionary()
)


def register_gradient(node: UOp, inputs: tuple[UOp, ...], backward: Callable[[UOp], tuple[UOp, ...]]) -> None:
    """Gradients arriving at node go to inputs as backward(g) (one per input, same shapes); backward must not hold
    node itself, or the entry never dies."""
    _composite_gradients[node] = (inputs, backward)


def _composite_rule(node: UOp, targets: set[UOp]) -> tuple[tuple[UOp, ...], Callable] | None:
    """node's registered gradient, unless a target lies strictly between node and its inputs (it needs the plain
    rules to get its own gradient)."""
    entry = _composite_gradients.get(node)
    if entry is None:
        return None
    inputs = set(entry[0])
    inside = node.toposort(gate=lambda u: u not in inputs)
    return None if any(u in targets for u in inside if u is not node and u not in inputs) else entry


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp], nodes: list[UOp] | None = None) -> dict[UOp, UOp]:
    """Gradients of root with respect to every float node on a path from root to one of targets (`nodes`: root's
    toposort, when the caller has it already)."""
    if nodes is None:
        nodes = root.toposort()
    on_path: set[UOp] = set()
    for u in nodes:  # sources come first, so one forward pass marks every node that reaches a target
        if u in targets:
            on_path.add(u)
            continue
        for s in u.src:
            if s in on_path:
                on_path.add(u)
                break
    grads: dict[UOp, UOp] = {root: root_grad}
    composites = len(_composite_gradients) > 0  # asked once: most graphs have no composite op to look up per node
    for node in reversed(nodes):
        g = grads.get(node)
        if g is None or node.op in NO_GRADIENT or not node.src:
            continue
        if composites and (composite := _composite_rule(node, targets)) is not None:
            inputs, backward = composite
            for src, sg in zip(inputs, backward(g)):
                if src in on_path and dtypes.is_float(src.dtype):
                    grads[src] = sg if src not in grads else _alu(Ops.ADD, grads[src], sg)
            continue
        if (per_source := SOURCE_RULES.get(node.op)) is not None:
            pairs = [
                (src, rule(node, g))
                for src, rule in zip(node.src, per_source)
                if rule is not None and src in on_path and dtypes.is_float(src.dtype)
            ]
        elif (all_rule := GRAD_RULES.get(node.op)) is not None:
            pairs = zip(node.src, all_rule(node, g))  # type: ignore[assignment]
        else:
            raise NotImplementedError(f"no gradient rule for {node.op}")
        for src, sg in pairs:
            if sg is None or src not in on_path or not dtypes.is_float(src.dtype):
                continue
            grads[src] = sg = sg if src not in grads else _alu(Ops.ADD, grads[src], sg)
            _same_shape(sg, src)
    return grads


def _same_shape(grad: UOp, src: UOp) -> None:
    # a gradient has its source's shape: recorded now, where the update reading it would infer it node by node (each
    # missing shape an exception, a step's gradients about a tenth of its Python time)
    try:
        grad._shape = src._shape
    except AttributeError:
        pass  # a source whose shape nobody asked yet: left to the usual inference
