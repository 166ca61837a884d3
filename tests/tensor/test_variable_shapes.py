"""Tensors with symbolic sizes (bound Variables): ops on them against numpy/torch for several bound values, one compiled
kernel per shape family, readback refused until shrunk to a concrete shape, and clear errors for bad uses."""

import numpy as np
import pytest
import torch

from fusegrad import GlobalCounters, Tensor, Variable
from fusegrad.uop.ops import UOp
from fusegrad.uop.sint import smul, sym_str
from fusegrad.runtime.device import Device

VALUES = (1, 3, 4, 7, 10)
RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 10)).astype(np.float32)
W = RNG.standard_normal((10, 3)).astype(np.float32)


def padded(t: Tensor, vb: UOp, axis: int, to: int = 10) -> Tensor:
    """t's symbolic axis padded back to `to`: a concrete shape, read back by the same kernel for every value."""
    return t.pad(tuple((0, to - vb) if a == axis else (0, 0) for a in range(t.ndim)))


def np_padded(a: np.ndarray, axis: int, to: int = 10) -> np.ndarray:
    return np.pad(a, [(0, to - a.shape[axis]) if i == axis else (0, 0) for i in range(a.ndim)])


def softmax(a: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# (name, fusegrad op on x (4, 10) and bound vb, numpy reference on x and the value): each result has a concrete shape
CASES = [
    (
        "elementwise",
        lambda t, vb: padded((t[:, :vb] * 2 + 1).exp(), vb, 1),
        lambda x, n: np_padded(np.exp(x[:, :n] * 2 + 1), 1),
    ),
    ("sum", lambda t, vb: t[:, :vb].sum(1), lambda x, n: x[:, :n].sum(1)),
    ("max", lambda t, vb: t[:, :vb].max(1), lambda x, n: x[:, :n].max(1)),
    ("mean", lambda t, vb: t[:, :vb].mean(1), lambda x, n: x[:, :n].mean(1)),
    (
        "sum_keep",
        lambda t, vb: padded(t[:, :vb].sum(0, keepdim=True), vb, 1),
        lambda x, n: np_padded(x[:, :n].sum(0, keepdims=True), 1),
    ),
    ("softmax", lambda t, vb: padded(t[:, :vb].softmax(1), vb, 1), lambda x, n: np_padded(softmax(x[:, :n], 1), 1)),
    ("matmul", lambda t, vb: t[:, :vb] @ Tensor(W)[:vb], lambda x, n: x[:, :n] @ W[:n]),
    ("matmul_out", lambda t, vb: padded(t.T[:vb] @ t, vb, 0), lambda x, n: np_padded(x.T[:n] @ x, 0)),
    ("shrink", lambda t, vb: t.shrink((None, (vb - 1, vb))), lambda x, n: x[:, n - 1 : n]),
    (
        "reshape",
        lambda t, vb: padded(t.T[:vb].reshape(vb * 4), vb * 4, 0, 40),
        lambda x, n: np_padded(x.T[:n].reshape(-1), 0, 40),
    ),
    (
        "reshape_split",
        lambda t, vb: t.reshape(40)[: vb * 4].reshape(vb, 4).sum(0),
        lambda x, n: x.reshape(40)[: n * 4].reshape(n, 4).sum(0),
    ),
    ("ones", lambda t, vb: Tensor.ones(vb, 2).sum(0), lambda x, n: np.full(2, float(n))),
    (
        "full",
        lambda t, vb: padded(Tensor.full((2, vb), 3.5), vb, 1),
        lambda x, n: np_padded(np.full((2, n), 3.5, np.float32), 1),
    ),
    ("zeros_add", lambda t, vb: (Tensor.zeros(4, vb) + t[:, :vb]).sum(1), lambda x, n: x[:, :n].sum(1)),
    (
        "pad_symbolic",
        lambda t, vb: t[:, :vb].pad(((0, 0), (1, 10 - vb))),
        lambda x, n: np.pad(x[:, :n], ((0, 0), (1, 10 - n))),
    ),
    ("scalar_operand", lambda t, vb: t * vb, lambda x, n: x * n),
    ("slice_expr", lambda t, vb: padded(t[:, : vb + 0][:, 0:vb], vb, 1), lambda x, n: np_padded(x[:, :n], 1)),
]


@pytest.mark.parametrize("name, op, ref", CASES, ids=[c[0] for c in CASES])
def test_symbolic_op_matches_numpy_with_one_kernel_set(name, op, ref):
    v = Variable("n", 1, 10)
    t = Tensor(X).realize()
    before = None
    for val in VALUES:
        out = op(t, v.bind(val))
        assert all(isinstance(d, int) for d in out.shape), out.shape
        np.testing.assert_allclose(out.numpy(), ref(X, val), rtol=1e-5, atol=1e-5, err_msg=f"{name} n={val}")
        if before is None:
            before = GlobalCounters.compile_count  # the first value compiles the family's kernels
        assert GlobalCounters.compile_count == before, f"{name}: value {val} compiled a new kernel"


def test_symbolic_shape_and_max_shape():
    v = Variable("n", 1, 10)
    vb = v.bind(3)
    t = Tensor(X)[:, :vb]
    assert t.shape[0] == 4 and t.shape[1] is vb
    assert t.max_shape == (4, 10) and t.max_numel() == 40
    assert t.numel() is smul(vb, 4) and sym_str(t.numel()) == "(n*4)"
    assert Tensor.ones(vb + 1, 2).shape[0].expr == "(n+1)"


def test_realized_symbolic_tensor_reads_back_through_a_concrete_shrink():
    v = Variable("n", 1, 10)
    t = Tensor(X)
    for val in (3, 6):
        s = (t[:, : v.bind(val)] + 1).realize()  # a buffer of the largest shape, viewed at the bound size
        np.testing.assert_allclose(s[:, :2].numpy(), X[:, :2] + 1)
        np.testing.assert_allclose(padded(s, v.bind(val), 1).numpy(), np_padded(X[:, :val] + 1, 1))


@pytest.mark.parametrize("read", ["numpy", "tolist", "item", "data"])
def test_readback_of_symbolic_shape_asserts(read):
    vb = Variable("n", 1, 10).bind(3)
    t = Tensor(X)[:, :vb]
    with pytest.raises(AssertionError, match=r"symbolic shape \(4, n\); shrink it"):
        getattr(t, read)()
    with pytest.raises(AssertionError, match="symbolic shape"):
        getattr(t.sum(0), read)()
    assert t[:, :3].numpy().shape == (4, 3)  # shrunk to a concrete shape it reads back


def test_backward_through_symbolic_slice_matches_torch():
    v = Variable("n", 1, 10)
    for val in (2, 5, 10):
        t = Tensor(X, requires_grad=True)
        s = t[:, : v.bind(val)]
        (s * s).sum().backward()
        ref = torch.tensor(X, requires_grad=True)
        (ref[:, :val] * ref[:, :val]).sum().backward()
        np.testing.assert_allclose(t.grad.numpy(), ref.grad.numpy(), rtol=1e-6)


def test_python_device_runs_symbolic_kernels():
    v = Variable("n", 1, 10)
    t = Tensor(X, device="PYTHON")
    for val in (2, 7):
        np.testing.assert_allclose(t[:, : v.bind(val)].sum(1).numpy(), X[:, :val].sum(1), rtol=1e-5)


def test_kv_cache_decode_one_kernel_set():
    """A preallocated cache written at a bound position, attention over cache[:pos+1] (issue 12's LLM decode)."""
    max_len, d = 16, 8
    rng = np.random.default_rng(1)
    cache_k = Tensor.zeros(max_len, d).contiguous().realize()
    cache_v = Tensor.zeros(max_len, d).contiguous().realize()
    ref_k, ref_v = np.zeros((max_len, d), np.float32), np.zeros((max_len, d), np.float32)
    start_pos = Variable("start_pos", 0, max_len - 1)
    compiled = None
    for pos in range(7):
        sp = start_pos.bind(pos)
        k, v, q = (rng.standard_normal((1, d)).astype(np.float32) for _ in range(3))
        cache_k[sp : sp + 1] = Tensor(k)  # setitem at a symbolic position
        cache_v.shrink(((sp, sp + 1), None)).assign(Tensor(v))  # assign through a symbolic shrink
        ref_k[pos], ref_v[pos] = k, v
        scores = (Tensor(q) @ cache_k[: sp + 1].T) / np.sqrt(d)
        got = (scores.softmax(-1) @ cache_v[: sp + 1]).numpy()
        del scores
        ref = softmax(q @ ref_k[: pos + 1].T / np.sqrt(d), -1) @ ref_v[: pos + 1]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cache_k.numpy(), ref_k)
        if pos == 1:
            compiled = GlobalCounters.compile_count  # position 0 and 1 give the same kernels; from here none is new
        elif compiled is not None:
            assert GlobalCounters.compile_count == compiled, f"position {pos} compiled a new kernel"


