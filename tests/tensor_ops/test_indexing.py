"""Indexing, gather and scatter (docs/api.md: Indexing, and __getitem__/__setitem__/__delitem__), checked against torch.

Forward values, result dtypes and shapes, and gradients (through .sum().gradient) are compared on CPU; a subset
also runs on the PYTHON interpreter device with tiny tensors."""

import numpy as np
import pytest
import torch

from fusegrad import Context, GlobalCounters, Tensor, dtypes
from reference import FG2NP, TORCH2FG

FG2TORCH = {v: k for k, v in TORCH2FG.items()}


def check(t: Tensor, ref, dtype=None, atol=1e-6, rtol=1e-3):
    """t matches ref (torch tensor or numpy array) in dtype, shape and values."""
    if isinstance(ref, torch.Tensor):
        exp_dt = dtype or TORCH2FG[ref.dtype]
        ref = ref.detach().float().numpy() if ref.dtype == torch.bfloat16 else ref.detach().numpy()
    else:
        ref = np.asarray(ref)
        exp_dt = dtype or {np.dtype(v): k for k, v in FG2NP.items()}[ref.dtype]
    assert t.dtype == exp_dt, f"dtype {t.dtype} != {exp_dt}"
    assert t.shape == ref.shape, f"shape {t.shape} != {ref.shape}"
    out = t.numpy()
    if dtypes.is_float(exp_dt):
        if exp_dt in (dtypes.float16, dtypes.bfloat16):
            atol, rtol = 1e-2, 1e-2
        np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), atol=atol, rtol=rtol)
    else:
        np.testing.assert_array_equal(out, ref)


@pytest.fixture
def unchecked():
    """The default fast path (docs/api.md), also when the suite runs under CHECK_OOB=1 (tests/engine/test_checks.py)."""
    with Context(CHECK_OOB=0):
        yield


def rnd(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-2, 2, size=shape).astype(dtype)


def rint(*shape, lo=-50, hi=50, seed=0, dtype=np.int32):
    return np.random.default_rng(seed).integers(lo, hi, size=shape).astype(dtype)


def compare(fn, *arrays, grad=False, device="CPU", dt=None, torch_fn=None):
    """fn(T, *inputs) on fusegrad and (or torch_fn) on torch, where T makes an index tensor of that library from numpy
    data: forward values, and with grad the gradients of out.sum() w.r.t. the inputs
    (the arrays, cast to dt if given)."""
    fg_in = [Tensor(a, device=device, dtype=dt) for a in arrays]
    th_in = [torch.tensor(a).to(FG2TORCH[dt]) if dt else torch.tensor(a, requires_grad=grad) for a in arrays]
    out, ref = fn(lambda a: Tensor(a, device=device), *fg_in), (torch_fn or fn)(torch.tensor, *th_in)
    check(out, ref)
    if not grad:
        return
    ref_grads = torch.autograd.grad(ref.sum(), th_in, allow_unused=True)
    for g, r, a in zip(out.sum().gradient(*fg_in), ref_grads, arrays):
        check(g, torch.zeros(a.shape) if r is None else r, atol=1e-4, rtol=1e-3)


# ---------------------------------------------------------------------------------------------------------------------
# __getitem__: index specs are built for both libraries; ("T", data) becomes an int Tensor / torch tensor


def build(spec, lib, device="CPU"):
    def one(i):
        if isinstance(i, tuple) and len(i) == 2 and i[0] == "T":
            if lib == "np":
                return np.array(i[1], np.int64)
            return (
                Tensor(np.array(i[1], np.int32), device=device)
                if lib == "fg"
                else torch.tensor(np.array(i[1], np.int64))
            )
        return i

    is_tuple = isinstance(spec, tuple) and not (len(spec) == 2 and spec[0] == "T")
    return tuple(one(i) for i in spec) if is_tuple else one(spec)


