"""exp, reciprocal and max of upcast float lanes run as vectors in the C renderer (its expf has no vector form: a
polynomial in vector arithmetic, and the same polynomial as scalar code elsewhere; log is inline scalar arithmetic
too; max is a bitwise select that lets NaN win like the scalar form) and equal numpy's, special values included."""

import numpy as np
import pytest
import torch

import fusegrad.engine.realize as realize
from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.renderer.gpu import OpenCLRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops
from tests.rendering import rendered


SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 88.72, 88.73, 89.5, 1e30, -87.3, -95.0, -103.9, -104.5, -1e30]


def c_source(t: Tensor) -> str:
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    info = lower_to_linear([i.ast for i in items if i.ast.op is Ops.SINK][-1], Device["CPU"].renderer)
    return rendered(Device["CPU"].renderer, "k", info.lin)


def whole_vectors(values: list) -> np.ndarray:
    """float32 values padded with ones to a multiple of 64 (the column sum's upcast fills whole vectors)."""
    return np.concatenate([values, np.ones(-len(values) % 64)]).astype(np.float32)


def column_sums(values: np.ndarray) -> Tensor:
    """A column sum (its output axis upcast into vector accumulators) whose sums are the values."""
    rows = np.zeros((8, values.size), np.float32)
    rows[3] = values
    return Tensor(rows).sum(0)


def test_exp_of_vector_lanes_equals_numpy():
    rng = np.random.default_rng(0)
    values = whole_vectors(
        [*SPECIAL, *np.linspace(-110, 95, 2000), *rng.standard_normal(1000) * 10, *rng.uniform(-1e-3, 1e-3, 80)]
    )
    sums = column_sums(values)
    assert "fg_exp_" in c_source(sums.exp()), "the exp runs on vectors"
    with np.errstate(over="ignore"):
        got, want = sums.exp().numpy(), np.exp(values)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
    np.testing.assert_allclose(got[normal], want[normal], rtol=2.5e-7)  # within 2 ulp
    tiny = np.isfinite(want) & ~normal  # subnormal and zero results: within one subnormal step or two
    np.testing.assert_allclose(got[tiny], want[tiny], rtol=0, atol=3e-45)


def test_scalar_exp_is_the_vector_exp_and_vectorizes_in_a_row_sum():
    """Scalar C computes float exp with fg_expf (the vector polynomial, lane by lane), not libm's expf, whose call no
    loop vectorizes (a softmax's row sum of exp ran at ~2 ns per element): same values as the vector lanes."""
    rng = np.random.default_rng(1)
    values = whole_vectors([*SPECIAL, *np.linspace(-110, 95, 2000), *rng.standard_normal(1000) * 10])
    x = Tensor(values)
    kernel = c_source(x.exp()).split("void k(")[1]
    assert "fg_expf(" in kernel and "expf(" not in kernel.replace("fg_expf(", "")
    assert "fg_expf(" in c_source(Tensor(values.reshape(-1, 64)).exp().sum(1)).split("void k(")[1]
    with np.errstate(over="ignore"):
        want = np.exp(values)
    scalar = x.exp().numpy()
    with Context(NOOPT=1):
        unoptimized = Tensor(values).exp().numpy()
    vector = column_sums(values).exp().numpy()
    np.testing.assert_array_equal(scalar, vector)  # NaN positions too
    np.testing.assert_array_equal(unoptimized, vector)
    normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
    np.testing.assert_allclose(scalar[normal], want[normal], rtol=2.5e-7)
    np.testing.assert_array_equal(np.isinf(scalar), np.isinf(want))
    # float64 keeps libm's exp
    assert "fg_expf(" not in c_source(Tensor(values.astype(np.float64)).exp()).split("void k(")[1]
    # a softmax over rows matches torch
    rows = rng.standard_normal((64, 1000)).astype(np.float32) * 5
    np.testing.assert_allclose(Tensor(rows).softmax(1).numpy(), torch.from_numpy(rows).softmax(1), rtol=1e-6, atol=1e-7)


