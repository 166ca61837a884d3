"""The CPU device: C from the renderer, compiled by the system C compiler, loaded with ctypes, split over threads."""

from __future__ import annotations
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from fusegrad.helpers import CACHELEVEL, CC, CCACHE, COMPILE_TIMEOUT, DEBUG, NUM_CPU_THREADS, cache_dir
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


def find_compiler() -> str:
    return _locate_compiler(CC.value)


@functools.cache
def _locate_compiler(requested: str) -> str:
    tried = [requested] if requested else list(COMPILER_CANDIDATES)
    for name in tried:
        if (path := shutil.which(name)) is not None:
            return path
    raise RuntimeError(
        f"no C compiler found for the CPU device (tried {', '.join(tried)} on PATH); install one, "
        "e.g. `apt-get install gcc`, or set CC=/path/to/compiler"
    )


def run_compiler(argv: list[str], stdin: str, what: str) -> subprocess.CompletedProcess:
    """Run the compiler in its own process group; past COMPILE_TIMEOUT seconds (0: no limit) the group is killed."""
    timeout = float(COMPILE_TIMEOUT.value)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a compiler driver's children (cc1, as, ld) are killed with it
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout if timeout > 0 else None)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise CompileError(
            f"C compiler {argv[0]} did not finish {what} within {timeout:g} s (COMPILE_TIMEOUT={timeout:g}); "
            "raise COMPILE_TIMEOUT or set CC to another compiler"
        ) from None
    except BaseException:
        _kill_group(proc)  # Ctrl-C: in its own session the compiler does not get the terminal's SIGINT
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it finished meanwhile
    proc.communicate()


@functools.cache
def compiler_identity(cc: str) -> str:
    version = run_compiler([cc, "--version"], "", "reporting its version").stdout.splitlines()[:1]
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    return f"{cc}|{version}|{platform.machine()}|{cpu}|{' '.join(CFLAGS)}"


def _sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class KernelCache:
    """Compiled kernels on disk, each `<key>.so` next to `<key>.sha256` (its content hash). A file whose hash does not
    match (truncated, zero bytes, garbage) is never loaded: it is deleted and compiled again. When the cache directory
    cannot be written, a temporary directory takes its place for the rest of the process, with one warning."""

    def __init__(self):
        self.fallback: str | None = None

    def dirs(self) -> list[str]:
        return [os.path.join(cache_dir(), "cpu")] + ([self.fallback] if self.fallback else [])

    def lookup(self, key: str) -> str | None:
        for d in self.dirs():
            path = os.path.join(d, f"{key}.so")
            if not os.path.exists(path):
                continue
            try:
                with open(os.path.join(d, f"{key}.sha256")) as f:
                    expected = f.read().strip()
                if _sha256_file(path) == expected:
                    return path
            except OSError:
                pass  # no or unreadable checksum: the binary is not trusted
            self.evict(path)
        return None

    def evict(self, path: str) -> None:
        for p in (path, path[: -len(".so")] + ".sha256"):
            try:
                os.unlink(p)
            except OSError:
                pass  # a read-only cache keeps the bad file; lookup then skips it and the fallback holds the good one

    def store(self, key: str, built: str) -> str:
        try:
            return self._store_in(os.path.join(cache_dir(), "cpu"), key, built)
        except OSError as e:
            if self.fallback is None:
                self.fallback = tempfile.mkdtemp(prefix="fusegrad-kernels-")
                warnings.warn(
                    f"kernel cache {os.path.join(cache_dir(), 'cpu')} is not writable ({e.strerror or e}); "
                    f"compiled kernels go to {self.fallback} for this process",
                    stacklevel=2,
                )
            return self._store_in(self.fallback, key, built)

    @staticmethod
    def _store_in(directory: str, key: str, built: str) -> str:
        os.makedirs(directory, exist_ok=True)
        with open(built, "rb") as f:
            data = f.read()
        path = os.path.join(directory, f"{key}.so")
        # checksum first: whoever sees the new binary also sees its checksum (each file is renamed into place whole)
        _write_atomic(os.path.join(directory, f"{key}.sha256"), hashlib.sha256(data).hexdigest().encode())
        _write_atomic(path, data)
        return path


