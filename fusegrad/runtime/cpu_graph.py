"""A graph of the CPU device: a batch of loaded kernels launched in order by one C call (TinyJit's replay).

The batch is a table of entries (kernel function pointer, its buffer addresses, how its outer loop is split over
threads); a small C runner, compiled once by the CPU device's compiler, walks the table. A kernel the CPU device would
split over threads is split the same way here, over the runner's own worker threads (NUM_CPU_THREADS - 1 of them).
The eager launch of a split kernel (CPUProgram) goes through the same workers with `fg_run_one`; the runner lets one
split run at a time."""

from __future__ import annotations
import ctypes
import threading
from functools import partial
from dataclasses import dataclass
from fusegrad.helpers import NUM_CPU_THREADS
from fusegrad.runtime import cpu_runner
from fusegrad.runtime.cpu_runner import MAX_KERNEL_ARGS, MAX_WORKERS, SPAN_CELLS
from fusegrad.runtime.cpu_runner import runner_built as runner_built  # the engine asks here whether batches can run
from fusegrad.runtime.device import Buffer
from fusegrad.runtime.ops_cpu import CPUProgram

_start_lock = threading.Lock()


@dataclass(frozen=True)
class GraphEntry:
    """One launch of a batch: a CPU kernel on buffers, or (program None) a copy of buffers[1] into buffers[0]."""

    program: CPUProgram | None
    buffers: tuple[Buffer, ...]


def batchable(program: object, nbuffers: int) -> bool:
    return isinstance(program, CPUProgram) and nbuffers <= MAX_KERNEL_ARGS and cpu_runner.graph_library() is not None


class GraphCall(ctypes.Structure):
    """fg_run_packed's argument: fg_run_graph's untimed arguments, the tables' addresses."""

    _fields_ = (
        [("count", ctypes.c_int)]
        + [(name, ctypes.c_void_p) for name in ("fns", "nargs", "args", "arg_off", "bounds", "bound_off", "chunks")]
        + [("threads", ctypes.c_int)]
    )


class KernelCall(ctypes.Structure):
    """fg_call_packed's argument: a kernel, its argument count, its table of buffer addresses and its loop bounds."""

    _fields_ = [
        ("fn", ctypes.c_void_p),
        ("nargs", ctypes.c_int),
        ("args", ctypes.c_void_p),
        ("start", ctypes.c_longlong),
        ("end", ctypes.c_longlong),
    ]


class PackedLaunch:
    """A one-chunk CPU kernel's launch as one C call of one argument (the runner's fg_call_packed): an eager op called
    again writes its buffers' addresses into `table` only when they differ from the last call's (`addrs`)."""

    __slots__ = ("table", "addrs", "call", "_args")

    def __init__(self, lib: ctypes.CDLL, program: CPUProgram):
        self.table = (ctypes.c_void_p * program.nparams)()
        self.addrs: list[int] | None = None
        table = ctypes.addressof(self.table)
        self._args = KernelCall(program.fn_address, program.nparams, table, 0, program.outer_size)
        self.call = partial(lib.fg_call_packed, ctypes.byref(self._args))


def packed_launch(program: object) -> PackedLaunch | bool:
    """The PackedLaunch of a kernel that runs as one call on this thread (`address_launch`), once the runner is built;
    True while it is still building (ask again), False where there will be none."""
    if not isinstance(program, CPUProgram) or program.address_launch() is None or program.nparams > MAX_KERNEL_ARGS:
        return False
    if not cpu_runner.runner_built():
        return True
    lib = cpu_runner.graph_library()
    return PackedLaunch(lib, program) if lib is not None else False


