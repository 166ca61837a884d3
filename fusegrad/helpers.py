"""Small pure utilities and the one place environment flags are read (docs/env_vars.md)."""

from __future__ import annotations
import contextlib
import contextvars
import functools
import math
import os
import pathlib
import time
from typing import Any, Iterable, Sequence, TypeVar

T = TypeVar("T")


def prod(xs: Iterable[Any], start: Any = 1) -> Any:
    return functools.reduce(lambda a, b: a * b, xs, start)


def all_same(xs: Sequence[Any]) -> bool:
    return all(x == xs[0] for x in xs)


def argfix(*args: Any) -> tuple:
    """Accept f(2, 3), f((2, 3)) and f([2, 3]) alike."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def dedup(xs: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(xs))


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
    return [x for xs in xss for x in xs]


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    return ceildiv(x, multiple) * multiple


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """Read an environment variable once, converted to type(default); a bad value names the variable."""
    raw = os.environ.get(key)
    if raw is None:
        return default
    try:
        return type(default)(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not a valid {type(default).__name__}") from None


_UNSET: Any = object()


class ContextVar:
    """A configuration value: a process default read from the environment at import, overridden per thread (and per
    asyncio task) by `with Context(NAME=value)`, so one thread's override never changes another thread's value."""

    registry: dict[str, ContextVar] = {}

    def __init__(self, key: str, default: Any):
        self.key, self.default = key, getenv(key, default)
        self._override: contextvars.ContextVar[Any] = contextvars.ContextVar(f"fusegrad.{key}", default=_UNSET)
        ContextVar.registry[key] = self

    @property
    def value(self) -> Any:
        v = self._override.get()
        return self.default if v is _UNSET else v

    @value.setter
    def value(self, v: Any) -> None:
        # inside a Context block the assignment lasts until the block ends; outside it sets the process default
        if self._override.get() is _UNSET:
            self.default = v
        else:
            self._override.set(v)

    def coerce(self, v: Any) -> Any:
        """A value given to Context, converted like the environment's string would be; a bad one names the variable."""
        if isinstance(self.default, int) and isinstance(v, (bool, str)):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"context variable {self.key}={v!r} is not a valid int") from None
        return v

    def tolist(self, obj: Any = None) -> list:
        """A comma-separated value as its items, each looked up as an attribute of obj when given
        (`EMULATED_DTYPES.tolist(dtypes)` -> [dtypes.half, ...]), as tinygrad's list-valued variables do."""
        items = [x.strip() for x in str(self.value).split(",") if x.strip()]
        return [getattr(obj, x) for x in items] if obj is not None else items

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, x: Any) -> bool:
        return self.value >= x

    def __gt__(self, x: Any) -> bool:
        return self.value > x

    def __lt__(self, x: Any) -> bool:
        return self.value < x

    def __le__(self, x: Any) -> bool:
        return self.value <= x

    def __eq__(self, x: Any) -> bool:
        return self.value == x

    def __hash__(self) -> int:
        return hash(self.key)

    def __int__(self) -> int:
        return int(self.value)

    def __repr__(self) -> str:
        return f"ContextVar({self.key}={self.value!r})"


