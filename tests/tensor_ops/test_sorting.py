"""Sorting, selection and misc (sort, argsort, topk, keccak, hash, multinomial), checked against torch,
Python's sort and hashlib.

Both sorting paths are covered: short rows (<= RANK_SORT_MAX) are ranked, longer rows go through the bitonic network.
Forward values, indices, dtypes and shapes, and value gradients (through .sum().gradient) are compared on CPU; a subset
also runs on the PYTHON interpreter device with tiny tensors."""

import hashlib

import numpy as np
import pytest
import torch

from fusegrad import GlobalCounters, Tensor, dtypes
from reference import NP2FG, NP_TYPES
from fusegrad.tensor_ops import sorting

SHORT, LONG = 9, 100  # row lengths on either side of RANK_SORT_MAX


@pytest.fixture(params=["rank", "network"])
def path(request, monkeypatch):
    """Which sorting path short rows take: ranking (the default) or the bitonic network (forced, to keep the network
    tests cheap: a 13-long row pads to 16 and needs 10 exchange steps)."""
    if request.param == "network":
        monkeypatch.setattr(sorting, "RANK_SORT_MAX", 0)
    return request.param


def check(t, ref, atol=1e-6, rtol=1e-3):
    """t matches ref (numpy array or torch tensor; torch int64 indices are expected as int32)
    in shape, dtype, values."""
    if isinstance(ref, torch.Tensor):
        ref = ref.detach().numpy().astype(np.int32) if ref.dtype == torch.int64 else ref.detach().numpy()
    ref = np.asarray(ref)
    assert t.dtype == NP2FG[ref.dtype], f"dtype {t.dtype} != expected {ref.dtype}"
    assert t.shape == ref.shape, f"shape {t.shape} != expected {ref.shape}"
    out = t.numpy()
    if np.issubdtype(ref.dtype, np.floating):
        np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    else:
        np.testing.assert_array_equal(out, ref)


def stable_order(a, axis, descending):
    """Reference: the stable sort permutation along axis (Python's sort; reverse=True keeps ties in order)."""
    moved = np.moveaxis(a, axis, -1)
    idx = np.zeros(moved.shape, np.int32)
    for r in np.ndindex(moved.shape[:-1]):
        row = moved[r].tolist()
        idx[r] = sorted(range(len(row)), key=lambda j: row[j], reverse=descending)
    return np.moveaxis(idx, -1, axis)


def data(np_dt, *shape, seed=0):
    """Values with many ties, and the extremes of the dtype."""
    rng = np.random.default_rng(seed)
    if np_dt is np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(np_dt, np.floating):
        return (rng.integers(-8, 8, size=shape) / 4).astype(np_dt)
    info = np.iinfo(np_dt)
    out = rng.integers(max(info.min, -20), min(info.max, 20), size=shape).astype(np_dt)
    out.reshape(-1)[:2] = (info.min, info.max)
    return out


def test_the_lengths_cover_both_paths():
    assert SHORT <= sorting.RANK_SORT_MAX < LONG


# ---------------------------------------------------------------------------------------------------------------------
# sort / argsort


@pytest.mark.parametrize("np_dt", NP_TYPES, ids=lambda d: np.dtype(d).name)
def test_sort_every_dtype_is_stable(np_dt, path):
    a = data(np_dt, 3, 13, seed=1)
    for descending in (False, True):
        values, index = Tensor(a).sort(descending=descending)
        ref_index = stable_order(a, 1, descending)
        check(index, ref_index)
        check(values, np.take_along_axis(a, ref_index, 1))
        check(Tensor(a).argsort(-1, descending), ref_index)


