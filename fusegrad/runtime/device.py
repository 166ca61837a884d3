"""The device interface (Allocator, Compiler, Compiled) with the registry, Buffer and the host allocator."""

from __future__ import annotations
import contextlib
import ctypes
import functools
import gc
import hashlib
import importlib
import importlib.util
import itertools
import mmap
import os
import sys
import threading
from collections import OrderedDict, deque
from typing import Any, Iterator
from fusegrad.lazy_numpy import np
from fusegrad.dtype import DType, to_numpy_dtype
from fusegrad.helpers import CACHELEVEL, CC, CCACHE, DEBUG, DEV, LRU_CACHE_MB, GlobalCounters, Hooks
from fusegrad.runtime.c_compiler import find_compiler
from fusegrad.runtime.kernel_cache import KernelCache

# transparent huge page size (x86-64, most arm64 kernels): blocks this large ask for huge pages, so first touch faults
# once per 2 MiB instead of once per 4 KiB page
HUGE_PAGE = 2 << 20
# where such a block starts in its first huge page: one of HUGE_COLORS offsets HUGE_COLOR_STEP apart, in turn. Blocks
# all starting on a huge page boundary put the same element of each in the same cache set: an operation reading two or
# three of them at once (MPI's reduction on 4 ranks, an elementwise kernel) evicted its own lines (an allreduce of
# 64 MB on 4 ranks took 27 % longer than on numpy's own arrays)
HUGE_COLORS, HUGE_COLOR_STEP = 16, 4096 + 64
_huge_color = itertools.count()


@functools.cache
def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_cache_limit() -> int:
    """Bytes of freed host buffers kept for reuse: LRU_CACHE_MB MiB, or an eighth of physical memory when it is -1."""
    mb = LRU_CACHE_MB.value
    if type(mb) is int and mb >= 0:  # the usual case first: every allocation and free asks
        return mb << 20
    if mb == -1:
        return physical_memory() // 8
    if not isinstance(mb, int) or mb < 0:
        raise ValueError(f"LRU_CACHE_MB={mb!r} is not a size: give MiB >= 0 (0 keeps nothing), or -1 for RAM / 8")
    return mb << 20


