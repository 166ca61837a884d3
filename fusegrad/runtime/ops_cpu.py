"""The CPU device: C from the renderer, compiled by the system C compiler, loaded with ctypes, split over threads."""

from __future__ import annotations
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from fusegrad.helpers import CACHELEVEL, CC, DEBUG, NUM_CPU_THREADS, cache_dir
from fusegrad.renderer.cstyle import CStyleRenderer
from fusegrad.runtime.device import Buffer, HostAllocator

COMPILER_CANDIDATES = ("cc", "clang", "gcc")
# -fopenmp-simd: only the simd pragmas, no OpenMP runtime (signed data arithmetic wraps in the renderer itself)
CFLAGS = (
    "-shared",
    "-fPIC",
    "-O2",
    "-ftree-vectorize",
    "-march=native",
    "-fopenmp-simd",
    "-fno-math-errno",
    "-Werror=implicit-function-declaration",
    "-Wall",
    "-Wno-unused-variable",
    "-Wno-unused-but-set-variable",
)


class CompileError(RuntimeError):
    pass


@functools.cache
def find_compiler() -> str:
    tried = [CC.value] if CC.value else list(COMPILER_CANDIDATES)
    for name in tried:
        if (path := shutil.which(name)) is not None:
            return path
    raise RuntimeError(
        f"no C compiler found for the CPU device (tried {', '.join(tried)} on PATH); install one, "
        "e.g. `apt-get install gcc`, or set CC=/path/to/compiler"
    )


@functools.cache
def compiler_identity(cc: str) -> str:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    return f"{cc}|{version}|{platform.machine()}|{cpu}|{' '.join(CFLAGS)}"


class ClangCompiler:
    """Compiles C source to a shared object; results are cached on disk by a hash of source, flags and compiler."""

    def compile(self, src: str) -> str:
        cc = find_compiler()
        key = hashlib.sha256((compiler_identity(cc) + src).encode()).hexdigest()
        path = os.path.join(cache_dir(), "cpu", f"{key}.so")
        if CACHELEVEL >= 1 and os.path.exists(path):
            return path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "kernel.so")
            proc = subprocess.run(
                [cc, *CFLAGS, "-x", "c", "-", "-o", out, "-lm"], input=src, capture_output=True, text=True
            )
            if proc.returncode != 0 or proc.stderr.strip():
                numbered = "\n".join(f"{i + 1:4d} {ln}" for i, ln in enumerate(src.splitlines()))
                raise CompileError(
                    f"C compiler {cc} {'failed' if proc.returncode else 'warned'} on a kernel:\n{proc.stderr}\n"
                    f"--- source ---\n{numbered}"
                )
            fd, tmp_final = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".so")
            os.close(fd)
            shutil.move(out, tmp_final)
            os.replace(tmp_final, path)  # atomic: a concurrent process sees the whole file or none
        if DEBUG >= 3:
            print(f"compiled {path}")
        return path


_pool: ThreadPoolExecutor | None = None


def thread_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(
            max_workers=max(int(NUM_CPU_THREADS.value) - 1, 1), thread_name_prefix="fusegrad-cpu"
        )
    return _pool


class CPUProgram:
    """A loaded kernel; ctypes releases the GIL during the call, so chunks of the outer loop run in parallel."""

    MIN_OPS_PER_THREAD = 1 << 17

    def __init__(self, name: str, lib_path: str, nparams: int, outer_size: int, ops: int):
        self.lib = ctypes.CDLL(lib_path)
        self.fn = getattr(self.lib, name)
        self.fn.argtypes = [ctypes.c_void_p] * nparams + [ctypes.c_longlong, ctypes.c_longlong]
        self.fn.restype = None
        self.outer_size, self.ops, self.nparams = outer_size, ops, nparams

    def __call__(self, buffers: list[Buffer]) -> None:
        if len(buffers) != self.nparams:
            raise RuntimeError(f"kernel takes {self.nparams} buffers, got {len(buffers)}")
        addrs = [b.address() for b in buffers]
        threads = int(NUM_CPU_THREADS.value)
        if threads <= 1 or self.outer_size < 2 or self.ops < self.MIN_OPS_PER_THREAD * 2:
            self.fn(*addrs, 0, self.outer_size)
            return
        n = min(threads, self.outer_size, max(self.ops // self.MIN_OPS_PER_THREAD, 1))
        bounds = [self.outer_size * i // n for i in range(n + 1)]
        futures = [thread_pool().submit(self.fn, *addrs, bounds[i], bounds[i + 1]) for i in range(1, n)]
        self.fn(*addrs, bounds[0], bounds[1])
        for f in futures:
            f.result()


class CpuDevice:
    def __init__(self, name: str):
        self.device = name
        self.allocator = HostAllocator()
        self.renderer = CStyleRenderer()
        self.compiler = ClangCompiler()

    def build(self, info) -> CPUProgram:
        src = self.renderer.render(info.name, info.lin)
        if DEBUG >= 4:
            print(src)
        return CPUProgram(info.name, self.compiler.compile(src), info.nparams, info.outer_size, info.ops_estimate)

    def synchronize(self) -> None:
        pass
