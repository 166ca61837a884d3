"""Properties, data access, placement, mutation, creation and random numbers against numpy/torch."""

import ctypes
import math
import numpy as np
import pytest
from fusegrad import Context, GlobalCounters, Tensor, dtypes


def test_properties():
    t = Tensor(np.zeros((2, 3, 4), np.float16))
    assert t.shape == (2, 3, 4) and t.dtype is dtypes.float16 and t.device == "CPU" and t.ndim == 3
    assert t.numel() == 24 and t.size() == (2, 3, 4) and t.size(-1) == 4 and t.element_size() == 2 and t.nbytes() == 48
    assert t.is_floating_point() and not Tensor([1, 2]).is_floating_point()
    assert t.T.shape == (3, 2, 4) and len(t) == 2 and t.max_shape == t.shape and t.max_numel() == 24
    assert "shape=(2, 3, 4)" in repr(t) and "float16" in repr(t)
    with pytest.raises(TypeError):
        len(Tensor(3.0))
    with pytest.raises(TypeError):
        bool(Tensor([1.0]))
    with pytest.raises(TypeError):
        del t[0]
    assert hash(t) != hash(Tensor(np.zeros((2, 3, 4), np.float16)))
    assert [x.item() for x in Tensor([3, 4, 5])] == [3, 4, 5]  # iteration falls back to indexing


def test_data_access():
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    t = Tensor(a)
    assert t.tolist() == a.tolist() and Tensor(2.5).item() == 2.5 and Tensor(7).tolist() == 7
    mv = t.data()
    assert mv.shape == (2, 3) and mv.format == "h" and mv[1, 2] == 5
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        t.item()
    bf = Tensor([1.5, -2.25], dtype=dtypes.bfloat16)
    assert bf.numpy().dtype == np.float32 and bf.tolist() == [1.5, -2.25]


def test_realize_many_at_once_is_one_schedule():
    a = Tensor(np.ones(4, np.float32)).realize()
    x, y = a + 1, a * 3
    GlobalCounters.reset()
    Tensor.realize(x, y)
    assert GlobalCounters.kernel_count == 2 and x.tolist() == [2.0] * 4 and y.tolist() == [3.0] * 4


def test_to_clone_detach_contiguous_replace():
    x = Tensor(np.arange(3, dtype=np.float32))
    x.grad = Tensor([1.0, 1.0, 1.0])
    y = x.to("PYTHON")
    assert y.device == "PYTHON" and y.grad is not None and y.grad.device == "PYTHON" and y.tolist() == [0, 1, 2]
    assert x.to("CPU") is x
    c = x.clone()
    assert c.tolist() == [0, 1, 2] and c.grad is not None
    z = Tensor(np.arange(3, dtype=np.float32))
    z.to_("PYTHON")
    assert z.device == "PYTHON"
    w = Tensor([1.0, 2.0])
    w.replace(Tensor([5, 6]))
    assert w.tolist() == [5, 6] and w.dtype is dtypes.int32
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        w.replace(Tensor([1, 2, 3]))
    d = Tensor([2.0, 3.0])
    assert ((d.detach() * d).sum().gradient(d)[0]).tolist() == [2.0, 3.0]


