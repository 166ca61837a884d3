"""Elementwise math and activations (docs/api.md): the unary functions, from exp to erf, and the activations."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fusegrad.dtype import DType, dtypes, least_upper_float
from fusegrad.uop.ops import Ops

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool

LN2 = math.log(2)
# atan(v) = v + v*z*P(z), z = v*v, for |v| <= tan(pi/8): least-squares fit, absolute error ~1e-11
_ATAN_P = (
    0.04761101314591112,
    -0.0848516358487591,
    0.11046431903824876,
    -0.14282164274456005,
    0.19999910176574254,
    -0.3333333258370382,
)
# erf(x) = 1 - t*E(t)*exp(-x*x), t = 1/(1 + p*x), x >= 0 (Abramowitz & Stegun 7.1.26, absolute error <= 1.5e-7)
_ERF_P = 0.3275911
_ERF_E = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def compute_dtype(dt: DType) -> DType:
    """Float dtype a formula runs in: int/bool -> default_float; narrow floats in float32, like torch's CPU kernels."""
    out = least_upper_float(dt)
    return dtypes.float32 if out.itemsize < 4 else out


def _horner(x: Tensor, coeffs: Sequence[float]) -> Tensor:
    """Polynomial with coefficients from the highest power down."""
    out = x * coeffs[0] + coeffs[1]
    for c in coeffs[2:]:
        out = out * x + c
    return out