class HostBufferCache:
    """Freed host blocks by exact size, least recently freed size first; the next allocation of a size gets the block
    freed last (its pages are already mapped, often still in cache). Finalizers give blocks back from any thread (gc),
    possibly while this thread holds the lock: they queue the block, and the lock's holder files the queue. A block
    keeps the address its last buffer found (0: not known), so the next buffer over it does not look it up again."""

    def __init__(self):
        self._blocks: OrderedDict[int, list[tuple[np.ndarray, int]]] = OrderedDict()
        # append and popleft are atomic: safe from any finalizer
        self._returned: deque[tuple[np.ndarray, int]] = deque()
        self._lock = threading.Lock()  # not reentrant on purpose: a finalizer inside a held section must not enter
        self.nbytes = 0

    def sizes(self) -> dict[int, int]:
        """{block size: number of cached blocks}."""
        with self._held():
            return {size: len(blocks) for size, blocks in self._blocks.items()}

    def take(self, nbytes: int, limit: int) -> np.ndarray | None:
        """A cached block of exactly nbytes that nothing else references, or None."""
        return None if (block := self.take_addressed(nbytes, limit)) is None else block[0]

    def take_addressed(self, nbytes: int, limit: int) -> tuple[np.ndarray, int] | None:
        """take(), with the block's address when a buffer over it asked for it (else 0)."""
        lock = self._lock
        lock.acquire()  # not `with self._held()`: a generator per allocation costs more than the rest here
        try:
            if self.nbytes > limit:
                self._evict(limit)  # a bound lowered since the last free applies from now
            while blocks := self._blocks.get(nbytes):  # an emptied size's list is dropped at once
                mem, address = blocks.pop()  # unpacked at once: the reference count check sees no tuple holding mem
                self.nbytes -= nbytes
                if not blocks:
                    del self._blocks[nbytes]
                # a numpy view of a freed buffer that outlived it (a host_view someone kept) still reads this memory:
                # such a block is dropped instead of reused, and goes back to the system when the view dies
                if _reference_counts(mem) == _unshared_counts():
                    return mem, address
            return None
        finally:
            if self._returned:
                self._file_returned_and_release()
            else:  # _file_returned_and_release's case of nothing queued, without its call
                lock.release()
                if self._returned and lock.acquire(False):
                    self._file_returned_and_release()

    def give_back(self, mem: np.ndarray, address: int = 0) -> None:
        lock = self._lock
        if not lock.acquire(False):  # its holder (maybe a frame of this thread) files the queue
            self._returned.append((mem, address))
            if lock.acquire(False):  # released since: nobody may look at the queue again
                self._file_returned_and_release()
            return
        # the usual case, free: filed at once, without the queue
        try:
            limit = host_cache_limit()
        except ValueError:
            limit = 0  # a bad LRU_CACHE_MB is reported by the next allocation; a finalizer cannot raise it
        if (nbytes := mem.nbytes) <= limit:
            if (blocks := self._blocks.get(nbytes)) is None:
                self._blocks[nbytes] = [(mem, address)]  # a new size goes last, as move_to_end puts a known one
            else:
                blocks.append((mem, address))
                self._blocks.move_to_end(nbytes)
            self.nbytes += nbytes
            if self.nbytes > limit:
                self._evict(limit)
        if self._returned:
            self._file_returned_and_release()
        else:
            lock.release()
            if self._returned and lock.acquire(False):
                self._file_returned_and_release()

    def flush(self) -> None:
        with self._held():
            self._blocks.clear()
            self.nbytes = 0

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        self._lock.acquire()
        try:
            yield
        finally:
            self._file_returned_and_release()

    def _file_returned_and_release(self) -> None:
        returned, blocks_of = self._returned, self._blocks
        while True:
            if returned:  # nothing queued: take() has applied the bound already
                try:
                    limit = host_cache_limit()
                except ValueError:
                    limit = 0  # a bad LRU_CACHE_MB is reported by the next allocation; a finalizer cannot raise it
                while returned:
                    block = returned.popleft()
                    if (nbytes := block[0].nbytes) <= limit:
                        if (blocks := blocks_of.get(nbytes)) is None:
                            blocks_of[nbytes] = [block]  # a new size goes last, as move_to_end puts a known one
                        else:
                            blocks.append(block)
                            blocks_of.move_to_end(nbytes)
                        self.nbytes += nbytes
                if self.nbytes > limit:
                    self._evict(limit)
            self._lock.release()
            # a block queued after the last look by a finalizer that found the lock taken is filed by us, or by it
            if not returned or not self._lock.acquire(False):
                return

    def _evict(self, limit: int) -> None:
        while self.nbytes > limit:
            size, blocks = next(iter(self._blocks.items()))
            blocks.pop(0)
            self.nbytes -= size
            if not blocks:
                del self._blocks[size]


def _reference_counts(mem: np.ndarray) -> tuple[int, int]:
    """References to a block and to the memory it views (every numpy view of the block points at the latter)."""
    return sys.getrefcount(mem), sys.getrefcount(mem.base)


@functools.cache
def _unshared_counts() -> tuple[int, int]:
    # measured on first use (keeps numpy out of import): how the interpreter counts a local's references varies
    block = np.empty(65, np.uint8)[1:]
    return _reference_counts(block)


class Allocator:
    """Device memory as opaque handles: alloc/free, and copies between the handle and host memory. A device that can
    copy straight from another device's handle says so in `can_transfer_from` and implements `transfer`."""

    host = False  # handles are numpy views of host memory (then Buffer.host_view works and copies are numpy copies)

    def alloc(self, nbytes: int) -> Any:
        raise NotImplementedError

    def free(self, handle: Any) -> None:
        pass

    def copyin(self, handle: Any, src: np.ndarray) -> None:
        """Host bytes `src` (a flat uint8 array) into the first src.nbytes bytes of `handle`."""
        raise NotImplementedError

    def copyout(self, dst: np.ndarray, handle: Any) -> None:
        """The first dst.nbytes bytes of `handle` into the host array `dst` (flat uint8)."""
        raise NotImplementedError

    def can_transfer_from(self, src: Allocator) -> bool:
        return False

    def transfer(self, dst: Any, src: Any, nbytes: int, src_allocator: Allocator) -> None:
        raise NotImplementedError