def test_assign_rules():
    t = Tensor.zeros(2, 2).contiguous().realize()
    t.assign(Tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert t.tolist() == [[1, 2], [3, 4]]
    t.assign(7)  # a Python scalar adopts the dtype and broadcasts
    assert t.tolist() == [[7, 7], [7, 7]]
    with pytest.raises(RuntimeError, match="int32"):
        t.assign(Tensor([[1, 2], [3, 4]]))
    with pytest.raises(RuntimeError, match="PYTHON"):
        t.assign(Tensor([[1.0, 2.0], [3.0, 4.0]], device="PYTHON"))
    assert t.tolist() == [[7, 7], [7, 7]]  # a failed assign leaves the tensor intact
    t += 1
    assert t.tolist() == [[8, 8], [8, 8]]


def test_contiguous_backward_is_identity_with_gradient():
    x = Tensor(np.arange(4, dtype=np.float32))
    y = (x * 3).contiguous_backward()
    assert y.tolist() == [0, 3, 6, 9]
    assert y.sum().gradient(x)[0].tolist() == [3, 3, 3, 3]


def test_is_param_and_requires_grad_compat():
    t = Tensor([1.0], requires_grad=False)
    assert t.is_param is False and t.requires_grad is False
    assert t.is_param_(True) is t and t.is_param
    u = Tensor([2.0]).requires_grad_(False)
    (u * 2).sum().backward()
    assert u.grad is None


@pytest.mark.parametrize(
    "fn, ref",
    [
        (lambda: Tensor.zeros(2, 3), np.zeros((2, 3), np.float32)),
        (lambda: Tensor.ones((2, 3), dtype="int8"), np.ones((2, 3), np.int8)),
        (lambda: Tensor.full((2,), 3), np.full(2, 3, np.int32)),
        (lambda: Tensor.full((2,), True), np.full(2, True)),
        (lambda: Tensor.full((2,), 1.5, buffer=False), np.full(2, 1.5, np.float32)),
        (lambda: Tensor([1, 2]).full_like(9), np.array([9, 9], np.int32)),
        (lambda: Tensor([1.0, 2]).zeros_like(), np.zeros(2, np.float32)),
        (lambda: Tensor([1, 2], dtype="uint8").ones_like(), np.ones(2, np.uint8)),
        (lambda: Tensor.arange(5), np.arange(5, dtype=np.int32)),
        (lambda: Tensor.arange(2, 10, 3), np.arange(2, 10, 3, dtype=np.int32)),
        (lambda: Tensor.arange(5, 0, -2), np.arange(5, 0, -2, dtype=np.int32)),
        (lambda: Tensor.arange(0.5, 2.0, 0.25), np.arange(0.5, 2.0, 0.25, dtype=np.float32)),
        (lambda: Tensor.arange(3, 3), np.arange(3, 3, dtype=np.int32)),
        (lambda: Tensor.arange(2**31, 2**31 + 3), np.arange(2**31, 2**31 + 3, dtype=np.int64)),
        (lambda: Tensor.linspace(0, 1, 5), np.linspace(0, 1, 5, dtype=np.float32)),
        (lambda: Tensor.linspace(-2, 3, 1), np.array([-2.0], np.float32)),
        (lambda: Tensor.eye(3), np.eye(3, dtype=np.float32)),
        (lambda: Tensor.eye(2, 4, dtype="int32"), np.eye(2, 4, dtype=np.int32)),
        (lambda: Tensor.const(3), np.array(3, np.int32)),
        (lambda: Tensor([1.0, 2.0]).const_like(4), np.array([4.0, 4.0], np.float32)),
    ],
)
def test_deterministic_creation(fn, ref):
    out = fn()
    assert out.numpy().dtype == ref.dtype and out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)


def test_creation_errors():
    with pytest.raises(ValueError, match="-1"):
        Tensor.zeros(2, -1)
    with pytest.raises(ValueError, match="-3"):
        Tensor.eye(-3)
    with pytest.raises(ValueError):
        Tensor.linspace(0, 1, -1)
    with pytest.raises(ValueError):
        Tensor.linspace(0, 1, 3, dtype=dtypes.bool)
    with pytest.raises(OverflowError):
        Tensor.arange(0, 300, dtype=dtypes.int8)
    with pytest.raises(ValueError):
        Tensor.rand(3, dtype=dtypes.int32)
    with pytest.raises(TypeError):
        Tensor.randint(3, low=0.5, high=3)
    with pytest.raises(ValueError):
        Tensor.randint(3, low=3, high=3)
    with pytest.raises(ValueError):
        Tensor.normal(3, std=-1)
    with pytest.raises(ValueError):
        Tensor.uniform(3, low=2, high=1)
    with pytest.raises(TypeError, match="bogus"):
        Tensor.zeros(2, bogus=1)