def test_scalar_log_is_inline_and_within_2_ulp_of_float64():
    """float log in C is fg_logf (arithmetic the compiler vectorizes; libm's logf was a call per element, and a
    log_softmax ran 5x slower than torch): within 2 ulp of the float64 log, specials and subnormals exact."""
    rng = np.random.default_rng(2)
    specials = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, 3e-39, 1.17549435e-38, 1.1754942e-38, 3.4e38]
    specials += [2.0, 0.5, 1.0000001, 0.99999994, 1.4142135, 1.4142137, 0.70710677, 0.7071068, -1e-30]
    values = np.concatenate(
        [specials, np.exp(rng.uniform(-100, 88, 20000)), rng.uniform(0.5, 2, 20000), 1 + rng.uniform(-1e-3, 1e-3, 5000)]
        + [rng.uniform(0, 1.2e-38, 2000), np.arange(1, 5000)]
    ).astype(np.float32)
    kernel = c_source(Tensor(values).log()).split("void k(")[1]
    assert "fg_logf(" in kernel and "logf(" not in kernel.replace("fg_logf(", "")
    got = Tensor(values).log().numpy()
    with np.errstate(all="ignore"):
        want = np.log(values.astype(np.float64))
    special = ~np.isfinite(want)
    np.testing.assert_array_equal(got[special], want[special].astype(np.float32))  # -inf, inf, NaN where numpy's
    ulps = np.abs(got[~special] - want[~special]) / np.spacing(np.abs(want[~special]).astype(np.float32))
    assert ulps.max() <= 2.0, (ulps.max(), values[~special][ulps.argmax()])
    with Context(NOOPT=1):
        np.testing.assert_array_equal(Tensor(values).log().numpy(), got)
    rows = rng.standard_normal((64, 1000)).astype(np.float32) * 5
    want_rows = torch.from_numpy(rows).log_softmax(1).numpy()
    np.testing.assert_allclose(Tensor(rows).log_softmax(1).numpy(), want_rows, rtol=1e-6, atol=2e-6)


def test_reciprocal_of_vector_lanes_equals_numpy():
    values = whole_vectors([*SPECIAL, *np.linspace(-5, 5, 1000)])
    out = column_sums(values).reciprocal()
    assert "(1.0f/vec" in c_source(out), "the reciprocal runs on vectors"
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(out.numpy(), np.float32(1) / (values + np.float32(0)))  # the sum makes -0 +0


def linear_kernels(t: Tensor) -> list:
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return [lower_to_linear(i.ast, Device["CPU"].renderer).lin for i in items if i.ast.op is Ops.SINK]


def test_max_partials_accumulate_in_vectors():
    src = c_source_of_first(Tensor.empty(1 << 20).max())
    assert "fg_floatx" in src and "vmask" in src, "the max partials accumulate in vectors"
    assert "float acc" not in src, "no scalar accumulators"
    assert "fg_doublex" in c_source_of_first(Tensor.empty(1 << 18, dtype="float64").max())
    # an elementwise max inside an upcast kernel packs too
    assert c_source_of_first(Tensor.empty(1 << 20).maximum(Tensor.empty(1 << 20)).sum()).count("vmask") >= 2


def test_max_stays_scalar_where_the_dialect_has_no_vector_max():
    # OpenCL C's fmax does not propagate NaN: its max accumulators stay scalar (the loads still pack), a sum's not
    cl = rendered(OpenCLRenderer(), "k", linear_kernels(Tensor.empty(1 << 20).max())[0])
    assert "float acc0 = (-INFINITY);" in cl and "acc0 = ((acc0!=acc0)?acc0:((acc0>vec0.s0)?acc0:vec0.s0));" in cl
    assert "float acc0" not in rendered(OpenCLRenderer(), "k", linear_kernels(Tensor.empty(1 << 20).sum())[0])


def c_source_of_first(t: Tensor) -> str:
    return rendered(Device["CPU"].renderer, "k", linear_kernels(t)[0])