class Context(contextlib.ContextDecorator):
    """Temporarily override ContextVars in the current thread: `with Context(DEBUG=2): ...` or as a decorator."""

    def __init__(self, **kwargs: Any):
        unknown = [k for k in kwargs if k not in ContextVar.registry]
        if unknown:
            raise KeyError(f"unknown context variable(s) {unknown}; known: {sorted(ContextVar.registry)}")
        self.kwargs = {k: ContextVar.registry[k].coerce(v) for k, v in kwargs.items()}
        self.tokens: list[tuple[ContextVar, contextvars.Token]] = []

    def _recreate_cm(self) -> Context:
        # as a decorator every call gets its own tokens: recursive or concurrent calls do not share them
        return Context(**self.kwargs)

    def __enter__(self):
        self.tokens = [
            (ContextVar.registry[k], ContextVar.registry[k]._override.set(v)) for k, v in self.kwargs.items()
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for var, token in reversed(self.tokens):
            var._override.reset(token)
        self.tokens = []


DEBUG = ContextVar("DEBUG", 0)
DEV = ContextVar("DEV", "")
TRAINING = ContextVar("TRAINING", 0)
DEFAULT_FLOAT = ContextVar("DEFAULT_FLOAT", "float32")  # a dtype name, or a DType given to Context
DEFAULT_INT = ContextVar("DEFAULT_INT", "int32")
SUM_DTYPE = ContextVar("SUM_DTYPE", "")  # minimum float accumulation dtype of sum ("" = the input dtype)
CACHELEVEL = ContextVar("CACHELEVEL", 2)
CCACHE = ContextVar("CCACHE", 1)
COMPILE_TIMEOUT = ContextVar("COMPILE_TIMEOUT", 120.0)  # seconds one compiler run may take
NUM_CPU_THREADS = ContextVar("NUM_CPU_THREADS", min(os.cpu_count() or 1, 8))
CC = ContextVar("CC", "")
FUSE_OPTIM = ContextVar("FUSE_OPTIM", 0)
CONST_LR = ContextVar("CONST_LR", 0)
OPTIM_DTYPE = ContextVar("OPTIM_DTYPE", "float32")
CHECK_OOB = ContextVar("CHECK_OOB", 0)
LRU_CACHE_MB = ContextVar("LRU_CACHE_MB", -1)  # MiB of freed host buffers kept for reuse (-1: RAM / 8, 0: none)
BEAM = ContextVar("BEAM", 0)  # beam width of the opts search (0: the heuristics)
IGNORE_BEAM_CACHE = ContextVar("IGNORE_BEAM_CACHE", 0)
CUDA_ARCH = ContextVar("CUDA_ARCH", "")  # sm_XX the CUDA compiler targets when no GPU says (compile-only)
NOOPT = ContextVar("NOOPT", 0)  # 1 applies no codegen opts
# 0: a quantized matvec multiplies float activations even where the target has 8-bit dot products (exact weights)
QUANT_DOT = ContextVar("QUANT_DOT", 1)
# 0: on an AVX2 CPU, decode matvecs (Q8_0 / Q4_K without 8-bit dot products, float32) run the generated kernels,
# not the hand-written ones of nn/quantized_avx2.py
AVX2_MATVEC = ContextVar("AVX2_MATVEC", 1)
AMD_SIM = ContextVar("AMD_SIM", 0)  # 1: DEV=AMD runs on the simulated MI350X VF
AMD_SIM_TWIN = ContextVar("AMD_SIM_TWIN", 0)  # 1: each simulated dispatch also runs the kernel's PYTHON twin, compared
AMD_PCI = ContextVar("AMD_PCI", "")  # PCI address of the AMD function DEV=AMD opens ("": the first AMD GPU)
AMD_ARCH = ContextVar("AMD_ARCH", "gfx950")  # kernel target; gfx942 when the installed LLVM lacks it
AMD_MFMA = ContextVar("AMD_MFMA", 1)  # 0: DEV=AMD matmuls stay on the vector ALUs (no matrix cores)
AMD_LLVM = ContextVar("AMD_LLVM", "")  # "external": compile AMD kernels with opt/llc/ld.lld, not llvmlite in-process
SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1)  # 0 plans every realize's schedule again instead of reusing one
SPEC = ContextVar("SPEC", 0)  # 1 checks scheduled kernel ASTs and every codegen stage (uop/spec.py)
JIT = ContextVar("JIT", 1)  # 0: TinyJit runs the function every call; 2: replays kernel by kernel, not batched
ONNX_REPLAY = ContextVar("ONNX_REPLAY", 1)  # 0: an OnnxRunner call never replays a TinyJit of an earlier call
JITBEAM = ContextVar("JITBEAM", 0)  # BEAM width for kernels a TinyJit captures
JIT_BATCH_SIZE = ContextVar("JIT_BATCH_SIZE", 32)  # most kernels one batched C call of a replay launches
NO_MEMORY_PLANNER = ContextVar("NO_MEMORY_PLANNER", 0)  # 1: a captured step's intermediates keep their own memory
# fusegrad/viz (docs/viz.md)
VIZ = ContextVar("VIZ", 0)  # 1: record rewrites and kernels, serve them as a web page at exit; 2: only save them
PROFILE = ContextVar("PROFILE", 0)  # 1 writes a Chrome trace of launches, compiles, copies and memory at exit
PROFILE_PATH = ContextVar("PROFILE_PATH", "")  # where PROFILE writes its trace ("": a file under the cache dir)
VIZ_PORT = ContextVar("VIZ_PORT", 8000)  # the VIZ page's port on 127.0.0.1 (the next free one when taken)
# fusegrad/distributed (docs/distributed.md)
DIST_TIMEOUT = ContextVar("FUSEGRAD_DIST_TIMEOUT", 300.0)  # seconds a collective waits for every rank before it fails
# collectives of up to this many bytes are one blocking MPI call (a watchdog thread bounds it; MPI's tuned blocking
# algorithms win up to 1 MB here); larger ones, and all with 0, are nonblocking calls waited on politely
DIST_BLOCKING = ContextVar("FUSEGRAD_DIST_BLOCKING", 1 << 20)
DIST_CHECK = ContextVar("FUSEGRAD_DIST_CHECK", 1)  # 0: eager collectives skip comparing ranks' shapes and dtypes
# comma-separated dtypes that kernels hold as bits and convert in integer and float32 arithmetic (codegen/emulate.py)
EMULATED_DTYPES = ContextVar("EMULATED_DTYPES", "")
# tinygrad's names; accepted now, they take effect when their feature lands (docs/env_vars.md)
IMAGE = ContextVar("IMAGE", 0)
FLOAT16 = ContextVar("FLOAT16", 0)
WINO = ContextVar("WINO", 0)
TC = ContextVar("TC", 1)
ALLOW_TF32 = ContextVar("ALLOW_TF32", 0)
TRANSCENDENTAL = ContextVar("TRANSCENDENTAL", 1)
CACHEDB = ContextVar("CACHEDB", "")
VALIDATE_WITH_CPU = ContextVar("VALIDATE_WITH_CPU", 0)
PARALLEL = ContextVar("PARALLEL", 0)
MAX_BUFFER_SIZE = ContextVar("MAX_BUFFER_SIZE", 0)
USE_ATOMICS = ContextVar("USE_ATOMICS", 0)
TRACEMETA = ContextVar("TRACEMETA", 0)
CUDA_PATH = ContextVar("CUDA_PATH", "")
WEBGPU_BACKEND = ContextVar("WEBGPU_BACKEND", "")
HCQ_VISIBLE_DEVICES = ContextVar("HCQ_VISIBLE_DEVICES", "")
FUSE_DEVICE = ContextVar("FUSE_DEVICE", "")  # the fusegrad device the torch device `fuse` runs on ("": Device.DEFAULT)
FUSE_CPU_FALLBACK = ContextVar("FUSE_CPU_FALLBACK", 0)  # 1: an aten op `fuse` lacks runs on torch CPU, warned once