def _odd(x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """fn on |x| with x's sign put back, for odd functions whose formula is accurate for x >= 0 only.
    (The slope of this |x| at 0 is +1, so the derivative of fn at 0 comes through.)"""
    neg = x < 0
    y = fn(neg.where(-x, x))
    return neg.where(-y, y)


def _atan_nonneg(t: Tensor) -> Tensor:
    big = t > 1
    # atan(t) = pi/2 - atan(1/t); the inner where keeps 1/0 out of the unused branch (and out of its gradient)
    u = big.where(big.where(t, 1).reciprocal(), t)
    v = u / (1 + (u * u + 1).sqrt())  # atan(u) = 2*atan(v), |v| <= tan(pi/8)
    z = v * v
    r = 2 * (v + v * z * _horner(z, _ATAN_P))
    return big.where(math.pi / 2 - r, r)


def _atan(x: Tensor) -> Tensor:
    return _odd(x, _atan_nonneg)


def _asin_mid(y: Tensor) -> Tensor:
    """asin for |y| <= 0.5, where the formula and its gradient are finite."""
    return _atan(y / ((1 - y) * (1 + y)).sqrt())


def _arcsin_split(a: Tensor) -> tuple[Tensor, Tensor]:
    """(|x| <= 0.5, sqrt((1-|x|)/2)) for a = |x|: near +-1, asin and acos are 2*asin(sqrt((1-|x|)/2)) taken from the
    edge, exact there and with torch's infinite gradient at +-1 (the plain atan form gives 0 * inf = nan). Lanes that
    do not use the edge form take sqrt(0.25), so no infinite local gradient meets their zero gradient."""
    small = a <= 0.5
    return small, small.where(0.25, (1 - a) * 0.5).sqrt()


def _asin_nonneg(a: Tensor) -> Tensor:
    small, edge = _arcsin_split(a)
    return small.where(_asin_mid(small.where(a, 0)), math.pi / 2 - 2 * _asin_mid(edge))


def _acos(x: Tensor) -> Tensor:
    small, edge = _arcsin_split(x.abs())
    from_edge = (x > 0).where(2 * _asin_mid(edge), math.pi - 2 * _asin_mid(edge))
    return small.where(math.pi / 2 - _asin_mid(small.where(x, 0)), from_edge)


def _erf_nonneg(a: Tensor) -> Tensor:
    t = (a * _ERF_P + 1).reciprocal()
    return 1 - t * _horner(t, _ERF_E) * (-(a * a)).exp()


def _sigmoid(x: Tensor) -> Tensor:
    neg = x < 0
    e = (-neg.where(-x, x)).exp()  # exp(-|x|) <= 1: no overflow for any x, and no inf in the gradient
    p = (1 + e).reciprocal()
    return neg.where(e * p, p)


def _softplus(x: Tensor) -> Tensor:
    return x.maximum(0) + (1 + (-x.abs()).exp()).log()


def _elu(x: Tensor, alpha: float, scale: float = 1.0) -> Tensor:
    """x for x > 0, else alpha * (exp(x / scale) - 1)."""
    pos = x > 0
    neg = pos.where(0, x)  # exp sees only x <= 0: no inf in the unused branch or its gradient
    return pos.where(x, alpha * ((neg if scale == 1 else neg / scale).exp() - 1))


def _log_big_or(x: Tensor, small: Callable[[Tensor], Tensor]) -> Tensor:
    """For asinh/acosh: log(2x) where x*x would overflow (x > 2**28 makes the +-1 under the root vanish),
    else small(x)."""
    big = x > 2**28
    return big.where(big.where(x, 1).log() + LN2, small(big.where(1, x)))


class UnaryMixin:
    # ------------------------------------------------------------------ unary math (G7)
    def _float_unary(self, op: Ops) -> Tensor:
        return self.cast(least_upper_float(self.dtype))._alu(op)

    def _float_fn(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """fn in the compute dtype (see compute_dtype), rounded once to the float result dtype."""
        return fn(self.cast(compute_dtype(self.dtype))).cast(least_upper_float(self.dtype))

    def neg(self) -> Tensor:
        return self._alu(Ops.NEG) if self.dtype is not dtypes.bool else self.logical_not()

    def reciprocal(self) -> Tensor:
        return self._float_unary(Ops.RECIPROCAL)

    def sqrt(self) -> Tensor:
        return self._float_unary(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self._float_fn(lambda x: x.sqrt().reciprocal())

    def square(self) -> Tensor:
        return self * self

    def abs(self) -> Tensor:
        if self.dtype is dtypes.bool or dtypes.is_unsigned(self.dtype):
            return self
        out = (self < 0).where(-self, self)
        # like torch: |-0.0| is +0.0 and the gradient at 0 is 0
        return (self == 0).where(0, out) if dtypes.is_float(self.dtype) else out

    def sign(self) -> Tensor:
        if self.dtype is dtypes.bool:
            return self
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)  # 0 for +-0 and NaN, like torch

    def exp(self) -> Tensor:
        return self._float_unary(Ops.EXP)

    def exp2(self) -> Tensor:
        return self._float_unary(Ops.EXP2)

    def log(self) -> Tensor:
        return self._float_unary(Ops.LOG)

    def log2(self) -> Tensor:
        return self._float_unary(Ops.LOG2)

    def log10(self) -> Tensor:
        return self._float_fn(lambda x: x.log2() * math.log10(2))

    def sin(self) -> Tensor:
        return self._float_unary(Ops.SIN)

    def cos(self) -> Tensor:
        return self._float_unary(Ops.COS)

    def tan(self) -> Tensor:
        return self._float_fn(lambda x: x.sin() / x.cos())

    def asin(self) -> Tensor:
        return self._float_fn(lambda x: _odd(x, _asin_nonneg))

    def acos(self) -> Tensor:
        return self._float_fn(_acos)

    def atan(self) -> Tensor:
        return self._float_fn(_atan)

    # exp(x - ln2) is e^x / 2 without overflowing where e^x alone would
    def sinh(self) -> Tensor:
        return self._float_fn(lambda x: (x - LN2).exp() - (-x - LN2).exp())

    def cosh(self) -> Tensor:
        return self._float_fn(lambda x: (x - LN2).exp() + (-x - LN2).exp())

    def asinh(self) -> Tensor:
        return self._float_fn(lambda x: _odd(x, lambda a: _log_big_or(a, lambda s: (s + (s * s + 1).sqrt()).log())))

    def acosh(self) -> Tensor:  # sqrt(s-1) is nan below 1 even where (s-1)*(s+1) would overflow to inf
        return self._float_fn(lambda x: _log_big_or(x, lambda s: (s + (s - 1).sqrt() * (s + 1).sqrt()).log()))

    def atanh(self) -> Tensor:
        return self._float_fn(lambda x: ((1 + x).log() - (1 - x).log()) * 0.5)  # gradient inf at +-1

    def erf(self) -> Tensor:
        return self._float_fn(lambda x: _odd(x, _erf_nonneg))

    def trunc(self) -> Tensor:
        return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    def floor(self) -> Tensor:
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> Tensor:
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def round(self) -> Tensor:
        """Round half to even."""
        if not dtypes.is_float(self.dtype):
            return self
        t = self.trunc()
        frac = (self - t).abs()  # exact
        odd = (t * 0.5).trunc() * 2 != t
        away = (frac > 0.5) | ((frac == 0.5) & odd)
        return away.where(t + self.sign(), t)

    # ------------------------------------------------------------------ activations (G8)
    def relu(self) -> Tensor:
        return (self <= 0).where(0, self)  # NaN stays NaN, gradient at 0 is 0

    def _hard_clip(self, lo: Scalar, hi: Scalar) -> Tensor:
        """Clip whose gradient is 0 at the bounds themselves (torch's hardtanh family, unlike clamp)."""
        return (self <= lo).where(lo, (self >= hi).where(hi, self))

    def relu6(self) -> Tensor:
        return self._hard_clip(0, 6)

    def hardtanh(self, min_val: Scalar = -1, max_val: Scalar = 1) -> Tensor:
        if dtypes.is_unsigned(self.dtype) and min(min_val, max_val) < 0:
            raise RuntimeError(
                f"hardtanh of an unsigned {self.dtype} tensor with negative limits ({min_val}, {max_val})"
            )
        return self._hard_clip(min_val, max_val)

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        return self._float_fn(lambda x: (x > 0).where(x, x * neg_slope))

    def elu(self, alpha: float = 1.0) -> Tensor:
        return self._float_fn(lambda x: _elu(x, alpha))

    def celu(self, alpha: float = 1.0) -> Tensor:
        return self._float_fn(lambda x: _elu(x, alpha, alpha))

    def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
        return self._float_fn(lambda x: _elu(x, alpha) * gamma)

    def sigmoid(self) -> Tensor:
        return self._float_fn(_sigmoid)

    def logsigmoid(self) -> Tensor:
        return self._float_fn(lambda x: -_softplus(-x))

    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        return self._float_fn(lambda x: (x * alpha + beta)._hard_clip(0, 1))

    def tanh(self) -> Tensor:
        return self._float_fn(lambda x: 2 * _sigmoid(2 * x) - 1)

    def gelu(self, approximate: str = "tanh") -> Tensor:
        if approximate == "tanh":
            return self._float_fn(
                lambda x: 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
            )
        if approximate == "none":
            return self._float_fn(lambda x: 0.5 * x * (1 + (x * math.sqrt(0.5)).erf()))
        raise RuntimeError(f"gelu approximate must be 'tanh' or 'none', got {approximate!r}")

    def quick_gelu(self) -> Tensor:
        return self._float_fn(lambda x: x * _sigmoid(x * 1.702))

    def silu(self) -> Tensor:
        return self._float_fn(lambda x: x * _sigmoid(x))

    def swish(self) -> Tensor:
        return self.silu()

    def hardswish(self) -> Tensor:
        return self._float_fn(lambda x: x * (x + 3).relu6() / 6)

    def mish(self) -> Tensor:
        return self._float_fn(lambda x: x * _softplus(x).tanh())

    def softplus(self, beta: float = 1.0) -> Tensor:
        return self._float_fn(lambda x: _softplus(x) if beta == 1 else _softplus(x * beta) / beta)

    def softsign(self) -> Tensor:
        return self._float_fn(lambda x: x / (1 + x.abs()))
