"""Elementwise ops: unary math, activations, binary arithmetic, comparison, logic, casts."""

from __future__ import annotations

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.loader import onnx_dtype
from fusegrad.onnx.registry import T, dtype_of, fold, op

UNARY = {
    "Abs": Tensor.abs,
    "Neg": Tensor.neg,
    "Exp": Tensor.exp,
    "Log": Tensor.log,
    "Sqrt": Tensor.sqrt,
    "Reciprocal": Tensor.reciprocal,
    "Sin": Tensor.sin,
    "Cos": Tensor.cos,
    "Tan": Tensor.tan,
    "Asin": Tensor.asin,
    "Acos": Tensor.acos,
    "Atan": Tensor.atan,
    "Sinh": Tensor.sinh,
    "Cosh": Tensor.cosh,
    "Asinh": Tensor.asinh,
    "Acosh": Tensor.acosh,
    "Atanh": Tensor.atanh,
    "Erf": Tensor.erf,
    "Floor": Tensor.floor,
    "Ceil": Tensor.ceil,
    "Round": Tensor.round,
    "Sign": Tensor.sign,
    "Relu": Tensor.relu,
    "Sigmoid": Tensor.sigmoid,
    "Tanh": Tensor.tanh,
    "Softsign": Tensor.softsign,
    "Not": Tensor.logical_not,
    "IsNaN": Tensor.isnan,
    "HardSwish": Tensor.hardswish,
    "BitwiseNot": Tensor.bitwise_not,
}


def _unary(fn):
    return lambda n, x: fn(T(x))


for _name, _fn in UNARY.items():
    op(_name)(_unary(_fn))


@op("Softplus")
def softplus(n, x):
    x = T(x)
    return (x.relu() + (-x.abs()).exp().add(1).log()).cast(x.dtype)


@op("Mish")
def mish(n, x):
    return T(x) * softplus(n, x).tanh()


@op("Gelu")
def gelu(n, x):
    return T(x).gelu(approximate=n.a("approximate", "none"))


@op("Elu")
def elu(n, x):
    x = T(x)
    return (x > 0).where(x, (x.exp() - 1) * n.a("alpha", 1.0))


@op("Selu")
def selu(n, x):
    x = T(x)
    alpha, gamma = n.a("alpha", 1.67326319217681884765625), n.a("gamma", 1.05070102214813232421875)
    return (x > 0).where(x * gamma, (x.exp() - 1) * (alpha * gamma))


@op("Celu")
def celu(n, x):
    x, alpha = T(x), n.a("alpha", 1.0)
    return x.relu() + ((x / alpha).exp() - 1).mul(alpha).minimum(0)


@op("LeakyRelu")
def leaky_relu(n, x):
    x = T(x)
    return (x < 0).where(x * n.a("alpha", 0.01), x)


@op("ThresholdedRelu")
def thresholded_relu(n, x):
    x = T(x)
    return (x > n.a("alpha", 1.0)).where(x, 0)


@op("HardSigmoid")
def hard_sigmoid(n, x):
    return (T(x) * n.a("alpha", 0.2) + n.a("beta", 0.5)).clip(0, 1)


@op("PRelu")
def prelu(n, x, slope):
    x, slope = T(x), T(slope)
    if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:  # one slope per channel
        slope = slope.reshape(-1, *([1] * (x.ndim - 2)))
    return (x < 0).where(x * slope, x)


@op("Shrink")
def shrink(n, x):
    x, bias, lambd = T(x), n.a("bias", 0.0), n.a("lambd", 0.5)
    return (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)


@op("IsInf")
def isinf(n, x):
    return T(x).isinf(bool(n.a("detect_positive", 1)), bool(n.a("detect_negative", 1)))


@op("Clip")
def clip(n, x, lo=None, hi=None):
    x = T(x)
    if n.opset < 11:
        lo, hi = n.a("min"), n.a("max")
    if lo is not None:
        x = x.maximum(T(lo).cast(x.dtype) if not isinstance(lo, float) else lo)
    if hi is not None:
        x = x.minimum(T(hi).cast(x.dtype) if not isinstance(hi, float) else hi)
    return x


def _binary(fn):
    return lambda n, a, b: fn(T(a), T(b))


def _same_int_div(a: Tensor, b: Tensor) -> Tensor:
    if dtypes.is_int(a.dtype):
        return a.div(b, rounding_mode="trunc")
    return a / b


BINARY = {
    "Add": Tensor.add,
    "Sub": Tensor.sub,
    "Mul": Tensor.mul,
    "Div": _same_int_div,
    "Equal": Tensor.eq,
    "Less": Tensor.__lt__,
    "Greater": Tensor.__gt__,
    "LessOrEqual": Tensor.__le__,
    "GreaterOrEqual": Tensor.__ge__,
    "And": Tensor.bitwise_and,
    "Or": Tensor.bitwise_or,
    "Xor": Tensor.bitwise_xor,
    "BitwiseAnd": Tensor.bitwise_and,
    "BitwiseOr": Tensor.bitwise_or,
    "BitwiseXor": Tensor.bitwise_xor,
}

for _name, _fn in BINARY.items():
    op(_name)(_binary(_fn))

_NP_BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
}