S = slice(None)
BASIC = [
    0,
    -1,
    (1, 2),
    (S, -2),
    (slice(1, 3), S, slice(None, None, 2)),
    (Ellipsis, 1),
    (None, 0, None, S, 3),
    (slice(None, None, -1),),
    (S, slice(3, 0, -2), slice(-1, -5, -3)),
    (slice(5, 10),),
    (Ellipsis,),
    (0, Ellipsis, None),
    (slice(-100, 100, 3),),
    (S, slice(2, 2)),
]
ADVANCED = [
    [0, 2, 1],
    [[0, 1], [1, 0]],
    [[0, 1], slice(1, 3)],
    [-1, 0, -2],
    np.array([[2, 0]]),
    ("T", [2, 2, 0, 0]),
    ("T", 1),
    [],
    (S, [0, 2]),
    (S, S, [3, 0, 3]),
    ([0, 1], S, [1, 2]),
    ([0, 1], [2, 0]),
    ([0, 1], [[2], [0]]),
    (S, [0, 1], [3, 2]),
    (S, [[0], [2]], slice(1, 3), [1, 0]),
    (1, S, [0, 2]),
    (S, 0, S, [0, 1]),
    ([0], None, [1]),
    (S, [0, 1, 2], None, [1, 2, 0]),
    (None, S, [0, 1, 2], [1, 2, 0]),
    (Ellipsis, [4, 0, -5]),
    ([1, 0], Ellipsis, ("T", [[1], [2]])),
    (("T", [[1, 0]]), slice(None, None, -1), 2, [3, 1]),
    (slice(1, None), [2, 0], slice(None, None, -2)),
    ([1, 1, 1],),
    (0, [2, 2], [3, 3], 1),
    ("T", [[[1]]]),
]


def has_negative_step(spec):
    return any(isinstance(i, slice) and (i.step or 1) < 0 for i in (spec if isinstance(spec, tuple) else (spec,)))


def check_getitem(a, spec, device="CPU"):
    """x[spec] and the gradient of (x[spec] * w).sum() against torch, or numpy where torch lacks negative steps."""
    x = Tensor(a, device=device)
    if has_negative_step(spec):
        ref = a[build(spec, "np")]
        w = rnd(*ref.shape, seed=1)
        ref_grad = np.zeros_like(a)
        np.add.at(ref_grad, build(spec, "np"), w)
    else:
        xt = torch.tensor(a, requires_grad=True)
        ref = xt[build(spec, "torch")]
        w = rnd(*ref.shape, seed=1)
        (ref_grad,) = torch.autograd.grad((ref * torch.tensor(w)).sum(), [xt])
    out = x[build(spec, "fg", device)]
    check(out, ref)
    check((out * Tensor(w, device=device)).sum().gradient(x)[0], ref_grad, atol=1e-4)


@pytest.mark.parametrize("spec", BASIC + ADVANCED, ids=[str(s) for s in BASIC + ADVANCED])
def test_getitem_values_and_grad(spec):
    check_getitem(rnd(3, 3, 4, 5), spec)


@pytest.mark.parametrize("spec", [(S, [0, 1, 2], None, [1, 2, 0]), ([[0, 0], [1, 0]], [2, 2]), (1, [0, 0, 2])])
def test_getitem_python_device(spec):
    check_getitem(rnd(2, 3, 4), spec, device="PYTHON")


def test_getitem_duplicate_indices_accumulate_gradient():
    compare(lambda T, x, w: x[[0, 0, 3, 0]] * w, rnd(4, 3), rnd(4, 3, seed=1), grad=True)


@pytest.mark.parametrize(
    "dt",
    [
        dtypes.bool,
        dtypes.int8,
        dtypes.uint8,
        dtypes.int16,
        dtypes.int32,
        dtypes.int64,
        dtypes.float16,
        dtypes.bfloat16,
        dtypes.float64,
    ],
)
def test_getitem_dtypes(dt):
    src = rint(3, 4, lo=-100, hi=100).astype(np.float32)
    ref = torch.tensor(src).to(FG2TORCH[dt])
    t = Tensor(src, dtype=dt)
    for spec in [([2, 0, 2], S), (S, [[1], [3]]), (1, [0, 3])]:
        check(t[spec], ref[spec])


@pytest.mark.parametrize("idx_dt", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int64, dtypes.uint32])
def test_getitem_index_dtypes(idx_dt):
    a = rnd(6, 2)
    idx = np.array([5, 0, 3, 3])
    check(Tensor(a)[Tensor(idx, dtype=idx_dt)], torch.tensor(a)[torch.tensor(idx)])


def test_getitem_non_contiguous_source_and_index():
    a, b = rnd(4, 5, 3), rint(6, 2, lo=0, hi=4)
    idx = Tensor(b).T[:, ::-2]  # a strided, negative-step index tensor
    ref_idx = torch.tensor(b).long().T.flip(1)[:, ::2]
    compare(
        lambda T, x: x.permute(2, 0, 1)[:, idx, ::-1],
        a,
        grad=True,
        torch_fn=lambda T, x: x.permute(2, 0, 1)[:, ref_idx].flip(-1),
    )
    compare(
        lambda T, x: x[1:, ::-1][[2, 0, 1], [4, 0, 2]],
        a,
        grad=True,
        torch_fn=lambda T, x: x[1:].flip(1)[[2, 0, 1], [4, 0, 2]],
    )


