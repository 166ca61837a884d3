"""A graph of the CPU device: a batch of loaded kernels launched in order by one C call (TinyJit's replay).

The batch is a table of entries (kernel function pointer, its buffer addresses, how its outer loop is split over
threads); a small C runner, compiled once by the CPU device's compiler, walks the table. A kernel the CPU device would
split over threads is split the same way here, over the runner's own worker threads (NUM_CPU_THREADS - 1 of them).
The eager launch of a split kernel (CPUProgram) goes through the same workers with `fg_run_one`; the runner lets one
split run at a time."""

from __future__ import annotations
import atexit
import ctypes
import threading
from dataclasses import dataclass
from fusegrad.helpers import DEBUG, NUM_CPU_THREADS
from fusegrad.runtime.device import Buffer
from fusegrad.runtime.ops_cpu import CPUProgram

# kernels with more buffers than this are launched from Python (the C switch has one case per arity); the
# scheduler gives a kernel at most 64 constant parameters besides its buffers
MAX_KERNEL_ARGS = 128
MAX_WORKERS = 63
SPAN_CELLS = 2 * (MAX_WORKERS + 1)  # a split entry's (start, end) per participant: the caller and each worker
# pauses a worker spins for the next kernel before it sleeps (about 40-140 cycles each on x86)
SPIN_PAUSES = 2000


