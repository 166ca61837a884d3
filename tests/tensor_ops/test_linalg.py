"""G18 linear algebra (dot, matmul, einsum, linear, qr, svd, newton_schulz) against torch: values, dtypes, grads."""

import numpy as np
import pytest
import torch

from fusegrad import GlobalCounters, Tensor, dtypes
from fusegrad.uop.ops import Ops
from fusegrad.runtime.device import Device
from reference import check_torch as check

GRAD_ATOL, GRAD_RTOL = 1e-4, 1e-3


def rand(*shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed + 31 * len(shape) + sum(shape))
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-20, 20, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def compare(fg_fn, th_fn, *arrays, device="CPU", atol=None, views=None):
    """Same inputs into fg_fn and th_fn; outputs must match, and so must the gradients of every float32/64 input."""
    fg_in = [Tensor(a, device=device) for a in arrays]
    th_in = [torch.tensor(a, requires_grad=a.dtype in (np.float32, np.float64)) for a in arrays]
    fg_args, th_args = ([views[0](t) for t in fg_in], [views[1](t) for t in th_in]) if views else (fg_in, th_in)
    out, ref = fg_fn(*fg_args), th_fn(*th_args)
    check(out, ref, atol)
    targets = [i for i, t in enumerate(th_in) if t.requires_grad]
    if not targets:
        return out
    w = rand(*ref.shape, seed=9)
    (ref * torch.tensor(w)).sum().backward()
    grads = (out * Tensor(w, device=device)).sum().gradient(*(fg_in[i] for i in targets))
    for i, g in zip(targets, grads):
        assert g.shape == tuple(th_in[i].shape) and g.dtype == fg_in[i].dtype
        np.testing.assert_allclose(
            g.numpy(), th_in[i].grad.numpy(), atol=GRAD_ATOL, rtol=GRAD_RTOL, err_msg=f"grad {i}"
        )
    return out


# ---------------------------------------------------------------------------------------------------------------------
# dot / matmul

MATMUL_SHAPES = [
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3, 4)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((4, 2, 3), (3, 5)),
    ((0, 3), (3, 4)),
    ((2, 0), (0, 3)),
    ((1, 5), (5, 1)),
]


@pytest.mark.parametrize("a,b", MATMUL_SHAPES)
def test_matmul_shapes(a, b):
    out = compare(lambda x, y: x @ y, lambda x, y: x @ y, rand(*a), rand(*b, seed=1), atol=1e-5)
    if a == (3,) and b == (3,):
        assert out.shape == ()


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.float16, np.float64])
def test_matmul_dtypes(dtype):
    x, y = rand(3, 4, dtype=dtype), rand(4, 2, dtype=dtype, seed=1)
    check(Tensor(x).matmul(Tensor(y)), torch.tensor(x) @ torch.tensor(y))
    check(Tensor(x).dot(Tensor(y)), torch.tensor(x) @ torch.tensor(y))


def test_matmul_mixed_and_accumulation_dtype():
    x, y = rand(3, 4, dtype=np.float16), rand(4, 2, seed=1)
    check(Tensor(x) @ Tensor(y), torch.tensor(x).float() @ torch.tensor(y))
    xi = rand(3, 4, dtype=np.int32)
    check(Tensor(xi) @ Tensor(y), torch.tensor(xi).float() @ torch.tensor(y))
    out = Tensor(x).matmul(Tensor(x.T.copy()), dtype=dtypes.float32)
    check(out, torch.tensor(x).float() @ torch.tensor(x.T.copy()).float(), atol=1e-5)
    out = Tensor(rand(2, 3, dtype=np.int8)).dot(Tensor(rand(3, 2, dtype=np.int8, seed=1)), dtype="int32")
    check(out, torch.tensor(rand(2, 3, dtype=np.int8)).int() @ torch.tensor(rand(3, 2, dtype=np.int8, seed=1)).int())


def test_matmul_views_reverse_and_kernels():
    x, y = rand(4, 3), rand(5, 4, seed=1)
    compare(lambda x, y: x.T @ y.T, lambda x, y: x.T @ y.T, x, y, atol=1e-5)
    compare(
        lambda x, y: x.flip(0)[:, ::2].matmul(y.T.flip(0)[::2], reverse=True),
        lambda x, y: y.T.flip(0)[::2] @ x.flip(0)[:, ::2],
        rand(5, 6),
        rand(5, 4, seed=1),
        atol=1e-5,
    )
    GlobalCounters.reset()
    (Tensor(x).T @ Tensor(y).T).realize()
    assert GlobalCounters.kernel_count == 1


