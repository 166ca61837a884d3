"""The DISK device: tensors backed by byte ranges of a file, memory-mapped when first read; copies only, no compute."""

from __future__ import annotations
import mmap
import os
from typing import Mapping
import numpy as np
from fusegrad.helpers import prod
from fusegrad.runtime.buffers import DiskBuffer, buffer_of
from fusegrad.runtime.device import Allocator, Buffer, Compiled
from fusegrad.uop.ops import GroupOp, Ops, UOp, view_over


def disk_view(u: UOp, table: Mapping[UOp, Buffer] = buffer_of) -> DiskBuffer | None:
    """A DiskBuffer over the bytes `u` reads when u is reshapes and slices of a DISK buffer that read one contiguous
    range in order (t[2:5], rows of a matrix): such a view needs no kernel, only a new offset into the mapping."""
    u, chain = u.peel_chain((Ops.RESHAPE, Ops.SHRINK))
    if u.op is not Ops.BUFFER or not isinstance(base := table.get(u), DiskBuffer):
        return None
    start = 0  # first element read, in the base buffer
    for node in reversed(chain):
        if node.op is not Ops.SHRINK or prod(node.shape) == 0:
            continue
        shape = node.src[0].shape
        partial = [i for i, (lo, hi) in enumerate(node.arg) if hi - lo != shape[i]]
        # in order and contiguous: the dims after the last sliced one are whole, the dims before it are single indices
        if partial and any(hi - lo != 1 for lo, hi in node.arg[: partial[-1]]):
            return None
        start += sum(lo * prod(shape[i + 1 :]) for i, (lo, _) in enumerate(node.arg))
    size = prod(chain[0].shape) if chain else base.size
    return DiskBuffer(base.device, size, base.dtype, base.mapping, base.offset + start * base.dtype.itemsize)


def copy_off_disk(u: UOp, device: str) -> UOp:
    """`u` (on DISK) copied to `device`: one copy of the bytes it reads when that is a contiguous range of a file; for
    any other view (strided slices, transposes) the viewed tensor is copied and the view is taken on `device`. Compute
    is not moved: DISK never runs it, so `(t + 1).to("CPU")` still fails when realized."""
    base = u.peel(GroupOp.Movement)
    if base.op is not Ops.BUFFER or base is u or disk_view(u) is not None:
        return UOp(Ops.COPY, u.dtype, (u,), device)
    return view_over(u, UOp(Ops.COPY, base.dtype, (base,), device))


class DiskAllocator(Allocator):
    host = True  # a DiskBuffer's memory is its file mapping, a host numpy view

    def __init__(self, device: str):
        self.device = device

    def alloc(self, nbytes: int) -> np.ndarray:
        raise RuntimeError(
            f"{self.device} is read-only: DISK tensors come from the loaders in fusegrad.nn.state; "
            "write files with nn.state.safe_save"
        )


class DiskDevice(Compiled):
    """One file. The mapping is shared by all buffers of the file as it is now; a changed file is mapped anew."""

    def __init__(self, name: str):
        super().__init__(name, DiskAllocator(name), None, None, None)
        self.path = name.partition(":")[2]
        self._stamp: tuple[int, int, int] | None = None
        self._mapping: mmap.mmap | bytes = b""

    def mapping(self) -> mmap.mmap | bytes:
        """A read-only map of the whole file; mapping reads nothing, pages are read when a buffer touches them."""
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise FileNotFoundError(f"{self.device}: cannot open {self.path!r}: {e.strerror}") from None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp:
            with open(self.path, "rb") as f:
                # a replaced file gets a new mapping; buffers made earlier keep the old one (and its old bytes)
                self._mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if st.st_size else b""
            self._stamp = stamp
        return self._mapping

    def plan_copy(self, u: UOp, device: str) -> UOp:
        return copy_off_disk(u, device)

    def refuse_kernels(self):
        raise RuntimeError(
            f"{self.device} cannot run kernels (a kernel was scheduled on it): a file is read whole or in "
            "contiguous slices; "
            "move the tensor with .to('CPU') first, then compute or slice it there"
        )
