"""Elementwise math, activations, binary arithmetic, comparison/logical/bitwise, selection, casting and
the operators that map to them, against torch: forward values, result dtypes and shapes, gradients (torch autograd),
edge shapes and views, a PYTHON-device subset, bad inputs and kernel counts."""

import math
import operator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import GlobalCounters, Tensor, dtypes
from reference import check_values as check
from reference import FG2NP, NP2FG, TORCH2FG
from fusegrad.schedule import base_buffer, buffer_of

FG2TORCH = {v: k for k, v in TORCH2FG.items()}
INF, NAN = math.inf, math.nan


def check_grads(fn, tfn, *arrays, atol=1e-4, rtol=1e-3):
    """Gradients of fn(*inputs).sum() w.r.t. every input, against torch autograd of tfn."""
    ts = [Tensor(a) for a in arrays]
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    grads = fn(*ts).sum().gradient(*ts)
    tfn(*xs).sum().backward()
    for g, x in zip(grads, xs):
        ref = x.grad if x.grad is not None else torch.zeros_like(x)
        check(g, ref, atol=atol, rtol=rtol)


def rnd(*shape, lo=-3.0, hi=3.0, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def kernels(*ts):
    GlobalCounters.reset()
    Tensor.realize(*ts)
    return GlobalCounters.kernel_count


# ---------------------------------------------------------------------------------------------------------------------
# unary math (G7) and activations (G8)

# name -> (fusegrad fn, torch fn, domain of the random inputs)
REAL, POS, UNIT, GE1 = (-3.0, 3.0), (0.1, 4.0), (-0.95, 0.95), (1.05, 5.0)
SELU_A, SELU_G = 1.67326, 1.0507  # the API's 5-digit constants (torch uses more digits)
UNARY = {
    "neg": (Tensor.neg, torch.neg, REAL),
    "reciprocal": (Tensor.reciprocal, torch.reciprocal, POS),
    "sqrt": (Tensor.sqrt, torch.sqrt, POS),
    "rsqrt": (Tensor.rsqrt, torch.rsqrt, POS),
    "square": (Tensor.square, torch.square, REAL),
    "abs": (Tensor.abs, torch.abs, REAL),
    "sign": (Tensor.sign, torch.sign, REAL),
    "exp": (Tensor.exp, torch.exp, REAL),
    "exp2": (Tensor.exp2, torch.exp2, REAL),
    "log": (Tensor.log, torch.log, POS),
    "log2": (Tensor.log2, torch.log2, POS),
    "log10": (Tensor.log10, torch.log10, POS),
    "sin": (Tensor.sin, torch.sin, REAL),
    "cos": (Tensor.cos, torch.cos, REAL),
    "tan": (Tensor.tan, torch.tan, (-1.4, 1.4)),
    "asin": (Tensor.asin, torch.asin, UNIT),
    "acos": (Tensor.acos, torch.acos, UNIT),
    "atan": (Tensor.atan, torch.atan, (-6.0, 6.0)),
    "sinh": (Tensor.sinh, torch.sinh, REAL),
    "cosh": (Tensor.cosh, torch.cosh, REAL),
    "asinh": (Tensor.asinh, torch.asinh, (-6.0, 6.0)),
    "acosh": (Tensor.acosh, torch.acosh, GE1),
    "atanh": (Tensor.atanh, torch.atanh, UNIT),
    "erf": (Tensor.erf, torch.erf, REAL),
    "trunc": (Tensor.trunc, torch.trunc, REAL),
    "floor": (Tensor.floor, torch.floor, REAL),
    "ceil": (Tensor.ceil, torch.ceil, REAL),
    "round": (Tensor.round, torch.round, REAL),
    "relu": (Tensor.relu, torch.relu, REAL),
    "relu6": (Tensor.relu6, F.relu6, (-2.0, 8.0)),
    "leaky_relu": (Tensor.leaky_relu, F.leaky_relu, REAL),
    "elu": (lambda t: t.elu(1.5), lambda x: F.elu(x, 1.5), REAL),
    "celu": (lambda t: t.celu(2.0), lambda x: F.celu(x, 2.0), REAL),
    "selu": (Tensor.selu, lambda x: SELU_G * torch.where(x > 0, x, SELU_A * torch.expm1(x)), REAL),
    "sigmoid": (Tensor.sigmoid, torch.sigmoid, (-8.0, 8.0)),
    "logsigmoid": (Tensor.logsigmoid, F.logsigmoid, (-8.0, 8.0)),
    "hardsigmoid": (Tensor.hardsigmoid, F.hardsigmoid, (-5.0, 5.0)),
    "tanh": (Tensor.tanh, torch.tanh, REAL),
    "hardtanh": (Tensor.hardtanh, F.hardtanh, REAL),
    "gelu": (Tensor.gelu, lambda x: F.gelu(x, approximate="tanh"), REAL),
    "gelu_erf": (lambda t: t.gelu(approximate="none"), F.gelu, REAL),
    "quick_gelu": (Tensor.quick_gelu, lambda x: x * torch.sigmoid(1.702 * x), REAL),
    "silu": (Tensor.silu, F.silu, REAL),
    "swish": (Tensor.swish, F.silu, REAL),
    "hardswish": (Tensor.hardswish, F.hardswish, (-5.0, 5.0)),
    "mish": (Tensor.mish, F.mish, REAL),
    "softplus": (Tensor.softplus, F.softplus, (-8.0, 8.0)),
    "softplus_beta": (lambda t: t.softplus(2.0), lambda x: F.softplus(x, beta=2.0), REAL),
    "softsign": (Tensor.softsign, F.softsign, REAL),
}
# these keep an int input's dtype; every other op computes in (and returns) default_float for int/bool inputs
KEEPS_INT = {"neg", "square", "abs", "sign", "trunc", "floor", "ceil", "round", "relu", "relu6", "hardtanh"}
NO_GRAD = {"sign", "trunc", "floor", "ceil", "round"}  # piecewise constant: zero gradient
SPECIAL = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1.5,
        -2.5,
        1e-4,
        -1e-4,
        3.0,
        -3.0,
        6.0,
        -6.0,
        20.0,
        -20.0,
        88.0,
        -88.0,
        100.0,
        -100.0,
        1e30,
        -1e30,
        INF,
        -INF,
        NAN,
    ],
    np.float32,
)
# where torch's special-value answer is an artifact of its formula (0 * inf), fusegrad gives the mathematical limit
SPECIAL_SKIP = {
    "gelu": (INF, -INF),
    "gelu_erf": (INF, -INF),
    "quick_gelu": (-INF,),
    "silu": (-INF,),
    "swish": (-INF,),
    "mish": (-INF,),
    "softsign": (INF, -INF),
}


def domain_data(name, shape, seed=0):
    return rnd(*shape, lo=UNARY[name][2][0], hi=UNARY[name][2][1], seed=seed)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_forward_and_grad(name):
    fn, tfn, _ = UNARY[name]
    x = domain_data(name, (4, 5))
    check(fn(Tensor(x)), tfn(torch.tensor(x)))
    if name not in NO_GRAD:
        check_grads(fn, tfn, x)
    else:
        assert np.all(fn(t := Tensor(x)).sum().gradient(t)[0].numpy() == 0)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(name):
    fn, tfn, _ = UNARY[name]
    x = SPECIAL[~np.isin(SPECIAL, SPECIAL_SKIP.get(name, ()))]
    with np.errstate(all="ignore"):
        check(fn(Tensor(x)), tfn(torch.tensor(x)), rtol=1e-5)