def sort_specials(n, np_dt):
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1.5, np.nan, 0.0], np.float32)
    a = np.resize(special, (3, n)).astype(np_dt)
    if np_dt is np.float64:
        a[0, :4] = (1e300, -1e-300, 1e-300, -1e300)  # beyond float32
    a[1] = np.random.default_rng(1).permutation(a[1])
    a[2] = np.random.default_rng(2).standard_normal(n)
    for descending in (False, True):
        values, index = Tensor(a).sort(1, descending=descending)
        ref_values, ref_index = torch.tensor(a).sort(dim=1, descending=descending, stable=True)
        check(values, ref_values)
        check(index, ref_index)


@pytest.mark.parametrize("n,np_dt", [(SHORT, np.float32), (13, np.float64)])
def test_sort_nan_inf_and_signed_zero_like_torch(n, np_dt, path):
    sort_specials(n, np_dt)


def test_sort_nan_inf_and_signed_zero_long_rows():
    sort_specials(LONG, np.float32)


@pytest.mark.parametrize("n", [SHORT, pytest.param(LONG, marks=pytest.mark.slow)])  # LONG: the network sort (CI)
def test_sort_gradient(n):
    a = np.random.default_rng(2).standard_normal((3, n)).astype(np.float32)
    weights = np.random.default_rng(3).standard_normal((3, n)).astype(np.float32)
    for dim, descending in ((1, False), (-1, True))[n > SHORT :]:
        t, tt = Tensor(a), torch.tensor(a, requires_grad=True)
        out = t.sort(dim, descending)[0] * Tensor(weights)
        ref = tt.sort(dim=dim, descending=descending)[0] * torch.tensor(weights)
        check(out, ref)
        (grad,) = out.sum().gradient(t)
        check(grad, torch.autograd.grad(ref.sum(), tt)[0], atol=1e-4)


def test_long_rows_by_default_network():
    """Rows longer than RANK_SORT_MAX take the network without any patching; 100 pads to 128."""
    a = data(np.int32, 3, LONG, seed=2)
    check(Tensor(a).argsort(1, descending=True), stable_order(a, 1, True))
    b = data(np.uint16, LONG, seed=3)
    values, index = Tensor(b).sort()
    check(index, stable_order(b, 0, False))
    check(values, b[stable_order(b, 0, False)])


def test_sort_bfloat16(path):
    a = np.random.default_rng(10).permutation(np.arange(-6, 7)).astype(np.float32) / 4  # exact in bfloat16
    t, tt = Tensor(a).cast(dtypes.bfloat16), torch.tensor(a).bfloat16()
    for descending in (False, True):
        values, index = t.sort(descending=descending)
        ref_values, ref_index = tt.sort(descending=descending, stable=True)
        assert values.dtype == dtypes.bfloat16
        np.testing.assert_array_equal(values.numpy(), ref_values.float().numpy())
        check(index, ref_index)


def test_sort_along_other_dims_and_views(path):
    a = np.random.default_rng(4).standard_normal((4, 5, 6)).astype(np.float32)
    t, tt = Tensor(a), torch.tensor(a)
    views = [
        (lambda x: x, lambda x: x),
        (lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1)),
        (lambda x: x[::-1, 1:, ::2], lambda x: x.flip(0)[:, 1:, ::2]),
        (lambda x: x[:, :1].expand(4, 3, 6), lambda x: x[:, :1].expand(4, 3, 6)),
    ]
    for (fg_view, th_view), dim in zip(views, (1, 0, -1, 1)):
        values, index = fg_view(t).sort(dim)
        ref_values, ref_index = th_view(tt).sort(dim=dim, stable=True)
        check(values, ref_values)
        check(index, ref_index)
    x, xx = Tensor(a), torch.tensor(a, requires_grad=True)
    out = x.permute(2, 0, 1)[::-1].sort(1, descending=True)[0].square()
    ref = xx.permute(2, 0, 1).flip(0).sort(dim=1, descending=True)[0].square()
    check(out, ref)
    check(out.sum().gradient(x)[0], torch.autograd.grad(ref.sum(), xx)[0], atol=1e-4)