def test_large_matmul_with_a_transposed_weight_copies_it_for_the_register_tiles():
    from fusegrad.codegen import lower_to_linear
    from fusegrad.codegen.opt import OptOps

    xn, wn = rand(128, 784), rand(64, 784, seed=1)
    GlobalCounters.reset()
    out = Tensor(xn) @ Tensor(wn).T
    kernels = [item for item in out.schedule_linear() if item.ast.op is Ops.SINK]
    assert len(kernels) == 2  # W.T made contiguous, then the matmul
    assert any(o.op is OptOps.UPCAST for o in lower_to_linear(kernels[-1].ast, Device["CPU"].renderer).opts)
    np.testing.assert_allclose(out.numpy(), xn @ wn.T, rtol=1e-4, atol=1e-4)
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    (x @ w.T).relu().sum().backward()
    (xt @ wt.T).relu().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_matmul_errors():
    with pytest.raises(RuntimeError, match="at least 1D"):
        Tensor(2.0).dot(Tensor(rand(3)))
    with pytest.raises(RuntimeError, match=r"\(3 != 4\)"):
        Tensor(rand(2, 3)) @ Tensor(rand(4, 2))
    with pytest.raises(RuntimeError, match="batch"):
        Tensor(rand(2, 2, 3)) @ Tensor(rand(3, 3, 2))


# ---------------------------------------------------------------------------------------------------------------------
# einsum

EINSUM_CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("bii->b", [(2, 3, 3)]),
    ("iji->j", [(3, 2, 3)]),
    ("...ij,jk", [(2, 3, 4), (4, 5)]),
    ("...ij,jk->ik", [(2, 3, 4), (4, 5)]),
    ("bA,Ab,Bc", [(2, 3), (3, 2), (4, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(3, 4)]),
    ("...,...", [(2, 1, 3), (4, 1)]),
    ("ij,jk->ik", [(2, 1), (3, 4)]),
    ("bhqd, bhkd -> bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("i,i->", [(5,), (5,)]),
    ("iij,jkk->ik", [(2, 2, 3), (3, 4, 4)]),
    ("ij->", [(0, 3)]),
    ("i...->...", [(3, 2, 2)]),
]


@pytest.mark.parametrize("formula,shapes", EINSUM_CASES)
def test_einsum(formula, shapes):
    arrays = [rand(*s, seed=i) for i, s in enumerate(shapes)]
    compare(lambda *ts: Tensor.einsum(formula, *ts), lambda *ts: torch.einsum(formula, *ts), *arrays, atol=1e-5)


def test_einsum_list_views_dtypes_kernels():
    a, b = rand(3, 4), rand(4, 5, seed=1)
    compare(
        lambda x, y: Tensor.einsum("ji,kj->ik", [x.T, y.T]),
        lambda x, y: torch.einsum("ji,kj->ik", x.T, y.T),
        a,
        b,
        atol=1e-5,
    )
    ai, bi = rand(3, 4, dtype=np.int8), rand(4, 5, dtype=np.int8, seed=1)
    ta, tb = torch.tensor(ai), torch.tensor(bi)
    check(Tensor.einsum("ij,jk->ik", Tensor(ai), Tensor(bi)), torch.einsum("ij,jk->ik", ta, tb))
    out = Tensor.einsum("ij,jk->ik", Tensor(ai), Tensor(bi), dtype=dtypes.int32)
    check(out, torch.einsum("ij,jk->ik", torch.tensor(ai).int(), torch.tensor(bi).int()))
    mixed = Tensor.einsum("ij,jk", Tensor(a.astype(np.float16)), Tensor(b))
    check(mixed, torch.einsum("ij,jk", torch.tensor(a.astype(np.float16)).float(), torch.tensor(b)), atol=1e-5)
    GlobalCounters.reset()
    Tensor.einsum("bij,bjk->bik", Tensor(rand(2, 3, 4)), Tensor(rand(2, 4, 5))).realize()
    assert GlobalCounters.kernel_count == 1


def test_einsum_errors():
    a, b = Tensor(rand(2, 3)), Tensor(rand(3, 4))
    with pytest.raises(ValueError, match="operand"):
        Tensor.einsum("ij,jk->ik", a)
    with pytest.raises(ValueError, match="operand"):
        Tensor.einsum("ij->ij", a, b)
    with pytest.raises(RuntimeError, match="subscript j has size 2"):
        Tensor.einsum("ij,jk->ik", a, Tensor(rand(2, 4)))
    with pytest.raises(RuntimeError, match="number of subscripts"):
        Tensor.einsum("ijk,jk->i", a, b)
    with pytest.raises(RuntimeError, match="more than once"):
        Tensor.einsum("ij,jk->ii", a, b)
    with pytest.raises(RuntimeError, match="does not appear"):
        Tensor.einsum("ij,jk->iz", a, b)
    with pytest.raises(RuntimeError, match="one size"):
        Tensor.einsum("ii->i", a)


# ---------------------------------------------------------------------------------------------------------------------
# linear


def test_linear():
    x, w, b = rand(2, 5, 3), rand(3, 4, seed=1), rand(4, seed=2)
    compare(lambda x, w, b: x.linear(w, b), lambda x, w, b: torch.nn.functional.linear(x, w.T, b), x, w, b, atol=1e-5)
    compare(lambda x, w: x.linear(w), lambda x, w: x @ w, x, w, atol=1e-5)
    compare(lambda x, w, b: x.linear(w, b), lambda x, w, b: x * w + b, x, rand(3, seed=3), rand(3, seed=4))
    out = Tensor(x.astype(np.float16)).linear(Tensor(w.astype(np.float16)), dtype=dtypes.float32)
    check(out, torch.tensor(x.astype(np.float16)).float() @ torch.tensor(w.astype(np.float16)).float(), atol=1e-5)
    with pytest.raises(RuntimeError, match="mismatch"):
        Tensor(x).linear(Tensor(rand(4, 4)))


# ---------------------------------------------------------------------------------------------------------------------
# qr, svd, newton_schulz


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3), (1, 1)])
def test_qr(shape):
    a = rand(*shape)
    q, r = Tensor(a).qr()
    tq, tr = torch.linalg.qr(torch.tensor(a), mode="complete")
    check(q, tq, atol=1e-5)
    check(r, tr, atol=1e-5)
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-5)