KINKS = np.array([-6.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0], np.float32)


@pytest.mark.parametrize(
    "name", [n for n, v in UNARY.items() if v[2] in (REAL, (-2.0, 8.0), (-5.0, 5.0), (-8.0, 8.0)) and n not in NO_GRAD]
)
def test_unary_grad_at_kinks(name):
    """Gradients at 0 and at the corners of piecewise ops (relu at 0 is 0, abs at 0 is 0, clip bounds, ...)
    like torch."""
    fn, tfn, _ = UNARY[name]
    check_grads(fn, tfn, KINKS)


# every op on every float dtype and int32; unsigned only where the int dtype is kept (bool: test_bool_unary)
UNARY_DTYPE_CASES = [(n, d) for n in UNARY for d in (dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32)] + [
    (n, dtypes.uint8) for n in sorted(KEEPS_INT) if n != "hardtanh"
]  # hardtanh: test_activation_bad_inputs


def _unary_input(name, dt):
    lo, hi = UNARY[name][2]
    if dt is dtypes.uint8:
        return np.array([v for v in (0, 1, 2, 3, 5, 7) if lo <= v <= hi or name in KEEPS_INT] or [2], np.uint8)
    if dt is dtypes.int32:
        return np.array([v for v in (-3, -1, 0, 1, 2, 4) if lo <= v <= hi or name in KEEPS_INT] or [2], np.int32)
    return domain_data(name, (6,), seed=3)


@pytest.mark.parametrize("name,dt", UNARY_DTYPE_CASES, ids=lambda x: x if isinstance(x, str) else x.attr)
def test_unary_dtypes(name, dt):
    """int inputs of float formulas give default_float; neg/abs/sign/rounding/relu/clips keep int dtypes."""
    fn, tfn, _ = UNARY[name]
    x = _unary_input(name, dt)
    out = fn(Tensor(x, dtype=dt) if dtypes.is_float(dt) else Tensor(x))
    exp_dt = dt if dtypes.is_float(dt) or name in KEEPS_INT else dtypes.float32
    assert out.dtype == exp_dt, f"{name}({dt}) -> {out.dtype}, expected {exp_dt}"
    if dtypes.is_float(exp_dt):
        # torch on the same dtype where its CPU kernels support it, else on float32 rounded to the dtype
        src = torch.tensor(x.astype(np.float32) if dt is dtypes.bfloat16 else x)
        src = src.to(FG2TORCH[dt]) if dtypes.is_float(dt) else src.float()
        try:
            ref = tfn(src)
        except (RuntimeError, NotImplementedError):
            ref = tfn(src.float()).to(FG2TORCH[exp_dt])
        check(out, ref.to(FG2TORCH[exp_dt]), atol=1e-6, rtol=1e-3)
    else:
        ref = tfn(torch.tensor(x.astype(np.int64)))
        check(out, ref.numpy().astype(x.dtype))


def test_bool_unary():
    """bool: neg is logical not, the value-keeping ops are identities, float formulas give default_float."""
    b = np.array([True, False])
    check(-Tensor(b), np.array([False, True]))
    for fn in (Tensor.square, Tensor.abs, Tensor.sign, Tensor.trunc, Tensor.floor, Tensor.ceil, Tensor.round):
        check(fn(Tensor(b)), b)
    for fn, tfn in [
        (Tensor.exp, torch.exp),
        (Tensor.sigmoid, torch.sigmoid),
        (Tensor.sqrt, torch.sqrt),
        (Tensor.erf, torch.erf),
        (Tensor.gelu, lambda v: F.gelu(v, approximate="tanh")),
        (Tensor.reciprocal, torch.reciprocal),
    ]:
        check(fn(Tensor(b)), tfn(torch.tensor(b).float()))


def test_unsigned_wraps_and_int_keeps():
    u = np.array([0, 1, 200, 255], np.uint8)
    check(-Tensor(u), (-u.astype(np.int64)).astype(np.uint8))
    check(Tensor(u).abs(), u)
    check(Tensor(u).square(), (u.astype(np.int64) ** 2).astype(np.uint8))
    i = np.array([-128, -5, 0, 7, 127], np.int8)
    check(Tensor(i).abs(), np.abs(i))  # |-128| wraps to -128 like torch
    check(Tensor(i).sign(), np.sign(i))
    check(Tensor(i).relu(), np.maximum(i, 0))


def test_half_computes_in_float32_like_torch():
    """A float16 composite rounds once at the end, so it matches torch's half kernels to one half ulp."""
    x = torch.linspace(-4, 4, 41).half()
    t = Tensor(x.numpy())
    for fn, tfn in [
        (Tensor.gelu, lambda v: F.gelu(v, approximate="tanh")),
        (Tensor.sigmoid, torch.sigmoid),
        (Tensor.erf, torch.erf),
        (Tensor.tanh, torch.tanh),
        (Tensor.silu, F.silu),
        (Tensor.softplus, F.softplus),
        (Tensor.mish, F.mish),
        (Tensor.atan, torch.atan),
        (Tensor.sinh, torch.sinh),
        (Tensor.log10, torch.log10),
    ]:
        with np.errstate(all="ignore"):
            check(fn(t), tfn(x), atol=2e-3, rtol=1e-3)


def test_round_half_to_even():
    x = np.array(
        [
            0.5,
            1.5,
            2.5,
            3.5,
            -0.5,
            -1.5,
            -2.5,
            0.49999997,
            -0.49999997,
            1.4999999,
            2.5000002,
            2**23 + 1,
            -(2**23 + 1),
            2**24,
            1e30,
            -1e-30,
            INF,
            -INF,
            NAN,
            0.0,
            -0.0,
        ],
        np.float32,
    )
    check(Tensor(x).round(), torch.round(torch.tensor(x)), atol=0, rtol=0)
    assert np.signbit(Tensor(np.array([-0.5, -0.0], np.float32)).round().numpy()).all()  # -0.5 rounds to -0.0
    check(Tensor(x.astype(np.float64)).round(), torch.round(torch.tensor(x.astype(np.float64))), atol=0, rtol=0)
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)  # 1e30 -> inf
    check(Tensor(x16).round(), torch.round(torch.tensor(x16)), atol=0, rtol=0)


def test_sign_abs_zero_and_nan():
    x = np.array([-0.0, 0.0, NAN, -INF, INF, -2.0], np.float32)
    check(Tensor(x).sign(), torch.sign(torch.tensor(x)))
    out = Tensor(x).abs().numpy()
    assert not np.signbit(out[:2]).any()  # |-0.0| = +0.0 like torch
    check(Tensor(x).abs(), torch.abs(torch.tensor(x)))


def test_erf_accuracy():
    """erf is a polynomial approximation: absolute error within ~1e-7 over the whole line."""
    x = np.linspace(-6, 6, 4001, dtype=np.float64)
    err = np.abs(Tensor(x).erf().numpy() - torch.erf(torch.tensor(x)).numpy())
    assert err.max() < 2e-7, err.max()


