"""Tensor: the user API. Every method builds a lazy UOp graph; nothing computes until realize() or a data accessor."""
from __future__ import annotations
import math
from typing import Any, Sequence
import numpy as np
from fusegrad.dtype import DType, DTypeLike, dtypes, from_numpy, least_upper_dtype, least_upper_float, np_bf16_to_f32, \
  sum_acc_dtype, to_dtype, to_numpy_dtype, truncate
from fusegrad.helpers import all_same, argfix, prod
from fusegrad.runtime.device import Buffer, Device
from fusegrad.schedule import base_buffer, buffer_of, buffer_uop, is_contiguous_view
from fusegrad.engine.realize import realize_uops
from fusegrad.uop.ops import Ops, UOp

Scalar = int | float | bool

def _py_dtype_of(data: Any) -> DType:
  """Dtype of nested Python data: any float -> default_float, else any int -> default_int, else bool."""
  flat = np.asarray(data, dtype=object).reshape(-1)
  if any(isinstance(x, float) for x in flat): return dtypes.default_float
  if any(isinstance(x, int) and not isinstance(x, bool) for x in flat): return dtypes.default_int
  return dtypes.bool if len(flat) else dtypes.default_float

def _nested_shape(data: Any) -> tuple[int, ...]:
  if not isinstance(data, (list, tuple)): return ()
  shapes = [_nested_shape(x) for x in data]
  if not all_same(shapes) if shapes else False: raise ValueError(f"ragged nested sequence: sub-shapes {sorted(set(shapes))}")
  return (len(data),) + (shapes[0] if shapes else ())

def _check_shape(shape: tuple) -> tuple[int, ...]:
  for d in shape:
    if not isinstance(d, (int, np.integer)) or isinstance(d, bool): raise TypeError(f"shape {shape} must contain ints, got {d!r}")
    if d < 0: raise ValueError(f"negative dimension in shape {shape}")
  return tuple(int(d) for d in shape)