def _write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class ClangCompiler:
    """Compiles C source to a shared object; results are cached on disk by a hash of source, flags and compiler."""

    def __init__(self):
        self.cache = KernelCache()

    def compile(self, src: str, name: str = "kernel") -> str:
        """Path of a verified shared object for `src`: from the disk cache, or compiled now and stored there."""
        cc = find_compiler()
        key = hashlib.sha256((compiler_identity(cc) + src).encode()).hexdigest()
        if CACHELEVEL >= 1 and CCACHE and (path := self.cache.lookup(key)) is not None:
            return path
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "kernel.so")
            proc = run_compiler([cc, *CFLAGS, "-x", "c", "-", "-o", out, "-lm"], src, f"compiling kernel {name}")
            if proc.returncode != 0 or proc.stderr.strip():
                numbered = "\n".join(f"{i + 1:4d} {ln}" for i, ln in enumerate(src.splitlines()))
                raise CompileError(
                    f"C compiler {cc} {'failed' if proc.returncode else 'warned'} on kernel {name}:\n{proc.stderr}\n"
                    f"--- source ---\n{numbered}"
                )
            if not os.path.exists(out) or os.path.getsize(out) == 0:
                raise CompileError(f"C compiler {cc} exited 0 on kernel {name} but wrote no shared object to {out}")
            path = self.cache.store(key, out)
        if DEBUG >= 3:
            print(f"compiled {path}")
        return path

    def load(self, src: str, name: str) -> ctypes.CDLL:
        """Compile (or find) and load `src`; a cached binary that fails to load is deleted and compiled once more."""
        path = self.compile(src, name)
        try:
            return ctypes.CDLL(path)
        except OSError:
            self.cache.evict(path)
        path = self.compile(src, name)
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            raise CompileError(f"kernel {name} compiled by {find_compiler()} to {path} cannot be loaded: {e}") from None


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def thread_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:  # two threads launching their first kernels get the same pool
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=max(int(NUM_CPU_THREADS.value) - 1, 1), thread_name_prefix="fusegrad-cpu"
            )
        return _pool


def _address(buf: Buffer) -> int:
    """buf's address, remembered with the memory it belongs to: numpy's .ctypes.data builds an object per call, and
    a kernel launch asks for every argument's address."""
    cached = buf.__dict__.get("_launch_address")
    if cached is not None and cached[0] is buf._mem:
        return cached[1]
    buf.ensure_allocated()
    try:  # a quarter of .ctypes.data's cost; read-only or empty memory cannot be exported this way
        address = ctypes.addressof(ctypes.c_char.from_buffer(buf._mem))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        address = buf.address()
    buf._launch_address = (buf._mem, address)  # type: ignore[attr-defined]
    return address


class CPUProgram:
    """A loaded kernel; ctypes releases the GIL during the call, so chunks of the outer loop run in parallel."""

    MIN_OPS_PER_THREAD = 1 << 17

    def __init__(self, name: str, lib: ctypes.CDLL, nparams: int, outer_size: int, ops: int):
        self.lib = lib
        self.fn = getattr(self.lib, name)
        self.fn.argtypes = [ctypes.c_void_p] * nparams + [ctypes.c_longlong, ctypes.c_longlong]
        self.fn.restype = None
        self.outer_size, self.ops, self.nparams = outer_size, ops, nparams

    def __call__(self, buffers: list[Buffer]) -> None:
        if len(buffers) != self.nparams:
            raise RuntimeError(f"kernel takes {self.nparams} buffers, got {len(buffers)}")
        addrs = [_address(b) for b in buffers]
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
        lib = self.compiler.load(src, info.name)
        return CPUProgram(info.name, lib, info.nparams, info.outer_size, info.ops_estimate)

    def synchronize(self) -> None:
        pass
