"""Where tensor data lives, for the front end: the BUFFER node -> Buffer table, host copies of a tensor's buffer, and
buffers over files. The front end and nn reach device memory only through here, never through a device module."""

from __future__ import annotations
import itertools
import mmap
from fusegrad.lazy_numpy import np
from typing import Sequence
from fusegrad.dtype import DType
from fusegrad.runtime.device import Buffer, Device, HostAllocator
from fusegrad.uop.ops import GroupOp, Ops, UOp, UOpMeta, is_contiguous_view

__all__ = [
    "Buffer",
    "DiskBuffer",
    "buffer_of",
    "buffer_uop",
    "base_buffer",
    "canonical_device",
    "default_device",
    "file_mapping",
    "is_contiguous_view",
    "view_buffer",
]


def default_device() -> str:
    """The device a tensor gets when none is named (DEV=..., else the best one installed)."""
    return Device.DEFAULT


def file_mapping(path: str):
    """The read-only memory map of a file, through the DISK device that owns it."""
    return Device[f"DISK:{path}"].mapping()


def canonical_device(device: str | Sequence[str] | None) -> str | tuple[str, ...]:
    """A device string, or a tuple of them for a multi-device placement (a 1-tuple is its one device)."""
    if isinstance(device, (tuple, list)):
        devices = tuple(Device.canonicalize(d) for d in device)
        if not devices:
            raise RuntimeError("a multi-device placement needs at least one device")
        return devices[0] if len(devices) == 1 else devices
    return Device.canonicalize(device)


class BufferTable:
    """BUFFER uop -> its storage; several uops (versions, after an assign) may share one Buffer. The Buffer is kept on
    the node (its `_buf` slot): a weak-keyed table would build a weak reference per lookup and per entry, and every
    realize makes and drops a few."""

    __slots__ = ()

    def __getitem__(self, u: UOp) -> Buffer:
        if (buf := u._buf) is None:
            raise KeyError(u)
        return buf

    def get(self, u: UOp, default: Buffer | None = None) -> Buffer | None:
        buf = u._buf
        return default if buf is None else buf

    def __setitem__(self, u: UOp, buf: Buffer) -> None:
        if u.op is not Ops.BUFFER:
            raise ValueError(f"only a BUFFER node has storage, not {u.op}")
        u.buffer = buf

    def __contains__(self, u: object) -> bool:
        return getattr(u, "_buf", None) is not None


buffer_of = BufferTable()

_unique = itertools.count()


def next_buffer_id() -> int:
    """An id no BUFFER node made so far has: nodes made from now on have larger ones (@function's trace start)."""
    return next(_unique)


def buffer_uop(buf: Buffer) -> UOp:
    """A fresh BUFFER node (a new version) for an existing Buffer."""
    return UOpMeta.new_buffer(buf.dtype, (next(_unique), buf.device, buf.size), buf)


def buffer_holding(device: str, size: int, dtype: DType, data: np.ndarray, owned: bool) -> Buffer:
    """A Buffer holding a copy of host data (of dtype's storage type): in host memory copied now, once, into a block
    the allocator reuses (a copy kept for later is a second copy, into fresh pages every time: a training loop's new
    batch each step); elsewhere kept until the first allocation, copied first unless `owned` (nobody else writes it)."""
    if type(Device[device].allocator) is not HostAllocator:
        return Buffer(device, size, dtype, initial=data if owned else np.array(data, copy=True, order="C"))
    buf = Buffer(device, size, dtype)
    buf.copyin(data)
    return buf


def base_buffer(u: UOp) -> UOp | None:
    """The BUFFER under a chain of movement ops, if u is only a view of one."""
    u = u.peel(GroupOp.Movement)
    return u if u.op is Ops.BUFFER else None


def view_buffer(u: UOp) -> Buffer | None:
    """The Buffer that u reads in order (u is reshapes of one BUFFER), else None."""
    return base.buffer if is_contiguous_view(u) and (base := base_buffer(u)) is not None else None


def read_values(u: UOp) -> np.ndarray:
    """A host copy of the buffer that the contiguous view u reads: flat, of the storage dtype, on any device."""
    buf = view_buffer(u)
    if buf is None:
        raise RuntimeError(f"{u.op} is not a realized contiguous buffer view: realize it first")
    return buf.numpy()


def host_values(u: UOp) -> np.ndarray:
    """Like read_values, without a copy when the buffer already is in host memory (a view: do not write to it)."""
    buf = view_buffer(u)
    if buf is None:
        raise RuntimeError(f"{u.op} is not a realized contiguous buffer view: realize it first")
    return buf.host_view() if buf.is_host else buf.numpy()


def copy_to_device(u: UOp, src_device: str, device: str) -> UOp:
    """u (on src_device) copied to `device`; a device that cannot compute (DISK) plans the copy of a view itself."""
    plan = getattr(Device[src_device], "plan_copy", None)
    return plan(u, device) if plan is not None else UOp(Ops.COPY, u.dtype, (u,), device)


class DiskBuffer(Buffer):
    """`size` elements of `dtype` at byte `offset` of a file mapping (the DISK device); nothing is read until the buffer
    is used."""

    def __init__(self, device: str, size: int, dtype: DType, mapping: mmap.mmap | bytes, offset: int):
        super().__init__(device, size, dtype)
        self.mapping, self.offset = mapping, offset

    @property
    def is_host(self) -> bool:
        return True

    def ensure_allocated(self) -> Buffer:
        # a view of the mapping, not host memory: it is not counted in GlobalCounters.mem_used
        if self._mem is None:
            check_mapped(self.mapping, self.offset, self.nbytes, self.device[5:], "tensor")
            self._mem = np.frombuffer(self.mapping, np.uint8, count=self.nbytes, offset=self.offset)
        return self

    def host_view(self) -> np.ndarray:
        # every read out of the mapping goes through here: a file cut short since loading must not be touched
        check_mapped(self.mapping, self.offset, self.nbytes, self.device[5:], "tensor")
        return super().host_view()


def file_buffer(path: str, dtype: DType) -> DiskBuffer:
    """A DISK buffer over a whole file, as elements of dtype."""
    device = Device.canonicalize(f"DISK:{path}")
    mapping = Device[device].mapping()
    return DiskBuffer(device, len(mapping) // dtype.itemsize, dtype, mapping, 0)


def check_mapped(mapping: mmap.mmap | bytes, start: int, nbytes: int, path: str, what: str) -> None:
    """Raise ValueError unless bytes [start, start + nbytes) of the mapped file still exist: reading mapped pages past
    the end of a file that shrank after it was mapped kills the process with SIGBUS."""
    size = mapping.size() if isinstance(mapping, mmap.mmap) else len(mapping)
    if start < 0 or nbytes < 0 or start + nbytes > size:
        raise ValueError(
            f"{path}: {what} needs bytes [{start}, {start + nbytes}) but the file now has {size} "
            f"(it was {len(mapping)} bytes when mapped: changed on disk after loading)"
        )
