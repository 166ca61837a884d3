"""The CPU device's C runner: one small library, compiled once by the CPU device's compiler, that launches a batch of
kernels from a table (cpu_graph's replays) and splits one kernel over its persistent worker threads (an eager split
launch). It builds in the background the first time, so no caller waits for its cold compile."""

from __future__ import annotations
import atexit
import ctypes
import threading
from fusegrad.helpers import DEBUG
from fusegrad.runtime.device import Device

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

/* one launch on this thread with its arguments in a struct (an eager op called again): a call converts one pointer */
struct fg_kernel_call {{ void *fn; int nargs; void **args; long long start, end; }};
void fg_call_packed(const struct fg_kernel_call *c) {{ fg_call(c->fn, c->nargs, c->args, c->start, c->end); }}

/* fg_run_graph untimed with its arguments in one struct: a replay's call converts one pointer, not eleven arguments */
struct fg_graph_call {{
  int count; void **fns; int *nargs; void **args; int *arg_off; long long *bounds; int *bound_off; int *chunks;
  int threads;
}};
void fg_run_packed(const struct fg_graph_call *c) {{
  fg_run_graph(c->count, c->fns, c->nargs, c->args, c->arg_off, c->bounds, c->bound_off, c->chunks, c->threads, 0, 0);
}}
"""


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
    try:
        lib = Device["CPU"].compiler.load(_runner_source(), "fg_graph_runner")
    except RuntimeError as e:  # CompileError is one, and so is a missing compiler
        if DEBUG >= 1:
            print(f"TinyJit replays without batching: the CPU graph runner did not build ({e})")
        return None
    lib.fg_run_graph.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 7 + [ctypes.c_int] + [ctypes.c_void_p] * 2
    lib.fg_run_graph.restype = None
    lib.fg_run_packed.argtypes = None  # its one argument is always a byref of a GraphCall: no per-call conversion
    lib.fg_run_packed.restype = None
    lib.fg_call_packed.argtypes = None  # a byref of a KernelCall
    lib.fg_call_packed.restype = None
    lib.fg_start_workers.argtypes = [ctypes.c_int]
    lib.fg_start_workers.restype = ctypes.c_int
    lib.fg_run_one.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 2
    lib.fg_run_one.restype = None
    return lib
