"""The CPU device: C from the renderer, compiled by the system C compiler, loaded with ctypes, split over threads."""

from __future__ import annotations
import ctypes
import functools
import hashlib
import os
import platform
import signal
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable
from fusegrad.helpers import CACHELEVEL, CCACHE, COMPILE_TIMEOUT, DEBUG, NUM_CPU_THREADS
from fusegrad.renderer import Capabilities
from fusegrad.renderer.c import CRenderer
from fusegrad.renderer.c_prelude import c_unit
from fusegrad.runtime import cpu_runner
from fusegrad.runtime.c_compiler import CompileError, find_compiler
from fusegrad.runtime.device import Buffer, Compiled, HostAllocator
from fusegrad.runtime.kernel_cache import KernelCache

# -fopenmp-simd: only the simd pragmas, no OpenMP runtime (signed data arithmetic wraps in the renderer itself). Not
# -fno-trapping-math: it vectorizes more selects, but the digits convnet's training step ran 20-30 % slower with it
CFLAGS = (
    "-shared",
    "-fPIC",
    "-pipe",  # no temporary files between the compiler's stages: ~3 of ~40 ms a kernel
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


# a float16 kernel the vectorizer turns into masked half moves and converts: gcc emits AVX512-FP16 for it under
# -march=native on Sapphire Rapids and later, which older assemblers (Debian 12's binutils) reject
FP16_PROBE = """
void probe(_Float16 *restrict out, const _Float16 *restrict a, const float *restrict b, unsigned char *restrict c,
           int n) {
  for (int i = 0; i < n; i++) {
    _Float16 v = a[i] * (_Float16)b[i] + (_Float16)c[i];
    out[i] = v > (_Float16)0 ? v : (_Float16)(b[i] * 0.5f);
    c[i] = (unsigned char)((double)a[i] * 2.0);
  }
}
"""
# tried in order until the probe builds. Kernels compute narrow floats in float32 (codegen/decompose.py), so
# AVX512-FP16 would only convert, which F16C does as well; with it gcc 12 drops the float -> half rounding of a
# vectorized matmul's (float)(_Float16)acc, and Debian 12's assembler rejects its masked vmovsh. Without the option
# (a compiler that does not know it, not x86): the flags as they are
FLAG_FALLBACKS: tuple[tuple[str, ...], ...] = (("-mno-avx512fp16",), ())
# added where the compiler takes it cleanly: gcc's default (fast) lets (float)(_Float16)x skip the rounding to half
OPTIONAL_FLAGS = ("-fexcess-precision=standard",)
_flag_cache = KernelCache("cpu-flags", ".txt")
# a kernel linked without the C runtime's start files and libc (libm brings libc as its own dependency, and the
# process has it loaded): the link step took ~7 of ~38 ms a kernel (gcc 12, Zen 3). Where the probe does not build
# and load with them (another platform's linker or libraries), kernels link as PLAIN_LINK
FAST_LINK = ("-nostdlib", "-lm", "-lgcc")
PLAIN_LINK = ("-lm",)
# the probe reads libm and libc (sinf, memcpy) and converts float16 (libgcc's helpers where the CPU has no F16C)
LINK_PROBE = """
float sinf(float);
void *memcpy(void *, const void *, __SIZE_TYPE__);
float fg_link_probe(float x) {
  float y;
  memcpy(&y, &x, sizeof y);
  volatile _Float16 h = (_Float16)y;
  return sinf((float)h);
}
"""


@functools.cache
def build_id(cc: str) -> str:
    """What a binary built by `cc` with CFLAGS depends on besides its source: the compiler, its version, the CPU."""
    version = run_compiler([cc, "--version"], "", "reporting its version").stdout.splitlines()[:1]
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    return f"{cc}|{version}|{platform.machine()}|{cpu}|{' '.join(CFLAGS)}"


def _build_probe(
    cc: str, flags: tuple[str, ...], src: str, what: str, tmp: str, libs: tuple[str, ...] = ()
) -> str | None:
    """The shared object of probe source src built cleanly with flags (libs after the source) in tmp, else None; a
    compiler that hangs on it raises (the caller decides nothing then)."""
    out = os.path.join(tmp, "probe.so")
    proc = run_compiler([cc, *flags, "-x", "c", "-", "-o", out, *libs], src, what)
    return out if proc.returncode == 0 and not proc.stderr.strip() and os.path.exists(out) else None


def _probe_builds(cc: str, flags: tuple[str, ...]) -> bool:
    """The float16 probe builds cleanly with flags."""
    with tempfile.TemporaryDirectory() as tmp:
        return _build_probe(cc, flags, FP16_PROBE, "building the float16 probe", tmp) is not None


def _kept_on_disk(what: str, cc: str, tried: str, decide: Callable[[], tuple[str, ...]]) -> tuple[str, ...] | None:
    """The flags decide() probes for this compiler, kept on disk under its identity and what was tried, so a machine
    probes once; None, and nothing kept, when the compiler ran past COMPILE_TIMEOUT."""
    key = hashlib.sha256(f"{what}|{build_id(cc)}|{tried}".encode()).hexdigest()
    if (path := _flag_cache.lookup(key)) is not None:
        with open(path) as f:
            return tuple(f.read().split())
    try:
        flags = decide()
    except CompileError:
        return None
    _flag_cache.store_if_writable(key, " ".join(flags).encode())
    return flags


@functools.cache
def compiler_flags(cc: str) -> tuple[str, ...]:
    """CFLAGS plus what this compiler and assembler need to build float16 kernels, probed once per machine and kept
    on disk under the compiler's identity (version, CPU, flags)."""

    def decide() -> tuple[str, ...]:
        base = CFLAGS + tuple(f for f in OPTIONAL_FLAGS if _probe_builds(cc, CFLAGS + (f,)))
        extra = base[len(CFLAGS) :] + next((e for e in FLAG_FALLBACKS if _probe_builds(cc, base + e)), ())
        if DEBUG >= 1 and extra:
            print(f"C compiler {cc}: adding {' '.join(extra)} to {' '.join(CFLAGS)} for float16 kernels")
        return extra

    extra = _kept_on_disk("fp16-probe", cc, f"{OPTIONAL_FLAGS}|{FLAG_FALLBACKS}|{FP16_PROBE}", decide)
    # a compiler past COMPILE_TIMEOUT: the kernel's own build then reports it, naming the kernel
    return CFLAGS + (extra or ())


def _probe_links(cc: str, link: tuple[str, ...]) -> bool:
    """The link probe builds cleanly with link and loads, and its function returns sin of its argument."""
    with tempfile.TemporaryDirectory() as tmp:
        if (out := _build_probe(cc, CFLAGS, LINK_PROBE, "building the link probe", tmp, link)) is None:
            return False
        try:
            fn = ctypes.CDLL(out).fg_link_probe
        except OSError:
            return False
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
        return abs(fn(0.5) - 0.479425538604203) < 1e-3  # sin(0.5) through a float16 rounding of 0.5 (exact)


@functools.cache
def link_flags(cc: str) -> tuple[str, ...]:
    """FAST_LINK where this compiler's kernels build and load with it, else PLAIN_LINK; probed once per machine and
    kept on disk under the compiler's identity."""

    def decide() -> tuple[str, ...]:
        return FAST_LINK if _probe_links(cc, FAST_LINK) else PLAIN_LINK

    # a compiler past COMPILE_TIMEOUT: the kernel's own build then reports it, naming the kernel
    return _kept_on_disk("link-probe", cc, f"{FAST_LINK}|{LINK_PROBE}", decide) or PLAIN_LINK


@functools.cache
def compiler_identity(cc: str) -> str:
    return f"{build_id(cc)}|{' '.join(compiler_flags(cc))}"


def kernel_flags(cc: str, src: str) -> tuple[str, ...]:
    """The flags a kernel's source needs: the probed float16 ones only where it computes in _Float16 (the probe's
    compiles are then off the path of every other first kernel)."""
    return compiler_flags(cc) if "_Float16" in src else CFLAGS


def _source_key(cc: str, flags: tuple[str, ...], src: str) -> str:
    return hashlib.sha256(f"{build_id(cc)}|{' '.join(flags)}{src}".encode()).hexdigest()


@functools.cache
def native_macros(cc: str) -> frozenset[str] | None:
    """The macros the C compiler predefines under `-march=native`; None when it cannot list them or refuses it."""
    try:
        macros = run_compiler([cc, "-march=native", "-dM", "-E", "-x", "c", "-"], "", "listing macros")
    except (OSError, RuntimeError):
        return None
    if macros.returncode != 0:
        return None
    return frozenset(line.split()[1] for line in macros.stdout.splitlines() if line.startswith("#define "))


# an 8-bit dot product instruction: AVX512-VNNI / AVX-VNNI vpdpbusd, Arm's sdot/udot
INT8_DOT_MACROS = ("__AVX512VNNI__", "__AVXVNNI__", "__ARM_FEATURE_DOTPROD")
# 16-bit pair products summed into 32 bits on 32-byte vectors: AVX2 vpmaddwd (SSE2's 16-byte one is not measured)
INT16_DOT_MACROS = ("__AVX2__",)
# vpmaddubsw on 32-byte vectors, and the FMA the AVX2 matvec kernels use (every AVX2 x86 CPU but one VIA has FMA)
U8S8_PAIR_DOT_MACROS = ("__AVX2__", "__FMA__")


def vector_target(cc: str) -> tuple[int, int]:
    """(vector bytes, vector registers) of `-march=native`, read from the C compiler's predefined macros once."""
    if (defined := native_macros(cc)) is None:
        return 16, 16  # the compiler cannot list them or refuses -march=native: SSE2-sized vectors, the x86 baseline
    if "__AVX512F__" in defined:
        return 64, 32
    if "__AVX__" in defined:
        return 32, 16
    return 16, 16 if "__x86_64__" in defined else 32  # aarch64 NEON: 32 registers of 16 bytes


def host_capabilities(base: Capabilities = CRenderer.capabilities) -> Capabilities:
    """base with the vector width and register count the C compiler targets on this machine (16 bytes, 16 registers
    when there is no compiler)."""
    try:
        cc = find_compiler()
    except RuntimeError:
        return base.replace(vector_bytes=16, vector_registers=16)
    vector_bytes, registers = vector_target(cc)
    # the dot product is found by the compiler's loop vectorizer: a dialect without one (the interpreter) never has it
    macros = native_macros(cc) or frozenset()
    int8_dot = base.loop_vectorizer and any(m in macros for m in INT8_DOT_MACROS)
    int16_dot = base.loop_vectorizer and any(m in macros for m in INT16_DOT_MACROS)
    # raw C kernels of intrinsics: only the C dialect (the one with a loop vectorizer) compiles them
    pair_dot = base.loop_vectorizer and all(m in macros for m in U8S8_PAIR_DOT_MACROS)
    return base.replace(
        vector_bytes=vector_bytes,
        vector_registers=registers,
        int8_dot=int8_dot,
        int16_dot=int16_dot,
        u8s8_pair_dot=pair_dot,
    )


class ClangCompiler:
    """Compiles C source to a shared object; results are cached on disk by a hash of source, flags and compiler."""

    def __init__(self):
        self.cache = KernelCache("cpu", ".so")

    def compile(self, src: str, name: str = "kernel") -> str:
        """Path of a verified shared object for `src`: from the disk cache, or compiled now and stored there."""
        cc = find_compiler()
        flags = kernel_flags(cc, src)
        key = _source_key(cc, flags, src)
        if CACHELEVEL >= 1 and CCACHE and (path := self.cache.lookup(key)) is not None:
            return path
        return self._build(cc, flags, src, name, [key])

    def compile_together(self, unit: str, srcs: list[str], name: str) -> bool:
        """Compile `unit`, one translation unit holding the kernels of `srcs` (c_unit), once, and cache the shared
        object under each source's key, where compile(src) finds it. False, and nothing cached, when the unit does not
        compile cleanly: each kernel is then compiled alone, and its own error names it."""
        cc = find_compiler()
        flags = kernel_flags(cc, unit)
        if any(kernel_flags(cc, src) != flags for src in srcs):
            raise ValueError(f"kernels compiled together in {name} need the same compiler flags")
        try:
            self._build(cc, flags, unit, name, [_source_key(cc, flags, src) for src in srcs])
        except CompileError:
            return False
        return True

    def _build(self, cc: str, flags: tuple[str, ...], src: str, name: str, keys: list[str]) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "kernel.so")
            argv = [cc, *flags, "-x", "c", "-", "-o", out, *link_flags(cc)]
            proc = run_compiler(argv, src, f"compiling kernel {name}")
            if proc.returncode != 0 or proc.stderr.strip():
                numbered = "\n".join(f"{i + 1:4d} {ln}" for i, ln in enumerate(src.splitlines()))
                raise CompileError(
                    f"C compiler {cc} {'failed' if proc.returncode else 'warned'} on kernel {name}:\n{proc.stderr}\n"
                    f"--- source ---\n{numbered}"
                )
            if not os.path.exists(out) or os.path.getsize(out) == 0:
                raise CompileError(f"C compiler {cc} exited 0 on kernel {name} but wrote no shared object to {out}")
            path = [self.cache.store(key, out) for key in keys][0]
        if DEBUG >= 3:
            print(f"compiled {path}")
        return path

    def is_cached(self, src: str) -> bool:
        """Whether compile(src) would find its binary in the disk cache."""
        cc = find_compiler()
        key = _source_key(cc, kernel_flags(cc, src), src)
        return CACHELEVEL >= 1 and bool(CCACHE) and self.cache.lookup(key) is not None

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
_pool_workers = 0
_pool_lock = threading.Lock()