def test_inverse_trig_hyperbolic_edges():
    x = np.array([-1.0, 1.0, -1.5, 1.5, 0.0, -0.0], np.float32)
    for fn, tfn in [(Tensor.asin, torch.asin), (Tensor.acos, torch.acos), (Tensor.atanh, torch.atanh)]:
        with np.errstate(all="ignore"):
            check(fn(Tensor(x)), tfn(torch.tensor(x)), rtol=1e-5)
    big = np.array([1e4, -1e4, 1e20, -1e20, 3e38, 1e-20, -1e-20], np.float32)
    check(Tensor(big).atan(), torch.atan(torch.tensor(big)), rtol=1e-5)
    check(Tensor(big).asinh(), torch.asinh(torch.tensor(big)), rtol=1e-5)
    check(Tensor(np.abs(big) + 1).acosh(), torch.acosh(torch.tensor(np.abs(big) + 1)), rtol=1e-5)
    check(
        Tensor(np.array([88.5, -88.5, 89.0], np.float32)).cosh(),
        torch.cosh(torch.tensor([88.5, -88.5, 89.0])),
        rtol=1e-5,
    )
    x64 = np.linspace(-0.999, 0.999, 101)
    for fn, tfn in [
        (Tensor.asin, torch.asin),
        (Tensor.acos, torch.acos),
        (Tensor.atan, torch.atan),
        (Tensor.atanh, torch.atanh),
    ]:
        check(fn(Tensor(x64)), tfn(torch.tensor(x64)), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name", ["asin", "acos"])
def test_arcsin_arccos_gradient_at_domain_edges(name):
    # torch: asin' = +inf and acos' = -inf at +-1, NaN outside; no NaN from 0 * inf inside the formula
    x = np.array([-1.0, 1.0, -0.99999994, 0.99999994, 0.5, 0.50000006, -0.5, 0.0, -1.5, 1.5], np.float32)
    t, tt = Tensor(x), torch.tensor(x, requires_grad=True)
    with np.errstate(all="ignore"):
        getattr(t, name)().sum().backward()
        getattr(torch, name)(tt).sum().backward()
        check(t.grad, tt.grad, rtol=1e-5)
    check_grads(getattr(Tensor, name), getattr(torch, name), rnd(64, lo=-0.999, hi=0.999))


def test_unary_bad_inputs():
    t = Tensor([1.0, 4.0])
    with pytest.raises(TypeError):
        t.sqrt(2)  # like torch.sqrt(x, 2): no such argument
    with pytest.raises(TypeError):
        t.round(decimals=1)  # round() rounds to integers only (docs/api.md)
    with pytest.raises(TypeError, match="str"):
        t.maximum("1")


def test_activation_bad_inputs():
    with pytest.raises(RuntimeError, match="'erf'"):
        Tensor([1.0]).gelu(approximate="erf")
    with pytest.raises(RuntimeError, match=r"uint8.*-1"):  # like torch
        Tensor(np.array([1, 2], np.uint8)).hardtanh()
    check(Tensor(np.array([1, 9], np.uint8)).hardtanh(0, 5), np.array([1, 5], np.uint8))


@pytest.mark.parametrize("name", ["abs", "exp", "atan", "sigmoid", "gelu", "round", "relu6", "softplus"])
def test_unary_views_and_edge_shapes(name):
    """0-size, 0-d, permuted, negative-step and broadcast (expanded) inputs."""
    fn, tfn, _ = UNARY[name]
    base = domain_data(name, (3, 4), seed=7)
    views = [
        (lambda a: a[:0], lambda t: t[:0]),
        (lambda a: a[1, 2], lambda t: t[1, 2]),
        (lambda a: a.T, lambda t: t.T),
        (lambda a: a[::-1, ::-2], lambda t: t[::-1, ::-2]),
        (lambda a: np.broadcast_to(a[:1], (3, 4)), lambda t: t[:1].expand(3, 4)),
    ]
    for npv, tv in views:
        ref = np.array(npv(base))
        check(fn(tv(Tensor(base))), tfn(torch.tensor(ref)))
    # the gradient flows back through the views
    if name not in NO_GRAD:
        check_grads(lambda t: fn(t.T[::-1]), lambda x: tfn(x.T.flip(0)), base)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_python_device(name):
    fn, tfn, _ = UNARY[name]
    x = np.concatenate([domain_data(name, (4,), seed=9), np.array([0.0, NAN], np.float32)])
    with np.errstate(all="ignore"):
        check(fn(Tensor(x, device="PYTHON")), tfn(torch.tensor(x)))


@pytest.mark.parametrize(
    "name", ["erf", "atan", "asinh", "acosh", "gelu", "gelu_erf", "mish", "logsigmoid", "round", "selu"]
)
def test_composite_unary_is_one_kernel(name):
    fn = UNARY[name][0]
    assert kernels(fn(Tensor(domain_data(name, (8, 8))))) == 1
    t = Tensor(domain_data(name, (8, 8)))
    assert kernels(fn(t).sum().gradient(t)[0]) <= 2


# ---------------------------------------------------------------------------------------------------------------------
# binary arithmetic (G9)

BINARY = {
    "add": (Tensor.add, torch.add),
    "sub": (Tensor.sub, torch.sub),
    "mul": (Tensor.mul, torch.mul),
    "div": (Tensor.div, torch.div),
    "pow": (Tensor.pow, torch.pow),
    "maximum": (Tensor.maximum, torch.maximum),
    "minimum": (Tensor.minimum, torch.minimum),
    "mod": (Tensor.mod, torch.remainder),
    "fmod": (Tensor.fmod, torch.fmod),
    "copysign": (Tensor.copysign, torch.copysign),
    "logaddexp": (Tensor.logaddexp, torch.logaddexp),
    "floordiv": (lambda a, b: a // b, lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "truncdiv": (lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: torch.div(a, b, rounding_mode="trunc")),
}
BINARY_NO_GRAD = {"floordiv", "truncdiv"}


def binary_inputs(name, sa, sb):
    a = rnd(*sa, lo=0.2 if name == "pow" else -3, hi=3, seed=1)
    b = rnd(*sb, lo=-2, hi=2, seed=2)
    if name in ("div", "mod", "fmod", "floordiv", "truncdiv"):
        b = np.where(np.abs(b) < 0.25, np.float32(0.75), b).astype(np.float32)
    return a, b


@pytest.mark.parametrize("sa,sb", [((3, 4), (3, 4)), ((2, 3, 1), (1, 4)), ((), (3,))], ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_forward_and_grad(name, sa, sb):
    fn, tfn = BINARY[name]
    a, b = binary_inputs(name, sa, sb)
    check(fn(Tensor(a), Tensor(b)), tfn(torch.tensor(a), torch.tensor(b)))
    if name not in BINARY_NO_GRAD:
        check_grads(fn, tfn, a, b)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_special_values(name):
    fn, tfn = BINARY[name]
    # (1e30 % 0.1 is not exact: the remainder is exact only for quotients below ~2**29)
    v = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.0, 0.1, 1e8, INF, -INF, NAN], np.float32)
    a, b = (m.ravel().copy() for m in np.meshgrid(v, v, indexing="ij"))
    with np.errstate(all="ignore"):
        check(fn(Tensor(a), Tensor(b)), tfn(torch.tensor(a), torch.tensor(b)), rtol=1e-5)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_python_device(name):
    fn, tfn = BINARY[name]
    a, b = binary_inputs(name, (2, 3), (3,))
    check(fn(Tensor(a, device="PYTHON"), Tensor(b, device="PYTHON")), tfn(torch.tensor(a), torch.tensor(b)))


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_views_and_zero_size(name):
    fn, tfn = BINARY[name]
    a, b = binary_inputs(name, (4, 3), (3, 4))
    check(fn(Tensor(a)[::-1], Tensor(b).T), tfn(torch.tensor(a).flip(0), torch.tensor(b).T))
    check(fn(Tensor(a)[:0], Tensor(b[0, :3])), tfn(torch.tensor(a)[:0], torch.tensor(b[0, :3])))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "mod", "floordiv", "maximum", "copysign"])