class HostAllocator(Allocator):
    """Host memory backed by numpy, so copies in and out are plain numpy copies: 64-byte aligned, and on transparent
    huge pages from HUGE_PAGE bytes up, each such block starting at its turn of HUGE_COLORS offsets into its first
    one. Freed blocks go to `cache` for the next allocation of the same size; a failed allocation empties the cache
    and tries once more."""

    host = True
    cache = HostBufferCache()  # one for every host device: they share the machine's memory, so they share one bound

    def alloc(self, nbytes: int) -> np.ndarray:
        nbytes = max(nbytes, 1)
        if (mem := self.cache.take(nbytes, host_cache_limit())) is not None:
            return mem
        try:
            return self._fresh(nbytes)
        except MemoryError:
            cached = self.cache.nbytes
            gc.collect()  # unreachable buffers in reference cycles give their memory back first
            self.cache.flush()
            try:
                return self._fresh(nbytes)
            except MemoryError as e:
                raise MemoryError(
                    f"cannot allocate {nbytes} bytes of host memory, even after releasing {cached} cached bytes"
                ) from e

    def free(self, mem: np.ndarray) -> None:
        self.cache.give_back(mem)

    def copyin(self, handle: np.ndarray, src: np.ndarray) -> None:
        handle[: src.nbytes] = src

    def copyout(self, dst: np.ndarray, handle: np.ndarray) -> None:
        dst[:] = handle[: dst.nbytes]

    def can_transfer_from(self, src: Allocator) -> bool:
        return src.host

    def transfer(self, dst: np.ndarray, src: np.ndarray, nbytes: int, src_allocator: Allocator) -> None:
        dst[:nbytes] = src[:nbytes]

    @staticmethod
    def _fresh(nbytes: int) -> np.ndarray:
        if nbytes < HUGE_PAGE:
            raw = np.empty(nbytes + 64, dtype=np.uint8)
            offset = (-raw.ctypes.data) % 64
            return raw[offset : offset + nbytes]
        # private anonymous memory (shared anonymous memory is shmem, whose huge pages are configured separately),
        # one huge page and the block's color longer than needed, so that its huge pages start on their boundaries
        color = next(_huge_color) % HUGE_COLORS * HUGE_COLOR_STEP
        length = nbytes + HUGE_PAGE + color
        try:
            region = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as e:
            raise MemoryError(f"cannot map {length} bytes of host memory for a {nbytes}-byte buffer: {e}") from e
        whole = np.frombuffer(region, np.uint8)
        offset = (-whole.ctypes.data) % HUGE_PAGE
        if hasattr(mmap, "MADV_HUGEPAGE"):
            # whole huge pages only, from the one the block starts in: a huge page for the tail would hold up to 2 MiB
            # the block never uses (its head wastes at most the color)
            end = color + nbytes
            with contextlib.suppress(OSError):  # kernels without transparent huge pages refuse the advice
                region.madvise(mmap.MADV_HUGEPAGE, offset, end - end % HUGE_PAGE)
        return whole[offset + color : offset + color + nbytes]


