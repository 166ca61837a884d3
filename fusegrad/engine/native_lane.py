"""TinyJit's steady lane as a C call (steady_lane.c): a CPython extension compiled on this machine like the kernels,
cached on disk, built on a background thread once a loop has shown it is worth it and loaded in milliseconds after.

A TinyJit whose lane has run NATIVE_AFTER times switches its class to `native_class()`, a subclass whose call is the
C function: the lane's checks, the replay's thunks and the hand-out of the returned tensor without an interpreter
frame; everything else goes to TinyJit.__call__, unchanged. Where no compiler or no Python headers are found, nothing
switches and the Python lane goes on (DEBUG=1 says why once)."""

from __future__ import annotations
import atexit
import hashlib
import os
import sys
import threading
from typing import Any
from fusegrad.helpers import CACHELEVEL, CCACHE, DEBUG

NATIVE_AFTER = 64  # lane runs of one TinyJit before it asks for the C lane: a loop, not a script's few calls
MODULE = "fusegrad_steady_lane"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "steady_lane.c")

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "class": the switched-to class once loaded (None: cannot build); "thread": the builder


def native_class(base: type) -> type | None:
    """The C-lane subclass of TinyJit `base` when the extension is loaded; else None, after starting its build on a
    background thread (or loading it at once when the disk cache has it)."""
    if (cls := _state.get("class", False)) is not False:
        return cls
    with _lock:
        if "class" in _state or "thread" in _state:
            return _state.get("class")
        try:
            build = _Build()
        except (OSError, RuntimeError) as e:  # no compiler, no headers
            return _give_up(e)
        if build.cached() is not None:
            _load(build, base)
            return _state["class"]
        builder = threading.Thread(target=_load, args=(build, base), name="fusegrad-lane-build", daemon=True)
        _state["thread"] = builder
        builder.start()
        atexit.register(builder.join)  # a process that ends first still leaves the compiler no temp files
    return None


def built_class(base: type) -> type | None:
    """native_class(base), waiting for a build in progress: for tests and benchmarks that need the C lane now."""
    if (cls := native_class(base)) is None and (builder := _state.get("thread")) is not None:
        builder.join()
        cls = _state.get("class")
    return cls


def lane_state(known: Any, cap: Any, lane: Any) -> tuple:
    """The tuple steady_lane.c reads as the known call's `c_lane` (its enum L_* gives the order): what the Python lane
    compares and runs, with the replay's counts; held by the known call, it goes when that goes, as the lane does. A
    thunk that calls one C function says so in its `c_call` attribute (its address, its argument's address, and for a
    watched MPI call World.watched's bookkeeping: see run_thunk in the C), and the lane calls that function itself;
    the thunks stay held by lane.steady, and with them what the addresses point at."""
    return (
        lane,
        cap,
        lane.steady,
        tuple(getattr(t, "c_call", t) for t in lane.steady[0]),  # a C function's thunk: its description
        known.uops,
        len(cap.launches),
        cap.ops,
        cap.mem,
        lane.uop,
        lane.device,
        lane.attrs,
        lane.held,
    )


class _Build:
    """The compiler command and cache key of the extension for this interpreter and compiler."""

    def __init__(self):
        # imported here, as the build needs them: `import fusegrad` loads none of them (its time is a target)
        import sysconfig
        from fusegrad.runtime.c_compiler import find_compiler
        from fusegrad.runtime.ops_cpu import CFLAGS, build_id
        from fusegrad.runtime.kernel_cache import KernelCache

        paths = sysconfig.get_paths()
        includes = list(dict.fromkeys([paths["include"], paths["platinclude"]]))
        if not os.path.exists(os.path.join(includes[0], "Python.h")):
            raise RuntimeError(f"no Python.h under {includes[0]} (the Python development headers are not installed)")
        self.cc = find_compiler()
        with open(SOURCE) as f:
            self.src = f.read()
        undefined = ("-undefined", "dynamic_lookup") if sys.platform == "darwin" else ()
        self.flags = (*CFLAGS, *[f"-I{d}" for d in includes], *undefined)
        ident = f"{build_id(self.cc)}|{sys.version}|{sys.implementation.cache_tag}|{' '.join(self.flags)}"
        self.key = hashlib.sha256(f"{ident}\n{self.src}".encode()).hexdigest()
        self.cache = KernelCache("cpu-ext", ".so")

    def cached(self) -> str | None:
        return self.cache.lookup(self.key) if CACHELEVEL >= 1 and CCACHE else None

    def path(self) -> str:
        """The built extension's path: from the disk cache, or compiled now and stored there."""
        if (path := self.cached()) is not None:
            return path
        import tempfile
        from fusegrad.runtime.c_compiler import CompileError
        from fusegrad.runtime.ops_cpu import run_compiler

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, f"{MODULE}.so")
            proc = run_compiler([self.cc, *self.flags, "-x", "c", "-", "-o", out], self.src, "compiling the C lane")
            if proc.returncode != 0 or proc.stderr.strip() or not os.path.exists(out):
                raise CompileError(f"C compiler {self.cc} on {SOURCE}:\n{proc.stderr}")
            return self.cache.store(self.key, out)


def _load(build: _Build, base: type) -> None:
    import importlib.machinery
    import importlib.util

    try:
        path = build.path()
        loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        _state["class"] = _subclass(module, base)
    except Exception as e:  # a speed-up, not a feature: whatever fails leaves the Python lane, which does it all
        _give_up(e)


def _subclass(module: Any, base: type) -> type:
    """TinyJit with the C call: LaneBase comes after TinyJit in the bases, so instances keep TinyJit's layout and can
    switch class, and its call slot is named in the class itself, so the C function is the type's call."""
    from fusegrad.engine.realize import capturing, realize_lock
    from fusegrad.helpers import _UNSET, JIT, GlobalCounters, Hooks
    from fusegrad.tensor import Tensor

    module.configure(Tensor, capturing, JIT, DEBUG, _UNSET, Hooks, GlobalCounters, base.__call__, realize_lock)

    def __reduce_ex__(self, protocol: int) -> tuple:
        return object.__new__, (base,), self.__getstate__()  # pickles (and copies) as the TinyJit it is

    attrs = {
        "__call__": module.LaneBase.__call__,
        "__reduce_ex__": __reduce_ex__,
        "__module__": base.__module__,
        "native_lane": True,
    }
    cls = type(base.__name__, (base, module.LaneBase), attrs)
    cls.__qualname__, cls.__doc__ = base.__qualname__, base.__doc__
    return cls


def _give_up(e: Exception) -> None:
    _state["class"] = None
    if DEBUG >= 1:
        print(f"TinyJit's steady lane stays in Python: its C version did not build ({e})")