def test_sort_scalar_single_and_empty(path):
    values, index = Tensor(2.5).sort()
    check(values, np.float32(2.5))
    check(index, np.int32(0))
    values, index = Tensor(np.array([[7], [3]], np.int32)).sort(1)
    check(values, np.array([[7], [3]], np.int32))
    check(index, np.zeros((2, 1), np.int32))
    for shape, dim in (((0,), 0), ((2, 0), 1), ((0, 3), 1)):
        values, index = Tensor(np.zeros(shape, np.float32)).sort(dim)
        check(values, np.zeros(shape, np.float32))
        check(index, np.zeros(shape, np.int32))


def test_sort_bad_dim():
    with pytest.raises(IndexError, match="2"):
        Tensor(np.zeros((2, 3), np.float32)).sort(2)
    with pytest.raises(IndexError, match="-3"):
        Tensor(np.zeros((2, 3), np.float32)).argsort(-3)
    with pytest.raises(IndexError):
        Tensor(1.0).sort(1)


def test_sort_kernel_counts(monkeypatch):
    short = Tensor(np.random.default_rng(5).standard_normal((8, SHORT)).astype(np.float32)).realize()
    GlobalCounters.reset()
    Tensor.realize_all(list(short.sort()))
    # ranks, then index and values picked by rank (the scheduler may also keep the order keys in a buffer)
    assert GlobalCounters.kernel_count <= 5, GlobalCounters.kernel_count
    monkeypatch.setattr(sorting, "RANK_SORT_MAX", 0)
    long = Tensor(np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)).realize()
    GlobalCounters.reset()
    Tensor.realize_all(list(long.sort()))
    steps = 4 * 5 // 2
    groups = -(-steps // sorting.STEPS_PER_KERNEL)
    assert GlobalCounters.kernel_count <= 2 * groups + 2, GlobalCounters.kernel_count


# ---------------------------------------------------------------------------------------------------------------------
# topk


@pytest.mark.parametrize("n", [SHORT, pytest.param(LONG, marks=pytest.mark.slow)])  # LONG: a bitonic sort per k, CI
def test_topk_against_torch(n):
    a = np.random.default_rng(6).standard_normal((3, n)).astype(np.float32)
    cases = ((1, -1, True), (4, 1, False), (n, 1, True), (2, 0, True), (0, 1, True))
    for k, dim, largest in cases if n == SHORT else cases[:2]:
        t, tt = Tensor(a), torch.tensor(a, requires_grad=True)
        values, index = t.topk(k, dim, largest)
        ref_values, ref_index = tt.topk(k, dim, largest)
        check(values, ref_values)
        check(index, ref_index)
        if k:
            check((values * 2).sum().gradient(t)[0], torch.autograd.grad((ref_values * 2).sum(), tt)[0], atol=1e-4)


def test_topk_ties_dtypes_and_scalar(path):
    a = np.array([[3, 1, 3, 2, 3], [5, 5, 5, 5, 5]], np.int32)
    values, index = Tensor(a).topk(2)
    check(values, np.array([[3, 3], [5, 5]], np.int32))
    check(index, np.array([[0, 2], [0, 1]], np.int32))  # ties: the earlier position first
    values, index = Tensor(a.astype(np.uint8)).topk(3, largest=False)
    check(values, np.array([[1, 2, 3], [5, 5, 5]], np.uint8))
    check(index, np.array([[1, 3, 0], [0, 1, 2]], np.int32))
    values, index = Tensor(4.0).topk(1)
    check(values, np.float32(4.0))
    check(index, np.int32(0))


def test_topk_bad_arguments():
    t = Tensor(np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="k=6"):
        t.topk(6)
    with pytest.raises(ValueError, match="k=3"):
        t.topk(3, dim=0)
    with pytest.raises(ValueError, match="-1"):
        t.topk(-1)
    with pytest.raises(NotImplementedError, match="sorted_"):
        t.topk(2, sorted_=False)
    with pytest.raises(IndexError, match="2"):
        t.topk(1, dim=2)


# ---------------------------------------------------------------------------------------------------------------------
# multinomial


def test_multinomial_with_replacement_follows_the_weights():
    Tensor.manual_seed(1)
    weights = np.array([1.0, 0.0, 3.0, 6.0], np.float32)
    draws = Tensor(weights).multinomial(20000, replacement=True)
    assert draws.dtype == dtypes.int32 and draws.shape == (20000,)
    freq = np.bincount(draws.numpy(), minlength=4) / 20000
    np.testing.assert_allclose(freq, weights / weights.sum(), atol=0.02)
    rows = Tensor(np.array([[0, 0, 1], [1, 1, 0]], np.float32)).multinomial(50, replacement=True).numpy()
    assert rows.shape == (2, 50) and (rows[0] == 2).all() and set(rows[1]) <= {0, 1}


def test_multinomial_without_replacement():
    Tensor.manual_seed(2)
    weights = np.array([[1, 0, 3, 6, 2], [5, 5, 0, 1, 0]], np.float32)
    out = Tensor(weights).multinomial(3).numpy()
    assert out.shape == (2, 3) and out.dtype == np.int32
    for row, w in zip(out, weights):
        assert len(set(row)) == 3 and all(w[i] > 0 for i in row)
    # 2000 independent rows with the same weights: the first draw follows them
    first = Tensor(np.tile(weights[0], (2000, 1))).multinomial(2).numpy()
    assert all(row[0] != row[1] for row in first)
    np.testing.assert_allclose(np.bincount(first[:, 0], minlength=5) / 2000, weights[0] / weights[0].sum(), atol=0.04)
    Tensor.manual_seed(7)
    a = Tensor(weights).multinomial(2).numpy()
    Tensor.manual_seed(7)
    np.testing.assert_array_equal(Tensor(weights).multinomial(2).numpy(), a)  # reproducible for a seed


def test_multinomial_bad_arguments():
    with pytest.raises(RuntimeError, match="3"):
        Tensor(np.ones(2, np.float32)).multinomial(3)
    with pytest.raises(RuntimeError, match=r"\(2, 2, 2\)"):
        Tensor(np.ones((2, 2, 2), np.float32)).multinomial(1)
    with pytest.raises(RuntimeError, match="0"):
        Tensor(np.ones(2, np.float32)).multinomial(0)


# ---------------------------------------------------------------------------------------------------------------------
# keccak / hash


@pytest.mark.parametrize(
    "cfg,ref",
    [
        ("sha3_256", lambda b: hashlib.sha3_256(b).digest()),
        ("sha3_224", lambda b: hashlib.sha3_224(b).digest()),
        ("shake_128", lambda b: hashlib.shake_128(b).digest(16)),
        ((136, 0x06), lambda b: hashlib.sha3_256(b).digest()),
    ],
    ids=["sha3_256", "sha3_224", "shake_128", "rate136_ds6"],
)
def test_keccak_against_hashlib(cfg, ref):
    rng = np.random.default_rng(11)
    # rows of one length (batched); for sha3_256 also empty, one byte short of a block (the domain byte and the final
    # bit share a byte) and exactly a block (the padding takes a whole block)
    for n in (0, 135, 136, 300) if cfg == "sha3_256" else (3, 300):
        rows = rng.integers(0, 256, size=(2, n)).astype(np.uint8)
        out = Tensor(rows).keccak(cfg)
        assert out.dtype == dtypes.uint8 and out.shape == (2, len(ref(b"")))
        for row, digest in zip(rows, out.numpy()):
            assert bytes(digest) == ref(row.tobytes()), (cfg, n)


def test_keccak_of_other_dtypes_and_bad_arguments():
    words = np.array([[1, -2, 3], [4, 5, -600]], np.int32)
    out = Tensor(words).keccak().numpy()
    for row, digest in zip(words, out):
        assert bytes(digest) == hashlib.sha3_256(row.tobytes()).digest()
    with pytest.raises(ValueError, match="sha3_999"):
        Tensor(b"abc").keccak("sha3_999")
    with pytest.raises(ValueError, match="rate"):
        Tensor(b"abc").keccak((100, 6))
    with pytest.raises(ValueError, match="dim"):
        Tensor(np.uint8(3)).keccak()


def test_hash():
    short = np.arange(40, dtype=np.float32)
    digest = Tensor(short).hash()
    assert digest.dtype == dtypes.uint8 and digest.shape == (16,)
    assert bytes(digest.numpy()) == hashlib.shake_128(short.tobytes()).digest(16)
    assert bytes(Tensor(short.reshape(5, 8)).hash().numpy()) == bytes(digest.numpy())  # the bytes, not the shape
    changed = short.copy()
    changed[7] = 7.5
    assert bytes(Tensor(changed).hash().numpy()) != bytes(digest.numpy())


def test_hash_of_long_data(monkeypatch):
    """Longer than one chunk: chunk digests side by side, then one digest of (digests, length). Small chunks here keep
    the test cheap; the scheme does not depend on the chunk size."""
    chunk = 64
    monkeypatch.setattr(sorting, "HASH_CHUNK", chunk)
    long = np.random.default_rng(12).integers(0, 256, size=chunk + 5).astype(np.uint8)
    chunks = [long[:chunk], np.pad(long[chunk:], (0, 2 * chunk - len(long)))]
    inner = b"".join(hashlib.shake_128(c.tobytes()).digest(16) for c in chunks) + len(long).to_bytes(8, "little")
    assert bytes(Tensor(long).hash().numpy()) == hashlib.shake_128(inner).digest(16)
    assert bytes(Tensor(np.append(long, 0)).hash().numpy()) != bytes(Tensor(long).hash().numpy())  # the length counts
    assert bytes(Tensor(7).hash().numpy()) == hashlib.shake_128(np.int32(7).tobytes()).digest(16)


# ---------------------------------------------------------------------------------------------------------------------
# the PYTHON interpreter device (tiny tensors)


@pytest.mark.slow  # the PYTHON interpreter device: CI
def test_python_device_subset():
    a = np.array([[3, -1, 2, 2, np.nan, 0], [1, 1, 1, -5, 4, 0]], np.float32)
    t, tt = Tensor(a, device="PYTHON"), torch.tensor(a)
    for descending in (False, True):
        values, index = t.sort(1, descending=descending)
        ref_values, ref_index = tt.sort(dim=1, descending=descending, stable=True)
        check(values, ref_values)
        check(index, ref_index)
    ints = data(np.int8, 2, 5, seed=8)
    check(Tensor(ints, device="PYTHON").argsort(0), stable_order(ints, 0, False))
    values, index = Tensor(ints, device="PYTHON").topk(2, largest=False)
    check(index, stable_order(ints, 1, False)[:, :2])
    check(values, np.take_along_axis(ints, stable_order(ints, 1, False)[:, :2], 1))
    assert bytes(Tensor(b"fusegrad", device="PYTHON").keccak().numpy()) == hashlib.sha3_256(b"fusegrad").digest()
    old = sorting.RANK_SORT_MAX
    try:
        sorting.RANK_SORT_MAX = 0  # the network path on the interpreter too
        g = np.random.default_rng(9).standard_normal(6).astype(np.float32)
        x, xx = Tensor(g, device="PYTHON"), torch.tensor(g, requires_grad=True)
        out, ref = (
            x.sort(descending=True)[0] * Tensor(np.arange(6, dtype=np.float32), device="PYTHON"),
            xx.sort(descending=True)[0] * torch.arange(6),
        )
        check(out, ref)
        check(out.sum().gradient(x)[0], torch.autograd.grad(ref.sum(), xx)[0])
        check(Tensor(ints, device="PYTHON").argsort(1, descending=True), stable_order(ints, 1, True))
    finally:
        sorting.RANK_SORT_MAX = old
