"""Creation, deterministic and random (API.md G5, G6)."""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from fusegrad.dtype import DType, DTypeLike, dtypes, to_dtype
from fusegrad.helpers import argfix, prod
from fusegrad.runtime.device import Buffer
from fusegrad.schedule import buffer_uop
from fusegrad.schedule.multi import canonical_device, make_multi, multi_axis, shard_shape
from fusegrad.tensor_ops.shapes import check_shape
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Scalar = int | float | bool


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


class CreationMixin:
    @staticmethod
    def _creation_kwargs(kwargs: dict) -> tuple[str, DType | None]:
        unknown = set(kwargs) - {"device", "dtype", "requires_grad"}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}")
        dt = kwargs.get("dtype")
        return canonical_device(kwargs.get("device")), to_dtype(dt) if dt is not None else None

    @staticmethod
    def full(
        shape: int | Sequence[int],
        fill_value: Scalar,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        buffer: bool = True,
        **kwargs: Any,
    ) -> Tensor:
        shape = check_shape(argfix(shape))
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
        shape = check_shape(argfix(*shape))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        placement = canonical_device(device)
        if isinstance(placement, tuple):  # replicated: one uninitialized buffer per device
            shards = [Tensor.empty(shape, device=d, dtype=dt).uop for d in placement]
            return Tensor(make_multi(shards, None, placement), device=placement)
        return Tensor(buffer_uop(Buffer(placement, prod(shape), dt)), device=placement).reshape(shape)

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
        dt = dtype or self.dtype
        return self._sharded_like(lambda d: Tensor.full(self.shape, fill_value, dtype=dt, device=d), device)

    def zeros_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(1, **kwargs)

    def empty_like(self, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        dt = to_dtype(dtype or self.dtype)
        if not isinstance(self.device, tuple) or device is not None:
            return Tensor.empty(self.shape, dtype=dt, device=device or self.device)
        axis = multi_axis(self.uop)
        shape = shard_shape(self.shape, axis, len(self.device))
        shards = [Tensor.empty(shape, dtype=dt, device=d).uop for d in self.device]
        return Tensor(make_multi(shards, axis, self.device), device=self.device)

    @staticmethod
    def arange(
        start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: DTypeLike | None = None, **kwargs: Any
    ) -> Tensor:
        device, _ = Tensor._creation_kwargs({k: v for k, v in kwargs.items() if k != "dtype"})
        if stop is None:
            start, stop = 0, start
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
        idx = Tensor(UOp(Ops.ARANGE, idx_dt, (), count), device=device)
        return (idx.cast(dt) * step + start).cast(dt) if (start, step) != (0, 1) or dt is not idx_dt else idx

    @staticmethod
    def linspace(start: Scalar, stop: Scalar, steps: int, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        if steps < 0:
            raise ValueError(f"linspace needs steps >= 0, got {steps}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if dt is dtypes.bool:
            raise ValueError("linspace cannot produce bool values")
        if steps == 1:
            return Tensor([start], dtype=dt, device=kwargs.get("device"))
        idx = Tensor.arange(steps, device=kwargs.get("device")).cast(
            dtypes.float64 if dt is dtypes.float64 else dtypes.float32
        )
        return (idx * ((stop - start) / max(steps - 1, 1)) + start).cast(dt)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        m = n if m is None else m
        if n < 0 or m < 0:
            raise ValueError(f"eye needs non-negative sizes, got n={n}, m={m}")
        rows = Tensor.arange(n, device=kwargs.get("device")).reshape(n, 1)
        cols = Tensor.arange(m, device=kwargs.get("device")).reshape(1, m)
        return (rows == cols).cast(dtype or dtypes.default_float)

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        Tensor._seed, Tensor._rng_calls = int(seed), 0

    @staticmethod
    def _random_bits(shape: tuple[int, ...], device: str | None) -> Tensor:
        """uint32 random bits from Threefry-2x32 (20 rounds) over (element index, call number) with the seed as key."""
        Tensor._rng_calls += 1
        n = prod(shape)
        counter = (
            Tensor.arange(n, device=device, dtype=dtypes.uint32)
            if n < 2**31
            else Tensor.arange(n, device=device).cast(dtypes.uint32)
        )
        return threefry2x32(counter, Tensor._rng_calls, Tensor._seed).reshape(shape)

    @staticmethod
    def rand(
        *shape: Any, device: str | None = None, dtype: DTypeLike | None = None, contiguous: bool = True, **kwargs: Any
    ) -> Tensor:
        shape = check_shape(argfix(*shape))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if not dtypes.is_float(dt):
            raise ValueError(f"rand needs a float dtype, got {dt}")
        bits = Tensor._random_bits(shape, device)
        # 23 random mantissa bits under exponent 0 give a float in [1, 2)
        one_to_two = ((bits >> 9) | 0x3F800000).bitcast(dtypes.float32)
        out = (one_to_two - 1.0).cast(dt)
        return out.contiguous() if contiguous else out

    @staticmethod
    def randn(*shape: Any, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        shape = check_shape(argfix(*shape))
        u = Tensor.rand(2, *shape, device=kwargs.get("device"), contiguous=False)
        # Box-Muller: 1 - u keeps the log argument in (0, 1]
        z = ((1.0 - u[0]).log() * -2.0).sqrt() * (u[1] * (2 * math.pi)).cos()
        return z.cast(to_dtype(dtype) if dtype is not None else dtypes.default_float).contiguous()

    def rand_like(self, **kwargs: Any) -> Tensor:
        dt = kwargs.get("dtype", self.dtype)
        return self._sharded_like(lambda d: Tensor.rand(self.shape, device=d, dtype=dt), kwargs.get("device"))

    def randn_like(self, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
        dt = dtype or self.dtype
        return self._sharded_like(lambda d: Tensor.randn(self.shape, dtype=dt, device=d), kwargs.get("device"))

    @staticmethod
    def const(b: Scalar, dtype: DTypeLike | None = None) -> Tensor:
        """A device-less-looking 0-d constant (it lives on the default device until combined)."""
        return Tensor(UOp.const(to_dtype(dtype) if dtype is not None else dtypes.from_py(b), b))

    def const_like(self, b: Scalar, dtype: DTypeLike | None = None) -> Tensor:
        return Tensor.full(self.shape, b, dtype=dtype or self.dtype, device=self.device)

    @staticmethod
    def invalids(*shape: Any, device: str | None = None, dtype: DTypeLike | None = None) -> Tensor:
        return Tensor.empty(*shape, device=device, dtype=dtype)

    @staticmethod
    def from_blob(ptr: int, shape: tuple[int, ...], **kwargs: Any) -> Tensor:
        """Wrap external host memory at address ptr without copying or owning it (the caller keeps it alive)."""
        device, dt = Tensor._creation_kwargs(kwargs)
        dt = dt or dtypes.default_float
        shape = check_shape(tuple(shape))
        buf = Buffer(device, prod(shape), dt)
        nbytes = max(buf.nbytes, 1)
        buf.use_external(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), shape=(nbytes,)))
        return Tensor(buffer_uop(buf), device=device).reshape(shape)

    @staticmethod
    def from_url(url: str, gunzip: bool = False, **kwargs: Any) -> Tensor:
        from fusegrad.helpers import fetch

        return Tensor(fetch(url, gunzip=gunzip).read_bytes(), **kwargs)

    # ---- random
    @staticmethod
    def randint(*shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32, **kwargs: Any) -> Tensor:
        dt = to_dtype(dtype)
        if not isinstance(low, int) or not isinstance(high, int):
            raise TypeError(f"randint bounds must be ints, got low={low!r}, high={high!r}")
        if not dtypes.is_int(dt):
            raise TypeError(f"randint needs an integer dtype, got {dt}")
        if low >= high:
            raise ValueError(f"randint needs low < high, got low={low}, high={high}")
        shape = check_shape(argfix(*shape))
        bits = Tensor._random_bits(shape, kwargs.get("device"))
        # 64-bit arithmetic keeps ranges wider than 2**31 exact
        return ((bits.cast(dtypes.uint64) % (high - low)).cast(dtypes.int64) + low).cast(dt).contiguous()

    @staticmethod
    def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Tensor:
        if std < 0:
            raise ValueError(f"normal needs std >= 0, got {std}")
        dt = kwargs.pop("dtype", None)
        out = Tensor.randn(*shape, **kwargs) * std + mean
        return out.cast(dt) if dt is not None else out

    @staticmethod
    def uniform(
        *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None, **kwargs: Any
    ) -> Tensor:
        if low >= high:
            raise ValueError(f"uniform needs low < high, got low={low}, high={high}")
        out = Tensor.rand(*shape, contiguous=False, device=kwargs.get("device")) * (high - low) + low
        return out.cast(to_dtype(dtype) if dtype is not None else dtypes.default_float).contiguous()

    @staticmethod
    def scaled_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs) * prod(argfix(*shape)) ** -0.5

    @staticmethod
    def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        s = argfix(*shape)
        bound = math.sqrt(6 / (s[0] + prod(s[1:])))
        return Tensor.uniform(*s, low=-bound, high=bound, **kwargs)

    @staticmethod
    def kaiming_uniform(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        s = argfix(*shape)
        bound = math.sqrt(6 / (1 + a * a) / prod(s[1:]))
        return Tensor.uniform(*s, low=-bound, high=bound, **kwargs)

    @staticmethod
    def kaiming_normal(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        s = argfix(*shape)
        return Tensor.normal(*s, std=math.sqrt(2 / (1 + a * a) / prod(s[1:])), **kwargs)

    @staticmethod
    def randperm(n: int, device: str | None = None, dtype: DTypeLike = dtypes.int32, **kwargs: Any) -> Tensor:
        if n < 0:
            raise ValueError(f"randperm needs n >= 0, got {n}")
        # sorting distinct random keys gives a uniform permutation; 31 random bits plus the index break ties
        keys = Tensor._random_bits((n,), device).cast(dtypes.int64) * max(n, 1) + Tensor.arange(
            n, device=device, dtype=dtypes.int64
        )
        return keys.argsort().cast(to_dtype(dtype))