def test_qr_gradient_and_errors():
    # a tall input's complete R is the reduced R over zero rows
    compare(lambda x: x.qr()[1][:3], lambda x: torch.linalg.qr(x)[1], rand(4, 3), atol=1e-5)
    compare(lambda x: x.qr()[0], lambda x: torch.linalg.qr(x)[0], rand(3, 3), atol=1e-5)
    q, r = Tensor(rand(3, 3, dtype=np.int32)).qr()
    assert q.dtype == r.dtype == dtypes.float32
    with pytest.raises(RuntimeError, match="at least 2 dims"):
        Tensor(rand(3)).qr()


def _canonical_signs(u, axis):
    """Flip each singular vector so its largest entry is positive (the SVD fixes vectors only up to sign)."""
    big = np.take_along_axis(u, np.abs(u).argmax(axis, keepdims=True), axis)
    return u * np.sign(big)


@pytest.mark.parametrize(
    "shape,full_matrices",
    [
        ((4, 4), True),
        ((5, 3), True),
        ((5, 3), False),
        ((3, 5), True),
        ((3, 5), False),
        ((2, 4, 3), True),
        ((1, 1), True),
    ],
)
def test_svd(shape, full_matrices):
    a = rand(*shape)
    u, s, vh = Tensor(a).svd(full_matrices=full_matrices)
    tu, ts, tvh = torch.linalg.svd(torch.tensor(a), full_matrices=full_matrices)
    assert (u.shape, s.shape, vh.shape) == (tuple(tu.shape), tuple(ts.shape), tuple(tvh.shape))
    assert u.dtype == s.dtype == vh.dtype == dtypes.float32
    check(s, ts, atol=1e-5)
    k = min(shape[-2:])
    un, sn, vhn = u.numpy(), s.numpy(), vh.numpy()
    np.testing.assert_allclose(_canonical_signs(un[..., :k], -2), _canonical_signs(tu.numpy()[..., :k], -2), atol=1e-5)
    np.testing.assert_allclose(
        _canonical_signs(vhn[..., :k, :], -1), _canonical_signs(tvh.numpy()[..., :k, :], -1), atol=1e-5
    )
    np.testing.assert_allclose((un[..., :k] * sn[..., None, :]) @ vhn[..., :k, :], a, atol=1e-5)
    eye = np.broadcast_to(np.eye(un.shape[-1]), un.shape[:-2] + (un.shape[-1],) * 2)
    np.testing.assert_allclose(np.swapaxes(un, -1, -2) @ un, eye, atol=1e-5)