class Buffer:
    """Device memory for `size` elements of `dtype`, allocated on first use and freed when unreferenced. It holds the
    allocator's opaque handle; only buffers of host devices expose it as numpy (`host_view`)."""

    _owner: Allocator | None = None  # the allocator _mem came from, which gets it back when the buffer dies
    _spare: list | None = None  # where its host memory goes when it dies, if that list is empty (allocate_spare)

    def __init__(self, device: str, size: int, dtype: DType, initial: np.ndarray | None = None):
        self.device, self.size, self.dtype = device, size, dtype
        self.nbytes = size * dtype.itemsize  # asked at every allocation, free and launch
        self._mem: Any = None  # the allocator's handle (a numpy array on host devices)
        self._initial = initial  # host data copied in on first allocation
        self._address: tuple[Any, int] | None = None  # (the memory, its address): address() of the current memory

    @property
    def is_allocated(self) -> bool:
        return self._mem is not None

    @property
    def allocator(self) -> Allocator:
        return Device[self.device].allocator

    @property
    def is_host(self) -> bool:
        # an allocator outside the Allocator hierarchy hands out numpy arrays the host can read (AMD: BAR views)
        return bool(getattr(self.allocator, "host", True))

    def ensure_allocated(self) -> Buffer:
        if self._mem is None:
            allocator, nbytes = Device[self.device].allocator, self.nbytes
            per_device = GlobalCounters.mem_used_per_device
            # a reused host block comes with the address a buffer over it found (every eager op allocates one)
            if type(allocator) is HostAllocator and (
                block := HostAllocator.cache.take_addressed(max(nbytes, 1), host_cache_limit())
            ):
                self._mem = block[0]
                if block[1]:
                    self._address = block
            else:
                self._mem = allocator.alloc(nbytes)
            GlobalCounters.mem_used += nbytes
            per_device[self.device] = per_device.get(self.device, 0) + nbytes
            self._owner = allocator
            if (hook := Hooks.trace) is not None:
                hook.memory(self.device)
            if self._initial is not None:
                self.copyin(self._initial)
                self._initial = None
        return self

    def allocate_spare(self, spare: list, allocator: HostAllocator) -> Buffer:
        """ensure_allocated for a buffer of a host device whose memory goes to `spare` when it dies, if that list is
        empty then (else to the allocator's cache): the block the list holds when there is one, taken without the
        cache's lock and bookkeeping. An eager op's outputs die and are made one after another at one size: its list
        keeps one small block for the next one (LRU_CACHE_MB=0 keeps none)."""
        self._spare = spare
        if spare and self._mem is None:
            mem, address = spare.pop()  # unpacked at once: the reference count check sees no tuple holding mem
            if type(mb := LRU_CACHE_MB.value) is not int or not (mb > 0 or mb == -1):
                spare.clear()  # nothing is to be kept: ensure_allocated applies (or refuses) the bound
            elif _reference_counts(mem) == _unshared_counts():  # no view of the old output outlived it
                self._mem, self._owner, nbytes = mem, allocator, self.nbytes
                if address:
                    self._address = (mem, address)
                GlobalCounters.mem_used += nbytes
                per_device = GlobalCounters.mem_used_per_device
                per_device[self.device] = per_device.get(self.device, 0) + nbytes
                if (hook := Hooks.trace) is not None:
                    hook.memory(self.device)
                return self
            del mem
        return self.ensure_allocated()

    def __del__(self) -> None:
        # the memory goes back to its allocator (a __del__ costs a fraction of a weakref.finalize per buffer); at exit
        # nothing is worth giving back
        if (owner := self._owner) is not None and not sys.is_finalizing():
            nbytes = self.nbytes
            GlobalCounters.mem_used -= nbytes
            per_device = GlobalCounters.mem_used_per_device
            per_device[self.device] = per_device.get(self.device, 0) - nbytes
            if (hook := Hooks.trace) is not None:
                hook.memory(self.device)
            if type(owner) is HostAllocator:  # the block keeps its address for the next buffer over it
                cached = self._address
                address = cached[1] if cached is not None and cached[0] is self._mem else 0
                if (spare := self._spare) is not None and not spare:
                    spare.append((self._mem, address))  # the next output of the same eager op takes it
                else:
                    HostAllocator.cache.give_back(self._mem, address)
            else:
                owner.free(self._mem)

    def use_external(self, mem: np.ndarray) -> None:
        """Back this buffer by host memory someone else owns (from_blob): neither copied nor freed here. A device whose
        memory is not host memory gets a copy of it instead."""
        if self.is_host:
            self._mem, self._initial = mem, None
        else:
            self._mem, self._initial = None, mem[: self.nbytes].copy()

    @property
    def handle(self) -> Any:
        """The allocator's handle for this buffer's memory (allocating it first)."""
        return self.ensure_allocated()._mem

    def host_view(self) -> np.ndarray:
        """The buffer's memory as a flat numpy array of its storage dtype (no copy); host devices only."""
        if not self.is_host:
            raise RuntimeError(
                f"{self.device} buffers live in device memory and have no host view: read them with Buffer.numpy()"
            )
        self.ensure_allocated()
        return self._mem[: self.nbytes].view(to_numpy_dtype(self.dtype))

    def address(self) -> int:
        """The host memory's address, remembered with the memory it belongs to: numpy's .ctypes.data builds an object
        per call, and every kernel launch asks for each argument's."""
        cached, mem = self._address, self._mem
        if cached is not None and cached[0] is mem:
            return cached[1]
        # memory from a host allocator (the usual case: a fresh output) skips the device lookup of is_host
        if mem is None or not getattr(self._owner or self.allocator, "host", True):
            self.host_view()  # allocates; raises for memory that is not the host's
            mem = self._mem
        try:  # a quarter of .ctypes.data's cost; read-only or empty memory cannot be exported this way
            address = ctypes.addressof(ctypes.c_char.from_buffer(mem))
        except (TypeError, ValueError):
            address = mem.ctypes.data
        self._address = (mem, address)
        return address

    def copyin(self, data: np.ndarray) -> None:
        """Host values (any shape, of this buffer's storage dtype) into the buffer."""
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if flat.nbytes != self.nbytes:
            raise ValueError(f"copying {flat.nbytes} bytes into {self!r} of {self.nbytes} bytes")
        if flat.nbytes:
            self.allocator.copyin(self.handle, flat)

    def numpy(self) -> np.ndarray:
        """A host copy of the values, flat, of the storage dtype."""
        if self.is_host:
            return self.host_view().copy()
        out = np.empty(self.nbytes, np.uint8)
        if self.nbytes:
            Device[self.device].synchronize()
            self.allocator.copyout(out, self.handle)
        return out.view(to_numpy_dtype(self.dtype))

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.size} {self.dtype}>"


