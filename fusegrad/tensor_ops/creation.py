"""Creation, deterministic and random (docs/api.md)."""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING, Any, Sequence

from fusegrad.lazy_numpy import np

from fusegrad.dtype import DType, DTypeLike, dtypes, to_dtype
from fusegrad.engine.realize import capturing
from fusegrad.helpers import argfix, prod
from fusegrad.runtime.buffers import Buffer, buffer_uop
from fusegrad.runtime.buffers import canonical_device
from fusegrad.uop.multi import make_multi, multi_axis, shard_shape
from fusegrad.tensor_ops.base import TensorBase
from fusegrad.tensor_ops.pydata import py_scalar_const
from fusegrad.tensor_ops.shapes import as_index, check_shape, is_index
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.sint import shape_str

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool


def threefry2x32(counter: Tensor, stream: int | Tensor, key: int) -> Tensor:
    """Threefry-2x32 with 20 rounds; returns the first output word as uint32 random bits. A stream given as a
    one-element uint32 tensor is read from memory, so each new stream reuses one compiled kernel."""
    rotations = (13, 15, 26, 6, 17, 29, 16, 24)
    k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    stream_bits = (
        stream.reshape((1,) * counter.ndim).expand(counter.shape)
        if isinstance(stream, TensorBase)
        else counter.full_like(stream & 0xFFFFFFFF)
    )
    x0, x1 = counter + ks[0], stream_bits + ks[1]
    for group in range(5):
        for r in range(4):
            rot = rotations[(group % 2) * 4 + r]
            x0 = x0 + x1
            x1 = (x1 << rot) | (x1 >> (32 - rot))
            x1 = x1 ^ x0
        x0 = x0 + ks[(group + 1) % 3]
        x1 = x1 + (ks[(group + 2) % 3] + group + 1) % 2**32
    return x0


def _floor_to_precision(x: Tensor, dt: DType) -> Tensor:
    """float32 x rounded toward -inf to dt's mantissa width, so the cast to dt is exact and never rounds up.

    Rounding to nearest would turn a draw just below 1 (or any `high`) into 1 in float16/bfloat16/fp8.
    """
    mantissa = dtypes.finfo(dt)[1]
    if mantissa >= 23:
        return x
    low_bits = (1 << (23 - mantissa)) - 1
    bits = x.bitcast(dtypes.uint32)
    # IEEE bit patterns order like magnitudes: clearing low bits floors a positive value; a negative one rounds its
    # magnitude up (the carry into the exponent is the next power of two)
    floored = (x < 0).where((bits + low_bits) & ~low_bits & 0xFFFFFFFF, bits & ~low_bits & 0xFFFFFFFF)
    return floored.bitcast(dtypes.float32)


def _number(name: str, x: Any) -> int | float:
    """A bound/step argument: Python or numpy int/float, kept as int or float by kind."""
    if is_index(x):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    raise TypeError(f"{name}() needs a number, got {type(x).__name__} {x!r}")


def _float_dtype(name: str, dtype: DTypeLike | None) -> DType:
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    if not dtypes.is_float(dt):
        raise ValueError(f"{name} needs a float dtype, got {dt}")
    return dt


def _rng_home(cls: type) -> Any:
    """The class that holds the seed and the draw count (Tensor, which the engine reads): a subclass shares them."""
    return next(c for c in cls.__mro__ if "_rng_calls" in vars(c))


def _fan_shape(name: str, shape: tuple) -> tuple[int, ...]:
    s = check_shape(argfix(*shape))
    if not s:
        raise ValueError(f"{name} needs at least one dimension to compute the fan, got shape {s}")
    return s