def test_getitem_lazy_computed_index():
    a = rnd(5, 4)
    idx = (Tensor([3, 1, 4]) + 1) % 5
    check(Tensor(a)[idx], torch.tensor(a)[torch.tensor([4, 2, 0])])
    order = Tensor(rnd(5, seed=2)).argmax() if hasattr(Tensor, "argmax") else Tensor(int(np.argmax(rnd(5, seed=2))))
    check(Tensor(a)[order], torch.tensor(a)[int(np.argmax(rnd(5, seed=2)))])


@pytest.mark.usefixtures("unchecked")
def test_getitem_out_of_range_reads_zero_and_negative_wraps():
    a = rnd(3, 4)
    out = Tensor(a)[Tensor([0, 3, -1, -3, -4, 100]), Tensor([1, 1, -4, 4, 0, 0])].numpy()
    np.testing.assert_array_equal(out, np.array([a[0, 1], 0, a[2, 0], 0, 0, 0], np.float32))
    np.testing.assert_array_equal(Tensor(a)[[5, -7]].numpy(), np.zeros((2, 4), np.float32))


def test_getitem_zero_size():
    a = rnd(3, 0, 2)
    check(Tensor(a)[[0, 2]], torch.tensor(a)[[0, 2]])
    check(Tensor(a)[:, []], torch.tensor(a)[:, []])
    check(Tensor(rnd(3, 4))[[]], torch.tensor(rnd(3, 4))[[]])
    compare(lambda T, x: x[T(np.zeros((2, 0), np.int64))], rnd(3, 4), grad=True)
    compare(lambda T, x: x[[], 1], rnd(3, 4), grad=True)


def test_getitem_scalar_and_zero_d():
    t, r = Tensor(2.5), torch.tensor(2.5)
    check(t[...], r[...])
    check(t[None], r[None])
    check(t[None, ..., None], r[None, ..., None])
    check(Tensor([4, 5, 6])[Tensor(2)], torch.tensor([4, 5, 6], dtype=torch.int32)[torch.tensor(2)])


@pytest.mark.usefixtures("unchecked")
def test_getitem_one_kernel():
    x, idx = Tensor(rnd(8, 6)).realize(), Tensor([[1, 7], [0, 0]]).realize()
    GlobalCounters.reset()
    x[idx, 1:].realize()
    assert GlobalCounters.kernel_count == 1
    GlobalCounters.reset()
    x[idx, [5, 0]].sum().gradient(x)[0].realize()
    assert GlobalCounters.kernel_count <= 2


def test_iteration_falls_back_to_indexing():
    assert [r.tolist() for r in Tensor([[1, 2], [3, 4]])] == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    "spec,exc,words",
    [
        ((0, 0, 0), IndexError, "too many indices"),
        (5, IndexError, "out of bounds"),
        (-6, IndexError, "-6"),
        ((Ellipsis, 0, Ellipsis), IndexError, "ellipsis"),
        (slice(None, None, 0), ValueError, "step"),
        (slice(Tensor(1), None), TypeError, "Tensor"),
        (True, IndexError, "bool"),
        (1.0, IndexError, "float"),
        ([1.0, 2.0], IndexError, "float"),
        ([True, False], IndexError, "bool"),
        (Tensor([1.0]), IndexError, "float32"),
        (Tensor([True, False, True, False, True]), IndexError, "bool"),
        ("a", IndexError, "str"),
        (([[0, 1], [2]],), IndexError, "ragged"),
    ],
)
def test_getitem_errors(spec, exc, words):
    with pytest.raises(exc, match=words):
        Tensor(rnd(5, 3))[spec]


def test_getitem_zero_d_slice_error():
    with pytest.raises(IndexError):
        Tensor(1.0)[:]
    with pytest.raises(IndexError):
        Tensor(1.0)[0]


def test_delitem_raises():
    t = Tensor([1, 2])
    with pytest.raises(TypeError):
        del t[0]


# ---------------------------------------------------------------------------------------------------------------------
# __setitem__