def test_linear_with_vars_reports_bound_values():
    v, w = Variable("n", 1, 10), Variable("m", 0, 5)
    t = Tensor(X)[:, : v.bind(4)].pad(((w.bind(2), 0), (0, 0)))
    items, var_vals = t.sum(1).linear_with_vars()
    assert var_vals == {v: 4, w: 2} and items


def test_unbound_variable_as_size():
    v = Variable("n", 1, 10)
    with pytest.raises(AssertionError, match="'n' must be bound"):
        Tensor.ones(v, 2)
    with pytest.raises(AssertionError, match="'n' must be bound"):
        Tensor(X)[:, :v]


def test_symbolic_bound_out_of_range_of_the_tensor():
    v = Variable("n", 1, 20)
    t = Tensor(X)
    with pytest.raises(ValueError, match=r"shrink bounds \(\(0, 4\), \(0, n\)\) are invalid for shape \(4, 10\)"):
        t[:, : v.bind(12)]
    with pytest.raises(ValueError, match="cannot reshape"):
        t.reshape(v.bind(3), 4)  # 12 elements are not 40


def test_binding_conflict_in_one_realize():
    v = Variable("n", 1, 10)
    t = Tensor(X)
    a, b = t[:, : v.bind(3)].sum(1), t[:, : v.bind(4)].sum(1)
    with pytest.raises(ValueError, match="'n' is bound to both 3 and 4"):
        Tensor.realize(a, b)
    np.testing.assert_allclose(a.numpy(), X[:, :3].sum(1), rtol=1e-5)  # nothing left half-done