def _np_binary(fn):
    def run(n, a, b):
        r = fn(a, b)
        return r.astype(a.dtype) if r.dtype != np.bool_ else r

    return run


for _name, _fn in _NP_BINARY.items():
    fold(_name)(_np_binary(_fn))


@fold("Div")
def div_fold(n, a, b):
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a.astype(np.float64) / b)).astype(a.dtype)
    return (a / b).astype(a.dtype)


@fold("Not")
def not_fold(n, x):
    return np.logical_not(x)


@op("Pow")
def pow_(n, a, b):
    a, b = T(a), T(b)
    if dtypes.is_int(a.dtype) and dtypes.is_float(b.dtype):
        return a.cast(b.dtype).pow(b).cast(a.dtype)
    return a.pow(b.cast(a.dtype) if dtypes.is_float(a.dtype) else b).cast(a.dtype)


@op("Mod")
def mod(n, a, b):
    a, b = T(a), T(b)
    return a.fmod(b) if n.a("fmod", 0) else a.mod(b)


@op("BitShift")
def bitshift(n, a, b):
    a, b = T(a), T(b)
    return a.lshift(b) if n.a("direction") == "LEFT" else a.rshift(b)


def _variadic(fn):
    def run(n, *xs):
        ts = [T(x) for x in xs]
        out = ts[0]
        for t in ts[1:]:
            out = fn(out, t)
        return out

    return run


op("Max")(_variadic(Tensor.maximum))
op("Min")(_variadic(Tensor.minimum))
op("Sum")(_variadic(Tensor.add))


@fold("Max")
def max_fold(n, *xs):
    return np.maximum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1 else xs[0]


@fold("Min")
def min_fold(n, *xs):
    return np.minimum.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1 else xs[0]


@op("Mean")
def mean(n, *xs):
    return _variadic(Tensor.add)(n, *xs) / len(xs)


@op("Where")
def where(n, c, a, b):
    a, b = T(a), T(b)
    return T(c).cast(dtypes.bool).where(a, b).cast(a.dtype)


@fold("Where")
def where_fold(n, c, a, b):
    return np.where(c, a, b).astype(a.dtype)


# the largest finite value of each fp8 format (dtype.max is inf for every float dtype)
FP8_MAX = {dtypes.fp8e4m3: 448.0, dtypes.fp8e4m3fnuz: 240.0, dtypes.fp8e5m2: 57344.0, dtypes.fp8e5m2fnuz: 57344.0}

# magnitudes above these round past the largest finite value (max + half an ulp; ties go to the even max)
FP8_OVERFLOW = {dtypes.fp8e4m3: 464.0, dtypes.fp8e4m3fnuz: 248.0, dtypes.fp8e5m2fnuz: 61440.0}


def cast_to(x, dt, saturate: bool = True):
    """x cast to dt the ONNX way: fp8 targets saturate (or not), float → int truncates."""
    x = T(x)
    if x.dtype == dt:
        return x
    if dt in dtypes.fp8s and dtypes.is_float(x.dtype) and saturate:
        big = FP8_MAX[dt]
        x = x.float()
        x = x.isnan().where(x, x.clip(-big, big))
    if dt in FP8_OVERFLOW and dtypes.is_float(x.dtype) and not saturate:  # no inf in these formats: overflow is NaN
        x = x.float()
        x = (x.abs() > FP8_OVERFLOW[dt]).where(float("nan"), x)
    if dt in dtypes.fp8s and x.dtype in dtypes.fp8s:
        x = x.float()
    return x.cast(dt)


@op("Cast")
def cast(n, x):
    return cast_to(x, onnx_dtype(n.a("to"), str(n)), bool(n.a("saturate", 1)))


@fold("Cast")
def cast_fold(n, x):
    dt = onnx_dtype(n.a("to"), str(n))
    if dt in (dtypes.bfloat16,) or dt in dtypes.fp8s or x.dtype.kind not in "biuf":
        return cast(n, x)
    from fusegrad.dtype import to_numpy_dtype

    return x.astype(to_numpy_dtype(dt))


@op("CastLike")
def cast_like(n, x, like):
    return cast_to(x, dtype_of(like), bool(n.a("saturate", 1)))


@op("Constant")
def constant(n):
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in n.attrs:
            v = n.attrs[key]
            if key in ("value_float", "value_floats"):
                return np.asarray(v, dtype=np.float32)
            if key in ("value_int", "value_ints"):
                return np.asarray(v, dtype=np.int64)
            return v
    raise NotImplementedError(f"{n}: only tensor, float and int constants are supported (not strings or sparse)")


fold("Constant")(constant)


@op("BitCast")
def bitcast(n, x):
    x, dt = T(x), onnx_dtype(n.a("to"), str(n))
    if x.dtype == dtypes.bool or dt == dtypes.bool:
        return x.cast(dtypes.uint8).bitcast(dt) if dt != dtypes.bool else x.bitcast(dtypes.uint8).cast(dtypes.bool)
    return x.bitcast(dt)


@op("Swish")
def swish(n, x):
    x = T(x)
    return x * (x * n.a("alpha", 1.0)).sigmoid()


@op("SwiGLU")
def swiglu(n, a, b):
    return swish(n, a) * T(b)