SET_SPECS = [
    0,
    -1,
    (1, 2),
    (S, 1),
    (slice(None, None, 2), slice(1, None)),
    (slice(None, None, -1), slice(None, None, -2)),
    (Ellipsis, 0),
    (None, 1, Ellipsis),
    (slice(2, 2),),
    (slice(-100, 100, 3), S),
    [0, 2],
    ([3, 0], [1, 4]),
    (S, [4, 0]),
    ([[0], [2]], [1, 3]),
    (slice(1, None), [0, -1]),
    (("T", [-1, 1]), slice(None, None, -2)),
    (1, [2, 3]),
    ([0, 1], S, [1, 1]),
    (S, [0, 1], 2),
]


@pytest.mark.parametrize("spec", SET_SPECS, ids=[str(s) for s in SET_SPECS])
def test_setitem_matches_numpy(spec):
    shape = (4, 5, 3) if isinstance(spec, tuple) and len(spec) == 3 else (4, 5)
    a = rnd(*shape)
    t, r = Tensor(a), a.copy()  # numpy as the reference: torch has no negative-step slices
    v = rnd(*r[build(spec, "np")].shape, seed=3)
    t[build(spec, "fg")] = Tensor(v)
    r[build(spec, "np")] = v
    check(t, r)


def test_setitem_scalar_list_and_broadcast():
    t, r = Tensor(rint(4, 5)), torch.tensor(rint(4, 5))
    t[1] = 7
    r[1] = 7
    t[:, 2] = Tensor([[1, 2, 3, 4]]).reshape(4)
    r[:, 2] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    t[2:, 1:3] = [9, 8]
    r[2:, 1:3] = torch.tensor([9, 8], dtype=torch.int32)
    t[[0, 3], [4, 4]] = Tensor([[-1, -2]])
    r[[0, 3], [4, 4]] = torch.tensor([[-1, -2]], dtype=torch.int32)
    t[[1, 2]] = Tensor([5, 6, 7, 8, 9])
    r[[1, 2]] = torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32)
    check(t, r)


@pytest.mark.parametrize("dt", [dtypes.bool, dtypes.uint8, dtypes.int64, dtypes.float16, dtypes.float64])
def test_setitem_dtypes(dt):
    a = rint(3, 4, lo=0, hi=3).astype(np.float32)
    t, r = Tensor(a, dtype=dt), torch.tensor(a).to(FG2TORCH[dt])
    t[1:, [0, 2]] = 1
    r[1:, [0, 2]] = 1
    t[0] = t[2]
    r[0] = r[2].clone()
    check(t, r)


