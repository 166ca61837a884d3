"""Gradient rules built per source (gradient.SOURCE_RULES): only the sources on a path to a target get a gradient
graph; the values equal numpy's."""

import numpy as np
from fusegrad import Tensor
from fusegrad.gradient import compute_gradient
from fusegrad.uop.ops import Ops, UOp, UOpMeta


def _nodes_made(fn, monkeypatch) -> set[UOp]:
    """Every node compute_gradient asks for on fn's graph, kept or thrown away, apart from the forward graph's."""
    rng = np.random.default_rng(5)
    x = Tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True).realize()
    out = fn(x)
    forward, asked = set(out.uop.toposort()), []
    make = UOpMeta.__call__

    def recorded(cls, *args, **kwargs):
        asked.append(node := make(cls, *args, **kwargs))
        return node

    monkeypatch.setattr(UOpMeta, "__call__", recorded)
    compute_gradient(out.uop, UOp.const(out.dtype, 1.0), {x.uop})
    monkeypatch.undo()
    return set(asked) - forward


def _is_zero(u: UOp) -> bool:
    while u.op in (Ops.RESHAPE, Ops.EXPAND):
        u = u.src[0]
    return u.op is Ops.CONST and u.arg == 0


def test_where_and_division_build_no_gradient_for_their_constants(monkeypatch):
    # relu's where(x > 0, x, 0): no gradient for the 0; a mean's division: none for the count it divides by
    made = _nodes_made(lambda x: (x > 0).where(x, 0.0).sum() / 12, monkeypatch)
    wheres = [u for u in made if u.op is Ops.WHERE]
    # where(c, g, 0) for x, and no where(c, 0, g) for the constant
    assert len(wheres) == 1 and _is_zero(wheres[0].src[2]) and not _is_zero(wheres[0].src[1]), wheres
    assert not [u for u in made if u.op is Ops.NEG], "the divisor's gradient -(g * n) / d was built"


def test_per_source_gradients_match_numpy():
    rng = np.random.default_rng(6)
    a_np, b_np = rng.standard_normal((5, 4)).astype(np.float32), rng.uniform(0.5, 2, (5, 4)).astype(np.float32)
    a, b = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=True)
    loss = ((a > 0).where(a * b, b) / b + a / 3).sum()
    loss.backward()
    # d/da: where(a > 0, b / b, 0) + 1/3; d/db: where(a > 0, 0, 1 / b) + where(a > 0, a, b) * (-1 / b^2)
    pos = a_np > 0
    np.testing.assert_allclose(a.grad.numpy(), np.where(pos, 1.0, 0.0) + 1 / 3, rtol=1e-5, atol=1e-6)
    want_b = np.where(pos, 0.0, 1 / b_np) - np.where(pos, a_np * b_np, b_np) / b_np**2 + np.where(pos, a_np / b_np, 0)
    np.testing.assert_allclose(b.grad.numpy(), want_b, rtol=1e-5, atol=1e-6)
