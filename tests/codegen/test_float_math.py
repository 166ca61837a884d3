"""codegen/float_math.py: the float64 transcendentals and the reduced float32 sin/cos written out in plain arithmetic,
run on the CPU device with the capabilities float64_math and sin_reduction off, against numpy."""

from collections import OrderedDict

import numpy as np
import pytest

import fusegrad.engine.realize as realize
from fusegrad import Tensor, dtypes
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.float_math import TRANSCENDENTAL
from fusegrad.renderer.c import CRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops

INF, NAN = np.inf, np.nan
EDGES = [0.0, -0.0, INF, -INF, NAN, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.0, 1.0]


@pytest.fixture
def no_math(monkeypatch):
    """The CPU device as a target without float64 math or float32 sin reduction, with no program built before."""
    caps = CRenderer.capabilities.replace(float64_math=False, sin_reduction=False)
    monkeypatch.setattr(Device["CPU"], "renderer", CRenderer(caps))
    monkeypatch.setattr(realize, "_runners", OrderedDict())


def run(fn, *xs):
    return fn(*(Tensor(x) for x in xs)).numpy()


def ulps(got, want):
    """Error in units of want's last place (subnormals: of the smallest subnormal); equal NaN/inf is 0."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(all="ignore"):
        err = np.abs(got - want) / np.spacing(np.abs(want))
    return np.where(same, 0.0, np.where(np.isfinite(err), err, np.inf))


def wide(seed=0, n=4000):
    """Values spread over every binade, both signs."""
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [rng.uniform(-1, 1, n // 2) * 10.0 ** rng.uniform(-300, 300, n // 2), rng.normal(0, 3, n // 2)]
    )


def test_the_kernel_has_no_math_op_left(no_math):
    x = Tensor(np.linspace(1, 2, 7))
    ts = (x.exp(), x.log2(), x.sin(), x.cos(), x ** Tensor(np.full(7, 0.3)), x.float().sin())
    items, _, _ = create_schedule([t.uop for t in ts], [Device["CPU"]])
    for it in items:
        lin = lower_to_linear(it.ast, Device["CPU"].renderer).lin
        assert not {u.op for u in lin} & set(TRANSCENDENTAL)
    assert {u.op for it in items for u in lower_to_linear(it.ast, CRenderer()).lin} & {Ops.SIN, Ops.EXP}


@pytest.mark.parametrize("name", ["exp", "exp2", "log", "log2"])
def test_exp_log_float64_within_ulps(no_math, name):
    x = np.concatenate([wide(1), np.array(EDGES), np.linspace(-760, 720, 2001), 2.0 ** np.arange(-1074, 1024)])
    if name in ("exp", "exp2"):
        x = np.concatenate([x[np.abs(x) < 2000], np.linspace(-1080, 1030, 3001), [709.782712893384, -745.13]])
    else:
        x = np.concatenate([np.abs(x), x[:50], 1 + np.linspace(-1e-3, 1e-3, 1001)])
    with np.errstate(all="ignore"):
        want = getattr(np, name)(x)
    got = run(getattr(Tensor, name), x)
    err = ulps(got, want)
    normal = np.abs(want) >= 2.2250738585072014e-308
    assert err[normal].max() <= 2, (x[np.argmax(np.where(normal, err, 0))], err[normal].max())
    # a subnormal result (exp far below 0) rounds once, to within 1 of the smallest step
    assert err[~normal].max() <= 1, x[np.argmax(np.where(~normal, err, 0))]
    assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_float64(no_math, name):
    x = np.concatenate(
        [
            wide(2),
            np.array(EDGES),
            np.linspace(-50, 50, 4001),
            np.pi / 2 * np.arange(-200, 200),
            2.0 ** np.arange(-1074, 1024),
        ]
    )
    with np.errstate(all="ignore"):
        want = getattr(np, name)(x)
    got = run(getattr(Tensor, name), x)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    err = np.abs(got[ok] - want[ok])
    small = np.abs(x[ok]) < 2.0**19
    assert err[small].max() <= 1e-16 + 4e-16 * np.abs(want[ok][small]).max(), x[ok][small][np.argmax(err[small])]
    assert (err[small] <= 2e-16 + 4e-16 * np.abs(want[ok][small])).all()
    assert err[~small].max() <= 4e-15, x[ok][~small][np.argmax(err[~small])]
    if name == "sin":
        assert np.array_equal(np.signbit(got[x == 0]), np.signbit(x[x == 0]))


def test_pow_float64_special_cases_like_numpy(no_math):
    v = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, INF, -INF, NAN, 1e-310, 1e300])
    x, y = (a.ravel() for a in np.meshgrid(v, v))
    with np.errstate(all="ignore"):
        want = np.power(x, y)
    got = run(lambda a, b: a**b, x, y)
    bad = ulps(got, want) > 4
    assert not bad.any(), list(zip(x[bad], y[bad], got[bad], want[bad]))[:5]
    assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))


def test_pow_float64_accuracy(no_math):
    rng = np.random.default_rng(3)
    x, y = rng.uniform(0, 50, 3000), rng.uniform(-40, 40, 3000)
    want = np.power(x, y)
    got = run(lambda a, b: a**b, x, y)
    # y log2 x in double-double: the large exponents (|y log2 x| up to ~226 here) lose no fractional bits
    assert ulps(got, want).max() <= 2


def test_float32_sin_cos_of_large_arguments(no_math):
    w = wide(4)
    x = np.concatenate(
        [np.float32([1e4, -1e4, 1e30, -1e30, 3.4e38, 88.0, 1e-4, 0.0, -0.0, INF, NAN]), w[np.abs(w) < 3e38]]
    ).astype(np.float32)
    for name in ("sin", "cos"):
        with np.errstate(all="ignore"):
            want = getattr(np, name)(x.astype(np.float64))
            got = run(getattr(Tensor, name), x)
        assert got.dtype == np.float32
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        # float64 reduction and series, rounded once: within half a float32 step (plus rounding of the reference)
        assert (np.abs(got[ok] - want[ok]) <= 0.51 * np.spacing(np.float32(np.abs(want[ok]))) + 1e-45).all()


def test_half_sin_and_float64_tan(no_math):
    x = np.linspace(-1e4, 1e4, 1001)
    got = run(lambda t: t.cast(dtypes.float16).sin(), x.astype(np.float16))
    np.testing.assert_allclose(got.astype(np.float32), np.sin(x.astype(np.float16).astype(np.float32)), atol=1e-3)
    np.testing.assert_allclose(run(Tensor.tan, x), np.tan(x), rtol=1e-13, atol=1e-13)
