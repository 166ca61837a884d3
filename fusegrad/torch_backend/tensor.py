"""FuseTensor: a torch tensor on the `fuse` device whose values are a view of a lazy fusegrad storage."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from fusegrad.helpers import FUSE_DEVICE, prod
from fusegrad.runtime.device import Device
from fusegrad.tensor import Tensor

from .dtypes import from_numpy, to_fuse_dtype, to_numpy, to_torch_dtype
from .views import contiguous_strides, read_view, write_view

# a sync realizes every storage written since the last one; past this many writes a write realizes them itself
MAX_PENDING_WRITES = 256


class Storage:
    """The flat lazy value behind a `fuse` tensor and its views; a write replaces `value` by a new graph."""

    __slots__ = ("value", "__weakref__")

    def __init__(self, value: Tensor):
        self.value = value


_dirty: weakref.WeakSet[Storage] = weakref.WeakSet()
_writes = [0]
# errors of ops run on autograd's device thread, raised by the next op or sync on the main thread
_deferred: list[Exception] = []


def fuse_device_name(index: int | None) -> str:
    """The fusegrad device that `fuse:index` runs on: FUSE_DEVICE (or the default device), then its index."""
    base = FUSE_DEVICE.value or Device.DEFAULT
    try:
        base = Device.canonicalize(base)
    except Exception as e:
        raise RuntimeError(f"FUSE_DEVICE={base!r} names no fusegrad device: {e}") from e
    return base if not index else f"{base.split(':')[0]}:{index}"


class FuseTensor(torch.Tensor):
    _fuse_storage: Storage

    @staticmethod
    def __new__(
        cls, storage: Storage, size: tuple, stride: tuple, offset: int, dtype: torch.dtype, index: int
    ) -> FuseTensor:
        t = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype, device=torch.device("fuse", index)
        )
        t._fuse_storage = storage
        return t

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()

    # dispatch.py installs itself here: every aten op on a FuseTensor goes to it
    dispatcher: Any = None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls.dispatcher(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        text = repr(to_cpu(self))
        return text[:-1] + f", device='{self.device}')" if text.endswith(")") else text

    def tolist(self) -> Any:
        return to_cpu(self).tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
            "memory first."
        )

    @property
    def fuse_device(self) -> str:
        return fuse_device_name(self.device.index)

    def fuse_value(self) -> Tensor:
        """The fusegrad Tensor this view reads (lazy)."""
        return read_view(self._fuse_storage.value, tuple(self.shape), self.stride(), self.storage_offset())

    def fuse_write(self, value: Tensor) -> None:
        """Write `value` (broadcast to this view and cast to its dtype) into the storage, so every alias sees it."""
        dt = to_fuse_dtype(self.dtype)
        value = value.cast(dt) if value.dtype != dt else value
        size = tuple(self.shape)
        if tuple(value.shape) != size:
            value = value.reshape((1,) * (len(size) - value.ndim) + tuple(value.shape)).expand(size)
        st = self._fuse_storage
        st.value = write_view(st.value, tuple(self.shape), self.stride(), self.storage_offset(), value)
        _dirty.add(st)
        _writes[0] += 1
        if _writes[0] > MAX_PENDING_WRITES:
            sync()


def wrap(value: Tensor, index: int) -> FuseTensor:
    """A fresh contiguous `fuse` tensor holding `value`."""
    size = tuple(value.shape)
    flat = value.reshape(prod(size)) if value.ndim != 1 else value
    return FuseTensor(Storage(flat), size, contiguous_strides(size), 0, to_torch_dtype(value.dtype), index)


def from_cpu(t: torch.Tensor, index: int, dtype: torch.dtype | None = None) -> FuseTensor:
    arr, bits_of = to_numpy(t if dtype is None or dtype == t.dtype else t.to(dtype))
    value = Tensor(arr, device=fuse_device_name(index))
    return wrap(value.bitcast(bits_of) if bits_of is not None else value, index)


def sync(*values: Tensor) -> None:
    """Realize `values` with every storage written since the last sync, in one schedule."""
    if _deferred:
        raise _deferred.pop(0)
    pending = list(_dirty)
    _dirty.clear()
    _writes[0] = 0
    if not values and not pending:
        return
    Tensor.realize(*values, *(st.value for st in pending))


def to_cpu(t: FuseTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    value = t.fuse_value()
    sync(value)
    out = from_numpy(value.numpy(), t.dtype)
    return out if dtype is None else out.to(dtype)