class Hooks:
    """What fusegrad/viz installs while it records; None when off, so a call site costs one attribute check.
    `trace` sees realizes, kernels, compiles, copies and allocations; `rewrites` sees every graph_rewrite (VIZ only)."""

    trace: Any = None
    rewrites: Any = None


def cache_dir() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusegrad")


DISABLE_HTTP_CACHE = ContextVar("DISABLE_HTTP_CACHE", 0)


def fetch(
    url: str,
    name: str | os.PathLike | None = None,
    subdir: str | None = None,
    gunzip: bool = False,
    allow_caching: bool = True,
    headers: dict[str, str] = {},
    sha256: str | None = None,  # noqa: B006
    extract: bool = False,
) -> pathlib.Path:
    """Download `url` into the cache (cache_dir()/downloads[/subdir]/name) once and return its pathlib.Path. A local
    path (starting with "/" or ".") is returned unchanged. `sha256` checks the bytes as downloaded before they enter the
    cache; `gunzip` caches the decompressed file; `extract` unpacks a tar or zip archive and returns its directory."""
    import hashlib

    if url.startswith(("/", ".")):
        return pathlib.Path(url)
    if name is not None and not isinstance(name, str):
        dest = pathlib.Path(name)
    else:
        fname = name or hashlib.sha256(url.encode()).hexdigest()[:32] + (".gunzip" if gunzip else "")
        dest = pathlib.Path(cache_dir()) / "downloads" / (subdir or "") / fname
    if not (allow_caching and not DISABLE_HTTP_CACHE and dest.is_file()):
        _download(url, dest, headers, sha256, gunzip)
    return _extract(dest) if extract else dest