def test_binary_scalar_and_reflected(name):
    fn, tfn = BINARY[name]
    a = rnd(2, 3, lo=0.5, hi=3, seed=3)
    for s in (2, 0.5, -1.5):
        ts = torch.tensor(s, dtype=torch.float32) if name in ("maximum", "copysign") else s
        check(fn(Tensor(a), s), tfn(torch.tensor(a), ts))
    ops = {
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "mul": lambda x, y: x * y,
        "div": lambda x, y: x / y,
        "pow": lambda x, y: x**y,
        "mod": lambda x, y: x % y,
        "floordiv": lambda x, y: x // y,
    }
    if name in ops:
        for s in (1.5, 3, -2):
            check(ops[name](s, Tensor(a)), ops[name](s, torch.tensor(a)))


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=lambda d: d.attr)
@pytest.mark.parametrize("name", ["add", "mul", "div", "pow", "mod", "floordiv", "maximum", "logaddexp", "copysign"])
def test_binary_float_dtypes(name, dt):
    """Narrow floats compute each op in float32 and round once, like torch's CPU kernels; float64 stays float64."""
    fn, tfn = BINARY[name]
    a, b = binary_inputs(name, (3, 4), (4,))
    xa, xb = torch.tensor(a).to(FG2TORCH[dt]), torch.tensor(b).to(FG2TORCH[dt])
    check(fn(Tensor(a, dtype=dt), Tensor(b, dtype=dt)), tfn(xa, xb))


def test_half_gradients():
    x = rnd(3, 4, seed=21).astype(np.float16)
    for fn, tfn in [
        (Tensor.gelu, lambda v: F.gelu(v, approximate="tanh")),
        (Tensor.sigmoid, torch.sigmoid),
        (Tensor.abs, torch.abs),
    ]:
        t, xt = Tensor(x), torch.tensor(x, requires_grad=True)
        tfn(xt).sum().backward()
        check(fn(t).sum().gradient(t)[0], xt.grad)


INT_DTYPES = [
    dtypes.int8,
    dtypes.int16,
    dtypes.int32,
    dtypes.int64,
    dtypes.uint8,
    dtypes.uint16,
    dtypes.uint32,
    dtypes.uint64,
]