def copy_buffer(dst: Buffer, src: Buffer) -> None:
    """dst = src between any two devices: a direct transfer when dst's allocator can read src's handles, else through
    host memory (a host side's own memory when there is one)."""
    if dst.nbytes != src.nbytes:
        raise ValueError(f"copy between buffers of different sizes: {src!r} -> {dst!r}")
    if dst.nbytes == 0:
        return
    dst_alloc, src_alloc = dst.allocator, src.allocator
    if (direct := getattr(dst_alloc, "can_transfer_from", None)) is not None and direct(src_alloc):
        Device[src.device].synchronize()
        dst_alloc.transfer(dst.handle, src.handle, dst.nbytes, src_alloc)
    elif src.is_host:
        dst_alloc.copyin(dst.handle, src.host_view().view(np.uint8))
    elif dst.is_host:
        Device[src.device].synchronize()
        src_alloc.copyout(dst.host_view().view(np.uint8), src.handle)
    else:
        dst.copyin(src.numpy())


class Compiler:
    """Source -> binary bytes, cached on disk (cache_dir()/<cache_name>) by a hash of the compiler's identity and the
    source; subclasses implement `compile` and say in `identity` what else changes the binary (version, target)."""

    def __init__(self, cache_name: str):
        self.cache = KernelCache(cache_name, ".bin")

    def identity(self) -> str:
        return type(self).__name__

    def compile(self, src: str, name: str) -> bytes:
        raise NotImplementedError

    def compile_cached(self, src: str, name: str) -> bytes:
        key = hashlib.sha256(f"{self.identity()}\n{src}".encode()).hexdigest()
        if CACHELEVEL >= 1 and CCACHE and (path := self.cache.lookup(key)) is not None:
            with open(path, "rb") as f:
                return f.read()
        binary = self.compile(src, name)
        self.cache.store_bytes(key, binary)
        return binary