@pytest.mark.usefixtures("unchecked")
def test_setitem_duplicates_last_write_wins_and_out_of_range_skipped():
    t = Tensor([0.0, 0.0, 0.0, 0.0])
    t[[1, 3, 1, -1]] = Tensor([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(t.numpy(), [0, 3, 0, 4])
    t[Tensor([7, 0])] = Tensor([5.0, 6.0])
    np.testing.assert_array_equal(t.numpy(), [6, 3, 0, 4])


def test_setitem_overlapping_self_read():
    t, r = Tensor(rnd(6)), torch.tensor(rnd(6))
    t[1:] = t[:-1]
    r[1:] = r[:-1].clone()
    t[[0, 1]] = t[[1, 0]]
    r[[0, 1]] = r[[1, 0]]
    check(t, r)


def test_setitem_is_in_place_and_unrealized_target():
    t = Tensor(rnd(3, 2))
    alias = t
    t[0, 1] = 5.0
    assert alias is t and t.numpy()[0, 1] == 5.0
    u = Tensor.zeros(2, 3)
    u[:, 1] = 2.0
    np.testing.assert_array_equal(u.numpy(), [[0, 2, 0], [0, 2, 0]])


def test_setitem_one_kernel_for_basic_index():
    t = Tensor(rnd(8, 8)).realize()
    GlobalCounters.reset()
    t[2:6:2, ::-3] = 1.0
    assert GlobalCounters.kernel_count == 1


def test_setitem_python_device():
    a = rnd(3, 4)
    t, r = Tensor(a, device="PYTHON"), a.copy()
    t[[2, 0], 1:3] = 0.5
    r[[2, 0], 1:3] = 0.5
    t[1, ::-2] = Tensor([1.0, 2.0], device="PYTHON")
    r[1, ::-2] = [1.0, 2.0]
    check(t, r)


def test_setitem_errors():
    t = Tensor(rnd(3, 4))
    with pytest.raises(RuntimeError, match="int32"):
        t[0] = Tensor([1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"\(3,\)"):
        t[0] = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(IndexError, match="out of bounds"):
        t[3] = 1.0
    with pytest.raises(ValueError, match="step"):
        t[::0] = 1.0
    pending = t * 2  # lazily reads t's current values
    with pytest.raises(RuntimeError, match="unrealized"):
        t[0] = 1.0
    pending.realize()
    t[0] = 1.0  # fine once the reader is realized
    np.testing.assert_allclose(pending.numpy()[0], rnd(3, 4)[0] * 2)


def test_setitem_through_views_writes_the_storage():
    a = rnd(3, 4)
    # numpy as the reference: its flips and negative steps are views like fusegrad's (torch copies or refuses them)
    cases = [
        (lambda t: t.permute(1, 0), lambda r: r.transpose(1, 0), (0, 1)),
        (lambda t: t.detach(), lambda r: r, (0, 2)),
        (lambda t: t[1:], lambda r: r[1:], (0, 3)),
        (lambda t: t[:, ::-2], lambda r: r[:, ::-2], (1, 0)),
        (lambda t: t.reshape(4, 3).T, lambda r: r.reshape(4, 3).T, (2, 1)),
        (lambda t: t[1:][::-1][0], lambda r: r[1:][::-1][0], 2),
        (lambda t: t.flip(0), lambda r: np.flip(r, 0), 1),
    ]
    for view, np_view, index in cases:
        t, r = Tensor(a), a.copy()
        view(t)[index] = Tensor(np.float32(5.0)) if index == 1 else 5.0
        np_view(r)[index] = 5.0
        check(t, r)
    t, r = Tensor(a), torch.tensor(a)
    t.permute(1, 0)[1:3, 0] = Tensor([7.0, 8.0])  # and against torch where it has the same view
    r.permute(1, 0)[1:3, 0] = torch.tensor([7.0, 8.0])
    check(t, r)


def test_setitem_is_seen_by_every_view_of_the_storage():
    a = rnd(5)
    t, r = Tensor(a), torch.tensor(a)
    tail, rtail, detached, rdetached = t[2:], r[2:], t.detach(), r.detach()
    t[3] = -1.0
    r[3] = -1.0
    tail[0] = 9.0
    rtail[0] = 9.0
    check(t, r)
    check(tail, rtail)
    check(detached, rdetached)


def test_assign_into_a_view_writes_the_storage():
    a = rnd(3, 4)
    t, r = Tensor(a), torch.tensor(a)
    t[1].assign(Tensor([1.0, 2.0, 3.0, 4.0]))
    r[1].copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    col, rcol = t[:, 2], r[:, 2]
    col.assign(col * 10)
    rcol.copy_(rcol * 10)
    t.T.assign(t.T.flip(0))  # reads the storage it writes: goes through a temporary
    r.T.copy_(r.T.flip(0).clone())
    check(t, r)
    check(col, rcol)


def test_setitem_into_unrealized_view_or_expanded_view_raises():
    t = Tensor(rnd(3, 4))
    with pytest.raises(RuntimeError, match="unrealized Ops.ADD"):
        (t + 1)[1:][0] = 5.0
    with pytest.raises(RuntimeError, match=r"expanded view \(shape \(1, 4\) expanded to \(3, 4\)\)"):
        t[0:1].expand(3, 4)[1, 1] = 5.0
    check(t, rnd(3, 4))  # nothing was written


def test_setitem_on_computed_tensor_is_differentiable():
    a, v = rnd(6), rnd(2, seed=4)
    x, xv = Tensor(a), Tensor(v)
    t = x * 2
    t[1:3] = xv
    t[[5]] = xv[0:1] * 3
    (t * Tensor(rnd(6, seed=5))).sum().backward()
    ra, rv = torch.tensor(a, requires_grad=True), torch.tensor(v, requires_grad=True)
    rt = ra * 2
    rt[1:3] = rv
    rt[[5]] = rv[0:1] * 3
    (rt * torch.tensor(rnd(6, seed=5))).sum().backward()
    check(t, rt.detach())
    check(x.grad, ra.grad)  # zero where the value was overwritten
    check(xv.grad, rv.grad)


# ---------------------------------------------------------------------------------------------------------------------
# gather


@pytest.mark.parametrize(
    "shape,dim,index_shape",
    [
        ((3, 4), 0, (5, 4)),
        ((3, 4), 1, (3, 6)),
        ((3, 4), -1, (2, 2)),
        ((2, 3, 4), 1, (2, 5, 3)),
        ((2, 3, 4), 0, (1, 1, 1)),
        ((3, 4), 0, (0, 4)),
        ((5,), 0, (7,)),
    ],
)
def test_gather(shape, dim, index_shape):
    idx = rint(*index_shape, lo=0, hi=shape[dim], seed=4).astype(np.int64)
    compare(lambda T, x: x.gather(dim, T(idx)), rnd(*shape), grad=True)


def test_gather_dtypes_and_views():
    idx = rint(4, 3, lo=0, hi=4, seed=1).astype(np.int64)
    for dt in (dtypes.int8, dtypes.bool, dtypes.float16, dtypes.int64):
        compare(lambda T, x: x.gather(0, T(idx)), rint(4, 5), dt=dt)
    compare(lambda T, x: x.T[:, 1:].gather(1, T(idx)), rnd(5, 4), grad=True)
    compare(lambda T, x: x.gather(0, T(np.array(0))), np.array(3.0, np.float32), grad=True)


def test_gather_negative_step_view():
    idx = rint(4, 3, lo=0, hi=4, seed=1)
    out = Tensor(rnd(5, 4)).T[:, ::-1].gather(1, Tensor(idx))
    check(out, torch.tensor(rnd(5, 4)).T.flip(1).gather(1, torch.tensor(idx).long()))


def test_gather_python_device():
    idx = np.array([[0, 2], [1, 1]], np.int64)
    compare(lambda T, x: x.gather(1, T(idx)), rnd(2, 3), grad=True, device="PYTHON")


def test_gather_errors():
    x = Tensor(rnd(3, 2))
    with pytest.raises(RuntimeError, match="1 dims"):
        x.gather(0, Tensor([0]))
    with pytest.raises(RuntimeError, match=r"\(1, 3\)"):
        x.gather(0, Tensor([[0, 0, 0]]))
    with pytest.raises(RuntimeError, match="float32"):
        x.gather(0, Tensor([[0.0]]))
    with pytest.raises(IndexError):
        x.gather(2, Tensor([[0]]))


# ---------------------------------------------------------------------------------------------------------------------
# scatter, scatter_reduce


def test_scatter_tensor_src():
    a = rnd(4, 5)
    idx = np.array([[3, 0, 1, 2, 2], [1, 2, 0, 3, 0]], np.int64)  # unique along dim 0 per column
    # torch's backward needs src shaped like index
    compare(lambda T, x, s: x.scatter(0, T(idx), s), a, rnd(2, 5, seed=1), grad=True)
    idx1 = np.array([[4, 0], [1, 2], [0, 3], [2, 4]], np.int64)
    compare(lambda T, x, s: x.scatter(1, T(idx1), s), a, rnd(4, 2, seed=2), grad=True)
    compare(lambda T, x, s: x.scatter(-1, T(idx1[:2, :1]), s), a, rnd(2, 1, seed=2), grad=True)
    compare(lambda T, x, s: x.scatter(0, T(idx[:, :2]), s), a, rnd(3, 4, seed=3))  # src larger than index


def test_scatter_duplicates_last_write_wins_with_torch_gradient():
    idx = np.array([0, 2, 0, 0], np.int64)
    compare(lambda T, x, s: x.scatter(0, T(idx), s), rnd(3), np.array([1.0, 2.0, 3.0, 4.0], np.float32), grad=True)


def test_scatter_scalar_and_reduce():
    a = rnd(3, 4)
    idx = np.array([[0, 1, 2, 0], [0, 0, 2, 2]], np.int64)
    compare(lambda T, x: x.scatter(0, T(idx), 2.5), a, grad=True)
    for red, equivalent in (("add", "sum"), ("multiply", "prod")):
        compare(lambda T, x, red=red: x.scatter(0, T(idx), 1.5, reduce=red), a)
        # torch has no scatter(reduce=) backward: compare with the scatter_reduce that computes the same
        compare(
            lambda T, x, red=red: x.scatter(0, T(idx), 1.5, reduce=red),
            a,
            grad=True,
            torch_fn=lambda T, x, eq=equivalent: x.scatter_reduce(0, T(idx), torch.full(idx.shape, 1.5), eq),
        )
    compare(lambda T, x: x.scatter(0, T(idx), 3, reduce="add"), rint(3, 4))


def test_scatter_int_bool_and_zero_d():
    idx = np.array([[2, 0], [1, 1]], np.int64)
    compare(lambda T, x, s: x.scatter(0, T(idx), s), rint(3, 2), rint(2, 2, seed=3))
    compare(lambda T, x: x.scatter(0, T(idx), False), np.array([[True, False], [False, True], [True, True]]))
    compare(
        lambda T, x, s: x.scatter(0, T(np.array(0)), s), np.array(1.0, np.float32), np.array(4.0, np.float32), grad=True
    )


def test_scatter_python_device():
    idx = np.array([[1, 0, 1]], np.int64)
    compare(lambda T, x, s: x.scatter(0, T(idx), s), rnd(2, 3), rnd(1, 3, seed=1), grad=True, device="PYTHON")


def test_scatter_errors():
    x, idx = Tensor(rnd(3, 2)), Tensor([[0, 1]])
    with pytest.raises(TypeError, match="Tensor src"):
        x.scatter(0, idx, Tensor(rnd(1, 2)), reduce="add")
    with pytest.raises(TypeError, match="'max'"):
        x.scatter(0, idx, 1.0, reduce="max")
    with pytest.raises(RuntimeError, match="float64"):
        x.scatter(0, idx, Tensor(rnd(1, 2, dtype=np.float64)))
    with pytest.raises(RuntimeError, match=r"\(1, 1\)"):
        x.scatter(0, idx, Tensor(rnd(1, 1)))
    with pytest.raises(RuntimeError, match="1 dims"):
        x.scatter(0, Tensor([0]), 1.0)


SCATTER_IDX = np.array([[0, 0, 2], [0, 1, 2], [1, 1, 2], [0, 2, 0]], np.int64)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_float_with_grad(reduce, include_self):
    a, src = rnd(3, 3), rnd(4, 3, seed=5)
    src[0, 0] = src[1, 0] = 1.25  # tied src values
    # a tie with self only where self takes part (torch also counts an excluded self in the tie, we do not)
    a[0, 0] = 1.25 if include_self else 3.0
    src[2, 1] = 0.0  # an exact zero for prod
    compare(
        lambda T, x, s: x.scatter_reduce(0, T(SCATTER_IDX), s, reduce, include_self=include_self), a, src, grad=True
    )


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.float16])
def test_scatter_reduce_dtypes(reduce, dt):
    lo = 0 if dt is dtypes.uint8 else -9
    a, src = rint(3, 3, lo=lo, hi=10), rint(4, 3, lo=lo, hi=10, seed=6)
    for inc in (True, False):
        compare(
            lambda T, x, s, inc=inc: x.scatter_reduce(1, T(SCATTER_IDX[:3]), s, reduce, include_self=inc), a, src, dt=dt
        )


def test_scatter_reduce_dims_and_views():
    a, src = rnd(2, 3, 4), rnd(2, 5, 3, seed=7)
    idx = rint(2, 5, 3, lo=0, hi=3, seed=8).astype(np.int64)
    compare(lambda T, x, s: x.scatter_reduce(1, T(idx), s, "amax"), a, src, grad=True)
    idx2 = rint(3, 3, 2, lo=0, hi=2, seed=9).astype(np.int64)
    compare(
        lambda T, x, s: x.permute(2, 1, 0).scatter_reduce(-1, T(idx2), s.permute(2, 1, 0)[:, 2:], "prod"),
        a,
        src,
        grad=True,
    )


def test_scatter_reduce_negative_step_src():
    idx = rint(3, 2, lo=0, hi=2, seed=9).astype(np.int64)
    compare(
        lambda T, x, s: x.scatter_reduce(0, T(idx), s[::-1, ::-2], "sum"),
        rnd(2, 2),
        rnd(3, 4),
        grad=True,
        torch_fn=lambda T, x, s: x.scatter_reduce(0, T(idx), s.flip(0, 1)[:, ::2], "sum"),
    )


def test_scatter_reduce_python_device():
    idx = np.array([[0, 0], [1, 0]], np.int64)
    compare(
        lambda T, x, s: x.scatter_reduce(0, T(idx), s, "mean"), rnd(2, 2), rnd(2, 2, seed=1), grad=True, device="PYTHON"
    )


def test_scatter_reduce_errors():
    x, idx = Tensor(rnd(3)), Tensor([0, 1])
    with pytest.raises(RuntimeError, match="'max'"):
        x.scatter_reduce(0, idx, Tensor(rnd(2)), "max")
    with pytest.raises(RuntimeError, match="int32"):
        x.scatter_reduce(0, idx, Tensor([1, 2]), "sum")


# ---------------------------------------------------------------------------------------------------------------------
# masked_select, nonzero, one_hot


@pytest.mark.parametrize(
    "shape,mask_shape", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((), ()), ((0, 3), (3,))]
)
def test_masked_select(shape, mask_shape):
    m = np.random.default_rng(9).integers(0, 2, size=mask_shape).astype(bool)
    compare(lambda T, x: x.masked_select(T(m)), rnd(*shape), grad=True)


