"""Elementwise math, activations, arithmetic, comparisons, bitwise, selection and casting (API.md G7-G12)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from fusegrad.dtype import DTypeLike, dtypes, least_upper_dtype, least_upper_float, to_dtype
from fusegrad.tensor_ops.shapes import broadcast_shape
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING: from fusegrad.tensor import Tensor

Scalar = int | float | bool

class ElementwiseMixin:
  def cast(self, dtype: DTypeLike) -> Tensor:
    dt = to_dtype(dtype)
    return self if dt == self.dtype else self._new(UOp(Ops.CAST, dt, (self.uop,)))
  def bitcast(self, dtype: DTypeLike) -> Tensor:
    dt = to_dtype(dtype)
    if dt.itemsize != self.dtype.itemsize:
      raise NotImplementedError(f"bitcast between item sizes ({self.dtype} -> {dt}) is not supported yet")
    return self if dt == self.dtype else self._new(UOp(Ops.BITCAST, dt, (self.uop,)))
  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def bfloat16(self) -> Tensor: return self.cast(dtypes.bfloat16)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def short(self) -> Tensor: return self.cast(dtypes.int16)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  def _float_unary(self, op: Ops) -> Tensor:
    t = self.cast(least_upper_float(self.dtype))
    return t._alu(op)
  def neg(self) -> Tensor: return self._alu(Ops.NEG) if self.dtype is not dtypes.bool else self.logical_not()
  def logical_not(self) -> Tensor: return self.cast(dtypes.bool)._alu(Ops.NEG)
  def exp(self) -> Tensor: return self._float_unary(Ops.EXP)
  def exp2(self) -> Tensor: return self._float_unary(Ops.EXP2)
  def log(self) -> Tensor: return self._float_unary(Ops.LOG)
  def log2(self) -> Tensor: return self._float_unary(Ops.LOG2)
  def sqrt(self) -> Tensor: return self._float_unary(Ops.SQRT)
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()
  def sin(self) -> Tensor: return self._float_unary(Ops.SIN)
  def cos(self) -> Tensor: return self._float_unary(Ops.COS)
  def reciprocal(self) -> Tensor: return self._float_unary(Ops.RECIPROCAL)
  def trunc(self) -> Tensor: return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self
  def square(self) -> Tensor: return self * self
  def abs(self) -> Tensor:
    if self.dtype is dtypes.bool or dtypes.is_unsigned(self.dtype): return self
    return (self < 0).where(-self, self)
  def relu(self) -> Tensor: return (self <= 0).where(0, self)  # NaN stays NaN, gradient at 0 is 0
  def sigmoid(self) -> Tensor:
    t = self.cast(least_upper_float(self.dtype))
    return (1 + (-t).exp()).reciprocal()
  def tanh(self) -> Tensor:
    t = self.cast(least_upper_float(self.dtype))
    return 2.0 * (2.0 * t).sigmoid() - 1.0
  def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor: return self._binary(Ops.ADD, x, reverse)
  def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
    a, b = self._operand(x, reverse)
    if a.dtype is dtypes.bool: raise TypeError("subtraction of bool tensors is not supported; use logical_xor or ^")
    return a._alu(Ops.ADD, b._alu(Ops.NEG))
  def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor: return self._binary(Ops.MUL, x, reverse)
  def div(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode not in (None, "trunc", "floor"): raise RuntimeError(f"div rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b = self._operand(x, reverse)
    if rounding_mode is not None and dtypes.is_int(a.dtype):
      q = a._alu(Ops.IDIV, b)
      if rounding_mode == "trunc": return q
      # floor: step down when the remainder is non-zero and the signs differ
      r = a._alu(Ops.MOD, b)
      return ((r != 0) & ((r < 0) != (b < 0))).where(q - 1, q)
    fa, fb = a.cast(least_upper_float(a.dtype)), b.cast(least_upper_float(b.dtype))
    out = fa._alu(Ops.FDIV, fb)
    if rounding_mode == "trunc": return out.trunc()
    if rounding_mode == "floor": return out.floor()
    return out
  def floor(self) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
    a, b = self._operand(x, reverse)
    if dtypes.is_int(a.dtype):
      r = a._alu(Ops.MOD, b)
      return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)
    return a - b * a.div(b, rounding_mode="floor")
  def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
    a, b = self._operand(x, reverse)
    if dtypes.is_int(a.dtype) or a.dtype is dtypes.bool:
      if not isinstance(x, Tensor) and not reverse and isinstance(x, int) and x < 0:
        raise RuntimeError("integers to negative integer powers are not allowed; the base needs to be float")
      return a.cast(dtypes.float64)._alu(Ops.POW, b.cast(dtypes.float64)).cast(a.dtype)
    return a._alu(Ops.POW, b)
  def maximum(self, x: Tensor | Scalar) -> Tensor: return self._binary(Ops.MAX, x)
  def minimum(self, x: Tensor | Scalar) -> Tensor:
    a, b = self._operand(x)
    if dtypes.is_float(a.dtype): return -((-a)._alu(Ops.MAX, -b))
    return (a < b).where(a, b)
  def where(self: Tensor, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
    cond = self.cast(dtypes.bool)
    if isinstance(x, Tensor): x, y = x._operand(y)
    elif isinstance(y, Tensor): y, x = y._operand(x)
    else:
      dt = least_upper_dtype(dtypes.from_py(x), dtypes.from_py(y))
      x, y = Tensor(UOp.const(dt, x), device=self.device), Tensor(UOp.const(dt, y), device=self.device)
    shape = broadcast_shape(broadcast_shape(cond.shape, x.shape), y.shape)
    cond, x, y = cond._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape)
    return cond._alu(Ops.WHERE, x, y, dtype=x.dtype)

  # comparisons: NaN compares false everywhere except !=
  def __lt__(self, x): return self._binary(Ops.CMPLT, x, dtype=dtypes.bool)
  def __gt__(self, x): return self._binary(Ops.CMPLT, x, reverse=True, dtype=dtypes.bool)
  def __le__(self, x): return (self < x) | self.eq(x)
  def __ge__(self, x): return (self > x) | self.eq(x)
  def eq(self, x) -> Tensor: return self._binary(Ops.CMPEQ, x, dtype=dtypes.bool)
  def ne(self, x) -> Tensor: return self._binary(Ops.CMPNE, x, dtype=dtypes.bool)
  def __eq__(self, x): return self.eq(x)  # type: ignore[override]
  def __ne__(self, x): return self.ne(x)  # type: ignore[override]
  def _bitwise(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
    a, b = self._operand(x, reverse)
    if dtypes.is_float(a.dtype): raise RuntimeError(f"bitwise op {op.name} needs integer or bool tensors, got {a.dtype}")
    return a._alu(op, b)
  def bitwise_and(self, x, reverse: bool = False) -> Tensor: return self._bitwise(Ops.AND, x, reverse)
  def bitwise_or(self, x, reverse: bool = False) -> Tensor: return self._bitwise(Ops.OR, x, reverse)
  def bitwise_xor(self, x, reverse: bool = False) -> Tensor: return self._bitwise(Ops.XOR, x, reverse)
  def lshift(self, x, reverse: bool = False) -> Tensor: return self._bitwise(Ops.SHL, x, reverse)
  def rshift(self, x, reverse: bool = False) -> Tensor: return self._bitwise(Ops.SHR, x, reverse)
  def __neg__(self): return self.neg()
  def __add__(self, x): return self.add(x)
  def __radd__(self, x): return self.add(x, True)
  def __sub__(self, x): return self.sub(x)
  def __rsub__(self, x): return self.sub(x, True)
  def __mul__(self, x): return self.mul(x)
  def __rmul__(self, x): return self.mul(x, True)
  def __truediv__(self, x): return self.div(x)
  def __rtruediv__(self, x): return self.div(x, True)
  def __floordiv__(self, x): return self.div(x, rounding_mode="floor")
  def __rfloordiv__(self, x): return self.div(x, True, rounding_mode="floor")
  def __mod__(self, x): return self.mod(x)
  def __rmod__(self, x): return self.mod(x, True)
  def __pow__(self, x): return self.pow(x)
  def __rpow__(self, x): return self.pow(x, True)
  def __matmul__(self, x): return self.matmul(x)
  def __rmatmul__(self, x): return self.matmul(x, True)
  def __and__(self, x): return self.bitwise_and(x)
  def __rand__(self, x): return self.bitwise_and(x, True)
  def __or__(self, x): return self.bitwise_or(x)
  def __ror__(self, x): return self.bitwise_or(x, True)
  def __xor__(self, x): return self.bitwise_xor(x)
  def __rxor__(self, x): return self.bitwise_xor(x, True)
  def __lshift__(self, x): return self.lshift(x)
  def __rlshift__(self, x): return self.lshift(x, True)
  def __rshift__(self, x): return self.rshift(x)
  def __rrshift__(self, x): return self.rshift(x, True)
  def __invert__(self):
    if self.dtype is dtypes.bool: return self.logical_not()
    if dtypes.is_float(self.dtype): raise RuntimeError(f"bitwise_not needs integer or bool tensors, got {self.dtype}")
    return self ^ -1 if not dtypes.is_unsigned(self.dtype) else self ^ self.dtype.max
  def bitwise_not(self) -> Tensor: return ~self
  def __iadd__(self, x): return self.assign(self + x)
  def __isub__(self, x): return self.assign(self - x)
  def __imul__(self, x): return self.assign(self * x)
  def __itruediv__(self, x): return self.assign(self / x)
