"""Kernels that differ only in a float constant share one compiled program: the scheduler reads such constants from
one-element parameter buffers, so a changing scalar (a learning rate, a loop variable) costs no compile."""

import numpy as np
import pytest
import torch
from fusegrad import Context, GlobalCounters, Tensor, dtypes
from fusegrad.engine import realize as engine
from fusegrad.nn.optim import SGD


def compiles_during(fn) -> int:
    before = GlobalCounters.compile_count
    fn()
    return GlobalCounters.compile_count - before


def test_fifty_scalars_compile_one_kernel():
    x_np = np.linspace(-3, 3, 37, dtype=np.float32)
    x = Tensor(x_np).realize()
    outs: list[np.ndarray] = []
    scalars = [(i * 0.1 + 0.05, i * 0.37 - 2.5) for i in range(50)]
    n = compiles_during(lambda: outs.extend((x * a + b).numpy() for a, b in scalars))
    assert n == 1
    for (a, b), got in zip(scalars, outs):
        ref = torch.from_numpy(x_np) * torch.tensor(a, dtype=torch.float32) + torch.tensor(b, dtype=torch.float32)
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-6, atol=2e-6)  # a*x+b may be one fused multiply-add


def test_scalar_loop_compiles_only_the_folded_special_cases():
    x_np = np.linspace(-3, 3, 29, dtype=np.float32)
    x = Tensor(x_np).realize()
    outs: list[np.ndarray] = []
    n = compiles_during(lambda: outs.extend((x * (i * 0.1)).numpy() for i in range(50)))
    assert n == 3  # one program for all scalars, plus x*0 and x*1, which the code generator folds by value
    for i, got in enumerate(outs):
        np.testing.assert_array_equal(got, (torch.from_numpy(x_np) * torch.tensor(i * 0.1)).numpy())


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float32, dtypes.float64])
def test_constants_keep_their_dtype_rounding(dtype):
    np_dt = {dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}[dtype]
    x_np = np.linspace(-2, 2, 21).astype(np_dt)
    x = Tensor(x_np).realize()
    outs = []
    n = compiles_during(lambda: outs.extend(((x * c) / (c + 3)).numpy() for c in (0.1, 1e-5, 3.3333, 1234.5678)))
    assert n == 1
    for c, got in zip((0.1, 1e-5, 3.3333, 1234.5678), outs):
        assert got.dtype == np_dt
        tx = torch.from_numpy(x_np)
        ref = (tx * torch.tensor(c, dtype=tx.dtype)) / (torch.tensor(c, dtype=tx.dtype) + 3)
        np.testing.assert_allclose(got, ref.numpy(), rtol=2e-3 if dtype is dtypes.float16 else 1e-6)


def test_folded_and_nonfinite_constants_stay_exact():
    x = Tensor([-2.0, 0.0, 3.0])
    assert (x * 1 + 0).tolist() == [-2.0, 0.0, 3.0]
    assert (x * -1).tolist() == [2.0, -0.0, -3.0]
    assert (x > 0).where(x, float("-inf")).tolist() == [float("-inf"), float("-inf"), 3.0]
    assert np.isnan((x * float("nan")).numpy()).all()
    assert (x.cast(dtypes.int32) * 7 + 3).tolist() == [-11, 3, 24]


def test_reduce_and_padded_kernels_with_constants():
    a_np = np.random.default_rng(1).standard_normal((6, 7)).astype(np.float32)
    a = Tensor(a_np)
    outs = []
    n = compiles_during(
        lambda: outs.extend(((a * s).pad(((1, 1), (0, 2)), value=s).sum(axis=1) * s).numpy() for s in (0.25, 0.5, 1.75))
    )
    assert n <= 2  # the padded value is one more constant: at most one kernel per structure, not one per scalar
    for s, got in zip((0.25, 0.5, 1.75), outs):
        ta = torch.nn.functional.pad(torch.from_numpy(a_np) * s, (0, 2, 1, 1), value=s)
        np.testing.assert_allclose(got, (ta.sum(1) * s).numpy(), rtol=1e-5, atol=1e-6)


def test_python_backend_reads_parameter_constants():
    x = Tensor([1.0, 2.0, 4.0], device="PYTHON")
    assert (x * 0.3 + 0.7).tolist() == pytest.approx([1.0, 1.3, 1.9], rel=1e-6)


def test_learning_rate_changes_compile_nothing_new():
    with Context(TRAINING=1, CONST_LR=1):
        w = Tensor([1.0, -2.0, 3.0], requires_grad=True)
        w_ref = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
        compiles = []
        for step, lr in enumerate((0.1, 0.05, 0.025, 0.0125)):
            opt, opt_ref = SGD([w], lr=lr), torch.optim.SGD([w_ref], lr=lr)
            before = GlobalCounters.compile_count
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
            w.realize()
            compiles.append(GlobalCounters.compile_count - before)
            opt_ref.zero_grad()
            (w_ref * w_ref).sum().backward()
            opt_ref.step()
            np.testing.assert_allclose(w.numpy(), w_ref.detach().numpy(), rtol=1e-6)
        assert compiles[0] >= 1 and compiles[2:] == [0, 0]