@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.attr)
def test_int_division_family(dt):
    """//, %, fmod and trunc division keep the int dtype; floor/% round like Python for negatives, fmod/trunc like C."""
    signed = not dtypes.is_unsigned(dt)
    a = np.array([-7, -7, 7, 7, -6, 0, 5, -1, 1, 9, -9, 100] if signed else [7, 7, 0, 5, 1, 9, 100, 200], np.int64)
    b = np.array([2, -2, 2, -2, 3, 3, -5, 4, -4, 3, -3, 7] if signed else [2, 3, 3, 5, 4, 3, 7, 9], np.int64)
    npdt = FG2NP[dt]
    ta, tb = Tensor(a.astype(npdt)), Tensor(b.astype(npdt))
    xa, xb = torch.tensor(a), torch.tensor(b)  # int64 reference: every value fits, so nothing wraps
    check(ta // tb, torch.div(xa, xb, rounding_mode="floor").numpy().astype(npdt))
    check(ta % tb, torch.remainder(xa, xb).numpy().astype(npdt))
    check(ta.fmod(tb), torch.fmod(xa, xb).numpy().astype(npdt))
    check(ta.div(tb, rounding_mode="trunc"), torch.div(xa, xb, rounding_mode="trunc").numpy().astype(npdt))
    check(ta / tb, (xa / xb).float())
    check(ta % 3, torch.remainder(xa, 3).numpy().astype(npdt))
    check(ta // 4, torch.div(xa, 4, rounding_mode="floor").numpy().astype(npdt))


def test_int_min_div_minus_one_wraps():
    """Regression: INT_MIN // -1 trapped (SIGFPE) in the C backend; torch wraps to INT_MIN and INT_MIN % -1 is 0."""
    for npdt in (np.int32, np.int64, np.int8):
        lo = np.iinfo(npdt).min
        a, b = np.array([lo, lo, 7, -7], npdt), np.array([-1, 1, -1, -1], npdt)
        for dev in ("CPU", "PYTHON"):
            ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
            check(ta // tb, np.array([lo, lo, -7, 7], npdt))
            check(ta.div(tb, rounding_mode="trunc"), np.array([lo, lo, -7, 7], npdt))
            check(ta % tb, np.zeros(4, npdt))
            check(ta.fmod(tb), np.zeros(4, npdt))


def test_float_floordiv_mod_exact():
    """Python/torch semantics: the quotient of the exact remainder (1 // 0.1 == 9, not floor(1 / 0.1) == 10)."""
    a = np.array([1.0, 1.0, -1.0, 0.3, 5.0, -5.0, 7.5, 1e6, 3.0, -0.0, 0.0], np.float32)
    b = np.array([0.1, -0.1, 0.1, 0.1, INF, INF, -2.0, 7.0, 0.0, 2.0, -2.0], np.float32)
    for dt in (np.float32, np.float16, np.float64):
        with np.errstate(over="ignore"):
            a_dt = a.astype(dt)  # 1e6 -> inf in half
        xa, xb, ta, tb = torch.tensor(a_dt), torch.tensor(b.astype(dt)), Tensor(a_dt), Tensor(b.astype(dt))
        if dt is not np.float64:
            check(ta // tb, torch.div(xa, xb, rounding_mode="floor"), atol=0, rtol=0)  # float64: approximate
        check(ta % tb, torch.remainder(xa, xb), rtol=1e-6)
        check(ta.fmod(tb), torch.fmod(xa, xb), rtol=1e-6)
    check(Tensor(a)[:2] // 0.1, torch.tensor(a)[:2] // 0.1, atol=0, rtol=0)


def test_true_div_int_and_bool():
    a, b = np.array([1, -3, 7, 0], np.int32), np.array([2, 2, -4, 5], np.int32)
    check(Tensor(a) / Tensor(b), torch.tensor(a) / torch.tensor(b))
    check(3 / Tensor(b), 3 / torch.tensor(b))
    check(Tensor([True, False]) / Tensor([True, True]), torch.tensor([True, False]) / torch.tensor([True, True]))
    check(Tensor(a.astype(np.int64)) // 2.0, torch.tensor(a.astype(np.int64)) // 2.0)


def test_bool_arithmetic():
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    check(Tensor(a) + Tensor(b), a | b)
    check(Tensor(a) * Tensor(b), a & b)
    check(Tensor(a) + 1, a.astype(np.int32) + 1)  # an int scalar with a bool tensor gives default_int
    check(Tensor(a) * 2.5, torch.tensor(a) * 2.5)
    with pytest.raises(RuntimeError, match="bool"):
        Tensor(a) - Tensor(b)


@pytest.mark.parametrize("npdt", [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64])
def test_int_overflow_wraps(npdt):
    info = np.iinfo(npdt)
    a = np.array([info.max, info.min, info.max // 2 + 3, 1], npdt)
    b = np.array([1, -1 if info.min else 1, 3, info.max], npdt)
    with np.errstate(over="ignore"):
        check(Tensor(a) + Tensor(b), a + b)
        check(Tensor(a) - Tensor(b), a - b)
        check(Tensor(a) * Tensor(b), a * b)
        check(-Tensor(a), -a)
        check(Tensor(a) * 3, a * npdt(3))


def test_pow_int():
    a = np.array([-3, -2, -1, 0, 1, 2, 3, 5], np.int32)
    for e in (0, 1, 2, 3, 7, 40):
        check(Tensor(a) ** e, torch.tensor(a) ** e)  # 3 ** 40 wraps like torch
    e = np.array([0, 3, -1, -2, 5, -3, 31, 40], np.int32)
    check(Tensor(a) ** Tensor(e), torch.tensor(a) ** torch.tensor(e))  # negative exponents: 0 unless |base| == 1
    check(Tensor(a.astype(np.int64)) ** Tensor(e.astype(np.int64)), torch.tensor(a).long() ** torch.tensor(e).long())
    e8 = (np.abs(e) % 9).astype(np.uint8)
    check(
        Tensor(a.astype(np.int8)) ** Tensor(e8), torch.tensor(a.astype(np.int8)).short() ** torch.tensor(e8).short()
    )  # int8 ** uint8 -> int16
    check(Tensor(a.astype(np.uint8)) ** Tensor(e8), torch.tensor(a.astype(np.uint8)) ** torch.tensor(e8))
    check(2 ** Tensor(np.array([0, 1, 5, 31, 33], np.int32)), 2 ** torch.tensor([0, 1, 5, 31, 33], dtype=torch.int32))
    check(Tensor(a) ** 0.5, torch.tensor(a) ** 0.5)  # a float exponent promotes an int base
    check(
        Tensor(a) ** Tensor(np.full(8, 2.0, np.float32)), torch.tensor(a) ** torch.tensor(np.full(8, 2.0, np.float32))
    )
    check(Tensor(a[:4], device="PYTHON") ** Tensor(e[:4], device="PYTHON"), torch.tensor(a[:4]) ** torch.tensor(e[:4]))
    check(Tensor([True, False]) ** 2, torch.tensor([1, 0], dtype=torch.int32))
    assert kernels(Tensor(a) ** Tensor(e)) == 1
    with pytest.raises(RuntimeError, match="-1"):
        Tensor(a) ** -1


def test_pow_float_edge_cases():
    base = np.array([0.0, 0.0, -2.0, -2.0, -2.0, 2.0, 4.0, -8.0, 0.0, 1.0, NAN, 1.0, -0.0, INF, -INF], np.float32)
    exp = np.array([0.0, -1.0, 3.0, 2.0, 0.5, -2.0, 0.5, 1 / 3, 2.0, NAN, 0.0, INF, -1.0, -1.0, 3.0], np.float32)
    check(Tensor(base) ** Tensor(exp), torch.tensor(base) ** torch.tensor(exp), rtol=1e-5)
    check(
        Tensor(base.astype(np.float16)) ** Tensor(exp.astype(np.float16)),
        torch.tensor(base.astype(np.float16)) ** torch.tensor(exp.astype(np.float16)),
    )


def test_maximum_minimum_nan_ties_and_grad():
    a = np.array([NAN, 1.0, NAN, -INF, 3.0, 2.0], np.float32)
    b = np.array([1.0, NAN, NAN, NAN, -INF, 2.0], np.float32)
    check(Tensor(a).maximum(Tensor(b)), torch.maximum(torch.tensor(a), torch.tensor(b)))
    check(Tensor(a).minimum(Tensor(b)), torch.minimum(torch.tensor(a), torch.tensor(b)))
    check(
        Tensor(a.astype(np.float16)).maximum(Tensor(b.astype(np.float16))),
        torch.maximum(torch.tensor(a.astype(np.float16)), torch.tensor(b.astype(np.float16))),
    )
    x, y = np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 1.0, 4.0], np.float32)  # a tie splits the gradient
    check_grads(Tensor.maximum, torch.maximum, x, y)
    check_grads(Tensor.minimum, torch.minimum, x, y)


def test_copysign_dtypes_and_signed_zero():
    a = np.array([1.0, -2.0, 3.0, 0.0, -0.0, INF, NAN], np.float32)
    b = np.array([-0.0, 0.0, -1.0, -1.0, 1.0, -NAN, -2.0], np.float32)
    check(Tensor(a).copysign(Tensor(b)), torch.copysign(torch.tensor(a), torch.tensor(b)))
    assert np.signbit(Tensor(a).copysign(Tensor(b)).numpy()[[0, 2, 3, 5]]).all()
    check(Tensor(a).copysign(-1.0), torch.copysign(torch.tensor(a), -1.0))
    i = np.array([3, -4, 0, 5], np.int32)
    check(
        Tensor(i).copysign(Tensor(np.array([-1, 1, -2, 0], np.int32))), np.array([-3, 4, 0, 5], np.int32)
    )  # ints stay ints
    check(Tensor(i).copysign(-0.0), torch.copysign(torch.tensor(i), -0.0))
    check(
        Tensor(a.astype(np.float16)).copysign(Tensor(b.astype(np.float16))),
        torch.copysign(torch.tensor(a.astype(np.float16)), torch.tensor(b.astype(np.float16))),
    )


def test_logaddexp_stable():
    a = np.array([-INF, INF, 1000.0, -1000.0, 0.0, 88.0, NAN, -INF], np.float32)
    b = np.array([-INF, 1.0, 1000.0, -1000.0, -INF, 89.0, 1.0, 5.0], np.float32)
    check(Tensor(a).logaddexp(Tensor(b)), torch.logaddexp(torch.tensor(a), torch.tensor(b)), rtol=1e-6)
    check(Tensor(np.array([1, 2], np.int32)).logaddexp(3), torch.logaddexp(torch.tensor([1.0, 2.0]), torch.tensor(3.0)))


def test_ufix():
    t = Tensor(np.array([1, 2], np.int32))
    assert t.ufix(3).dtype == dtypes.int32 and t.ufix(2.5).dtype == dtypes.float32
    assert Tensor([1.0]).half().ufix(2).dtype == dtypes.float16 and Tensor([True]).ufix(2).dtype == dtypes.int32
    check(t.ufix(3), np.array([3, 3], np.int32))
    u = Tensor([1.0])
    assert t.ufix(u) is u


def test_binary_bad_inputs():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)|\(4,\).*\(2, 3\)"):
        Tensor.ones(2, 3) + Tensor.ones(4)
    with pytest.raises(RuntimeError, match="'round'"):
        Tensor([1.0]).div(2, rounding_mode="round")
    with pytest.raises(RuntimeError, match="int32"):
        Tensor([2]) ** -2
    with pytest.raises(TypeError):
        Tensor([1.0]) + "a"


# ---------------------------------------------------------------------------------------------------------------------
# comparison, logical, bitwise (G10)


def test_comparisons_dtype_broadcast_no_grad():
    a, b = rnd(3, 1, seed=4), rnd(4, seed=5)
    for op in (
        lambda x, y: x < y,
        lambda x, y: x > y,
        lambda x, y: x <= y,
        lambda x, y: x >= y,
        lambda x, y: x == y,
        lambda x, y: x != y,
        lambda x, y: x.eq(y),
        lambda x, y: x.ne(y),
    ):
        out = op(Tensor(a), Tensor(b))
        check(out, op(torch.tensor(a), torch.tensor(b)))
    t = Tensor(a)
    g = (t < 0).where(t, 0.0).sum().gradient(t)[0]
    check(g, (torch.tensor(a) < 0).float())
    check(Tensor(np.array([1.5, 0.0, -0.0, NAN], np.float32)).logical_not(), np.array([False, True, True, False]))
    check(Tensor(np.array([3, 0], np.int8)).logical_not(), np.array([False, True]))
    check(Tensor(np.array([1, 2, 3], np.int32), device="PYTHON") >= 2, np.array([False, True, True]))


def test_isnan_isinf_isfinite():
    x = np.array([0.0, -1.0, INF, -INF, NAN, 1e30], np.float32)
    for dt in (np.float32, np.float16, np.float64):
        with np.errstate(over="ignore"):
            tx, xx = Tensor(x.astype(dt)), torch.tensor(x.astype(dt))  # 1e30 -> inf in half
        check(tx.isnan(), torch.isnan(xx))
        check(tx.isinf(), torch.isinf(xx))
        check(tx.isinf(detect_negative=False), torch.isposinf(xx))
        check(tx.isinf(detect_positive=False), torch.isneginf(xx))
        check(tx.isinf(False, False), np.zeros(6, bool))
        check(tx.isfinite(), torch.isfinite(xx))
    i = Tensor(np.array([1, -5], np.int32))
    check(i.isnan(), np.zeros(2, bool))
    check(i.isinf(), np.zeros(2, bool))
    check(i.isfinite(), np.ones(2, bool))
    check(Tensor(x, device="PYTHON").isfinite(), np.isfinite(x))


def test_isclose_allclose():
    a = np.array([1.0, 1.0, INF, INF, -INF, NAN, NAN, 0.0, 1e-9, 100.0], np.float32)
    b = np.array([1.0 + 1e-6, 1.1, INF, -INF, -INF, NAN, 1.0, 1e-9, 0.0, 100.001], np.float32)
    ta, tb, xa, xb = Tensor(a), Tensor(b), torch.tensor(a), torch.tensor(b)
    check(ta.isclose(tb), torch.isclose(xa, xb))
    check(ta.isclose(tb, equal_nan=True), torch.isclose(xa, xb, equal_nan=True))
    check(ta.isclose(tb, rtol=0.2, atol=0.0), torch.isclose(xa, xb, rtol=0.2, atol=0.0))
    check(ta.isclose(1.0), torch.isclose(xa, torch.tensor(1.0)))
    i = np.array([1, 2, 100], np.int32)
    check(
        Tensor(i).isclose(Tensor(np.array([1, 3, 101], np.int32)), rtol=0.01),
        torch.isclose(torch.tensor(i), torch.tensor([1, 3, 101], dtype=torch.int32), rtol=0.01),
    )
    out = ta[:2].allclose(tb[:2], rtol=1e-5)
    assert isinstance(out, Tensor) and out.shape == () and out.dtype == dtypes.bool and out.item() is False
    assert Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7])).item() is True
    with pytest.raises(RuntimeError, match="-0.5"):
        ta.isclose(tb, rtol=-0.5)


BIT_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("npdt", BIT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_bitwise(npdt):
    rng = np.random.default_rng(6)
    if npdt is np.bool_:
        a, b = rng.integers(0, 2, 8).astype(bool), rng.integers(0, 2, 8).astype(bool)
    else:
        info = np.iinfo(npdt)
        a = rng.integers(info.min, info.max, 8, dtype=npdt, endpoint=True)
        b = rng.integers(info.min, info.max, 8, dtype=npdt, endpoint=True)
    ta, tb = Tensor(a), Tensor(b)
    check(ta & tb, a & b)
    check(ta | tb, a | b)
    check(ta ^ tb, a ^ b)
    check(~ta, ~a)
    check(ta.bitwise_and(tb), np.bitwise_and(a, b))
    check(ta.bitwise_or(tb), np.bitwise_or(a, b))
    check(ta.bitwise_xor(tb), np.bitwise_xor(a, b))
    check(ta.bitwise_not(), np.invert(a))
    if npdt is not np.bool_:
        check(ta & 0x5A, a & npdt(0x5A))
        check(0x0F | ta, npdt(0x0F) | a)
        check(ta.bitwise_xor(3, reverse=True), npdt(3) ^ a)


@pytest.mark.parametrize(
    "npdt", [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64], ids=lambda d: np.dtype(d).name
)
def test_shifts(npdt):
    """Shifts by the bit width or more give 0 (or -1 for >> of negatives) like torch;
    >> of signed values is arithmetic."""
    info = np.iinfo(npdt)
    a = np.array([1, 3, -8 if info.min else 200, info.max, info.min, 0], npdt)

    def wrap(v):
        return np.array([int(x) & ((1 << info.bits) - 1) for x in v], np.uint64).astype(npdt)

    def lsh(x, s):
        return int(x) << int(s) if s < info.bits else 0

    def rsh(x, s):
        return int(x) >> int(s) if s < info.bits else (-1 if x < 0 else 0)

    for s in (0, 1, 3, info.bits - 1, info.bits, info.bits + 5):
        check(Tensor(a) << s, wrap([lsh(x, s) for x in a]))
        check(Tensor(a) >> s, wrap([rsh(x, s) for x in a]))
    sh = np.array([0, 1, 2, info.bits - 1, info.bits, info.bits + 3], npdt)
    check(Tensor(a).lshift(Tensor(sh)), wrap([lsh(x, s) for x, s in zip(a, sh)]))
    check(Tensor(a).rshift(Tensor(sh)), wrap([rsh(x, s) for x, s in zip(a, sh)]))
    if npdt in (np.int8, np.int32, np.int64):
        xa = torch.tensor(a)
        check(Tensor(a) << 2, xa << 2)
        check(Tensor(a) >> 2, xa >> 2)
    check(Tensor(a, device="PYTHON") << (info.bits + 1), np.zeros(6, npdt))
    check(1 << Tensor(np.array([0, 1, 2], npdt)), np.array([1, 2, 4], npdt))
    check(Tensor(np.array([64, 16], npdt)).rshift(2, reverse=False), np.array([16, 4], npdt))


def test_bitwise_bad_inputs():
    f, i = Tensor([1.5, 2.0]), Tensor([1, 2])
    for call in (
        lambda: f & i,
        lambda: f | 1,
        lambda: i ^ 1.5,
        lambda: ~f,
        lambda: f.bitwise_not(),
        lambda: i << 1.0,
        lambda: f >> 1,
        lambda: i.lshift(f),
        lambda: f.lshift(2, reverse=True),
    ):
        with pytest.raises(RuntimeError, match="float32"):
            call()
    with pytest.raises(RuntimeError, match="bool"):
        Tensor([True]) >> Tensor([False])


# ---------------------------------------------------------------------------------------------------------------------
# where, masked_fill, clamp, lerp (G11)


def test_where_grad_and_forms():
    c = np.array([[True, False, True], [False, False, True]])
    x, y = rnd(2, 3, seed=8), rnd(3, seed=9)
    check(Tensor(c).where(Tensor(x), Tensor(y)), torch.where(torch.tensor(c), torch.tensor(x), torch.tensor(y)))
    check(Tensor.where(Tensor(c), Tensor(x), 1.5), torch.where(torch.tensor(c), torch.tensor(x), 1.5))
    check(Tensor(c).where(2, 3.5), np.where(c, 2.0, 3.5).astype(np.float32))
    check(Tensor(c).where(True, False), c)
    check_grads(lambda a, b: Tensor(c).where(a, b), lambda a, b: torch.where(torch.tensor(c), a, b), x, y)
    check(Tensor(c, device="PYTHON").where(Tensor(x, device="PYTHON"), -1.0), np.where(c, x, np.float32(-1.0)))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        Tensor(c).where(Tensor(x), Tensor.ones(4))


def test_masked_fill():
    x = rnd(3, 4, seed=10)
    m = np.random.default_rng(0).integers(0, 2, (1, 4)).astype(bool)
    check(Tensor(x).masked_fill(Tensor(m), -INF), torch.tensor(x).masked_fill(torch.tensor(m), -INF))
    check(Tensor(x).masked_fill(Tensor(m), Tensor(np.float32(2.0))), torch.tensor(x).masked_fill(torch.tensor(m), 2.0))
    check_grads(lambda t: t.masked_fill(Tensor(m), 0.0), lambda t: t.masked_fill(torch.tensor(m), 0.0), x)
    check(Tensor(np.array([1, 2], np.int32)).masked_fill(Tensor([True, False]), 7), np.array([7, 2], np.int32))


def test_clamp_clip():
    x = np.array([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, NAN, INF, -INF], np.float32)
    tx, xx = Tensor(x), torch.tensor(x)
    check(tx.clamp(-1, 1), xx.clamp(-1, 1))
    check(tx.clip(-1.0, 1.0), xx.clip(-1.0, 1.0))
    check(tx.clamp(min_=0.0), xx.clamp(min=0.0))
    check(tx.clamp(max_=0.5), xx.clamp(max=0.5))
    check(tx.clamp(2.0, 1.0), xx.clamp(2.0, 1.0))  # min > max gives max, like torch
    lo, hi = rnd(10, lo=-2, hi=0, seed=11), rnd(10, lo=0, hi=2, seed=12)
    check(tx.clamp(Tensor(lo), Tensor(hi)), xx.clamp(torch.tensor(lo), torch.tensor(hi)))
    i = np.array([-5, 0, 5, 9], np.int32)
    check(Tensor(i).clamp(-2, 6), torch.tensor(i).clamp(-2, 6))  # int bounds keep int32
    check(Tensor(i).clamp(-2.5, 6), torch.tensor(i).clamp(-2.5, 6))  # a float bound promotes
    check(Tensor(x.astype(np.float16)).clamp(-1, 1), torch.tensor(x.astype(np.float16)).clamp(-1, 1))
    # gradient is inclusive at the bounds (unlike hardtanh), and flows into tensor bounds
    k = np.array([-2.0, -1.0, 0.0, 1.0, 2.0], np.float32)
    check_grads(lambda t: t.clamp(-1, 1), lambda t: t.clamp(-1, 1), k)
    check_grads(lambda t, a, b: t.clamp(a, b), lambda t, a, b: t.clamp(a, b), x[:7], lo[:7], hi[:7])
    check(Tensor(x[:4], device="PYTHON").clip(-0.75, 0.25), np.clip(x[:4], -0.75, 0.25))
    with pytest.raises(RuntimeError, match="None"):
        tx.clamp()


def test_lerp():
    a, b, w = rnd(3, 4, seed=13), rnd(3, 4, seed=14), rnd(4, lo=0, hi=1, seed=15)
    check(Tensor(a).lerp(Tensor(b), 0.3), torch.lerp(torch.tensor(a), torch.tensor(b), 0.3))
    check(Tensor(a).lerp(Tensor(b), Tensor(w)), torch.lerp(torch.tensor(a), torch.tensor(b), torch.tensor(w)))
    check_grads(lambda x, y, z: x.lerp(y, z), torch.lerp, a, b, np.broadcast_to(w, (3, 4)).copy())
    check(
        Tensor(a.astype(np.float16)).lerp(Tensor(b.astype(np.float16)), 0.75),
        torch.lerp(torch.tensor(a.astype(np.float16)), torch.tensor(b.astype(np.float16)), 0.75),
    )
    # uint8 with a Tensor weight: 7-bit fixed point, stays uint8, within 1 of the exact value
    ua, ub = np.array([0, 255, 10, 200, 255], np.uint8), np.array([255, 0, 20, 100, 255], np.uint8)
    uw = np.array([0.5, 0.25, 1.0, 0.0, 0.3], np.float32)
    out = Tensor(ua).lerp(Tensor(ub), Tensor(uw))
    assert out.dtype == dtypes.uint8
    exact = ua + (ub.astype(np.float64) - ua) * uw
    assert np.abs(out.numpy().astype(np.float64) - exact).max() <= 1


# ---------------------------------------------------------------------------------------------------------------------
# casting and bitcast (G12)


def test_cast_shorthands():
    x = np.array([1.7, -2.5, 0.0, 300.25], np.float32)
    t, xx = Tensor(x), torch.tensor(x)
    for fn, tfn in [
        (Tensor.float, torch.Tensor.float),
        (Tensor.half, torch.Tensor.half),
        (Tensor.double, torch.Tensor.double),
        (Tensor.bfloat16, torch.Tensor.bfloat16),
        (Tensor.int, torch.Tensor.int),
        (Tensor.long, torch.Tensor.long),
        (Tensor.short, torch.Tensor.short),
        (Tensor.bool, torch.Tensor.bool),
    ]:
        check(fn(t), tfn(xx), atol=0, rtol=0)
    assert t.cast(dtypes.float32) is t and t.cast("float32") is t
    check(Tensor(x, device="PYTHON").cast(dtypes.int8), xx.to(torch.int32).to(torch.int8))
    check_grads(lambda v: v.double().square().float(), lambda v: v.double().square().float(), x)
    with pytest.raises(AttributeError, match="floaty"):
        t.cast("floaty")


def test_cast_float_to_unsigned_wraps_like_torch():
    """Negative floats to uint32/uint64 wrap like torch (C leaves that conversion undefined), as uint8/uint16 do."""
    small = [-1.0, -3.7, 300.0, -129.5, 5.0]
    for dev in ("CPU", "PYTHON"):
        for dt, extra in [
            (dtypes.uint8, []),
            (dtypes.uint16, []),
            (dtypes.int8, []),
            (dtypes.uint32, [3e9]),
            (dtypes.int64, [3e9, -3e9]),
            (dtypes.uint64, [3e9, -3e9, 1e19]),
        ]:
            x = np.array(small + extra, np.float32)
            check(Tensor(x, device=dev).cast(dt), torch.tensor(x).to(FG2TORCH[dt]))


BITCASTS = [
    (np.float32, np.int32),
    (np.float32, np.uint32),
    (np.int32, np.float32),
    (np.float16, np.int16),
    (np.uint16, np.float16),
    (np.float64, np.int64),
    (np.uint32, np.uint16),
    (np.uint16, np.uint32),
    (np.uint8, np.float32),
    (np.float32, np.uint8),
    (np.int64, np.int16),
    (np.int8, np.float64),
    (np.float64, np.float32),
    (np.float16, np.uint64),
    (np.int16, np.int8),
    (np.bool_, np.uint8),
]


@pytest.mark.parametrize("src,dst", BITCASTS, ids=lambda d: np.dtype(d).name)
def test_bitcast(src, dst):
    """Reinterpreting bits; a different item size rescales the last axis (like numpy's view)."""
    raw = np.random.default_rng(16).integers(0, 256, 96, dtype=np.uint8)
    if src is np.bool_:
        raw = raw & 1
    if np.dtype(src).kind == "f":  # keep NaN payloads out (their bits may be canonicalised)
        raw = (
            np.abs(np.random.default_rng(16).uniform(-100, 100, 96 // np.dtype(src).itemsize))
            .astype(src)
            .view(np.uint8)
        )
    a = raw.view(src).reshape(2, -1)
    out = Tensor(a).bitcast(NP2FG[np.dtype(dst)])
    check(out, a.view(dst), atol=0, rtol=0)
    # non-contiguous and negative-step views are reinterpreted in their logical layout
    check(Tensor(a)[::-1].bitcast(NP2FG[np.dtype(dst)]), np.ascontiguousarray(a[::-1]).view(dst), atol=0, rtol=0)
    assert kernels(Tensor(a).bitcast(NP2FG[np.dtype(dst)]) + 0) == 1


def test_bitcast_details():
    x = np.array([[1.5, -2.0], [INF, -0.0]], np.float32)
    check(Tensor(x).T.bitcast(dtypes.uint16), np.ascontiguousarray(x.T).view(np.uint16))
    check(Tensor(x)[:, :0].bitcast(dtypes.uint8), np.zeros((2, 0), np.uint8))
    check(Tensor(np.array([1, 2], np.uint32)).bitcast(dtypes.uint16), np.array([1, 0, 2, 0], np.uint16))
    check(Tensor(np.array([0x3F80, 0xC000], np.uint16)).bitcast(dtypes.bfloat16), torch.tensor([1.0, -2.0]).bfloat16())
    check(
        Tensor(np.array([1.0, -2.0], np.float32)).bfloat16().bitcast(dtypes.int16), np.array([0x3F80, -16384], np.int16)
    )
    check(
        Tensor(np.array([0x3F800000, 0x40490FDB], np.uint32), device="PYTHON").bitcast(dtypes.float32),
        np.array([1.0, 3.14159274], np.float32),
        atol=0,
        rtol=0,
    )
    check(
        Tensor(np.arange(8, dtype=np.uint8), device="PYTHON").bitcast(dtypes.uint32),
        np.arange(8, dtype=np.uint8).view(np.uint32),
    )
    check(Tensor(np.array([7], np.int32)).bitcast(dtypes.int32), np.array([7], np.int32))
    t = Tensor(x)
    assert np.all(
        t.bitcast(dtypes.int32).cast(dtypes.float32).sum().gradient(t)[0].numpy() == 0
    )  # bitcast has no gradient


def test_bitcast_bad_inputs():
    with pytest.raises(RuntimeError, match="0-d"):
        Tensor(np.float32(1.0)).bitcast(dtypes.uint8)
    with pytest.raises(RuntimeError, match="3"):
        Tensor(np.zeros((2, 3), np.uint8)).bitcast(dtypes.uint16)
    with pytest.raises(RuntimeError, match="weak"):
        Tensor([1, 2]).bitcast(dtypes.weakint)


# ---------------------------------------------------------------------------------------------------------------------
# Python operator protocol (G4): reflected forms, in-place operators, what is not provided


def test_reflected_operators():
    a = rnd(2, 3, lo=0.5, hi=2, seed=17)
    ta, xa = Tensor(a), torch.tensor(a)
    for op in (
        lambda x: 2 + x,
        lambda x: 2 - x,
        lambda x: 2 * x,
        lambda x: 2 / x,
        lambda x: 2 // x,
        lambda x: 2 % x,
        lambda x: 2**x,
        lambda x: -x,
        lambda x: 1.5 < x,
        lambda x: 1.5 >= x,
        lambda x: 1.0 == x,
    ):
        check(op(ta), op(xa))
    i = np.array([5, -6, 7], np.int32)
    ti, xi = Tensor(i), torch.tensor(i)
    for op in (
        lambda x: 3 & x,
        lambda x: 3 | x,
        lambda x: 3 ^ x,
        lambda x: 1 << (x & 7),
        lambda x: 256 >> (x & 7),
        lambda x: ~x,
        lambda x: 17 // x,
        lambda x: 17 % x,
    ):
        check(op(ti), op(xi))


def test_inplace_operators():
    """Each in-place operator writes into the same tensor (and buffer) and returns it."""
    t = Tensor(np.array([1.0, 2.0, 3.0], np.float32)).realize()
    ref, buf = np.array([1.0, 2.0, 3.0], np.float32), buffer_of[base_buffer(t.uop)]  # not the uop: it would read old
    for op, npop in [
        (operator.iadd, np.add),
        (operator.isub, np.subtract),
        (operator.imul, np.multiply),
        (operator.itruediv, np.divide),
        (operator.ifloordiv, np.floor_divide),
        (operator.ipow, np.power),
        (operator.imod, np.mod),
    ]:
        assert op(t, 1.5) is t
        ref = npop(ref, np.float32(1.5)).astype(np.float32)
        check(t, ref)
    assert buffer_of[base_buffer(t.realize().uop)] is buf  # written in place
    i = Tensor(np.array([12, 5, 9], np.int32)).realize()
    iref = np.array([12, 5, 9], np.int32)
    for op, npop in [
        (operator.iand, np.bitwise_and),
        (operator.ior, np.bitwise_or),
        (operator.ixor, np.bitwise_xor),
        (operator.ilshift, np.left_shift),
        (operator.irshift, np.right_shift),
        (operator.ifloordiv, np.floor_divide),
        (operator.imod, np.mod),
        (operator.ipow, np.power),
    ]:
        assert op(i, 3) is i
        iref = npop(iref, np.int32(3))
        check(i, iref)
    m = Tensor(np.eye(2, dtype=np.float32) * 2).realize()
    m @= Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    check(m, np.array([[2.0, 4.0], [6.0, 8.0]], np.float32))
    with pytest.raises(RuntimeError, match="float32"):
        i /= 2  # the result dtype would change


def test_assign_realized_through_another_tensor():
    """Regression: an in-place result realized inside another tensor's graph (numpy() or t * 2) ran again later."""
    t = Tensor(np.array([1.0, 2.0], np.float32)).realize()
    t += 1
    u = t * 2
    check(u, np.array([4.0, 6.0], np.float32))
    check(t, np.array([2.0, 3.0], np.float32))
    t -= 0.5
    check(t, np.array([1.5, 2.5], np.float32))
    t *= 2
    check(t, np.array([3.0, 5.0], np.float32))


def test_not_provided_operators():
    t = Tensor([1.5, -2.0])
    with pytest.raises(TypeError):
        abs(t)
    with pytest.raises(TypeError):
        float(Tensor(1.5))