def test_masked_select_size_and_fill():
    a, m = rint(3, 4), rint(3, 4, lo=0, hi=2, seed=2).astype(bool)
    sel = a[m]
    padded = np.concatenate([sel, [-7] * 3]).astype(np.int32)
    check(Tensor(a).masked_select(Tensor(m), size=len(sel) + 3, fill_value=-7), padded)
    check(Tensor(a).masked_select(Tensor(m), size=2), sel[:2])
    check(
        Tensor(a, dtype=dtypes.int16).masked_select(Tensor(m), size=len(sel) + 1, fill_value=2.9),
        np.concatenate([sel, [2]]).astype(np.int16),
    )
    check(Tensor(a, device="PYTHON").masked_select(Tensor(m, device="PYTHON")), sel)


def test_masked_select_errors():
    with pytest.raises(RuntimeError, match="int32"):
        Tensor(rnd(3)).masked_select(Tensor([1, 0, 1]))
    with pytest.raises(ValueError):
        Tensor(rnd(3)).masked_select(Tensor([True, False]))


@pytest.mark.parametrize(
    "a",
    [
        rint(3, 4, lo=-1, hi=2),
        rnd(5) * (rint(5, lo=0, hi=2) > 0),
        np.array([True, False, True]),
        np.zeros((2, 2), np.float32),
        np.array(3.0, np.float32),
        np.array(0, np.int32),
        np.zeros((0, 2), np.int32),
        rint(2, 2, 3, lo=0, hi=2).astype(np.uint8),
        np.array([np.nan, 0.0, -0.0, 1.0], np.float32),
    ],
)
def test_nonzero(a):
    check(Tensor(a).nonzero(), torch.tensor(a).nonzero().int())


