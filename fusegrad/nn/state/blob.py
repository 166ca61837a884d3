"""Where a file's bytes live: a mapped file, a tensor's bytes, a file-like object; read as views without copies."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from fusegrad.dtype import DType, dtypes, to_numpy_dtype
from fusegrad.helpers import prod
from fusegrad.runtime.buffers import (
    Buffer,
    DiskBuffer,
    buffer_uop,
    check_mapped,
    file_mapping,
    host_values,
    is_contiguous_view,
    view_buffer,
)
from fusegrad.tensor import Tensor


class Blob:
    """A file's bytes: a range of a file on disk read through its memory map (only touched pages are read), or bytes
    in host memory. `device` is "DISK:<path>" for a file; for host bytes, the device their tensors go to."""

    def __init__(self, name: str, mem: memoryview, device: str, mapping: Any = None, offset: int = 0):
        self.name, self.mem, self.device, self.mapping, self.offset = name, mem, device, mapping, offset

    def __len__(self) -> int:
        return len(self.mem)

    def check(self, start: int, n: int, what: str) -> None:
        """Bytes [start, start + n) are inside the blob and, for a file, still on disk (a file cut short after it was
        mapped would kill the process with SIGBUS when the missing pages are read)."""
        if start < 0 or n < 0 or start + n > len(self.mem):
            raise ValueError(
                f"{self.name}: truncated: {what} needs bytes [{start}, {start + n}) but the file has {len(self.mem)}"
            )
        if self.mapping is not None:
            check_mapped(self.mapping, self.offset + start, n, f"{self.name} ({self.device[5:]})", what)

    def read(self, start: int, n: int, what: str) -> bytes:
        self.check(start, n, what)
        return bytes(self.mem[start : start + n])

    def sub(self, start: int, n: int, name: str) -> Blob:
        self.check(start, n, name)
        return Blob(name, self.mem[start : start + n], self.device, self.mapping, self.offset + start)

    def tensor(self, start: int, dtype: DType, shape: tuple[int, ...], what: str) -> Tensor:
        """The elements at byte `start`: a lazy DISK tensor for a file, else a copy of the bytes on self.device."""
        n = prod(shape)
        nbytes = n * dtype.itemsize
        if start < 0 or start + nbytes > len(self.mem):
            raise ValueError(
                f"{self.name}: truncated: {what} ({dtype}, shape {shape}) needs bytes [{start}, {start + nbytes}) "
                f"but the file has {len(self.mem)}"
            )
        self.check(start, nbytes, what)
        if self.mapping is not None:
            buf: Buffer = DiskBuffer(self.device, n, dtype, self.mapping, self.offset + start)
        else:
            raw = np.frombuffer(self.mem, np.uint8, count=nbytes, offset=start).view(to_numpy_dtype(dtype)).copy()
            buf = Buffer(self.device, n, dtype, initial=raw)
        return Tensor(buffer_uop(buf), device=self.device).reshape(shape)


def file_blob(path: str | os.PathLike) -> Blob:
    full = os.path.abspath(os.fspath(path))
    mapping = file_mapping(full)
    return Blob(os.fspath(path), memoryview(mapping), f"DISK:{full}", mapping)


def blob_of(fn: Any) -> Blob:
    """A path, or a uint8 Tensor holding a file's bytes (a DISK tensor stays lazy)."""
    if isinstance(fn, (str, os.PathLike)):
        return file_blob(fn)
    if not isinstance(fn, Tensor):
        raise TypeError(f"expected a path or a uint8 Tensor, got {type(fn).__name__}")
    if fn.dtype is not dtypes.uint8 or fn.ndim != 1:
        raise TypeError(f"expected a 1-D uint8 Tensor of file bytes, got {fn}")
    buf = view_buffer(fn.uop)
    if isinstance(buf, DiskBuffer):
        mem = memoryview(buf.mapping)[buf.offset : buf.offset + buf.nbytes]
        return Blob(
            f"{buf.device[5:]}[{buf.offset}:{buf.offset + buf.nbytes}]", mem, buf.device, buf.mapping, buf.offset
        )
    return Blob(f"<uint8 tensor of {fn.numel()} bytes on {fn.device}>", memoryview(fn.numpy()), fn.device)


def raw_bytes(t: Tensor) -> np.ndarray:
    """The tensor's stored bytes (bfloat16/fp8 bits unchanged), realized in one contiguous buffer."""
    if not is_contiguous_view(t.uop):
        t = t.contiguous()
    t.realize()
    return host_values(t.uop).view(np.uint8)


class BlobIO(io.RawIOBase):
    """A seekable read-only file over a blob, for tarfile/zipfile/pickle."""

    def __init__(self, blob: Blob):
        super().__init__()
        self.blob, self.pos = blob, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = max(0, (0, self.pos, len(self.blob))[whence] + offset)
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self.blob) - self.pos))
        self.blob.check(self.pos, n, "archive data")
        b[:n] = self.blob.mem[self.pos : self.pos + n]
        self.pos += n
        return n


def TensorIO(t: Tensor) -> io.BufferedReader:
    """A read-only, seekable file over a 1-D uint8 Tensor (a DISK tensor is read lazily)."""
    return io.BufferedReader(BlobIO(blob_of(t)))