def _download(url: str, dest: pathlib.Path, headers: dict[str, str], sha256: str | None, gunzip: bool) -> None:
    import gzip
    import hashlib
    import shutil
    import tempfile
    import urllib.request  # here, not at the top: `import fusegrad` stays light

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
    try:
        digest = hashlib.sha256()
        try:
            with (
                urllib.request.urlopen(
                    urllib.request.Request(url, headers={"User-Agent": "fusegrad", **headers}), timeout=60
                ) as resp,
                os.fdopen(fd, "wb") as f,
            ):
                bar = _Progress(int(resp.headers.get("content-length") or 0), dest.name)
                while chunk := resp.read(1 << 16):
                    f.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
                bar.close()
        except OSError as e:  # URLError and HTTPError are OSErrors, as is a connection dropped mid-download
            raise ConnectionError(
                f"cannot download {url}: {getattr(e, 'reason', e)}; offline, put the file at {dest}"
            ) from None
        if sha256 is not None and digest.hexdigest() != sha256.lower():
            raise ValueError(
                f"download of {url} has sha256 {digest.hexdigest()}, expected {sha256.lower()}: corrupt or changed file"
            )
        if gunzip:
            with gzip.open(tmp, "rb") as src, open(tmp + ".gunzip", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(tmp + ".gunzip", tmp)
        os.replace(tmp, dest)  # atomic: the cache never holds a partial or unverified file
    finally:
        for leftover in (tmp, tmp + ".gunzip"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _extract(archive: pathlib.Path) -> pathlib.Path:
    """Unpack a tar (any compression) or zip archive once, next to it; returns the directory."""
    import shutil
    import tarfile
    import tempfile
    import zipfile

    out = archive.with_name(archive.name + ".extracted")
    if out.is_dir():
        return out
    tmp = tempfile.mkdtemp(dir=archive.parent, prefix=".extract-")
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                tf.extractall(tmp, filter="data")  # "data": no paths outside tmp, no devices
        else:
            raise ValueError(f"{archive} is neither a tar nor a zip archive, cannot extract it")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    return out


class _Progress:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.done, self.last = total, desc, 0, 0.0

    def update(self, n: int) -> None:
        self.done += n
        if time.perf_counter() - self.last > 0.1:
            self.draw()

    def draw(self) -> None:
        import sys

        self.last = time.perf_counter()
        frac = min(self.done / self.total, 1.0) if self.total else 0.0
        bar = ("#" * int(frac * 30)).ljust(30, ".") if self.total else "?" * 30
        total = f"/{self.total / 1e6:.1f}" if self.total else ""
        sys.stderr.write(f"\r{self.desc} [{bar}] {frac * 100:3.0f}% {self.done / 1e6:.1f}{total} MB")
        sys.stderr.flush()

    def close(self) -> None:
        import sys

        self.draw()
        sys.stderr.write("\n")


class _GlobalCounters:
    """Process-wide counters of launched work: the one instance GlobalCounters (an instance's attribute is updated at a
    third of a class attribute's cost, and every launch and allocation updates several)."""

    __slots__ = (
        "global_ops",
        "global_mem",
        "time_sum_s",
        "kernel_count",
        "compile_count",
        "mem_used",
        "mem_used_per_device",
    )

    def __init__(self):
        self.global_ops, self.global_mem, self.time_sum_s, self.kernel_count = 0, 0, 0.0, 0
        self.compile_count = 0  # kernels lowered and built into a loaded program (from the disk cache or the compiler)
        self.mem_used = 0
        self.mem_used_per_device: dict[str, int] = {}

    def reset(self) -> None:
        self.global_ops, self.global_mem, self.time_sum_s = 0, 0, 0.0
        self.kernel_count, self.compile_count = 0, 0


GlobalCounters = _GlobalCounters()


class Timing(contextlib.ContextDecorator):
    """Print the elapsed time of a block in ms."""

    def __init__(self, prefix: str = "", on_exit: Any = None, enabled: bool = True):
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled

    def __enter__(self):
        self.st = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.et = time.perf_counter_ns() - self.st
        if self.enabled:
            print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


def to_function_name(s: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in s)


def is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def log2_int(x: int) -> int:
    return int(math.log2(x))