def thread_pool(workers: int | None = None) -> ThreadPoolExecutor:
    """The persistent pool of worker threads (the launching thread runs one chunk itself); it grows when a kernel asks
    for more workers than it has (NUM_CPU_THREADS raised in a Context), and never starts threads per launch."""
    global _pool, _pool_workers
    workers = max(workers if workers is not None else int(NUM_CPU_THREADS.value) - 1, 1)
    with _pool_lock:  # two threads launching their first kernels get the same pool
        if _pool is None or workers > _pool_workers:
            old, _pool, _pool_workers = _pool, ThreadPoolExecutor(workers, thread_name_prefix="fusegrad-cpu"), workers
            if old is not None:
                old.shutdown(wait=False)  # its queued chunks still run; its threads exit after them
        return _pool


def split_launcher() -> ctypes._CFuncPtr | None:
    """The C runner's `fg_run_one` (a kernel split over its persistent pthread workers in one call), or None where the
    runner does not build or is still building: split kernels then go to the Python pool."""
    lib = cpu_runner.graph_library() if cpu_runner.runner_built() else None
    return None if lib is None else lib.fg_run_one


# the C runner switches on the argument count up to this many buffers (cpu_runner.MAX_KERNEL_ARGS)
MAX_C_SPLIT_ARGS = 128