class Tensor:
  """An n-dimensional array on a device, computed lazily."""
  __slots__ = ("uop", "device", "grad", "requires_grad", "is_param", "__weakref__")
  training: bool = False  # [compat] mirror of TRAINING
  _seed: int = 0
  _rng_calls: int = 0

  def __init__(self, data: Any = None, device: str | tuple | None = None, dtype: DTypeLike | None = None,
               requires_grad: bool | None = None):
    dt = to_dtype(dtype) if dtype is not None else None
    self.device = Device.canonicalize(device if isinstance(device, str) or device is None else device[0])
    self.grad: Tensor | None = None
    self.requires_grad, self.is_param = requires_grad, requires_grad is not False
    if isinstance(data, UOp): self.uop = data
    elif data is None: self.uop = UOp.const(dt or dtypes.default_float, 0)
    elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
      self.uop = UOp.const(dt or dtypes.from_py(data), data)
    elif isinstance(data, bytes): self.uop = self._from_numpy(np.frombuffer(data, np.uint8), dt)
    elif isinstance(data, (list, tuple)):
      shape = _nested_shape(data)
      inferred = dt or _py_dtype_of(data)
      if inferred is dtypes.bfloat16 or dtypes.is_float(inferred) and inferred.fmt is None:
        arr = np.array(data, dtype=np.float32).reshape(shape)
      else: arr = np.array([truncate(x, inferred) for x in np.asarray(data, dtype=object).reshape(-1)],
                           dtype=to_numpy_dtype(inferred)).reshape(shape)
      self.uop = self._from_numpy(arr, inferred)
    elif isinstance(data, (np.ndarray, np.generic)): self.uop = self._from_numpy(np.asarray(data), dt)
    else: raise TypeError(f"cannot build a Tensor from {type(data).__name__}")

  def _from_numpy(self, arr: np.ndarray, dt: DType | None) -> UOp:
    src_dt = from_numpy(arr.dtype)
    dt = dt or src_dt
    if dt is dtypes.bfloat16:
      from fusegrad.dtype import np_f32_to_bf16
      store = np_f32_to_bf16(arr.astype(np.float32))
    elif dt.fmt is None: raise TypeError(f"cannot build {dt} tensors from numpy data yet")
    else: store = arr.astype(to_numpy_dtype(dt), copy=True) if src_dt is not dt else np.array(arr, copy=True, order="C")
    buf = buffer_uop(Buffer(self.device, arr.size, dt, initial=store))
    return buf if arr.ndim == 1 else UOp(Ops.RESHAPE, dt, (buf,), arr.shape)

  # ------------------------------------------------------------------ properties
  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return prod(self.shape)
  def size(self, dim: int | None = None) -> Any: return self.shape if dim is None else self.shape[self._axis(dim)]
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return self.numel() * self.element_size()
  def is_floating_point(self) -> bool: return dtypes.is_float(self.dtype)
  @property
  def T(self) -> Tensor: return self.transpose()
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  def __bool__(self): raise TypeError("the truth value of a Tensor is ambiguous; use .item(), .any() or .all()")
  def __hash__(self) -> int: return id(self)
  def __repr__(self) -> str:
    return f"<Tensor {self.device} shape={self.shape} dtype={self.dtype}{' with grad' if self.grad is not None else ''}>"
  def requires_grad_(self, flag: bool = True) -> Tensor:
    self.requires_grad, self.is_param = flag, flag
    return self

  # ------------------------------------------------------------------ realization and data
  def realize(self, *lst: Tensor, do_update_stats: bool = True) -> Tensor:
    Tensor.realize_all([self, *lst])
    return self
  @staticmethod
  def realize_all(tensors: Sequence[Tensor]) -> None:
    todo = [t for t in tensors if base_buffer(t.uop) is None]
    if not todo: return
    results = realize_uops([t.uop for t in todo], [t.device for t in todo])
    for t, r in zip(todo, results): t.uop = r

  def _host_data(self) -> np.ndarray:
    """The values as a new numpy array (bfloat16 widened to float32)."""
    t = self if is_contiguous_view(self.uop) else self.contiguous()
    t.realize()
    buf = buffer_of[base_buffer(t.uop)]  # type: ignore[index]
    data = buf.host_view().copy().reshape(self.shape)
    return np_bf16_to_f32(data) if self.dtype is dtypes.bfloat16 else data
  def numpy(self) -> np.ndarray: return self._host_data()
  def tolist(self) -> Any: return self._host_data().tolist()
  def item(self) -> Scalar:
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
    return self._host_data().reshape(()).item()
  def data(self) -> memoryview:
    arr = self._host_data()
    return memoryview(arr.reshape(-1)).cast(arr.dtype.char, self.shape) if self.shape else memoryview(arr.reshape(1)).cast(arr.dtype.char)

  # ------------------------------------------------------------------ placement and mutation
  def to(self, device: str | None) -> Tensor:
    device = Device.canonicalize(device)
    if device == self.device: return self
    out = Tensor(UOp(Ops.COPY, self.dtype, (self.uop,), device), device=device)
    if self.grad is not None: out.grad = self.grad.to(device)
    return out
  def to_(self, device: str | None) -> Tensor:
    moved = self.to(device)
    self.uop, self.device, self.grad = moved.uop, moved.device, moved.grad
    return self
  def contiguous(self) -> Tensor: return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))
  def clone(self, device: str | None = None) -> Tensor:
    out = (self.to(device) if device is not None else self).contiguous()
    if self.grad is not None: out.grad = self.grad.clone(device)
    return out
  def detach(self) -> Tensor: return self._new(UOp(Ops.DETACH, self.dtype, (self.uop,)))
  def assign(self, x: Any) -> Tensor:
    if not isinstance(x, Tensor): x = Tensor(x, device=self.device, dtype=self.dtype)
    if x.device != self.device: raise RuntimeError(f"assign from device {x.device} into a tensor on {self.device}")
    if x.dtype != self.dtype: raise RuntimeError(f"assign of {x.dtype} into a {self.dtype} tensor; cast it first")
    x = x._broadcast_to(self.shape)
    if base_buffer(self.uop) is None or not is_contiguous_view(self.uop): self.replace(self.contiguous().realize())
    self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, x.uop))
    return self
  def replace(self, x: Tensor) -> Tensor:
    if x.shape != self.shape: raise ValueError(f"replace needs equal shapes, got {self.shape} and {x.shape}")
    self.uop, self.device = x.uop, x.device
    return self
  def _new(self, uop: UOp) -> Tensor: return Tensor(uop, device=self.device)

  # ------------------------------------------------------------------ creation
  @staticmethod
  def _creation_kwargs(kwargs: dict) -> tuple[str, DType | None]:
    unknown = set(kwargs) - {"device", "dtype", "requires_grad"}
    if unknown: raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}")
    dt = kwargs.get("dtype")
    return Device.canonicalize(kwargs.get("device")), to_dtype(dt) if dt is not None else None
  @staticmethod
  def full(shape: int | Sequence[int], fill_value: Scalar, dtype: DTypeLike | None = None, device: str | None = None,
           buffer: bool = True, **kwargs: Any) -> Tensor:
    shape = _check_shape(argfix(shape))
    dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
    const = Tensor(UOp.const(dt, fill_value), device=device)
    return const.reshape((1,) * len(shape)).expand(shape)
  @staticmethod
  def zeros(*shape: Any, **kwargs: Any) -> Tensor:
    device, dt = Tensor._creation_kwargs(kwargs)
    return Tensor.full(argfix(*shape), 0.0, dtype=dt or dtypes.default_float, device=device)
  @staticmethod
  def ones(*shape: Any, **kwargs: Any) -> Tensor:
    device, dt = Tensor._creation_kwargs(kwargs)
    return Tensor.full(argfix(*shape), 1.0, dtype=dt or dtypes.default_float, device=device)
  @staticmethod
  def empty(*shape: Any, device: str | None = None, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
    shape = _check_shape(argfix(*shape))
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    t = Tensor(buffer_uop(Buffer(Device.canonicalize(device), prod(shape), dt)), device=device)
    return t.reshape(shape)
  def full_like(self, fill_value: Scalar, dtype: DTypeLike | None = None, device: str | None = None, **kwargs: Any) -> Tensor:
    return Tensor.full(self.shape, fill_value, dtype=dtype or self.dtype, device=device or self.device)
  def zeros_like(self, **kwargs: Any) -> Tensor: return self.full_like(0, **kwargs)
  def ones_like(self, **kwargs: Any) -> Tensor: return self.full_like(1, **kwargs)
  def empty_like(self, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
    return Tensor.empty(self.shape, dtype=dtype or self.dtype, device=device or self.device)
  @staticmethod
  def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
    device, _ = Tensor._creation_kwargs({k: v for k, v in kwargs.items() if k != "dtype"})
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange step must be non-zero")
    count = max(math.ceil((stop - start) / step), 0)
    is_float = any(isinstance(x, float) for x in (start, stop, step))
    if dtype is not None: dt = to_dtype(dtype)
    elif is_float: dt = dtypes.default_float
    else: dt = dtypes.default_int if all(-2**31 <= v < 2**31 for v in (start, start + step * max(count - 1, 0))) else dtypes.int64
    if dtypes.is_int(dt) and count and not all(dt.min <= v <= dt.max for v in (start, start + step * (count - 1))):
      raise OverflowError(f"arange({start}, {stop}, {step}) does not fit {dt}")
    idx_dt = dtypes.int64 if count >= 2**31 else dtypes.int32
    idx = Tensor(UOp(Ops.ARANGE, idx_dt, (), count), device=device)
    return (idx.cast(dt) * step + start).cast(dt) if (start, step) != (0, 1) or dt is not idx_dt else idx
  @staticmethod
  def linspace(start: Scalar, stop: Scalar, steps: int, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
    if steps < 0: raise ValueError(f"linspace needs steps >= 0, got {steps}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if dt is dtypes.bool: raise ValueError("linspace cannot produce bool values")
    if steps == 1: return Tensor([start], dtype=dt, device=kwargs.get("device"))
    idx = Tensor.arange(steps, device=kwargs.get("device")).cast(dtypes.float64 if dt is dtypes.float64 else dtypes.float32)
    return (idx * ((stop - start) / max(steps - 1, 1)) + start).cast(dt)
  @staticmethod
  def eye(n: int, m: int | None = None, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
    m = n if m is None else m
    if n < 0 or m < 0: raise ValueError(f"eye needs non-negative sizes, got n={n}, m={m}")
    rows = Tensor.arange(n, device=kwargs.get("device")).reshape(n, 1)
    cols = Tensor.arange(m, device=kwargs.get("device")).reshape(1, m)
    return (rows == cols).cast(dtype or dtypes.default_float)

  # ------------------------------------------------------------------ random numbers
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    Tensor._seed, Tensor._rng_calls = int(seed), 0
  @staticmethod
  def _random_bits(shape: tuple[int, ...], device: str | None) -> Tensor:
    """uint32 random bits from Threefry-2x32 (20 rounds) over (element index, call number) with the seed as key."""
    Tensor._rng_calls += 1
    n = prod(shape)
    counter = Tensor.arange(n, device=device, dtype=dtypes.uint32) if n < 2**31 else Tensor.arange(n, device=device).cast(dtypes.uint32)
    return threefry2x32(counter, Tensor._rng_calls, Tensor._seed).reshape(shape)
  @staticmethod
  def rand(*shape: Any, device: str | None = None, dtype: DTypeLike | None = None, contiguous: bool = True, **kwargs: Any) -> Tensor:
    shape = _check_shape(argfix(*shape))
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dtypes.is_float(dt): raise ValueError(f"rand needs a float dtype, got {dt}")
    bits = Tensor._random_bits(shape, device)
    # 23 random mantissa bits under exponent 0 give a float in [1, 2)
    one_to_two = ((bits >> 9) | 0x3F800000).bitcast(dtypes.float32)
    out = (one_to_two - 1.0).cast(dt)
    return out.contiguous() if contiguous else out
  @staticmethod
  def randn(*shape: Any, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
    shape = _check_shape(argfix(*shape))
    u = Tensor.rand(2, *shape, device=kwargs.get("device"), contiguous=False)
    # Box-Muller: 1 - u keeps the log argument in (0, 1]
    z = ((1.0 - u[0]).log() * -2.0).sqrt() * (u[1] * (2 * math.pi)).cos()
    return z.cast(to_dtype(dtype) if dtype is not None else dtypes.default_float).contiguous()
  def rand_like(self, **kwargs: Any) -> Tensor:
    return Tensor.rand(self.shape, device=kwargs.get("device", self.device), dtype=kwargs.get("dtype", self.dtype))
  def randn_like(self, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
    return Tensor.randn(self.shape, dtype=dtype or self.dtype, device=kwargs.get("device", self.device))

  # ------------------------------------------------------------------ broadcasting and dtype promotion
  def _operand(self, x: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """Both operands broadcast to one shape and promoted to one dtype; Python scalars are weak (API.md §3.3)."""
    if isinstance(x, Tensor):
      if x.device != self.device: raise RuntimeError(f"operands on different devices: {self.device} and {x.device}")
      out_dt = least_upper_dtype(self.dtype, x.dtype)
      a, b = self, x
    else:
      if not isinstance(x, (bool, int, float)) or isinstance(x, np.generic): x = _scalar(x)
      if isinstance(x, bool): out_dt = self.dtype
      elif isinstance(x, int): out_dt = dtypes.default_int if self.dtype is dtypes.bool else self.dtype
      else: out_dt = self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float
      const = UOp.const(out_dt, x)
      a = self.cast(out_dt)
      # a scalar becomes a broadcast constant directly: this is the hot path of elementwise code
      if a.shape: const = UOp(Ops.EXPAND, out_dt, (UOp(Ops.RESHAPE, out_dt, (const,), (1,) * a.ndim),), a.shape)
      b = a._new(const)
      return (b, a) if reverse else (a, b)
    a, b = a.cast(out_dt), b.cast(out_dt)
    if a.shape != b.shape:
      shape = _broadcast_shape(a.shape, b.shape)
      a, b = a._broadcast_to(shape), b._broadcast_to(shape)
    return (b, a) if reverse else (a, b)
  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape: return self
    if len(self.shape) > len(shape): raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
    padded = (1,) * (len(shape) - len(self.shape)) + self.shape
    if any(s != d and s != 1 for s, d in zip(padded, shape)): raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
    t = self.reshape(padded) if padded != self.shape else self
    return t._new(UOp(Ops.EXPAND, t.dtype, (t.uop,), shape)) if padded != shape else t

  def _alu(self, op: Ops, *srcs: Tensor, dtype: DType | None = None) -> Tensor:
    return self._new(UOp(op, dtype or self.dtype, (self.uop, *(s.uop for s in srcs))))
  def _binary(self, op: Ops, x: Tensor | Scalar, reverse: bool = False, dtype: DType | None = None) -> Tensor:
    a, b = self._operand(x, reverse)
    return a._alu(op, b, dtype=dtype)

  # ------------------------------------------------------------------ elementwise math
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
    shape = _broadcast_shape(_broadcast_shape(cond.shape, x.shape), y.shape)
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

  # ------------------------------------------------------------------ reductions
  def _axes(self, axis: int | Sequence[int] | None) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = tuple(self._axis(a) for a in axes)
    if len(set(out)) != len(out): raise RuntimeError(f"axis {axis} repeats a dimension")
    return out
  def _axis(self, a: int, extra: int = 0) -> int:
    n = self.ndim + extra
    if not isinstance(a, int): raise TypeError(f"axis must be an int, got {type(a).__name__}")
    if not -max(n, 1) <= a < max(n, 1): raise IndexError(f"dimension {a} is out of range for a tensor with {self.ndim} dims")
    return a + n if a < 0 else a
  def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
    axes = self._axes(axis)
    out = self._new(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes))) if axes else self
    return out if keepdim else out.reshape(tuple(d for i, d in enumerate(self.shape) if i not in axes))
  def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
    acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
    out = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
    return out.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) else out
  def prod(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
    return self.cast(to_dtype(dtype) if dtype is not None else self.dtype)._reduce(Ops.MUL, axis, keepdim)
  def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    if dtypes.is_unsigned(self.dtype): return self.dtype.max - (self.dtype.max - self).max(axis, keepdim)
    if self.dtype is dtypes.bool: return self.logical_not().max(axis, keepdim).logical_not()
    return -((-self).max(axis, keepdim))
  def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    out_dt = self.dtype if dtypes.is_float(self.dtype) else dtypes.float32
    count = prod(d for i, d in enumerate(self.shape) if i in self._axes(axis))
    total = self.cast(out_dt).sum(axis, keepdim)
    return total.div(count) if count else total * math.nan
  def any(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self.cast(dtypes.bool)._reduce(Ops.MAX, axis, keepdim)
  def all(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    return self.logical_not().any(axis, keepdim).logical_not()

  # ------------------------------------------------------------------ movement
  def reshape(self, shape: Any, *args: Any) -> Tensor:
    new = list(argfix(shape, *args))
    new = [self.shape[i] if d is None else d for i, d in enumerate(new)]
    if sum(1 for d in new if d == -1) > 1: raise RuntimeError(f"only one dimension can be inferred in reshape {tuple(new)}")
    if -1 in new:
      known = prod(d for d in new if d != -1)
      if known == 0 or self.numel() % known: raise ValueError(f"cannot reshape {self.shape} into {tuple(new)}")
      new[new.index(-1)] = self.numel() // known
    shape_t = _check_shape(tuple(new))
    if prod(shape_t) != self.numel(): raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) into {shape_t}")
    return self if shape_t == self.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape_t))
  def view(self, shape: Any, *args: Any) -> Tensor: return self.reshape(shape, *args)
  def expand(self, shape: Any, *args: Any) -> Tensor:
    new = argfix(shape, *args)
    if len(new) < self.ndim: raise ValueError(f"expand to {new} has fewer dims than {self.shape}")
    padded = (None,) * (len(new) - self.ndim) + self.shape
    target = tuple(s if d in (-1, None) else d for s, d in zip(padded, new))
    if any(t is None for t in target): raise ValueError(f"cannot keep a new leading dim with -1 in expand {new}")
    return self._broadcast_to(_check_shape(target))
  def permute(self, order: Any, *args: Any) -> Tensor:
    order_t = tuple(self._axis(a) for a in argfix(order, *args))
    if sorted(order_t) != list(range(self.ndim)):
      raise RuntimeError(f"permute order {argfix(order, *args)} is not a permutation of {self.ndim} dims")
    return self if order_t == tuple(range(self.ndim)) else self._new(UOp(Ops.PERMUTE, self.dtype, (self.uop,), order_t))
  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    a, b = self._axis(dim0), self._axis(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._axis(start_dim), self._axis(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
    d = self._axis(dim)
    return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])
  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(tuple(d for d in self.shape if d != 1))
    if self.ndim == 0: return self
    d = self._axis(dim)
    return self.reshape(self.shape[:d] + self.shape[d + 1:]) if self.shape[d] == 1 else self
  def unsqueeze(self, dim: int) -> Tensor:
    d = self._axis(dim, extra=1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])
  def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
    if len(arg) != self.ndim: raise ValueError(f"shrink needs one entry per dim ({self.ndim}), got {len(arg)}")
    bounds = tuple((0, s) if a is None else (int(a[0]), int(a[1])) for a, s in zip(arg, self.shape))
    for (b, e), s in zip(bounds, self.shape):
      if not 0 <= b <= e <= s: raise ValueError(f"shrink bounds {tuple(arg)} are invalid for shape {self.shape}")
    if all(b == 0 and e == s for (b, e), s in zip(bounds, self.shape)): return self
    return self._new(UOp(Ops.SHRINK, self.dtype, (self.uop,), bounds))
  def flip(self, axis: Any, *args: Any) -> Tensor:
    axes = [self._axis(a) for a in argfix(axis, *args)]
    if len(set(axes)) != len(axes): raise RuntimeError(f"flip axis {argfix(axis, *args)} repeats a dimension")
    return self._new(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim)))) if axes else self
  def pad(self, padding: Sequence[int] | Sequence[tuple[int, int] | None], mode: str = "constant", value: Scalar = 0.0) -> Tensor:
    if mode != "constant": raise NotImplementedError(f"pad mode {mode!r} is not implemented yet (only 'constant')")
    pads = _pad_pairs(padding, self.ndim)
    # negative amounts crop first
    t = self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pads, self.shape)))
    pos = tuple((max(b, 0), max(a, 0)) for b, a in pads)
    if all(p == (0, 0) for p in pos): return t
    out = t._new(UOp(Ops.PAD, t.dtype, (t.uop,), pos))
    if value == 0: return out
    inside = Tensor.ones(t.shape, dtype=dtypes.bool, device=t.device)._new_pad(pos)
    return inside.where(out, value)
  def _new_pad(self, pos: tuple[tuple[int, int], ...]) -> Tensor: return self._new(UOp(Ops.PAD, self.dtype, (self.uop,), pos))

  # ------------------------------------------------------------------ indexing
  def __getitem__(self, indices: Any) -> Tensor:
    idx = list(indices) if isinstance(indices, tuple) else [indices]
    for i in idx:
      if isinstance(i, (Tensor, list, np.ndarray)): raise NotImplementedError("tensor and list indices are not supported yet")
      if isinstance(i, (bool, float)): raise IndexError(f"index {i!r} of type {type(i).__name__} is not supported")
      if not isinstance(i, (int, slice, type(None), type(Ellipsis))): raise IndexError(f"unsupported index {i!r}")
    if sum(i is Ellipsis for i in idx) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > self.ndim: raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    if Ellipsis in idx:
      e = idx.index(Ellipsis)
      idx = idx[:e] + [slice(None)] * (self.ndim - n_real) + idx[e + 1:]
    else: idx += [slice(None)] * (self.ndim - n_real)
    t, dim, new_shape = self, 0, []
    for i in idx:
      if i is None:
        new_shape.append(1)
        continue
      size = t.shape[dim]
      if isinstance(i, int):
        if not -size <= i < size: raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
        i = i + size if i < 0 else i
        t = t._slice_dim(dim, i, 1, 1)
      else:
        if i.step == 0: raise ValueError("slice step cannot be zero")
        for v in (i.start, i.stop, i.step):
          if v is not None and not isinstance(v, int): raise TypeError(f"slice bounds must be ints or None, got {v!r}")
        start, stop, step = i.indices(size)
        count = len(range(start, stop, step))
        t = t._slice_dim(dim, start, count, step)
        new_shape.append(count)
      dim += 1
    return t.reshape(tuple(new_shape))

  def _slice_dim(self, dim: int, start: int, count: int, step: int) -> Tensor:
    """Take `count` elements from `start` with stride `step` along dim, as flip/shrink/pad/reshape views."""
    t, size = self, self.shape[dim]
    if count == 0: return t.shrink(tuple((0, 0) if d == dim else None for d in range(t.ndim)))
    if step < 0: t, start, step = t.flip(dim), size - 1 - start, -step
    t = t.shrink(tuple((start, start + (count - 1) * step + 1) if d == dim else None for d in range(t.ndim)))
    if step == 1: return t
    t = t.pad(tuple((0, count * step - t.shape[dim]) if d == dim else (0, 0) for d in range(t.ndim)))
    t = t.reshape(t.shape[:dim] + (count, step) + t.shape[dim + 1:])
    t = t.shrink(tuple((0, 1) if d == dim + 1 else None for d in range(t.ndim)))
    return t.reshape(t.shape[:dim + 1] + t.shape[dim + 2:])

  # ------------------------------------------------------------------ linear algebra
  def dot(self, w: Tensor, dtype: DTypeLike | None = None) -> Tensor:
    if self.ndim == 0 or w.ndim == 0: raise RuntimeError(f"dot needs tensors of at least 1 dim, got shapes {self.shape} and {w.shape}")
    k = self.shape[-1]
    wk = w.shape[-2] if w.ndim >= 2 else w.shape[0]
    if k != wk: raise RuntimeError(f"matmul shape mismatch: {self.shape} @ {w.shape} ({k} != {wk})")
    if w.ndim == 1: products = self * w
    elif self.ndim == 1: products = self.reshape(1, k) * w.transpose(-1, -2)
    else: products = self.reshape(self.shape[:-1] + (1, k)) * w.transpose(-1, -2).unsqueeze(-3)
    if dtype is not None: return products.sum(-1, dtype=dtype)
    return products.sum(-1).cast(products.dtype)
  def matmul(self, x: Tensor, reverse: bool = False, dtype: DTypeLike | None = None) -> Tensor:
    return x.dot(self, dtype=dtype) if reverse else self.dot(x, dtype=dtype)

  # ------------------------------------------------------------------ training mode [compat]
  @staticmethod
  def train(mode: bool = True):
    from fusegrad.helpers import Context
    return Context(TRAINING=int(mode))

