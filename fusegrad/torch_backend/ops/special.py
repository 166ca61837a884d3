"""Special functions and orthogonal polynomials, in float64 then cast back."""

from __future__ import annotations

import math
from typing import Any, Callable


from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor


from .table import OpCall, aten, as_tensor, meta_dtype, prims, register


# ---- special functions, in float64 (then cast back): Lanczos lgamma and the asymptotic series of digamma

_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)


def _lgamma_right(x: Tensor) -> Tensor:
    """lgamma for x >= 0.5 (Lanczos, g = 7)."""
    z = x - 1
    a = sum(
        (c / (z + i) for i, c in enumerate(_LANCZOS[1:], start=1)),
        Tensor.full(x.shape, _LANCZOS[0], dtype=x.dtype, device=x.device),
    )
    t = z + 7.5
    return 0.5 * math.log(2 * math.pi) + (z + 0.5) * t.log() - t + a.log()


@register(aten.lgamma.default, prims.lgamma.default)
def _lgamma(call: OpCall, x: Tensor) -> Tensor:
    x = x.cast(dtypes.float64)
    left = (x < 0.5).where(x, 0.25)  # each branch sees only inputs it is defined for
    right = (x < 0.5).where(1.5, x)
    reflected = math.log(math.pi) - (left * math.pi).sin().abs().log() - _lgamma_right(1 - left)
    return (x < 0.5).where(reflected, _lgamma_right(right))


def _digamma_right(x: Tensor) -> Tensor:
    """digamma for x >= 0.5: the recurrence up to x + 6, then the asymptotic series."""
    shift = sum((1 / (x + k) for k in range(6)), x * 0)
    y = x + 6
    inv2 = 1 / (y * y)
    series = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))
    return y.log() - 0.5 / y - series - shift


@register(aten.digamma.default, prims.digamma.default)
def _digamma(call: OpCall, x: Tensor) -> Tensor:
    x = x.cast(dtypes.float64)
    left = (x < 0.5).where(x, 0.25)
    right = (x < 0.5).where(1.5, x)
    reflected = _digamma_right(1 - left) - math.pi / (left * math.pi).tan()
    at_pole = (x <= 0) & (x == x.floor())
    value = (x < 0.5).where(reflected, _digamma_right(right))
    return at_pole.where((x == 0).where(-math.inf, math.nan), value)


@register(aten.nextafter.default, prims.nextafter.default)
def _nextafter(call: OpCall, x: Tensor, other: Tensor) -> Tensor:
    """The next float after x toward other, by stepping the bit pattern (float32 and float64)."""
    dt = meta_dtype(call.out)
    x, other = x.cast(dt), other.cast(dt)
    ints = dtypes.int32 if dt == dtypes.float32 else dtypes.int64
    bits = x.bitcast(ints)
    away = (other > x) == (x > 0)
    stepped = (away.where(bits + 1, bits - 1)).bitcast(dt)
    tiny = Tensor.ones(x.shape, dtype=ints, device=x.device).bitcast(dt)
    from_zero = (other > 0).where(tiny, -tiny)
    out = (x == 0).where(from_zero, stepped)
    out = (x == other).where(other, out)
    return (x.isnan() | other.isnan()).where(math.nan, out)


# ---- orthogonal polynomials of degree n (truncated to an integer, as torch does; n < 0 gives 0) by recurrence

_POLYNOMIALS: dict[str, tuple[Callable, Callable, Callable]] = {
    # name: (p0, p1, p_{k+1} from k, x, p_k, p_{k-1})
    "chebyshev_polynomial_t": (lambda x: x * 0 + 1, lambda x: x, lambda k, x, p, q: 2 * x * p - q),
    "chebyshev_polynomial_u": (lambda x: x * 0 + 1, lambda x: 2 * x, lambda k, x, p, q: 2 * x * p - q),
    "chebyshev_polynomial_v": (lambda x: x * 0 + 1, lambda x: 2 * x - 1, lambda k, x, p, q: 2 * x * p - q),
    "chebyshev_polynomial_w": (lambda x: x * 0 + 1, lambda x: 2 * x + 1, lambda k, x, p, q: 2 * x * p - q),
    "hermite_polynomial_h": (lambda x: x * 0 + 1, lambda x: 2 * x, lambda k, x, p, q: 2 * x * p - 2 * k * q),
    "hermite_polynomial_he": (lambda x: x * 0 + 1, lambda x: x, lambda k, x, p, q: x * p - k * q),
    "laguerre_polynomial_l": (
        lambda x: x * 0 + 1,
        lambda x: 1 - x,
        lambda k, x, p, q: ((2 * k + 1 - x) * p - k * q) / (k + 1),
    ),
    "legendre_polynomial_p": (
        lambda x: x * 0 + 1,
        lambda x: x,
        lambda k, x, p, q: ((2 * k + 1) * x * p - k * q) / (k + 1),
    ),
}
_MAX_DEGREE = 4096


def _polynomial(name: str, shifted: bool) -> Callable:
    p0, p1, step = _POLYNOMIALS[name]

    def impl(call: OpCall, x: Any, n: Any) -> Tensor:
        x, n = as_tensor(x, dtypes.float64, call.device), as_tensor(n, dtypes.float64, call.device).trunc()
        shape = tuple(call.out.shape)
        x, n = (
            x.reshape((1,) * (len(shape) - x.ndim) + x.shape).expand(shape),
            n.reshape((1,) * (len(shape) - n.ndim) + n.shape).expand(shape),
        )
        if shifted:
            x = 2 * x - 1
        top = int(n.max().item()) if n.numel() else 0
        if top > _MAX_DEGREE:
            return NotImplemented
        q, p = p0(x), p1(x)
        out = (n == 0).where(q, (n == 1).where(p, 0.0))
        for k in range(1, top):
            q, p = p, step(k, x, p, q)
            out = (n == k + 1).where(p, out)
        return out

    return impl


for _name in _POLYNOMIALS:
    for _shifted in (False, True) if _name.startswith("chebyshev") else (False,):
        _packet = getattr(aten, f"special_shifted_{_name}" if _shifted else f"special_{_name}")
        for _ov in ("default", "x_scalar", "n_scalar"):
            register(getattr(_packet, _ov))(_polynomial(_name, _shifted))
