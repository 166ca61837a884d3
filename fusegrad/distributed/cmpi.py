"""Blocking collectives called in libmpi directly (ctypes), on memory addresses bound once: mpi4py's call parses its
buffer arguments on every call, a third of a small allreduce's time. The library is the one mpi4py loaded, the
communicator, datatype and op handles are mpi4py's, so the two share one MPI state. None where that library cannot be
found (mpi4py then makes the call)."""

from __future__ import annotations
import ctypes
from functools import partial
from typing import Any, Callable

import numpy as np

INT_MAX = 2**31 - 1  # MPI's counts are C ints here; a larger count goes through mpi4py's large-count calls


def _find_libmpi() -> ctypes.CDLL | None:
    """The libmpi mpi4py loaded (found in this process's memory map), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libmpi" in line and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)  # already loaded: only its handle; CDLL releases the GIL for the watchdog
            if hasattr(lib, "MPI_Allreduce"):
                return lib
        except OSError:
            continue
    return None


class LibMPI:
    """libmpi's blocking collectives as calls of no arguments, each bound to its buffers' addresses and handles."""

    def __init__(self, mpi: Any, lib: ctypes.CDLL):
        # numpy's type codes -> MPI's predefined datatypes: the table mpi4py's own buffer arguments use
        self.mpi, self.lib, self.types = mpi, lib, mpi._typedict
        # an MPI handle is a pointer (Open MPI) or an int (MPICH): its C type by its size
        self.handle = ctypes.c_void_p if mpi._sizeof(mpi.Comm) == ctypes.sizeof(ctypes.c_void_p) else ctypes.c_int
        for name in ("MPI_Allreduce", "MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Bcast"):
            getattr(lib, name).restype = ctypes.c_int

    def h(self, obj: Any) -> Any:
        return self.handle(self.mpi._handleof(obj))

    def bind(
        self, kind: str, comm: Any, op: Any, root: int, dst: np.ndarray, inp: np.ndarray
    ) -> Callable[[], int] | None:
        """kind's blocking call from inp into dst (their memory must outlive the call), returning MPI's error code;
        None when this kind, dtype or count is left to mpi4py."""
        count = inp.size
        if count > INT_MAX or dst.size > INT_MAX or not (dst.flags.c_contiguous and inp.flags.c_contiguous):
            return None
        if (mpi_type := self.types.get(inp.dtype.char)) is None:
            return None
        dtype = self.h(mpi_type)
        lib, c, ptr = self.lib, self.h(comm), ctypes.c_void_p
        send, recv, n = ptr(inp.ctypes.data), ptr(dst.ctypes.data), ctypes.c_int(count)
        if kind == "all_reduce":
            return partial(lib.MPI_Allreduce, send, recv, n, dtype, self.h(op), c)
        if kind == "all_gather":
            return partial(lib.MPI_Allgather, send, n, dtype, recv, n, dtype, c)
        if kind == "reduce_scatter":
            return partial(lib.MPI_Reduce_scatter_block, send, recv, ctypes.c_int(dst.size), dtype, self.h(op), c)
        if kind == "broadcast":
            return partial(lib.MPI_Bcast, recv, n, dtype, ctypes.c_int(root), c)
        return None


def libmpi(mpi: Any) -> LibMPI | None:
    """The direct calls for mpi4py's library, or None where they are not available."""
    lib = _find_libmpi()
    if lib is None:
        return None
    try:
        return LibMPI(mpi, lib)
    except AttributeError:
        return None


__all__ = ["LibMPI", "libmpi"]