def test_empty_and_from_blob():
    e = Tensor.empty(3, 2, dtype="int16")
    assert e.shape == (3, 2) and e.dtype is dtypes.int16 and e.empty_like().shape == (3, 2)
    a = np.arange(6, dtype=np.float32)
    t = Tensor.from_blob(a.ctypes.data, (2, 3), dtype=dtypes.float32)
    np.testing.assert_array_equal((t + 1).numpy(), a.reshape(2, 3) + 1)
    a[0] = 50  # no copy was made
    assert t.numpy()[0, 0] == 50
    ctypes.c_float.from_address(a.ctypes.data + 4).value = 7.0
    assert t.tolist()[0][1] == 7.0


def test_random_reproducible_and_distributed():
    Tensor.manual_seed(42)
    a, b = Tensor.rand(1000).numpy(), Tensor.rand(1000).numpy()
    Tensor.manual_seed(42)
    assert np.array_equal(Tensor.rand(1000).numpy(), a) and not np.array_equal(a, b)
    Tensor.manual_seed(42)
    assert np.array_equal(Tensor.rand(1000, device="PYTHON").numpy()[:50], a[:50])  # same bits on every device
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    n = Tensor.randn(20000).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    r = Tensor.randint(5000, low=-3, high=4).numpy()
    assert r.dtype == np.int32 and set(np.unique(r)) == set(range(-3, 4))
    u = Tensor.uniform(5000, low=2, high=5).numpy()
    assert u.min() >= 2 and u.max() < 5
    nm = Tensor.normal(5000, mean=3, std=0.5).numpy()
    assert abs(nm.mean() - 3) < 0.05 and abs(nm.std() - 0.5) < 0.05


def test_rand_is_one_kernel():
    GlobalCounters.reset()
    Tensor.rand(64, 64).realize()
    assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize(
    "name, bound",
    [
        ("scaled_uniform", lambda s: math.prod(s) ** -0.5),
        ("glorot_uniform", lambda s: math.sqrt(6 / (s[0] + math.prod(s[1:])))),
        ("kaiming_uniform", lambda s: math.sqrt(6 / (1 + 0.01**2) / math.prod(s[1:]))),
    ],
)
def test_init_bounds(name, bound):
    shape = (64, 32)
    out = getattr(Tensor, name)(*shape).numpy()
    b = bound(shape)
    assert out.shape == shape and out.min() >= -b and out.max() <= b and out.max() > 0.8 * b


def test_kaiming_normal_std():
    out = Tensor.kaiming_normal(256, 64).numpy()
    assert abs(out.std() - math.sqrt(2 / (1 + 0.01**2) / 64)) < 0.01


def test_rand_like_and_randn_like_keep_shape_and_dtype():
    t = Tensor.zeros(3, 4, dtype=dtypes.float16)
    assert t.rand_like().shape == (3, 4) and t.rand_like().dtype is dtypes.float16
    assert t.randn_like(dtype=dtypes.float32).dtype is dtypes.float32


def test_training_compat_switches():
    with Tensor.train():
        from fusegrad.helpers import TRAINING

        assert TRAINING.value == 1
    with Context(TRAINING=0):
        assert not TRAINING


def test_tensor_from_path_is_a_lazy_disk_tensor(tmp_path):
    import pathlib

    f = tmp_path / "data.bin"
    np.arange(10, dtype=np.float32).tofile(f)
    t = Tensor(pathlib.Path(f), dtype=dtypes.float32)
    assert t.device == f"DISK:{f}" and t.shape == (10,) and t.dtype is dtypes.float32
    np.testing.assert_array_equal((t.to("CPU") * 2).numpy(), np.arange(10) * 2)
    raw = Tensor(pathlib.Path(f))
    assert raw.dtype is dtypes.uint8 and raw.shape == (40,)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        Tensor(pathlib.Path(tmp_path / "missing.bin"))


