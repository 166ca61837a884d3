"""Elementwise casting, arithmetic, comparisons, bitwise, selection and operators (docs/api.md); the unary math and
activations are UnaryMixin's (unary.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fusegrad.dtype import DType, DTypeLike, dtypes, least_upper_dtype, least_upper_float, to_dtype
from fusegrad.tensor_ops.base import TensorBase
from fusegrad.tensor_ops.pydata import infer_py_dtype, py_scalar
from fusegrad.tensor_ops.shapes import broadcast_shape
from fusegrad.tensor_ops.unary import UnaryMixin, compute_dtype
from fusegrad.uop.ops import Ops, UOp, elementwise_uop

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool

_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}
_SINT_OF_SIZE = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def _wide_dtype(dt: DType) -> DType:
    """float64 for narrow floats, so that a*b and a-b of their values are exact."""
    return dtypes.float64 if dtypes.is_float(dt) and dt.itemsize < 8 else dt


def _fmod_wide(a: Tensor, b: Tensor) -> Tensor:
    """C fmod as a - trunc(a/b)*b (a itself when the quotient is 0; b = inf keeps a).
    Exact when a, b are narrower than the compute dtype and |a/b| < 2**29, where trunc(a/b) and q*b are exact."""
    q = (a / b).trunc()
    return (q == 0).where(a, a - q * b)


def _wrong_sign(r: Tensor, b: Tensor) -> Tensor:
    return (r != 0) & ((r < 0) != (b < 0))


class ElementwiseMixin(UnaryMixin):
    # ------------------------------------------------------------------ casting (G12)
    def cast(self, dtype: DTypeLike) -> Tensor:
        dt = to_dtype(dtype)
        if dt == self.dtype:
            return self
        direct = self._new(elementwise_uop(Ops.CAST, dt, (self._uop,), self.shape))  # its shape recorded
        if not (dtypes.is_float(self.dtype) and dt in (dtypes.uint32, dtypes.uint64)):
            return direct
        # C leaves negative float -> unsigned conversions undefined; torch wraps them like a conversion through int64
        wrapped = self._new(UOp(Ops.CAST, dt, (self.cast(dtypes.int64).uop,)))
        return wrapped if dt is dtypes.uint32 else (self < 0).where(wrapped, direct)

    def bitcast(self, dtype: DTypeLike) -> Tensor:
        dt = to_dtype(dtype)
        if dt in dtypes.weaks:
            raise RuntimeError(f"bitcast of a {self.dtype} tensor to {dt}: weak dtypes have no bits")
        if dt == self.dtype:
            return self
        if dt.itemsize == self.dtype.itemsize:
            return self._new(UOp(Ops.BITCAST, dt, (self.uop,)))
        if not self.shape:
            raise RuntimeError(f"bitcast of a 0-d tensor from {self.dtype} to {dt} would change its element count")
        ratio = max(dt.itemsize, self.dtype.itemsize) // min(dt.itemsize, self.dtype.itemsize)
        if dt.itemsize > self.dtype.itemsize and self.shape[-1] % ratio:
            raise RuntimeError(
                f"bitcast {self.dtype} -> {dt} needs the last dim ({self.shape[-1]}) to be a multiple of {ratio}"
            )
        return self._bitcast_resized(dt, ratio)

    def _bitcast_resized(self, dt: DType, ratio: int) -> Tensor:
        """Bitcast to another item size as unsigned-int shifts over the last axis (little-endian), so it stays lazy
        and fuses."""
        src_u, dst_u = _UINT_OF_SIZE[self.dtype.itemsize], _UINT_OF_SIZE[dt.itemsize]
        words = self.bitcast(src_u)
        if dt.itemsize < self.dtype.itemsize:  # split: part k holds bits [8*k*itemsize, 8*(k+1)*itemsize)
            shifts = type(self).arange(ratio, device=self.device, dtype=src_u) * (8 * dt.itemsize)
            parts = words.unsqueeze(-1)._binary(Ops.SHR, shifts).cast(dst_u)
            return parts.reshape(self.shape[:-1] + (self.shape[-1] * ratio,)).bitcast(dt)
        n = self.shape[-1] // ratio
        parts = words.reshape(self.shape[:-1] + (n, ratio)).cast(dst_u)
        lead = (None,) * (parts.ndim - 1)
        out = None
        for k in range(ratio):
            part = parts.shrink(lead + ((k, k + 1),)).reshape(self.shape[:-1] + (n,)) << (8 * self.dtype.itemsize * k)
            out = part if out is None else out | part
        return out.bitcast(dt)

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def double(self) -> Tensor:
        return self.cast(dtypes.float64)

    def bfloat16(self) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        return self.cast(dtypes.int64)

    def short(self) -> Tensor:
        return self.cast(dtypes.int16)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)

    # ------------------------------------------------------------------ binary arithmetic (G9)
    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._binary(Ops.ADD, x, reverse)

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._operand(x, reverse)
        if a.dtype is dtypes.bool:
            raise RuntimeError("subtraction of two bool tensors is not supported; use ^ (bitwise_xor)")
        return a._alu(Ops.ADD, b._alu(Ops.NEG))

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._binary(Ops.MUL, x, reverse)

    def div(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        if rounding_mode not in (None, "trunc", "floor"):
            raise RuntimeError(f"div rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        a, b = self._operand(x, reverse)
        if rounding_mode is not None and not dtypes.is_float(a.dtype):
            if a.dtype is dtypes.bool:
                a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
            q = a._alu(Ops.IDIV, b)
            return q if rounding_mode == "trunc" else _wrong_sign(a._alu(Ops.MOD, b), b).where(q - 1, q)
        if rounding_mode == "floor":
            return a._floor_div_float(b)
        out = a.cast(least_upper_float(a.dtype))._alu(Ops.FDIV, b.cast(least_upper_float(b.dtype)))
        return out.trunc() if rounding_mode == "trunc" else out

    def _floor_div_float(self, b: Tensor) -> Tensor:
        """Python's float a // b: the quotient of the exact remainder, so 1 // 0.1 is 9 (floor(1 / 0.1) would be 10)."""
        wide = _wide_dtype(self.dtype)
        a, b = self.cast(wide), b.cast(wide)
        mod = _fmod_wide(a, b)
        div = (a - mod) / b
        div = _wrong_sign(mod, b).where(div - 1, div)
        fl = div.floor()
        fl = (div - fl > 0.5).where(fl + 1, fl)
        return (b == 0).where(a / b, fl).cast(self.dtype)

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Python-style remainder: the sign follows the divisor."""
        a, b = self._operand(x, reverse)
        if not dtypes.is_float(a.dtype):
            r = a._alu(Ops.MOD, b)
            return _wrong_sign(r, b).where(r + b, r)
        wa, wb = a.cast(_wide_dtype(a.dtype)), b.cast(_wide_dtype(a.dtype))
        r = _fmod_wide(wa, wb)
        return _wrong_sign(r, wb).where(r + wb, r).cast(a.dtype)

    def fmod(self, x: Tensor | Scalar) -> Tensor:
        """C-style remainder: the sign follows the dividend."""
        a, b = self._operand(x)
        if not dtypes.is_float(a.dtype):
            return a._alu(Ops.MOD, b)
        return _fmod_wide(a.cast(_wide_dtype(a.dtype)), b.cast(_wide_dtype(a.dtype))).cast(a.dtype)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        if not reverse and isinstance(x, int) and x < 0 and not dtypes.is_float(self.dtype):
            raise RuntimeError(
                f"integers to negative integer powers are not allowed ({self.dtype} tensor ** {x});"
                " the base needs to be float"
            )
        a, b = self._operand(x, reverse)
        if dtypes.is_float(a.dtype):
            return a._alu(Ops.POW, b)
        if not reverse and isinstance(x, int):
            return a._int_pow_const(int(x))
        return a._int_pow(b)

    def _int_pow_const(self, e: int) -> Tensor:
        """Square-and-multiply on the integer dtype, so overflow wraps like torch."""
        out, base = None, self
        while e:
            if e & 1:
                out = base if out is None else out * base
            e >>= 1
            if e:
                base = base * base
        return self.ones_like() if out is None else out

    def _int_pow(self, e: Tensor) -> Tensor:
        """Square-and-multiply over every bit of an integer exponent tensor; negative exponents give 1/x truncated."""
        if e.dtype is dtypes.bool:
            return e.logical_not() | self
        out, base = self.ones_like(), self
        nbits = e.dtype.bitsize - (0 if dtypes.is_unsigned(e.dtype) else 1)
        for i in range(nbits):
            out = ((e >> i) & 1).ne(0).where(out * base, out)
            if i + 1 < nbits:
                base = base * base
        if dtypes.is_unsigned(e.dtype):
            return out
        # x ** -n truncates to 0 unless |x| == 1 (torch gives 0 for 0 ** -n too)
        unit = (self == 1) | (self == -1)
        return (e < 0).where(unit.where((e & 1).ne(0).where(self, self * self), 0), out)

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        return self._binary(Ops.MAX, x)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._operand(x)
        if dtypes.is_float(a.dtype):
            return -((-a)._alu(Ops.MAX, -b))
        return (a < b).where(a, b)

    def copysign(self, other: Tensor | Scalar) -> Tensor:
        a, b = self._operand(other)
        if a.dtype is dtypes.bool:
            return a
        # the sign bit, so that -0.0 (and -nan) count as negative
        neg = b.bitcast(_SINT_OF_SIZE[b.dtype.itemsize]) < 0 if dtypes.is_float(b.dtype) else b < 0
        mag = a.abs()
        return neg.where(-mag, mag)

    def logaddexp(self, other: Tensor | Scalar) -> Tensor:
        a, b = self._operand(other)
        out_dt, dt = least_upper_float(a.dtype), compute_dtype(a.dtype)
        a, b = a.cast(dt), b.cast(dt)
        m = a.maximum(b)
        # both -inf (or one +inf) would give nan below
        return m.isinf().where(m, m + (1 + (-(a - b).abs()).exp()).log()).cast(out_dt)

    def ufix(self, x: Tensor | Scalar) -> Tensor:
        """x as a Tensor combinable with self: a Python scalar becomes a weak constant in self's shape."""
        return x if isinstance(x, TensorBase) else self._operand(x)[1]

    # ------------------------------------------------------------------ comparison, logical, bitwise (G10)
    # NaN compares false everywhere except !=
    def __lt__(self, x):
        return self._binary(Ops.CMPLT, x, dtype=dtypes.bool)

    def __gt__(self, x):
        return self._binary(Ops.CMPLT, x, reverse=True, dtype=dtypes.bool)

    def __le__(self, x):
        return (self < x) | self.eq(x)

    def __ge__(self, x):
        return (self > x) | self.eq(x)

    def eq(self, x) -> Tensor:
        return self._binary(Ops.CMPEQ, x, dtype=dtypes.bool)

    def ne(self, x) -> Tensor:
        return self._binary(Ops.CMPNE, x, dtype=dtypes.bool)

    def __eq__(self, x):
        return self.eq(x)  # type: ignore[override]

    def __ne__(self, x):
        return self.ne(x)  # type: ignore[override]

    def logical_not(self) -> Tensor:
        return self.cast(dtypes.bool)._alu(Ops.NEG)

    def isnan(self) -> Tensor:
        return self.ne(self) if dtypes.is_float(self.dtype) else self.full_like(False, dtype=dtypes.bool)

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        if not dtypes.is_float(self.dtype) or not (detect_positive or detect_negative):
            return self.full_like(False, dtype=dtypes.bool)
        if not detect_negative:
            return self == math.inf
        if not detect_positive:
            return self == -math.inf
        return (self == math.inf) | (self == -math.inf)

    def isfinite(self) -> Tensor:
        if not dtypes.is_float(self.dtype):
            return self.full_like(True, dtype=dtypes.bool)
        return (self < math.inf) & (self > -math.inf)

    def isclose(
        self, other: Tensor | Scalar, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
    ) -> Tensor:
        """|self - other| <= atol + rtol * |other|; equal values (infinities too) are close;
        NaNs only with equal_nan."""
        if rtol < 0 or atol < 0:
            raise RuntimeError(f"isclose needs rtol >= 0 and atol >= 0, got rtol={rtol}, atol={atol}")
        a, b = self._operand(other)
        close = a == b
        if not dtypes.is_float(a.dtype):
            a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
        diff = (a - b).abs()
        close = close | ((diff <= b.abs() * rtol + atol) & diff.isfinite())
        return close | (a.isnan() & b.isnan()) if equal_nan else close

    def allclose(
        self, other: Tensor | Scalar, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
    ) -> Tensor:
        return self.isclose(other, rtol, atol, equal_nan).all()

    def _bitwise(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        if type(x) is type(self) and x.uop.dtype is (dt := self.uop.dtype) and not dtypes.is_float(dt):
            return self._binary(op, x, reverse)  # two masks of one dtype (`a <= b` is `(a < b) | a.eq(b)`)
        a, b = self._operand(x, reverse)
        if dtypes.is_float(a.dtype):
            raise RuntimeError(f"bitwise {op.name.lower()} needs integer or bool tensors, got {a.dtype}")
        return a._alu(op, b)

    def bitwise_and(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.AND, x, reverse)

    def bitwise_or(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.OR, x, reverse)

    def bitwise_xor(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.XOR, x, reverse)

    def _shift(self, op: Ops, x: Tensor | Scalar, reverse: bool) -> Tensor:
        if not reverse and isinstance(x, int) and not isinstance(x, bool) and x < 0:
            raise ValueError(f"negative shift count {x} (as Python's {'<<' if op is Ops.SHL else '>>'})")
        a, b = self._operand(x, reverse)
        if not dtypes.is_int(a.dtype):
            raise RuntimeError(f"shift needs integer tensors, got {a.dtype}")
        bits = a.dtype.bitsize
        if not reverse and isinstance(x, int) and x < bits:
            return a._alu(op, b)
        # a count below 0 or at/above the bit width is undefined in C; torch gives 0 (or the sign for >> of negatives)
        fill = (
            a._alu(Ops.SHR, a.full_like(bits - 1))
            if op is Ops.SHR and not dtypes.is_unsigned(a.dtype)
            else a.zeros_like()
        )
        in_range = (b < bits) if dtypes.is_unsigned(b.dtype) else (b >= 0) & (b < bits)
        return in_range.where(a._alu(op, in_range.where(b, 0)), fill)

    def lshift(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._shift(Ops.SHL, x, reverse)

    def rshift(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._shift(Ops.SHR, x, reverse)

    def bitwise_not(self) -> Tensor:
        if self.dtype is dtypes.bool:
            return self.logical_not()
        if dtypes.is_float(self.dtype):
            raise RuntimeError(f"bitwise_not needs integer or bool tensors, got {self.dtype}")
        return self ^ (self.dtype.max if dtypes.is_unsigned(self.dtype) else -1)

    # ------------------------------------------------------------------ ternary, selection, clamping (G11)
    def where(self: Tensor, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        if (out := self._where_scalar(x, y)) is not None:  # the hot case (relu, clamp): no promotion, no broadcast
            return out
        cond = self.cast(dtypes.bool)
        if isinstance(x, TensorBase):
            x, y = x._operand(y)
        elif isinstance(y, TensorBase):
            y, x = y._operand(x)
        else:
            dt = infer_py_dtype([py_scalar(x), py_scalar(y)])  # like Tensor([x, y]): 2**40 needs int64
            x, y = type(self)(UOp.const(dt, x), device=self.device), type(self)(UOp.const(dt, y), device=self.device)
        shape = broadcast_shape(broadcast_shape(cond.shape, x.shape), y.shape)
        cond, x, y = cond._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape)
        return cond._alu(Ops.WHERE, x, y, dtype=x.dtype)

    def masked_fill(self, mask: Tensor, value: Tensor | Scalar) -> Tensor:
        return mask.where(value, self)

    def clamp(self, min_: Tensor | Scalar | None = None, max_: Tensor | Scalar | None = None) -> Tensor:
        """Bounds are inclusive for the gradient, like torch.clamp; NaN stays NaN."""
        if min_ is None and max_ is None:
            raise RuntimeError("clamp needs at least one of min_ and max_ (both are None)")
        out = self
        if min_ is not None:
            out = (out < min_).where(min_, out)
        if max_ is not None:
            out = (out > max_).where(max_, out)
        return out

    def clip(self, min_: Tensor | Scalar | None = None, max_: Tensor | Scalar | None = None) -> Tensor:
        return self.clamp(min_, max_)

    def lerp(self, end: Tensor | Scalar, weight: Tensor | Scalar) -> Tensor:
        a, e = self._operand(end)
        if a.dtype is dtypes.uint8 and isinstance(weight, TensorBase):
            # 7-bit fixed-point weight; a*(128-w) + e*w + 64 fits int32 and rounds the >> 7
            w = (weight * 128).round().cast(dtypes.int32)
            mixed = a.cast(dtypes.int32) * (128 - w) + e.cast(dtypes.int32) * w + 64
            return (mixed >> 7).cast(dtypes.uint8)
        out_dt = least_upper_float(
            least_upper_dtype(a.dtype, weight.dtype) if isinstance(weight, TensorBase) else a.dtype
        )
        dt = compute_dtype(out_dt)
        a, e = a.cast(dt), e.cast(dt)
        return (a + (e - a) * (weight.cast(dt) if isinstance(weight, TensorBase) else weight)).cast(out_dt)

    # ------------------------------------------------------------------ Python operators (G4)
    def __neg__(self):
        return self.neg()

    # add and mul are _binary: the operators call it straight (an eager op's frames)
    def __add__(self, x):
        return self._binary(Ops.ADD, x)

    def __radd__(self, x):
        return self._binary(Ops.ADD, x, True)

    def __sub__(self, x):
        return self.sub(x)

    def __rsub__(self, x):
        return self.sub(x, True)

    def __mul__(self, x):
        return self._binary(Ops.MUL, x)

    def __rmul__(self, x):
        return self._binary(Ops.MUL, x, True)

    def __truediv__(self, x):
        return self.div(x)

    def __rtruediv__(self, x):
        return self.div(x, True)

    def __floordiv__(self, x):
        return self.div(x, rounding_mode="floor")

    def __rfloordiv__(self, x):
        return self.div(x, True, rounding_mode="floor")

    def __mod__(self, x):
        return self.mod(x)

    def __rmod__(self, x):
        return self.mod(x, True)

    def __pow__(self, x):
        return self.pow(x)

    def __rpow__(self, x):
        return self.pow(x, True)

    def __matmul__(self, x):
        return self.matmul(x)

    def __rmatmul__(self, x):
        return self.matmul(x, True)

    def __and__(self, x):
        return self.bitwise_and(x)

    def __rand__(self, x):
        return self.bitwise_and(x, True)

    def __or__(self, x):
        return self.bitwise_or(x)

    def __ror__(self, x):
        return self.bitwise_or(x, True)

    def __xor__(self, x):
        return self.bitwise_xor(x)

    def __rxor__(self, x):
        return self.bitwise_xor(x, True)

    def __lshift__(self, x):
        return self.lshift(x)

    def __rlshift__(self, x):
        return self.lshift(x, True)

    def __rshift__(self, x):
        return self.rshift(x)

    def __rrshift__(self, x):
        return self.rshift(x, True)

    def __invert__(self):
        return self.bitwise_not()

    # in-place operators write into self's storage; assign raises if the result dtype differs (e.g. int /= 2)
    def __iadd__(self, x):
        return self.assign(self + x)

    def __isub__(self, x):
        return self.assign(self - x)

    def __imul__(self, x):
        return self.assign(self * x)

    def __itruediv__(self, x):
        return self.assign(self / x)

    def __ifloordiv__(self, x):
        return self.assign(self // x)

    def __imod__(self, x):
        return self.assign(self % x)

    def __ipow__(self, x):
        return self.assign(self**x)

    def __iand__(self, x):
        return self.assign(self & x)

    def __ior__(self, x):
        return self.assign(self | x)

    def __ixor__(self, x):
        return self.assign(self ^ x)

    def __ilshift__(self, x):
        return self.assign(self << x)

    def __irshift__(self, x):
        return self.assign(self >> x)

    def __imatmul__(self, x):
        return self.assign(self @ x)