class CPUGraph:
    """A batch of launches compiled into argument tables once; `slots` says where each buffer's address sits, so a
    replay swaps buffers (new inputs) by rewriting table cells and runs the batch in one call."""

    def __init__(self, entries: list[GraphEntry]):
        lib = cpu_runner.graph_library()
        assert lib is not None, "a CPUGraph needs the compiled runner (see batchable)"
        self.lib = lib
        threads = self.threads = int(NUM_CPU_THREADS.value)
        with _start_lock:
            self.lib.fg_start_workers(min(max(threads - 1, 0), MAX_WORKERS))
        self.entries = entries
        n = len(entries)
        fns, nargs, arg_off, bound_off, chunks = [], [], [], [], []
        flat_args: list[Buffer] = []
        bounds: list[int] = []
        for e in entries:
            arg_off.append(len(flat_args))
            bound_off.append(len(bounds))
            flat_args.extend(e.buffers)
            if e.program is None:
                fns.append(None)
                nargs.append(-1)
                chunks.append(1)
                bounds.extend((min(e.buffers[0].nbytes, e.buffers[1].nbytes), 0))
            else:
                fns.append(ctypes.cast(e.program.fn, ctypes.c_void_p).value)
                nargs.append(len(e.buffers))
                b = e.program.chunk_bounds(threads)
                chunks.append(len(b) - 1)
                bounds.extend(b)
        self.count = n
        self.fns = (ctypes.c_void_p * n)(*fns)
        self.nargs = (ctypes.c_int * n)(*nargs)
        self.args = (ctypes.c_void_p * max(len(flat_args), 1))(*(b.address() for b in flat_args))
        self.arg_off = (ctypes.c_int * n)(*arg_off)  # entry i's buffer addresses start at cell arg_off[i]
        self.bounds = (ctypes.c_longlong * max(len(bounds), 1))(*bounds)
        self.bound_off = (ctypes.c_int * n)(*bound_off)
        self.chunks = (ctypes.c_int * n)(*chunks)
        self.slots: dict[Buffer, list[int]] = {}
        for i, b in enumerate(flat_args):
            self.slots.setdefault(b, []).append(i)
        # timed()'s tables of entry start and end times and of split entries' thread spans, made here so that a timed
        # run neither allocates nor touches fresh pages inside the time it reports
        self._times = (ctypes.c_longlong * (2 * self.count))()
        self._spans = (ctypes.c_longlong * (SPAN_CELLS * self.count))()
        self._call_args = tuple(
            ctypes.addressof(a)
            for a in (self.fns, self.nargs, self.args, self.arg_off, self.bounds, self.bound_off, self.chunks)
        )
        self._packed = GraphCall(self.count, *self._call_args, self.threads)
        # the batch's run as one C call of one argument (a replay's thunk): the tables it points at stay these arrays
        self.run = partial(self.lib.fg_run_packed, ctypes.byref(self._packed))
        # the same call described for a caller in C (TinyJit's C lane): the function's address and its argument's
        self.run.c_call = (ctypes.cast(self.lib.fg_run_packed, ctypes.c_void_p).value, ctypes.addressof(self._packed))

    def forget_buffers(self) -> None:
        """Drop the buffers the batch was built with (a graph every run rebinds whole, with `bind_all`)."""
        self.entries, self.slots = [], {}

    def bind_all(self, addresses: list[int]) -> None:
        """Every entry's buffer addresses anew, in entry order."""
        self.args[: len(addresses)] = addresses

    def set_address(self, slots: list[int], address: int) -> None:
        for i in slots:
            self.args[i] = address

    def __call__(self) -> None:
        self.run()

    def timed(self) -> None:
        """Run the batch as __call__ does, recording each entry's start and end and each split entry's thread spans
        for timings() to read (kept apart so a caller's clock around this call times the batch alone)."""
        self.lib.fg_run_graph(
            self.count, *self._call_args, self.threads, *map(ctypes.addressof, (self._times, self._spans))
        )

    def timings(self) -> tuple[list[int], list[list[tuple[int, int, int]]]]:
        """The last timed() run: each entry's start and end, in perf_counter_ns's clock, and for each entry the
        (participant, start, end) of every thread that ran chunks of it (participant 0: the caller)."""
        flat = self._spans[:]
        per_entry = [
            [(p, flat[i * SPAN_CELLS + 2 * p], flat[i * SPAN_CELLS + 2 * p + 1]) for p in range(SPAN_CELLS // 2)]
            for i in range(self.count)
        ]
        return self._times[:], [[span for span in entry if span[1]] for entry in per_entry]