def test_raw_building_blocks():
    from fusegrad.uop.ops import Ops

    a, b = Tensor([1.0, 2.0]), Tensor([3.0, 5.0])
    assert a.alu(Ops.ADD, b).tolist() == [4.0, 7.0] and a.alu(Ops.CMPLT, b).tolist() == [True, True]
    assert Tensor.usum(a, b, a).tolist() == [5.0, 9.0] and Tensor.uprod(a, b).tolist() == [3.0, 10.0]
    bits = Tensor.random_bits(7, 0, 1000).numpy()
    assert bits.dtype == np.uint32 and len(np.unique(bits)) > 990
    assert np.array_equal(Tensor.random_bits(7, 0, 1000).numpy(), bits) and not np.array_equal(
        Tensor.random_bits(8, 0, 1000).numpy(), bits
    )
    np.testing.assert_allclose(a.reshape(1, 2).image_dot(b.reshape(2, 1)).numpy(), [[13.0]])
    with pytest.raises(TypeError, match="custom_kernel needs fxn"):
        a.custom_kernel(b, fxn=None)


def test_legacy_training_switches():
    from fusegrad.helpers import TRAINING

    x = Tensor.ones(1000)
    assert x.dropout(0.5).numpy().min() == 1.0  # not training: identity
    Tensor.training = True
    try:
        kept = x.dropout(0.5).numpy()
        assert set(np.unique(kept)) <= {0.0, 2.0} and 0.3 < (kept == 0).mean() < 0.7
    finally:
        Tensor.training = False
    with Tensor.test():
        assert not TRAINING
    assert Tensor.no_grad is False


def test_tensor_pickles_and_copies_and_copies_take_gradients():
    import copy
    import pickle

    t = Tensor(np.arange(3, dtype=np.float32)) * 2
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(t)).numpy(), [0, 2, 4])
    np.testing.assert_array_equal(copy.deepcopy(t).numpy(), [0, 2, 4])
    w = Tensor([1.0, 2.0], requires_grad=True)
    w_copy = copy.copy(w)  # holds the same node: backward finds it from the graph like w
    (w_copy * 3).sum().backward()
    np.testing.assert_array_equal(w_copy.grad.numpy(), [3, 3])
    np.testing.assert_array_equal(w.grad.numpy(), [3, 3])


def test_backward_reaches_live_intermediates_among_many_tensors():
    import torch

    unrelated = [Tensor.ones(2) * i for i in range(200)]  # live tensors outside the graph get nothing
    x_np = np.array([[0.5, -1.0], [2.0, 3.0]], np.float32)
    x = Tensor(x_np, requires_grad=True)
    h = (x * x).relu()
    loss = (h * 2).sum()
    loss.backward()
    xt = torch.tensor(x_np, requires_grad=True)
    ht = (xt * xt).relu()
    ht.retain_grad()
    (ht * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(h.grad.numpy(), ht.grad.numpy(), rtol=1e-6)
    assert all(t.grad is None for t in unrelated)


@pytest.mark.parametrize("dtype", [None, dtypes.float16, dtypes.int32])
def test_tensor_copies_the_numpy_data_it_is_built_from(dtype):
    # host data is copied into the buffer at construction: later writes to the array (a reused batch) never show
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    strided = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]  # not contiguous: copied all the same
    t, s = Tensor(a, dtype=dtype), Tensor(strided, dtype=dtype)
    expected, expected_strided = a.copy(), strided.copy()
    a[:] = -1
    strided[:] = -1
    np.testing.assert_array_equal(t.numpy(), expected.astype(t.numpy().dtype))
    np.testing.assert_array_equal(s.numpy(), expected_strided.astype(s.numpy().dtype))
    np.testing.assert_array_equal((t + s).numpy(), (expected + expected_strided).astype(t.numpy().dtype))