def test_bad_symbolic_uses():
    v = Variable("n", 1, 10)
    vb = v.bind(3)
    t = Tensor(X)
    with pytest.raises(IndexError, match="step 1"):
        t[:, 0:vb:2]
    with pytest.raises(NotImplementedError, match="constant mode"):
        t.pad(((0, 0), (vb, 0)), mode="reflect")
    with pytest.raises(ValueError, match="-1"):
        t[:, :vb].reshape(-1)
    with pytest.raises(ValueError, match="shapes"):
        t[:, :vb] + t[:, : v.bind(4)]


def test_opts_never_cut_a_symbolic_axis():
    from fusegrad.codegen import lower_to_linear
    from fusegrad.codegen.opt import Opt, OptError, OptOps, check_opts
    from fusegrad.codegen.opt.beam import actions

    vb = Variable("n", 1, 64).bind(40)
    a = Tensor(RNG.standard_normal((64, 64)).astype(np.float32))
    # matmul-like with a symbolic row axis: no upcast or tile of that axis, from the heuristic or the BEAM moves
    ast = (a[:vb] @ a).schedule_linear()[-1].ast
    shape = ast.src[0].src[1].shape
    assert isinstance(shape[0], UOp) and shape[1] == 64
    assert all(o.axis != 0 for o in actions(ast, Device["CPU"].renderer.capabilities)) and all(
        o.axis != 0 for o in lower_to_linear(ast, Device["CPU"].renderer).opts
    )
    with pytest.raises(OptError, match="symbolic size"):
        check_opts([Opt(OptOps.UPCAST, 0, 4)], shape, reads_output=False)
    # a long sum over a symbolic axis is not blocked (its length is unknown when compiling)
    ast = a.reshape(4096)[: vb * 64].sum().schedule_linear()[-1].ast
    assert not any(
        o.op is OptOps.REDUCE_BLOCK
        for o in (
            *actions(ast, Device["CPU"].renderer.capabilities),
            *lower_to_linear(ast, Device["CPU"].renderer).opts,
        )
    )