def test_loaded_programs_are_bounded(monkeypatch):
    monkeypatch.setattr(engine, "MAX_LOADED_PROGRAMS", 3)
    x = Tensor(np.arange(5, dtype=np.float32)).realize()
    for n in range(2, 9):
        np.testing.assert_array_equal(x.pow(n).numpy(), np.arange(5, dtype=np.float32) ** n)
    assert len(engine._runners) <= 3


def test_fifty_int_scalars_compile_one_kernel():
    """Int data constants are parameters too: `x * k + c` over 50 different k, c (int32 and int64) is one program."""
    for dtype, np_dt in ((dtypes.int32, np.int32), (dtypes.int64, np.int64)):
        x_np = np.arange(-20, 21, dtype=np_dt)
        x = Tensor(x_np, dtype=dtype).realize()
        outs: list[np.ndarray] = []
        scalars = [(i * 7 - 170, 3 * i + 7) for i in range(50) if i * 7 - 170 not in (0, 1, -1)]
        n = compiles_during(lambda: outs.extend(((x * k + c).maximum(c - 5) < k * 3).numpy() for k, c in scalars))
        assert n == 1
        for (k, c), got in zip(scalars, outs):
            np.testing.assert_array_equal(got, np.maximum(x_np * np_dt(k) + np_dt(c), np_dt(c - 5)) < np_dt(k * 3))
        sums: list[np.ndarray] = []
        assert compiles_during(lambda: sums.extend((x + c).sum().numpy() for c in range(2, 12))) == 1
        assert [int(s) for s in sums] == [int((x_np + c).sum()) for c in range(2, 12)]


@pytest.mark.parametrize(
    "build,ref",
    [
        (lambda x, k: x << k, lambda x, k: x << k),
        (lambda x, k: x >> k, lambda x, k: x >> k),
        (lambda x, k: x**k, lambda x, k: x**k),
        (lambda x, k: x // k, lambda x, k: x // k),
        (lambda x, k: x % k, lambda x, k: x % k),
    ],
    ids=["shl", "shr", "pow", "floordiv", "mod"],
)
def test_int_constants_that_shape_the_code_stay_literals(build, ref):
    """Shift counts, integer powers and divisors are compiled in (the code depends on them: a power is unrolled, a
    division by a constant becomes a multiply): each value is its own program, with numpy's values."""
    x_np = np.arange(1, 40, dtype=np.int32)
    x = Tensor(x_np).realize()
    outs: list[np.ndarray] = []
    n = compiles_during(lambda: outs.extend(build(x, k).numpy() for k in (2, 3, 5)))
    assert n == 3
    for k, got in zip((2, 3, 5), outs):
        np.testing.assert_array_equal(got, ref(x_np, np.int32(k)))


def test_schedule_cache_never_rebinds_a_literal_int_constant():
    """`x * k` lifts k but `x << k` keeps it literal: a graph using one int constant both ways is planned again for
    each value, never served with another value's compiled shift."""
    x_np = np.arange(0, 30, dtype=np.int32)
    x = Tensor(x_np).realize()
    for k in (2, 3, 4, 5):
        np.testing.assert_array_equal(((x * k) + (x << k)).numpy(), x_np * k + (x_np << k))


def test_python_backend_reads_int_parameter_constants():
    x = Tensor(np.arange(-4, 4, dtype=np.int32), device="PYTHON")
    outs: list[list[int]] = []
    assert compiles_during(lambda: outs.extend((x * k + 3 * k).tolist() for k in (5, 7, 9))) == 1
    assert outs == [[k * v + 3 * k for v in range(-4, 4)] for k in (5, 7, 9)]


def test_int_constants_reaching_a_shift_count_stay_literals():
    """A constant that only reaches a shift count through other int ops (`x >> where(m, k, 0)`: a dequantizer's nibble
    shift picked per part) is compiled in too, so the compiler can fold the shift; values equal numpy's."""
    x_np = np.arange(0, 64, dtype=np.int32) * 37
    m_np = np.arange(64) % 3 == 0
    x, m = Tensor(x_np).realize(), Tensor(m_np).realize()
    outs: list[np.ndarray] = []
    n = compiles_during(lambda: outs.extend((x >> m.where(k, 0)).numpy() for k in (2, 3, 4)))
    assert n == 3
    for k, got in zip((2, 3, 4), outs):
        np.testing.assert_array_equal(got, x_np >> np.where(m_np, np.int32(k), np.int32(0)))
    # through movement ops: a per-part shift table `arange(2) * k` broadcast over the rows
    pairs = x.reshape(32, 2)
    tables: list[np.ndarray] = []
    n = compiles_during(lambda: tables.extend((pairs >> (Tensor.arange(2) * k)).numpy() for k in (2, 3, 4)))
    assert n == 3
    for k, got in zip((2, 3, 4), tables):
        np.testing.assert_array_equal(got, x_np.reshape(32, 2) >> (np.arange(2, dtype=np.int32) * k))