def test_svd_special_and_gradient():
    # rank-deficient input: a zero singular value still gets an orthonormal vector
    a = np.outer(rand(4), rand(3, seed=1)).astype(np.float32)
    u, s, vh = Tensor(a).svd()
    np.testing.assert_allclose(s.numpy(), torch.linalg.svdvals(torch.tensor(a)).numpy(), atol=1e-5)
    np.testing.assert_allclose(u.numpy().T @ u.numpy(), np.eye(4), atol=1e-5)
    np.testing.assert_allclose(vh.numpy() @ vh.numpy().T, np.eye(3), atol=1e-5)
    compare(lambda x: x.svd(full_matrices=False)[1], lambda x: torch.linalg.svdvals(x), rand(4, 3), atol=1e-5)
    with pytest.raises(RuntimeError, match="at least 2 dims"):
        Tensor(rand(3)).svd()


def _newton_schulz_ref(g, steps, abc, eps=1e-7):
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + eps)
    for a, b, c in abc[:steps]:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def test_newton_schulz():
    muon = (3.4445, -4.7750, 2.0315)
    for shape in [(3, 5), (6, 4)]:
        g = rand(*shape).astype(np.float64)
        out = Tensor(g).newton_schulz(5, muon)
        assert out.dtype == dtypes.float64 and out.shape == shape
        np.testing.assert_allclose(out.numpy(), _newton_schulz_ref(g, 5, [muon] * 5), atol=1e-6, rtol=1e-6)
    per_step = [(2.0, -1.5, 0.5), (1.5, -0.5, 0.0)]
    g = rand(4, 4)
    out = Tensor(g).newton_schulz(2, per_step)
    np.testing.assert_allclose(out.numpy(), _newton_schulz_ref(g, 2, per_step), atol=1e-5, rtol=1e-4)
    # the classic cubic iteration converges to the orthogonal polar factor
    orth = Tensor(g.astype(np.float64)).newton_schulz(40, (1.5, -0.5, 0.0)).numpy()
    np.testing.assert_allclose(orth.T @ orth, np.eye(4), atol=1e-6)
    with pytest.raises(ValueError, match="params"):
        Tensor(g).newton_schulz(3, (1.0, 2.0))


# ---------------------------------------------------------------------------------------------------------------------
# the PYTHON interpreter backend on tiny tensors


def test_python_device_subset():
    compare(lambda x, y: x @ y, lambda x, y: x @ y, rand(2, 3, 4), rand(4, 3, seed=1), device="PYTHON", atol=1e-5)
    compare(
        lambda x, y: Tensor.einsum("iij,jk->ik", x, y),
        lambda x, y: torch.einsum("iij,jk->ik", x, y),
        rand(3, 3, 2),
        rand(2, 4, seed=1),
        device="PYTHON",
        atol=1e-5,
    )
    xi, yi = rand(3, 4, dtype=np.int32), rand(4, 2, dtype=np.int32, seed=1)
    check(Tensor(xi, device="PYTHON") @ Tensor(yi, device="PYTHON"), torch.tensor(xi) @ torch.tensor(yi))
    q, r = Tensor(rand(3, 2), device="PYTHON").qr()
    tq, tr = torch.linalg.qr(torch.tensor(rand(3, 2)), mode="complete")
    check(q, tq, atol=1e-5)
    check(r, tr, atol=1e-5)


# a panel is two vectors of the compiler's width: 32 float32 columns with AVX-512, 16 with AVX2
def _panel_columns() -> int:
    from fusegrad.engine.realize import device_capabilities

    return 2 * device_capabilities("CPU").vector_bytes // 4


@pytest.fixture
def small_panels(monkeypatch):
    """Every matmul of at least one row and 2 panels of columns packs its weight, however small."""
    import fusegrad.schedule.panels as panels_pass

    monkeypatch.setattr(panels_pass, "PANEL_MIN_ROWS", 1)
    monkeypatch.setattr(panels_pass, "PANEL_MIN_MACS", 1)
    return _panel_columns()