def _runner_source() -> str:
    arities = "\n".join(
        f"typedef void (*fg_k{n})({'void*, ' * n}long long, long long);\n" for n in range(MAX_KERNEL_ARGS + 1)
    )
    cases = "\n".join(
        f"    case {n}: ((fg_k{n})f)({''.join(f'a[{i}], ' for i in range(n))}s, e); break;"
        for n in range(MAX_KERNEL_ARGS + 1)
    )
    return f"""#include <pthread.h>
#include <string.h>
#include <time.h>
{arities}
static void fg_call(void *f, int n, void **a, long long s, long long e) {{
  switch (n) {{
{cases}
    default: break;
  }}
}}

/* the kernel being split: the caller and workers 0..helpers-1 take its chunks from `next` until none is left */
static struct {{
  void *f; int n; void **a; long long *bounds; int chunks; int next; int busy; int helpers; long gen;
  long long *spans;  /* non-null: participant p (0 the caller, 1 + a worker's id) writes its first chunk's start and
                        last chunk's end at spans[2p], spans[2p + 1] (CLOCK_MONOTONIC ns) */
}} job;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
/* one split at a time: a second caller (another Python thread) waits until the first has all its chunks done */
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;
static int nworkers = 0, atfork_set = 0;

/* a forked child has none of the workers: it starts its own when it first splits */
static void fg_after_fork_child(void) {{
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
  mu = fresh; run_mu = fresh; go = fresh_cond; done = fresh_cond;
  nworkers = 0; job.busy = 0;
}}

static long long fg_now(void) {{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}}

static void fg_take_chunks(int participant) {{
  long long *span = job.spans ? job.spans + 2 * participant : 0;
  for (int taken = 0;; taken++) {{
    int c = __atomic_fetch_add(&job.next, 1, __ATOMIC_ACQ_REL);
    if (c >= job.chunks) return;
    if (span && !taken) span[0] = fg_now();
    fg_call(job.f, job.n, job.a, job.bounds[c], job.bounds[c + 1]);
    if (span) span[1] = fg_now();
  }}
}}

/* a worker spins this many pauses (tens of microseconds) for the next job before it sleeps, and so does a caller
   for its helpers: the kernels of a step follow each other closer than a futex wake-up */
#define FG_SPIN {SPIN_PAUSES}
static inline void fg_pause(void) {{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}}

static void *fg_worker(void *arg) {{
  long id = (long)arg, seen = 0;
  for (;;) {{
    for (int i = 0; i < FG_SPIN && __atomic_load_n(&job.gen, __ATOMIC_ACQUIRE) == seen; i++) fg_pause();
    pthread_mutex_lock(&mu);
    while (job.gen == seen) pthread_cond_wait(&go, &mu);
    seen = job.gen;
    if (id >= job.helpers) {{  /* more workers than this launch's thread count: this one sits it out */
      pthread_mutex_unlock(&mu);
      continue;
    }}
    __atomic_add_fetch(&job.busy, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&mu);
    fg_take_chunks(1 + (int)id);
    pthread_mutex_lock(&mu);
    if (__atomic_sub_fetch(&job.busy, 1, __ATOMIC_RELEASE) == 0) pthread_cond_signal(&done);
    pthread_mutex_unlock(&mu);
  }}
  return 0;
}}

int fg_start_workers(int n) {{
  if (n > {MAX_WORKERS}) n = {MAX_WORKERS};
  pthread_mutex_lock(&mu);
  if (!atfork_set) {{ pthread_atfork(0, 0, fg_after_fork_child); atfork_set = 1; }}
  while (nworkers < n) {{
    pthread_t t;
    if (pthread_create(&t, 0, fg_worker, (void *)(long)nworkers) != 0) break;
    pthread_detach(t);
    nworkers++;
  }}
  int started = nworkers;
  pthread_mutex_unlock(&mu);
  return started;
}}

static void fg_split(void *f, int n, void **a, long long *bounds, int chunks, int helpers, long long *spans) {{
  pthread_mutex_lock(&run_mu);
  pthread_mutex_lock(&mu);
  /* a worker that woke late for the previous job may still be in it: the fields change only once it has left */
  while (job.busy > 0) pthread_cond_wait(&done, &mu);
  job.f = f; job.n = n; job.a = a; job.bounds = bounds; job.chunks = chunks; job.next = 0; job.helpers = helpers;
  job.spans = spans;
  __atomic_store_n(&job.gen, job.gen + 1, __ATOMIC_RELEASE);  /* spinning workers read it without the lock */
  pthread_cond_broadcast(&go);
  pthread_mutex_unlock(&mu);
  fg_take_chunks(0);
  for (int i = 0; i < FG_SPIN && __atomic_load_n(&job.busy, __ATOMIC_ACQUIRE) > 0; i++) fg_pause();
  pthread_mutex_lock(&mu);
  while (job.busy > 0) pthread_cond_wait(&done, &mu);
  pthread_mutex_unlock(&mu);
  pthread_mutex_unlock(&run_mu);
}}

static int fg_helpers(int chunks, int threads) {{
  int helpers = (chunks < threads ? chunks : threads) - 1;
  return helpers < nworkers ? helpers : nworkers;
}}

/* one kernel split over `chunks` chunks (bounds[0..chunks]) by the caller and threads - 1 workers, started here when
   fewer run: an eager launch's one call */
void fg_run_one(void *f, int n, void **a, long long *bounds, int chunks, int threads) {{
  int want = (chunks < threads ? chunks : threads) - 1;
  if (want > 0 && __atomic_load_n(&nworkers, __ATOMIC_ACQUIRE) < want) fg_start_workers(want);
  if (want > 0 && nworkers > 0) fg_split(f, n, a, bounds, chunks, fg_helpers(chunks, threads), 0);
  else fg_call(f, n, a, bounds[0], bounds[chunks]);
}}

/* entry i: nargs[i] >= 0 launches fns[i] on args[arg_off[i]..] over its chunks (bounds[bound_off[i]..], chunks[i]
   of them, on up to `threads` threads); nargs[i] == -1 copies bounds[bound_off[i]] bytes from args[arg_off[i] + 1]
   to args[arg_off[i]]; a non-null `times` gets each entry's start and end (CLOCK_MONOTONIC ns, the profiler's clock)
   and a non-null `spans` each participant's span of a split entry at spans[i * SPAN_CELLS ..] (zero: it took none) */
#define SPAN_CELLS (2 * ({MAX_WORKERS} + 1))
void fg_run_graph(int count, void **fns, int *nargs, void **args, int *arg_off, long long *bounds, int *bound_off,
                  int *chunks, int threads, long long *times, long long *spans) {{
  for (int i = 0; i < count; i++) {{
    void **a = args + arg_off[i];
    long long *b = bounds + bound_off[i];
    long long *span = spans ? spans + (long long)i * SPAN_CELLS : 0;
    if (span) memset(span, 0, sizeof(long long) * SPAN_CELLS);
    if (times) times[2 * i] = fg_now();
    if (nargs[i] < 0) memcpy(a[0], a[1], (size_t)b[0]);
    else if (chunks[i] > 1 && threads > 1 && nworkers > 0)
      fg_split(fns[i], nargs[i], a, b, chunks[i], fg_helpers(chunks[i], threads), span);
    else fg_call(fns[i], nargs[i], a, b[0], b[chunks[i]]);
    if (times) times[2 * i + 1] = fg_now();
  }}
}}
"""