def test_nonzero_size_and_fill():
    a = np.array([[0, 3, 0], [4, 0, 5]], np.int32)
    ref = torch.tensor(a).nonzero().int()
    check(Tensor(a).nonzero(size=5, fill_value=-1), torch.cat([ref, torch.full((2, 2), -1, dtype=torch.int32)]))
    check(Tensor(a).nonzero(size=2), ref[:2])
    check(
        Tensor(a, device="PYTHON").nonzero(size=4, fill_value=9.5),
        torch.cat([ref, torch.full((1, 2), 9, dtype=torch.int32)]),
    )


@pytest.mark.parametrize("num_classes", [-1, 5])
def test_one_hot(num_classes):
    a = rint(2, 3, lo=0, hi=4)
    check(Tensor(a).one_hot(num_classes), torch.nn.functional.one_hot(torch.tensor(a).long(), num_classes).int())


def test_one_hot_empty_dtypes_and_device():
    check(Tensor(np.zeros((2, 0), np.int32)).one_hot(0), np.zeros((2, 0, 0), np.int32))
    check(Tensor(np.array([2, 0], np.uint8), device="PYTHON").one_hot(3), np.array([[0, 0, 1], [1, 0, 0]], np.int32))
    check(Tensor(np.array(1, np.int64)).one_hot(2), np.array([0, 1], np.int32))


def test_one_hot_errors():
    with pytest.raises(RuntimeError, match="float32"):
        Tensor([1.0]).one_hot(3)
    with pytest.raises(ValueError, match="-2"):
        Tensor([1]).one_hot(-2)


def test_setitem_finds_lazy_readers_through_views_only():
    t = Tensor(rnd(3, 4)).realize()
    flat = t.reshape(12)  # a view: sees the write
    lazy = flat.permute(0) * 3  # computes from the storage through two views
    with pytest.raises(RuntimeError, match="unrealized graph"):
        t[1] = 5.0
    del lazy
    t[1] = 5.0  # the only reader is gone: views are fine
    want = rnd(3, 4)
    want[1] = 5.0
    np.testing.assert_allclose(flat.numpy(), want.reshape(12))