@pytest.mark.parametrize("rows,k,panels", [(1, 1, 2), (97, 67, 2), (13, 1, 3), (8, 257, 3), (31, 5, 4)])
def test_panel_matmul_values_and_gradients(small_panels, rows, k, panels):
    n = panels * small_panels
    x, w = rand(rows, k), rand(k, n, seed=1)
    out = Tensor(x) @ Tensor(w)
    kernels = [item for item in out.schedule_linear() if item.ast.op is Ops.SINK]
    assert len(kernels) == 2  # w copied into panels, then the matmul
    compare(lambda a, b: a @ b, lambda a, b: a @ b, x, w, atol=1e-4)
    # x @ W.T (a transposed view) and a batched x pack too
    compare(lambda a, b: a @ b.T, lambda a, b: a @ b.T, x, rand(n, k, seed=2), atol=1e-4)
    compare(lambda a, b: (a @ b).relu(), lambda a, b: (a @ b).relu(), rand(2, rows, k), w, atol=1e-4)


def test_panel_matmul_dtypes_and_accumulation(small_panels):
    n = 2 * small_panels
    x, w = rand(9, 40, dtype=np.float64), rand(40, n, dtype=np.float64, seed=1)
    compare(lambda a, b: a @ b, lambda a, b: a @ b, x, w, atol=1e-10)
    xh, wh = rand(9, 40, dtype=np.float16), rand(40, n, dtype=np.float16, seed=1)
    out = Tensor(xh).matmul(Tensor(wh), dtype=dtypes.float32)
    assert out.dtype == dtypes.float32
    np.testing.assert_allclose(out.numpy(), xh.astype(np.float32) @ wh.astype(np.float32), rtol=1e-3, atol=1e-3)


def _packs(x: Tensor, w: Tensor) -> bool:
    """Whether the scheduler reads w in panels: the matmul then runs as two kernels (the copy, the product)."""
    return len([item for item in (x @ w).schedule_linear() if item.ast.op is Ops.SINK]) == 2


def test_panel_matmul_needs_whole_panels_and_a_big_product(small_panels):
    n = 2 * small_panels
    assert _packs(Tensor.rand(4, 8).realize(), Tensor.rand(8, n).realize())
    assert _packs(Tensor.rand(2, 4, 8).realize(), Tensor.rand(8, n).realize())  # a batched x
    assert not _packs(Tensor.rand(4, 8).realize(), Tensor.rand(8, n + 1).realize())  # no partial panels
    assert not _packs(Tensor.rand(4, 8).realize(), Tensor.rand(8, small_panels).realize())  # one panel: no gain
    assert not _packs(Tensor.rand(8).realize(), Tensor.rand(8, n).realize())  # a vector times a matrix
    assert not _packs(Tensor.rand(2, 4, 8).realize(), Tensor.rand(2, 8, n).realize())  # batched weights
    ints = Tensor.rand(4, 8).cast(dtypes.int32).realize(), Tensor.rand(8, n).cast(dtypes.int32).realize()
    assert not _packs(*ints)


def test_large_matmul_packs_its_weight_and_small_does_not():
    assert _packs(Tensor.empty(1024, 1024), Tensor.empty(1024, 1024))
    assert not _packs(Tensor.empty(128, 128), Tensor.empty(128, 128))  # below every target's minimum (panels.py)
    # the decision is the target's (its renderer's weight_panels), not the front end's
    assert not _packs(Tensor.empty(1024, 1024, device="PYTHON"), Tensor.empty(1024, 1024, device="PYTHON"))


def test_the_forward_copy_of_a_transposed_weight_is_not_what_gradients_read():
    """x @ W.T copies W.T for the forward's tiles (a "layout" copy); x's gradient reads W itself, where it tiles
    better, and equals torch's."""
    xn, wn = rand(64, 96), rand(80, 96, seed=1)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    out = x @ w.T
    assert any(u.op is Ops.CONTIGUOUS and u.arg == "layout" for u in out.uop.toposort())
    gn = rand(64, 80, seed=2)
    (out * Tensor(gn)).sum().backward()
    assert not any(u.op is Ops.CONTIGUOUS and u.arg == "layout" for u in x.grad.uop.toposort())
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    ((xt @ wt.T) * torch.tensor(gn)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-5, atol=1e-5)