class CreationMixin:
    @staticmethod
    def _reject_kwargs(name: str, kwargs: dict, allowed: tuple[str, ...] = ()) -> None:
        """TypeError naming the first keyword `name` does not take; requires_grad is always accepted."""
        for key in kwargs:
            if key not in allowed and key != "requires_grad":
                raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")

    @staticmethod
    def _with_requires_grad(out: Tensor, kwargs: dict) -> Tensor:
        if "requires_grad" in kwargs:
            out.requires_grad, out.is_param = kwargs["requires_grad"], kwargs["requires_grad"] is not False
        return out

    @classmethod
    def _creation_kwargs(cls, name: str, kwargs: dict) -> tuple[str, DType | None]:
        cls._reject_kwargs(name, kwargs, ("device", "dtype", "buffer"))
        dt = kwargs.get("dtype")
        return canonical_device(kwargs.get("device")), to_dtype(dt) if dt is not None else None

    @classmethod
    def full(
        cls,
        shape: int | Sequence[int],
        fill_value: Scalar,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        buffer: bool = True,
        **kwargs: Any,
    ) -> Tensor:
        cls._reject_kwargs("full", kwargs)
        shape = check_shape(argfix(shape))
        value, dt = py_scalar_const(fill_value, to_dtype(dtype) if dtype is not None else None)
        return cls._with_requires_grad(cls._filled(shape, value, dt, device), kwargs)

    @classmethod
    def _filled(cls, shape: tuple[int, ...], value: Scalar, dt: DType, device: Any) -> Tensor:
        """A broadcast constant; value is stored as dt stores it (ints wrap), for callers that already chose dt."""
        return cls(UOp.const(dt, value), device=device).reshape((1,) * len(shape)).expand(shape)

    @classmethod
    def zeros(cls, *shape: Any, **kwargs: Any) -> Tensor:
        device, dt = cls._creation_kwargs("zeros", kwargs)
        out = cls.full(argfix(*shape), 0, dtype=dt or dtypes.default_float, device=device)
        return cls._with_requires_grad(out, kwargs)

    @classmethod
    def ones(cls, *shape: Any, **kwargs: Any) -> Tensor:
        device, dt = cls._creation_kwargs("ones", kwargs)
        out = cls.full(argfix(*shape), 1, dtype=dt or dtypes.default_float, device=device)
        return cls._with_requires_grad(out, kwargs)

    @classmethod
    def empty(cls, *shape: Any, device: str | None = None, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        cls._reject_kwargs("empty", kwargs)
        shape = check_shape(argfix(*shape))
        if any(isinstance(d, UOp) for d in shape):
            raise ValueError(f"empty() allocates storage, so its shape must be concrete, got {shape_str(shape)}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        placement = canonical_device(device)
        if isinstance(placement, tuple):  # replicated: one uninitialized buffer per device
            shards = [cls.empty(shape, device=d, dtype=dt).uop for d in placement]
            return cls(make_multi(shards, None, placement), device=placement)
        out = cls(buffer_uop(Buffer(placement, prod(shape), dt)), device=placement).reshape(shape)
        return cls._with_requires_grad(out, kwargs)

    def _sharded_like(self, make: Any, device: str | None) -> Tensor:
        """make(device) shaped like self; a sharded self is sharded the same way (then device must not be given)."""
        if not isinstance(self.device, tuple):
            return make(device or self.device)
        if device is not None:
            raise RuntimeError(f"cannot pass device={device!r} for a tensor sharded on {self.device}")
        return make(self.device[0]).shard(self.device, multi_axis(self.uop))

    def full_like(
        self, fill_value: Scalar, dtype: DTypeLike | None = None, device: str | None = None, **kwargs: Any
    ) -> Tensor:
        type(self)._reject_kwargs("full_like", kwargs)
        dt = dtype or self.dtype
        out = self._sharded_like(lambda d: type(self).full(self.shape, fill_value, dtype=dt, device=d), device)
        return type(self)._with_requires_grad(out, kwargs)

    def zeros_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(1, **kwargs)

    def empty_like(self, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        dt = to_dtype(dtype or self.dtype)
        if not isinstance(self.device, tuple) or device is not None:
            return type(self).empty(self.shape, dtype=dt, device=device or self.device)
        axis = multi_axis(self.uop)
        shape = shard_shape(self.shape, axis, len(self.device))
        shards = [type(self).empty(shape, dtype=dt, device=d).uop for d in self.device]
        return type(self)(make_multi(shards, axis, self.device), device=self.device)

    @classmethod
    def arange(
        cls, start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: DTypeLike | None = None, **kwargs: Any
    ) -> Tensor:
        cls._reject_kwargs("arange", kwargs, ("device",))
        device = canonical_device(kwargs.get("device"))
        if stop is None:
            start, stop = 0, start
        start, stop, step = (_number("arange", x) for x in (start, stop, step))
        if not all(math.isfinite(x) for x in (start, stop, step)):
            raise ValueError(f"arange({start}, {stop}, {step}) needs finite bounds and step")
        if step == 0:
            raise ValueError("arange step must be non-zero")
        count = max(math.ceil((stop - start) / step), 0)
        is_float = any(isinstance(x, float) for x in (start, stop, step))
        if dtype is not None:
            dt = to_dtype(dtype)
        elif is_float:
            dt = dtypes.default_float
        else:
            dt = (
                dtypes.default_int
                if all(-(2**31) <= v < 2**31 for v in (start, start + step * max(count - 1, 0)))
                else dtypes.int64
            )
        if dtypes.is_int(dt) and count and not all(dt.min <= v <= dt.max for v in (start, start + step * (count - 1))):
            raise OverflowError(f"arange({start}, {stop}, {step}) does not fit {dt}")
        idx_dt = dtypes.int64 if count >= 2**31 else dtypes.int32
        idx = cls(UOp(Ops.ARANGE, idx_dt, (), count), device=device)
        out = (idx.cast(dt) * step + start).cast(dt) if (start, step) != (0, 1) or dt is not idx_dt else idx
        return cls._with_requires_grad(out, kwargs)

    @classmethod
    def linspace(cls, start: Scalar, stop: Scalar, steps: int, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        cls._reject_kwargs("linspace", kwargs, ("device",))
        start, stop, steps = _number("linspace", start), _number("linspace", stop), as_index("linspace", steps)
        if steps < 0:
            raise ValueError(f"linspace needs steps >= 0, got {steps}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if dt is dtypes.bool:
            raise ValueError("linspace cannot produce bool values")
        if steps == 1:
            return cls._with_requires_grad(cls([start], dtype=dt, device=kwargs.get("device")), kwargs)
        idx = cls.arange(steps, device=kwargs.get("device")).cast(
            dtypes.float64 if dt is dtypes.float64 else dtypes.float32
        )
        return cls._with_requires_grad((idx * ((stop - start) / max(steps - 1, 1)) + start).cast(dt), kwargs)

    @classmethod
    def eye(cls, n: int, m: int | None = None, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        cls._reject_kwargs("eye", kwargs, ("device",))
        n = as_index("eye", n)
        m = n if m is None else as_index("eye", m)
        if n < 0 or m < 0:
            raise ValueError(f"eye needs non-negative sizes, got n={n}, m={m}")
        rows = cls.arange(n, device=kwargs.get("device")).reshape(n, 1)
        cols = cls.arange(m, device=kwargs.get("device")).reshape(1, m)
        return cls._with_requires_grad((rows == cols).cast(dtype or dtypes.default_float), kwargs)

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        home = _rng_home(cls)
        home._seed, home._rng_calls = int(seed), 0

    @classmethod
    def _random_bits(cls, shape: tuple[int, ...], device: str | None) -> Tensor:
        """uint32 random bits from Threefry-2x32 (20 rounds) over (element index, call number) with the seed as key."""
        if any(isinstance(d, UOp) for d in shape):
            raise NotImplementedError(f"random tensors need a concrete shape, got {shape_str(shape)}; shrink after")
        home = _rng_home(cls)
        home._rng_calls += 1
        n = prod(shape)
        counter = (
            cls.arange(n, device=device, dtype=dtypes.uint32)
            if n < 2**31
            else cls.arange(n, device=device).cast(dtypes.uint32)
        )
        # the call number is data (not a constant in the kernel): every dropout mask of a training loop is one kernel;
        # while a TinyJit captures, it comes from the capture's stream buffer, so each replay draws new numbers
        stream = (
            capturing[-1].rng_stream(counter.device, cls._rng_calls)
            if capturing
            else cls(np.array([cls._rng_calls & 0xFFFFFFFF], np.uint32), device=device)
        )
        return threefry2x32(counter, stream, cls._seed).reshape(shape)

    @classmethod
    def rand(
        cls,
        *shape: Any,
        device: str | None = None,
        dtype: DTypeLike | None = None,
        contiguous: bool = True,
        **kwargs: Any,
    ) -> Tensor:
        cls._reject_kwargs("rand", kwargs)
        shape = check_shape(argfix(*shape))
        dt = _float_dtype("rand", dtype)
        bits = cls._random_bits(shape, device)
        # 23 random mantissa bits under exponent 0 give a float in [1, 2)
        one_to_two = ((bits >> 9) | 0x3F800000).bitcast(dtypes.float32)
        out = _floor_to_precision(one_to_two - 1.0, dt).cast(dt)
        return cls._with_requires_grad(out.contiguous() if contiguous else out, kwargs)

    @classmethod
    def randn(cls, *shape: Any, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        cls._reject_kwargs("randn", kwargs, ("device", "contiguous"))
        shape = check_shape(argfix(*shape))
        dt = _float_dtype("randn", dtype)
        u = cls.rand(2, *shape, device=kwargs.get("device"), contiguous=False)
        # Box-Muller: 1 - u keeps the log argument in (0, 1]
        z = (((1.0 - u[0]).log() * -2.0).sqrt() * (u[1] * (2 * math.pi)).cos()).cast(dt)
        return cls._with_requires_grad(z.contiguous() if kwargs.get("contiguous", True) else z, kwargs)

    def rand_like(self, **kwargs: Any) -> Tensor:
        type(self)._reject_kwargs("rand_like", kwargs, ("device", "dtype", "contiguous"))
        dt, contiguous = kwargs.get("dtype") or self.dtype, kwargs.get("contiguous", True)
        out = self._sharded_like(
            lambda d: type(self).rand(self.shape, device=d, dtype=dt, contiguous=contiguous), kwargs.get("device")
        )
        return type(self)._with_requires_grad(out, kwargs)

    def randn_like(self, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        type(self)._reject_kwargs("randn_like", kwargs, ("device", "contiguous"))
        dt, contiguous = dtype or self.dtype, kwargs.get("contiguous", True)
        out = self._sharded_like(
            lambda d: type(self).randn(self.shape, dtype=dt, device=d, contiguous=contiguous), kwargs.get("device")
        )
        return type(self)._with_requires_grad(out, kwargs)

    @classmethod
    def const(cls, b: Scalar, dtype: DTypeLike | None = None) -> Tensor:
        """A device-less-looking 0-d constant (it lives on the default device until combined)."""
        return cls(UOp.const(to_dtype(dtype) if dtype is not None else dtypes.from_py(b), b))

    def const_like(self, b: Scalar, dtype: DTypeLike | None = None) -> Tensor:
        return type(self).full(self.shape, b, dtype=dtype or self.dtype, device=self.device)

    @classmethod
    def invalids(cls, *shape: Any, device: str | None = None, dtype: DTypeLike | None = None) -> Tensor:
        return cls.empty(*shape, device=device, dtype=dtype)

    @classmethod
    def from_blob(cls, ptr: int, shape: tuple[int, ...], **kwargs: Any) -> Tensor:
        """Wrap external host memory at address ptr without copying or owning it (the caller keeps it alive)."""
        device, dt = cls._creation_kwargs("from_blob", kwargs)
        dt = dt or dtypes.default_float
        shape = check_shape(tuple(shape))
        buf = Buffer(device, prod(shape), dt)
        nbytes = max(buf.nbytes, 1)
        buf.use_external(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), shape=(nbytes,)))
        return cls(buffer_uop(buf), device=device).reshape(shape)

    @classmethod
    def from_url(cls, url: str, gunzip: bool = False, **kwargs: Any) -> Tensor:
        from fusegrad.helpers import fetch

        return cls(fetch(url, gunzip=gunzip).read_bytes(), **kwargs)

    # ---- random
    @classmethod
    def randint(
        cls, *shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32, **kwargs: Any
    ) -> Tensor:
        cls._reject_kwargs("randint", kwargs, ("device", "contiguous"))
        dt = to_dtype(dtype)
        if not isinstance(low, int) or not isinstance(high, int):
            raise TypeError(f"randint bounds must be ints, got low={low!r}, high={high!r}")
        if not dtypes.is_int(dt):
            raise TypeError(f"randint needs an integer dtype, got {dt}")
        if low >= high:
            raise ValueError(f"randint needs low < high, got low={low}, high={high}")
        if low < dt.min or high - 1 > dt.max:
            raise RuntimeError(f"randint range [{low}, {high}) does not fit {dt}")
        shape = check_shape(argfix(*shape))
        span = high - low
        bits = cls._random_bits(shape, kwargs.get("device")).cast(dtypes.uint64)
        if span > 2**32:  # 32 random bits would only reach the bottom 2**32 values of a wider range
            bits = (bits << 32) | cls._random_bits(shape, kwargs.get("device")).cast(dtypes.uint64)
        # 64-bit arithmetic (wrapping like two's complement) keeps every range of int64/uint64 exact
        offset = bits % span if span < 2**64 else bits
        out = (offset.cast(dtypes.int64) + low).cast(dt)
        return cls._with_requires_grad(out.contiguous() if kwargs.get("contiguous", True) else out, kwargs)

    @classmethod
    def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Tensor:
        cls._reject_kwargs("normal", kwargs, ("device", "dtype", "contiguous"))
        if std < 0:
            raise ValueError(f"normal needs std >= 0, got {std}")
        dt = _float_dtype("normal", kwargs.get("dtype"))
        out = (cls.randn(*shape, device=kwargs.get("device"), contiguous=False) * std + mean).cast(dt)
        return cls._with_requires_grad(out.contiguous() if kwargs.get("contiguous", True) else out, kwargs)

    @classmethod
    def uniform(
        cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None, **kwargs: Any
    ) -> Tensor:
        cls._reject_kwargs("uniform", kwargs, ("device", "contiguous"))
        if low >= high:
            raise ValueError(f"uniform needs low < high, got low={low}, high={high}")
        dt = _float_dtype("uniform", dtype)
        out = cls.rand(*shape, contiguous=False, device=kwargs.get("device")) * (high - low) + low
        out = _floor_to_precision(out, dt).cast(dt)
        return cls._with_requires_grad(out.contiguous() if kwargs.get("contiguous", True) else out, kwargs)

    @classmethod
    def scaled_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
        s = check_shape(argfix(*shape))
        bound = prod(s) ** -0.5
        return cls.uniform(s, low=-bound, high=bound, **kwargs)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> Tensor:
        s = _fan_shape("glorot_uniform", shape)
        bound = math.sqrt(6 / (s[0] + prod(s[1:])))
        return cls.uniform(s, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        s = _fan_shape("kaiming_uniform", shape)
        bound = math.sqrt(6 / (1 + a * a) / prod(s[1:]))
        return cls.uniform(s, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        s = _fan_shape("kaiming_normal", shape)
        return cls.normal(s, std=math.sqrt(2 / (1 + a * a) / prod(s[1:])), **kwargs)

    @classmethod
    def randperm(cls, n: int, device: str | None = None, dtype: DTypeLike = dtypes.int32, **kwargs: Any) -> Tensor:
        cls._reject_kwargs("randperm", kwargs)
        n = as_index("randperm", n)
        if n < 0:
            raise ValueError(f"randperm needs n >= 0, got {n}")
        # sorting distinct random keys gives a uniform permutation; 31 random bits plus the index break ties
        keys = cls._random_bits((n,), device).cast(dtypes.int64) * max(n, 1) + cls.arange(
            n, device=device, dtype=dtypes.int64
        )
        return cls._with_requires_grad(keys.argsort().cast(to_dtype(dtype)), kwargs)