def test_replay_with_new_values_through_rebind_buffers():
    """What TinyJit does: capture the kernels once, then run them with other values swapped into their buffers."""
    from fusegrad.engine.realize import run_item
    from fusegrad.schedule import ScheduleItem
    from fusegrad.schedule.variables import bound_vars, rebind_buffers, var_params

    v = Variable("n", 1, 10)
    t = Tensor(X).realize()
    out = t[:, : v.bind(3)].sum(1) * v.bind(3)
    assert bound_vars([out.uop]) == {v: 3}
    items = out.schedule_linear()
    slots = [var_params(i.ast) for i in items if var_params(i.ast)]
    assert len(slots) == 1 and list(slots[0].values()) == [v]  # one kernel reads v, from one parameter
    for val in (5, 9, 1):
        for item in items:
            run_item(ScheduleItem(item.ast, rebind_buffers(item.ast, item.buffers, item.device, {v: val}), item.device))
        np.testing.assert_allclose(items[-1].buffers[0].host_view(), X[:, :val].sum(1) * val, rtol=1e-5)
    with pytest.raises(AssertionError, match="outside its range"):
        rebind_buffers(items[0].ast, items[0].buffers, items[0].device, {v: 11})


def test_views_must_fit_for_every_value_of_the_range():
    """One kernel serves every value, so a view that fits the bound value but not the variable's range is refused."""
    v = Variable("n", 1, 20)
    t = Tensor(X)
    with pytest.raises(ValueError, match=r"leave shape \(4, 10\).*for some values"):
        t[:, : v.bind(5)]
    with pytest.raises(ValueError, match="cannot reshape"):
        t.reshape(40)[:12].reshape(Variable("k", 1, 4).bind(3), 4)  # 16 elements at k=4, only 12 there
    assert t.reshape(40)[:12].reshape(Variable("k", 1, 3).bind(3), 4).sum().item() == pytest.approx(
        X.reshape(40)[:12].sum(), rel=1e-5
    )


def test_more_ops_on_symbolic_shapes():
    v = Variable("n", 1, 8)
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    t = Tensor(x)
    for val in (2, 3, 8):
        vb = v.bind(val)
        np.testing.assert_allclose(t[:vb].std(0).numpy(), torch.tensor(x[:val]).std(0).numpy(), rtol=1e-5)
        np.testing.assert_allclose(t[:vb].var(0, correction=0).numpy(), x[:val].var(0), rtol=1e-5)
        np.testing.assert_allclose(t[vb - 1].numpy(), x[val - 1])  # a symbolic integer index
        np.testing.assert_allclose(t[:vb].cat(t[:1]).sum(0).numpy(), np.concatenate([x[:val], x[:1]]).sum(0))
        np.testing.assert_allclose(Tensor.ones(1, 4).expand(vb, 4).sum().item(), 4 * val)
        np.testing.assert_allclose(t[:vb].T.sum(1).numpy(), x[:val].T.sum(1))
        np.testing.assert_allclose(
            ((t[:vb] > 5).where(t[:vb], 0)).sum(0).numpy(), np.where(x[:val] > 5, x[:val], 0).sum(0)
        )
    with pytest.raises(ValueError, match=r"concrete, got \(n, 2\)"):
        Tensor.empty(v.bind(3), 2)
    with pytest.raises(NotImplementedError, match="concrete shape"):
        Tensor.rand(v.bind(3), 2)


def test_bound_variable_as_a_value():
    v = Variable("n", 1, 10)
    a, f = Tensor([1, 2, 3]), Tensor([1.5, 2.0, 3.0])
    for val in (2, 9):
        vb = v.bind(val)
        np.testing.assert_array_equal((a + vb).numpy(), np.array([1, 2, 3]) + val)
        np.testing.assert_array_equal((vb - a).numpy(), val - np.array([1, 2, 3]))  # Tensor's reflected op
        np.testing.assert_allclose((f * (vb + 1)).numpy(), np.array([1.5, 2.0, 3.0], np.float32) * (val + 1))
        np.testing.assert_allclose((f / vb).numpy(), np.array([1.5, 2.0, 3.0], np.float32) / val, rtol=1e-6)
        assert Tensor(vb).item() == val