def _scalar(x: Any) -> Scalar:
  if isinstance(x, np.generic): return x.item()
  raise TypeError(f"unsupported operand type {type(x).__name__}")

def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
  n = max(len(a), len(b))
  pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
  out = []
  for x, y in zip(pa, pb):
    if x != y and x != 1 and y != 1: raise ValueError(f"shapes {a} and {b} cannot be broadcast together")
    out.append(y if x == 1 else x)
  return tuple(out)

def _pad_pairs(padding: Sequence[Any], ndim: int) -> tuple[tuple[int, int], ...]:
  """Flat torch-order (left_last, right_last, ...) or per-dim ((before, after) | None, ...) -> per-dim pairs."""
  if all(isinstance(p, (tuple, list)) or p is None for p in padding) and len(padding) == ndim and ndim:
    return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
  if len(padding) % 2 or len(padding) > 2 * ndim or not all(isinstance(p, int) for p in padding):
    raise ValueError(f"padding {tuple(padding)} must be flat pairs (even length <= {2*ndim}) or one pair per dim")
  pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)][::-1]
  return tuple([(0, 0)] * (ndim - len(pairs)) + pairs)

def threefry2x32(counter: Tensor, stream: int, key: int) -> Tensor:
  """Threefry-2x32 with 20 rounds; returns the first output word as uint32 random bits."""
  rotations = (13, 15, 26, 6, 17, 29, 16, 24)
  k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
  ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
  x0, x1 = counter + ks[0], counter.full_like(stream & 0xFFFFFFFF) + ks[1]
  for group in range(5):
    for r in range(4):
      rot = rotations[(group % 2) * 4 + r]
      x0 = x0 + x1
      x1 = (x1 << rot) | (x1 >> (32 - rot))
      x1 = x1 ^ x0
    x0 = x0 + ks[(group + 1) % 3]
    x1 = x1 + (ks[(group + 2) % 3] + group + 1) % 2**32
  return x0