class CPUProgram:
    """A loaded kernel; ctypes releases the GIL during the call, so chunks of the outer loop run in parallel."""

    MIN_OPS_PER_THREAD = 1 << 17
    # chunks per thread of a split launch, when they divide the outer loop evenly (see chunk_bounds): a worker that
    # wakes late leaves at most one short piece for the end (the 16M sum: 0.81x torch in 8 pieces, 0.82x in 32;
    # elementwise, matmul and column-sum kernels measured the same either way) ...
    PIECES_PER_THREAD = 16
    # ... but beyond COARSE_PIECES per thread each piece keeps this much work: a layernorm's 2048-row kernels ran 13 %
    # slower in 32 pieces of 64K ops than in 8
    COARSE_PIECES, MIN_OPS_PER_FINE_PIECE = 4, 1 << 19

    def __init__(self, name: str, lib: ctypes.CDLL, nparams: int, outer_size: int, ops: int):
        self.lib = lib
        self.fn = getattr(self.lib, name)
        self.fn.argtypes = [ctypes.c_void_p] * nparams + [ctypes.c_longlong, ctypes.c_longlong]
        self.fn.restype = None
        self.outer_size, self.ops, self.nparams = outer_size, ops, nparams

    # cached on first use (not set in __init__: LLVMProgram sets only fn, outer_size, ops and nparams)
    @functools.cached_property
    def one_chunk(self) -> bool:
        """Too little work to split for any thread count: the launch skips asking how many threads there are."""
        return self.outer_size < 2 or self.ops < self.MIN_OPS_PER_THREAD * 2

    @functools.cached_property
    def fn_address(self) -> int:
        return ctypes.cast(self.fn, ctypes.c_void_p).value  # type: ignore[return-value]

    @functools.cached_property
    def _splits(self) -> dict[int, tuple[list[int], ctypes.Array]]:
        return {}  # thread count -> (chunk bounds, the same as a C array for fg_run_one)

    def chunk_bounds(self, threads: int) -> list[int]:
        """Where the outer loop is cut: one chunk unless each thread gets enough work; else one chunk per thread, or
        up to PIECES_PER_THREAD equal ones each where the loop divides into them and each keeps MIN_OPS_PER_THREAD
        (MIN_OPS_PER_FINE_PIECE beyond COARSE_PIECES). The C
        runner hands chunks out one at a time, so a thread that starts late (a worker waking, or one whose core another
        process holds) takes fewer of them instead of finishing last."""
        if threads <= 1 or self.outer_size < 2 or self.ops < self.MIN_OPS_PER_THREAD * 2:
            return [0, self.outer_size]
        n = min(threads, self.outer_size, max(self.ops // self.MIN_OPS_PER_THREAD, 1))
        if self.outer_size % n == 0:
            for k in range(self.PIECES_PER_THREAD, 1, -1):
                least = self.MIN_OPS_PER_THREAD if k <= self.COARSE_PIECES else self.MIN_OPS_PER_FINE_PIECE
                if self.outer_size % (n * k) == 0 and self.ops // (n * k) >= least:
                    n *= k
                    break
        return [self.outer_size * i // n for i in range(n + 1)]

    def address_launch(self) -> tuple[Any, tuple[int, int]] | None:
        """(the C function, what follows the buffers' addresses in its call) when every launch is that one call on
        this thread, whatever NUM_CPU_THREADS says (too little work to split): an eager op calls it with the
        addresses, skipping __call__'s checks. Else None."""
        return (self.fn, (0, self.outer_size)) if self.one_chunk else None

    def __call__(self, buffers: list[Buffer]) -> None:
        if len(buffers) != self.nparams:
            raise RuntimeError(f"kernel takes {self.nparams} buffers, got {len(buffers)}")
        addrs = [b.address() for b in buffers]
        if self.one_chunk:
            self.fn(*addrs, 0, self.outer_size)
            return
        threads = int(NUM_CPU_THREADS.value)
        if (split := self._splits.get(threads)) is None:
            bounds = self.chunk_bounds(threads)
            split = self._splits[threads] = (bounds, (ctypes.c_longlong * len(bounds))(*bounds))
        bounds, c_bounds = split
        n = len(bounds) - 1
        if n == 1:
            self.fn(*addrs, 0, self.outer_size)
            return
        if self.nparams <= MAX_C_SPLIT_ARGS and (run_one := split_launcher()) is not None:
            run_one(self.fn_address, self.nparams, (ctypes.c_void_p * self.nparams)(*addrs), c_bounds, n, threads)
            return
        # the pool's workers and this thread take chunks from one iterator (next() on it holds the GIL), as in C
        chunks = iter(range(n))

        def take_chunks() -> None:
            for i in chunks:
                self.fn(*addrs, bounds[i], bounds[i + 1])

        helpers = min(threads, n) - 1
        futures = [thread_pool(helpers).submit(take_chunks) for _ in range(helpers)]
        take_chunks()
        for f in futures:
            f.result()


# kernels per translation unit in compile_ahead: more share one compiler run, fewer leave cores to parallel units
KERNELS_PER_UNIT = 8


class CpuDevice(Compiled):
    def __init__(self, name: str):
        super().__init__(name, HostAllocator(), CRenderer(host_capabilities()), None, CPUProgram)
        self.compiler = ClangCompiler()  # its binaries are shared objects on disk, loaded from their path

    def compile_ahead(self, infos: list) -> None:
        """Compile the kernels the disk cache lacks before the builds that follow load them: up to KERNELS_PER_UNIT
        in one translation unit (a compiler run costs about the same for one small kernel as for eight), the units on
        parallel compiler processes."""
        self._rendered = {}
        todo: dict[tuple[str, ...], list[list[tuple[str, str, str]]]] = {}
        cc = find_compiler()
        for info in infos:
            kernel = self.renderer.render_kernel(info.name, info.lin, info.packs)
            src = self.renderer.render_prelude(info.lin, kernel) + kernel
            self._rendered[id(info)] = (info, src)
            if self.compiler.is_cached(src):
                continue
            units = todo.setdefault(kernel_flags(cc, src), [[]])
            # a unit takes one function of each name (two kernels may share a name and differ in body)
            if len(units[-1]) == KERNELS_PER_UNIT or any(n == info.name for n, _, _ in units[-1]):
                units.append([])
            units[-1].append((info.name, kernel, src))
        jobs = [unit for units in todo.values() for unit in units]
        if sum(len(unit) for unit in jobs) < 2:
            return

        def compile_quietly(unit: list[tuple[str, str, str]]) -> None:
            if len(unit) > 1:
                try:
                    text = c_unit([(name, kernel) for name, kernel, _ in unit])
                except ValueError:
                    text = None  # a kernel text of another shape: each compiles alone
                if text is not None and self.compiler.compile_together(text, [src for _, _, src in unit], unit[0][0]):
                    return
            for name, _, src in unit:
                try:
                    self.compiler.compile(src, name)
                except CompileError:
                    pass  # build() compiles it again and raises, naming the kernel, where it would have anyway

        with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1), thread_name_prefix="fusegrad-cc") as pool:
            list(pool.map(compile_quietly, jobs))

    def build(self, info) -> CPUProgram:
        ahead = getattr(self, "_rendered", {}).pop(id(info), None)
        src = ahead[1] if ahead is not None and ahead[0] is info else self.render(info)
        if DEBUG >= 4:
            print(src)
        lib = self.compiler.load(src, info.name)
        return CPUProgram(info.name, lib, info.nparams, info.outer_size, info.ops_estimate)

    def assembly(self, info) -> str:
        """The kernel's machine code as the compiler's assembly listing, built with the kernel's own flags (VIZ)."""
        src, cc = self.render(info), find_compiler()
        proc = run_compiler([cc, *kernel_flags(cc, src), "-S", "-x", "c", "-", "-o", "-"], src, f"listing {info.name}")
        if proc.returncode != 0:
            raise CompileError(f"C compiler {cc} could not list the assembly of kernel {info.name}:\n{proc.stderr}")
        return proc.stdout

    def build_raw(self, raw: Any, nparams: int) -> CPUProgram:
        """A user's C function (RawKernel) taking one pointer per buffer, called once per launch, or, with `items`,
        on chunks of them split over the threads."""
        from fusegrad.runtime.raw_source import c_with_wrapper

        src, name = c_with_wrapper(raw.src, raw.entry, nparams, split=raw.items > 0)
        return CPUProgram(name, self.compiler.load(src, name), nparams, max(raw.items, 1), raw.ops)