class Compiled:
    """A device that runs kernels: `render(info)` gives source, the compiler a cached binary, and
    `program(info, binary)` something callable on the kernel's buffers (with its launch dimensions)."""

    def __init__(self, name: str, allocator: Allocator, renderer: Any, compiler: Compiler | None, program: Any):
        self.device, self.allocator, self.renderer, self.compiler, self.program = (
            name,
            allocator,
            renderer,
            compiler,
            program,
        )

    def refuse_kernels(self) -> None:
        """Called for a kernel scheduled on a device without a renderer: says why it runs none."""
        raise RuntimeError(f"{self.device} cannot run kernels: it has no code generator")

    def render(self, info: Any) -> str:
        return self.renderer.render(info.name, info.lin, info.packs)

    def build(self, info: Any) -> Any:
        src = self.render(info)
        if DEBUG >= 4:
            print(src)
        binary = self.compiler.compile_cached(src, info.name) if self.compiler is not None else src.encode()
        return self.program(self, info, binary)

    def synchronize(self) -> None:
        pass


class _DeviceRegistry:
    """`Device["CPU"]` opens (once) the device implemented by runtime/ops_<name>.py."""

    def __init__(self):
        self._opened: dict[str, Any] = {}
        self._lock = threading.Lock()  # threads opening one device at once get the same instance

    @staticmethod
    def canonicalize(name: str | None) -> str:
        if name is None:
            return Device.DEFAULT
        if not isinstance(name, str):
            raise TypeError(f"device must be a string, got {type(name).__name__} {name!r}")
        if name.upper().startswith("DISK:"):
            return "DISK:" + name[5:]
        base, _, idx = name.partition(":")
        base = base.upper()
        if base not in _known_devices():
            raise RuntimeError(f"unknown device {name!r}; available device types: {sorted(_known_devices())}")
        return base if idx in ("", "0") else f"{base}:{idx}"

    def __getitem__(self, name: str) -> Any:
        if (
            type(name) is str and (dev := self._opened.get(name)) is not None
        ):  # canonical and open: every allocation asks
            return dev
        name = self.canonicalize(name)
        if (dev := self._opened.get(name)) is not None:
            return dev
        with self._lock:
            if name not in self._opened:
                base = name.split(":")[0]
                module = importlib.import_module(f"fusegrad.runtime.ops_{base.lower()}")
                self._opened[name] = getattr(module, f"{base.capitalize()}Device")(name)
            return self._opened[name]

    @property
    def DEFAULT(self) -> str:
        return self.canonicalize(DEV.value) if DEV.value else _host_default(CC.value)

    @DEFAULT.setter
    def DEFAULT(self, name: str) -> None:
        DEV.value = self.canonicalize(name)

    @property
    def default(self) -> Any:
        return self[self.DEFAULT]

    def get_available_devices(self):
        for base in sorted(_known_devices()):
            try:
                self[base]
                yield base
            except Exception:
                pass


@functools.cache
def _host_default(cc: str) -> str:
    """CPU where a C compiler is installed; otherwise LLVM (compiles in-process through llvmlite), said once."""
    try:
        find_compiler()
        return "CPU"
    except RuntimeError as no_compiler:
        if importlib.util.find_spec("llvmlite") is None:
            raise RuntimeError(
                f"no device can compile kernels: the CPU device needs a C compiler ({no_compiler}), and the LLVM "
                "device needs llvmlite (pip install llvmlite, or pip install 'fusegrad[llvm]')"
            ) from None
    print(
        "fusegrad: no C compiler found for the CPU device, so the default device is LLVM (set CC or DEV to choose)",
        file=sys.stderr,
    )
    return "LLVM"


@functools.cache
def _known_devices() -> frozenset[str]:
    import pkgutil
    import fusegrad.runtime as rt

    return frozenset(m.name[4:].upper() for m in pkgutil.iter_modules(rt.__path__) if m.name.startswith("ops_"))


Device = _DeviceRegistry()