_start_lock = threading.Lock()
_build_lock = threading.Lock()
_build_started = threading.Event()
_built: list[ctypes.CDLL | None] = []  # the runner once its build has finished (None: it did not build)


def graph_library() -> ctypes.CDLL | None:
    """The compiled runner, or None where no C compiler is found (e.g. on the LLVM device): replays then launch kernel
    by kernel. Waits for a build already running on the background thread."""
    with _build_lock:
        if not _built:
            _built.append(_build_runner())
        return _built[0]


def runner_built() -> bool:
    """Whether the runner's build has finished; if not, it goes on in a background thread, and the eager launches
    that asked go kernel by kernel meanwhile rather than wait a second and a half for a cold compile."""
    if _built:
        return True
    if not _build_started.is_set():
        with _build_lock:
            if _built:
                return True
            if not _build_started.is_set():
                _build_started.set()
                from fusegrad.runtime.device import Device

                try:
                    quick = Device["CPU"].compiler.is_cached(_runner_source())  # loading takes milliseconds
                except RuntimeError:
                    quick = True  # no C compiler: the build gives up at once
                if quick:
                    _built.append(_build_runner())
                    return True
                builder = threading.Thread(target=graph_library, name="fusegrad-runner-build", daemon=True)
                builder.start()
                atexit.register(builder.join)  # a process that ends first still leaves the compiler no temp files
    return False


def _build_runner() -> ctypes.CDLL | None:
    from fusegrad.runtime.device import Device

    try:
        lib = Device["CPU"].compiler.load(_runner_source(), "fg_graph_runner")
    except RuntimeError as e:  # CompileError is one, and so is a missing compiler
        if DEBUG >= 1:
            print(f"TinyJit replays without batching: the CPU graph runner did not build ({e})")
        return None
    lib.fg_run_graph.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 7 + [ctypes.c_int] + [ctypes.c_void_p] * 2
    lib.fg_run_graph.restype = None
    lib.fg_start_workers.argtypes = [ctypes.c_int]
    lib.fg_start_workers.restype = ctypes.c_int
    lib.fg_run_one.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 2
    lib.fg_run_one.restype = None
    return lib


@dataclass(frozen=True)
class GraphEntry:
    """One launch of a batch: a CPU kernel on buffers, or (program None) a copy of buffers[1] into buffers[0]."""

    program: CPUProgram | None
    buffers: tuple[Buffer, ...]


def batchable(program: object, nbuffers: int) -> bool:
    return isinstance(program, CPUProgram) and nbuffers <= MAX_KERNEL_ARGS and graph_library() is not None


class CPUGraph:
    """A batch of launches compiled into argument tables once; `slots` says where each buffer's address sits, so a
    replay swaps buffers (new inputs) by rewriting table cells and runs the batch in one call."""

    def __init__(self, entries: list[GraphEntry]):
        lib = graph_library()
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
        self.lib.fg_run_graph(self.count, *self._call_args, self.threads, None, None)

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