def with_specials(n: int, kind: str) -> np.ndarray:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    if kind == "nan_first":
        x[0] = np.nan
    elif kind == "nan_last":
        x[-1] = np.nan
    elif kind == "nan_middle":
        x[n // 2 + 3] = np.nan
    elif kind == "nan_lane_end":
        x[63] = np.nan
    elif kind == "all_nan":
        x[:] = np.nan
    elif kind == "infs":
        x[[5, n // 3]], x[n - 2] = -np.inf, np.inf
    elif kind == "neg_inf_only":
        x[:] = -np.inf
    elif kind == "nan_and_inf":
        x[1], x[n - 5] = np.inf, np.nan
    elif kind == "zeros":
        x[:] = np.where(np.arange(n) % 3 == 0, np.float32(0.0), np.float32(-0.0))
    elif kind == "negative":
        x = -np.abs(x) - 1
        x[n // 2] = -0.0
    return x


def bits(x: np.ndarray) -> np.ndarray:
    """float32 bits, every NaN as one NaN (payloads are not compared)."""
    return np.where(np.isnan(x), np.float32(np.nan), x).view(np.uint32)


KINDS = ["plain", "nan_first", "nan_last", "nan_middle", "nan_lane_end", "all_nan", "infs", "neg_inf_only"]
KINDS += ["nan_and_inf", "zeros", "negative"]


@pytest.mark.parametrize("n", [1 << 20, (1 << 20) + 7, 1 << 16, 100000])
@pytest.mark.parametrize("kind", KINDS)
def test_vector_max_and_min_equal_torch_and_noopt(n, kind):
    x = with_specials(n, kind)
    got = [Tensor(x).max().numpy(), Tensor(x).min().numpy()]
    want = [torch.from_numpy(x).max().numpy(), torch.from_numpy(x).min().numpy()]
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and (np.isnan(g) if np.isnan(w) else g == w), (g, w)
    realize._runners.clear()  # compile again without opts, not reuse the optimized kernels
    with Context(NOOPT=1):
        plain = [Tensor(x).max().numpy(), Tensor(x).min().numpy()]
    realize._runners.clear()
    # the same partials in the same order: bit-equal, the sign of a zero included
    np.testing.assert_array_equal(bits(np.array(got)), bits(np.array(plain)))


def test_vector_max_of_float64_equals_numpy():
    x = np.random.default_rng(1).standard_normal(1 << 18)
    assert Tensor(x).max().numpy() == x.max() and Tensor(x).min().numpy() == x.min()
    x[1000] = np.nan
    assert np.isnan(Tensor(x).max().numpy()) and np.isnan(Tensor(x).min().numpy())


def test_vector_maximum_lanes_keep_the_scalar_semantics():
    # rows of -inf around the values: the column max is the values, -0.0 and NaN included, then an elementwise
    # maximum (packed lane by lane) against other values
    values = whole_vectors([*SPECIAL, 0.0, -0.0, np.nan, 2.0, *np.linspace(-3, 3, 300)])
    other = whole_vectors([*SPECIAL[::-1], -0.0, 0.0, 1.0, np.nan, *np.linspace(3, -3, 300)])
    rows = np.full((8, values.size), -np.inf, np.float32)
    rows[3] = values
    out = Tensor(rows).max(0).maximum(Tensor(other))
    assert c_source(out).count("vmask") >= 2, "the column max and the maximum run on vectors"
    got = out.numpy()
    # the scalar form ((x>y||x!=x)?x:y): NaN wins, a tie (+0.0 vs -0.0) gives the second operand like np.maximum
    np.testing.assert_array_equal(bits(got), bits(np.maximum(values, other)))
    assert np.array_equal(np.isnan(got), np.isnan(values) | np.isnan(other))
    realize._runners.clear()
    with Context(NOOPT=1):
        np.testing.assert_array_equal(bits(Tensor(rows).max(0).maximum(Tensor(other)).numpy()), bits(got))
    realize._runners.clear()
    relu = column_sums(values).relu().numpy()
    np.testing.assert_array_equal(relu, torch.relu(torch.from_numpy(values + np.float32(0))).numpy())


def test_integer_max_stays_correct():
    x = np.random.default_rng(2).integers(-(2**31), 2**31 - 1, 1 << 20, dtype=np.int32)
    x[77] = 2**31 - 1
    assert Tensor(x).max().numpy() == x.max() and Tensor(x).min().numpy() == x.min()


@pytest.mark.parametrize("kind", KINDS)
def test_row_max_runs_in_a_simd_loop_and_lets_nan_win(kind):
    """A row max (the reduce innermost and contiguous, no upcast) runs in a simd loop: `max` over the non-NaN values,
    a flag per accumulator for NaN. Rows of one kind of special values, reversed and rotated; values as torch's, zeros
    by value."""
    x = with_specials(1000, kind)
    rows = np.stack([x, x[::-1].copy(), with_specials(1000, "plain"), np.roll(x, 333)])
    source = c_source(Tensor(rows).max(1)).split("void k(")[1]
    assert "#pragma omp simd reduction(max:" in source and "reduction(|:" in source
    t = torch.from_numpy(rows)
    for fn, ref in ((lambda x: x.max(1), t.amax(1)), (lambda x: x.min(1), t.amin(1))):
        got = fn(Tensor(rows)).numpy()
        np.testing.assert_array_equal(got, ref.numpy())  # NaN where torch has NaN; -0.0 == 0.0
        with Context(NOOPT=1):
            np.testing.assert_array_equal(fn(Tensor(rows)).numpy(), got)
    # float64 too, and a row max under other ops (softmax) against torch
    np.testing.assert_array_equal(Tensor(rows.astype(np.float64)).max(1).numpy(), t.double().amax(1).numpy())
    if kind == "plain":
        np.testing.assert_allclose(Tensor(rows).softmax(1).numpy(), t.softmax(1).numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("where", [0, 7, 100, 779])
def test_max_over_several_loops_keeps_a_nan_from_an_earlier_row(where):
    """A max over several axes runs its innermost loop as a simd max once per outer iteration: a NaN found in an earlier
    row must survive the next row's loop (the simd reduction's combine step drops a NaN accumulator)."""
    rng = np.random.default_rng(where)
    x = rng.standard_normal((4, 5, 6, 13)).astype(np.float32)
    x.reshape(-1)[where] = np.nan
    t = torch.from_numpy(x)
    for dtype in (np.float32, np.float64):
        for axes in ((2, 3), (1, 2, 3), None):
            ax = tuple(range(4)) if axes is None else axes
            for fn, ref in ((lambda y: y.max(axes), t.double().amax(ax)), (lambda y: y.min(axes), t.double().amin(ax))):
                got = fn(Tensor(x.astype(dtype))).numpy()
                np.testing.assert_array_equal(got, ref.numpy().astype(dtype), err_msg=f"{dtype} {axes}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_float_select_over_arithmetic_is_a_bit_mask_blend_and_keeps_every_value(dtype):
    """A scalar float where() with an arithmetic arm renders as fg_selectf/fg_select (bit masks: GCC sinks the arm into
    a branch of ?: and keeps the loop scalar under trapping math), one of loaded values stays ?:; the chosen values pass
    through bit for bit, NaN, infinities and -0.0 too."""
    rng = np.random.default_rng(2)
    a = np.array([*SPECIAL, *rng.standard_normal(200)], dtype)
    b = np.array([*SPECIAL[::-1], *rng.standard_normal(200)], dtype)
    cond = rng.integers(0, 2, a.size).astype(bool)
    blend = "fg_selectf(" if dtype is np.float32 else "fg_select("
    out = Tensor(cond).where(-Tensor(a), Tensor(b))
    kernel = c_source(out).split("void k(")[1]
    assert blend in kernel and "?" not in kernel
    np.testing.assert_array_equal(out.numpy().view(np.uint8), np.where(cond, -a, b).view(np.uint8))
    plain = Tensor(cond).where(Tensor(a), Tensor(b))
    assert blend not in c_source(plain).split("void k(")[1]
    np.testing.assert_array_equal(plain.numpy().view(np.uint8), np.where(cond, a, b).view(np.uint8))
    # silu, whose stable form selects between two arms of exp(-|x|), equals torch
    x = rng.standard_normal((64, 256)).astype(dtype) * 8
    assert blend in c_source(Tensor(x).silu()).split("void k(")[1]
    np.testing.assert_allclose(Tensor(x).silu().numpy(), torch.nn.functional.silu(torch.from_numpy(x)), rtol=1e-6)
