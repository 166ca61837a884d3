"""Blocking collectives called in libmpi directly, on memory addresses bound once: mpi4py's call parses its buffer
arguments on every call, a third of a small allreduce's time. The library is the one mpi4py loaded, the communicator,
datatype and op handles are mpi4py's, so the two share one MPI state. None where that library cannot be found (mpi4py
then makes the call).

A bound call is one C function of one argument (a small shim compiled by the CPU device's compiler, given libmpi's
function and the arguments in a struct): ctypes converts one pointer per call instead of six or seven arguments,
0.46 -> 0.18 us a call here. Where the shim does not build, ctypes calls libmpi with the arguments themselves."""

from __future__ import annotations
import ctypes
from functools import partial
from typing import Any, Callable

import numpy as np

from fusegrad.runtime.device import Device

INT_MAX = 2**31 - 1  # MPI's counts are C ints here; a larger count goes through mpi4py's large-count calls
# each collective's libmpi function and its number in the shim (MPI_Reduce_scatter_block has MPI_Allreduce's signature)
CALLS = {
    "all_reduce": ("MPI_Allreduce", 0),
    "all_gather": ("MPI_Allgather", 1),
    "reduce_scatter": ("MPI_Reduce_scatter_block", 0),
    "broadcast": ("MPI_Bcast", 2),
}
SHIM = """typedef FG_HANDLE fg_h;
struct fg_mpi_call { void *fn; const void *send; void *recv; fg_h dtype, op, comm; int kind, count, root; };
typedef int (*fg_allreduce)(const void *, void *, int, fg_h, fg_h, fg_h);
typedef int (*fg_allgather)(const void *, int, fg_h, void *, int, fg_h, fg_h);
typedef int (*fg_bcast)(void *, int, fg_h, int, fg_h);
/* one blocking collective: libmpi's function on its bound arguments (cmpi.CALLS numbers the signatures) */
int fg_mpi_call(const struct fg_mpi_call *c) {
  if (c->kind == 0) return ((fg_allreduce)c->fn)(c->send, c->recv, c->count, c->dtype, c->op, c->comm);
  if (c->kind == 1) return ((fg_allgather)c->fn)(c->send, c->count, c->dtype, c->recv, c->count, c->dtype, c->comm);
  return ((fg_bcast)c->fn)(c->recv, c->count, c->dtype, c->root, c->comm);
}
"""


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
    """libmpi's blocking collectives as calls of no arguments, each bound to its buffers' addresses and handles (through
    the shim where it built)."""

    def __init__(self, mpi: Any, lib: ctypes.CDLL):
        # numpy's type codes -> MPI's predefined datatypes: the table mpi4py's own buffer arguments use
        self.mpi, self.lib, self.types = mpi, lib, mpi._typedict
        # an MPI handle is a pointer (Open MPI) or an int (MPICH): its C type by its size
        self.handle = ctypes.c_void_p if mpi._sizeof(mpi.Comm) == ctypes.sizeof(ctypes.c_void_p) else ctypes.c_int
        for name in ("MPI_Allreduce", "MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Bcast"):
            getattr(lib, name).restype = ctypes.c_int
        self.shim, self.struct = _shim(self.handle)
        self.fns = {fn: ctypes.cast(getattr(lib, fn), ctypes.c_void_p).value for fn, _ in CALLS.values()}

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
        if kind not in CALLS or (mpi_type := self.types.get(inp.dtype.char)) is None:
            return None
        if kind == "reduce_scatter":
            count = dst.size  # each rank's block
        if self.shim is not None:
            fn, code = CALLS[kind]
            handle = self.mpi._handleof
            args = self.struct(
                self.fns[fn], inp.ctypes.data, dst.ctypes.data, handle(mpi_type), 0 if op is None else handle(op),
                handle(comm), code, count, root,
            )  # fmt: skip
            call = partial(self.shim, ctypes.byref(args))  # the byref keeps the struct alive
            # described for a caller in C (TinyJit's C lane): the shim's address and its argument's
            call.c_call = (ctypes.cast(self.shim, ctypes.c_void_p).value, ctypes.addressof(args))
            return call
        lib, c, dtype, ptr = self.lib, self.h(comm), self.h(mpi_type), ctypes.c_void_p
        send, recv, n = ptr(inp.ctypes.data), ptr(dst.ctypes.data), ctypes.c_int(count)
        if kind == "all_reduce":
            return partial(lib.MPI_Allreduce, send, recv, n, dtype, self.h(op), c)
        if kind == "all_gather":
            return partial(lib.MPI_Allgather, send, n, dtype, recv, n, dtype, c)
        if kind == "reduce_scatter":
            return partial(lib.MPI_Reduce_scatter_block, send, recv, n, dtype, self.h(op), c)
        return partial(lib.MPI_Bcast, recv, n, dtype, ctypes.c_int(root), c)


def libmpi(mpi: Any) -> LibMPI | None:
    """The direct calls for mpi4py's library, or None where they are not available."""
    lib = _find_libmpi()
    if lib is None:
        return None
    try:
        return LibMPI(mpi, lib)
    except AttributeError:
        return None


_shims: dict[Any, tuple[Any, Any]] = {}  # handle type -> (the shim's function or None, its struct type)


def _shim(handle: Any) -> tuple[Any, Any]:
    """The compiled shim's fg_mpi_call for this handle type (None where the CPU device's compiler cannot build it) and
    the ctypes struct it reads."""
    if handle in _shims:
        return _shims[handle]

    class Call(ctypes.Structure):
        _fields_ = [("fn", ctypes.c_void_p), ("send", ctypes.c_void_p), ("recv", ctypes.c_void_p)]
        _fields_ += [(name, handle) for name in ("dtype", "op", "comm")]
        _fields_ += [(name, ctypes.c_int) for name in ("kind", "count", "root")]

    c_type = "void *" if handle is ctypes.c_void_p else "int"
    try:
        lib = Device["CPU"].compiler.load(f"#define FG_HANDLE {c_type}\n" + SHIM, "fg_mpi_call")
        fn = lib.fg_mpi_call  # no argtypes: ctypes passes the byref as is, the fastest conversion it has
        fn.restype = ctypes.c_int
    except (RuntimeError, AttributeError, OSError):  # no C compiler (CompileError is a RuntimeError), no cache to write
        fn = None
    _shims[handle] = (fn, Call)
    return _shims[handle]


__all__ = ["LibMPI", "libmpi"]
