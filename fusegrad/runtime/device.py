"""Device registry, Buffer and the host allocator shared by the CPU and PYTHON devices."""

from __future__ import annotations
import functools
import importlib
import threading
import weakref
from typing import Any
import numpy as np
from fusegrad.dtype import DType, to_numpy_dtype
from fusegrad.helpers import DEV, GlobalCounters


class HostAllocator:
    """64-byte aligned host memory backed by numpy, so copies in and out are plain numpy copies."""

    def alloc(self, nbytes: int) -> np.ndarray:
        raw = np.empty(max(nbytes, 1) + 64, dtype=np.uint8)
        offset = (-raw.ctypes.data) % 64
        return raw[offset : offset + max(nbytes, 1)]


class Buffer:
    """Device memory for `size` elements of `dtype`; allocated on first use, freed when unreferenced."""

    def __init__(self, device: str, size: int, dtype: DType, initial: np.ndarray | None = None):
        self.device, self.size, self.dtype = device, size, dtype
        self._mem: np.ndarray | None = None
        self._initial = initial  # host data copied in on first allocation

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_allocated(self) -> bool:
        return self._mem is not None

    def ensure_allocated(self) -> Buffer:
        if self._mem is None:
            self._mem = Device[self.device].allocator.alloc(self.nbytes)
            GlobalCounters.mem_used += self.nbytes
            GlobalCounters.mem_used_per_device[self.device] = (
                GlobalCounters.mem_used_per_device.get(self.device, 0) + self.nbytes
            )
            weakref.finalize(self, _account_free, self.device, self.nbytes)
            if self._initial is not None:
                self.host_view()[:] = self._initial.reshape(-1)
                self._initial = None
        return self

    def use_external(self, mem: np.ndarray) -> None:
        """Back this buffer by memory someone else owns (from_blob); it is neither copied nor freed here."""
        self._mem, self._initial = mem, None

    def host_view(self) -> np.ndarray:
        """The buffer's memory as a flat numpy array of its storage dtype (no copy)."""
        self.ensure_allocated()
        assert self._mem is not None
        return self._mem[: self.nbytes].view(to_numpy_dtype(self.dtype))

    def address(self) -> int:
        return self.ensure_allocated()._mem.ctypes.data  # type: ignore[union-attr]

    def copyin(self, data: np.ndarray) -> None:
        self.host_view()[:] = data.reshape(-1)

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.size} {self.dtype}>"


def _account_free(device: str, nbytes: int) -> None:
    GlobalCounters.mem_used -= nbytes
    GlobalCounters.mem_used_per_device[device] = GlobalCounters.mem_used_per_device.get(device, 0) - nbytes


class _DeviceRegistry:
    """`Device["CPU"]` opens (once) the device implemented by runtime/ops_<name>.py."""

    def __init__(self):
        self._opened: dict[str, Any] = {}
        self._lock = threading.Lock()  # threads opening one device at once get the same instance

    @staticmethod
    def canonicalize(name: str | None) -> str:
        if name is None:
            return Device.DEFAULT
        if not isinstance(name, str):
            raise TypeError(f"device must be a string, got {type(name).__name__} {name!r}")
        if name.upper().startswith("DISK:"):
            return "DISK:" + name[5:]
        base, _, idx = name.partition(":")
        base = base.upper()
        if base not in _known_devices():
            raise RuntimeError(f"unknown device {name!r}; available device types: {sorted(_known_devices())}")
        return base if idx in ("", "0") else f"{base}:{idx}"

    def __getitem__(self, name: str) -> Any:
        name = self.canonicalize(name)
        if (dev := self._opened.get(name)) is not None:
            return dev
        with self._lock:
            if name not in self._opened:
                base = name.split(":")[0]
                module = importlib.import_module(f"fusegrad.runtime.ops_{base.lower()}")
                self._opened[name] = getattr(module, f"{base.capitalize()}Device")(name)
            return self._opened[name]

    @property
    def DEFAULT(self) -> str:
        return self.canonicalize(DEV.value) if DEV.value else "CPU"

    @DEFAULT.setter
    def DEFAULT(self, name: str) -> None:
        DEV.value = self.canonicalize(name)

    @property
    def default(self) -> Any:
        return self[self.DEFAULT]

    def get_available_devices(self):
        for base in sorted(_known_devices()):
            try:
                self[base]
                yield base
            except Exception:
                pass


@functools.cache
def _known_devices() -> frozenset[str]:
    import pkgutil
    import fusegrad.runtime as rt

    return frozenset(m.name[4:].upper() for m in pkgutil.iter_modules(rt.__path__) if m.name.startswith("ops_"))


Device = _DeviceRegistry()
