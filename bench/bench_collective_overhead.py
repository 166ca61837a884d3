"""Where the microseconds of a small allreduce go: fusegrad's Python around MPI's call, piece by piece, in one process.

Run: python bench/bench_collective_overhead.py   (no mpirun: the group is this process alone over MPI's COMM_SELF, so
MPI's own call costs almost nothing and what remains is each layer's overhead; env N = elements, default 1 float32).
Each line is the best of ROUNDS runs of REPS calls, minus an empty lambda's time; interleaved, one process run."""

from __future__ import annotations
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def best_us(fn, reps: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        st = time.perf_counter_ns()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter_ns() - st) / reps / 1e3)
    return min(times)


def main() -> None:
    from mpi4py import MPI

    from fusegrad import Tensor, TinyJit
    from fusegrad.distributed import all_reduce
    from fusegrad.distributed import comm as dist_comm
    from fusegrad.engine.realize import realize_lock
    from fusegrad.tensor import tensor_of_uop

    w = dist_comm.World(MPI, MPI.COMM_SELF)
    dist_comm._world[:] = [w]  # a group of one that still runs every collective through MPI
    n, reps, rounds = (
        int(os.environ.get("N", "1")),
        int(os.environ.get("REPS", "3000")),
        int(os.environ.get("ROUNDS", "40")),
    )
    a, b = np.ones(n, np.float32), np.empty(n, np.float32)
    x = Tensor(a).realize()
    jitted = TinyJit(lambda t: all_reduce(t))
    for _ in range(3):
        jitted(x)
    assert np.all(jitted(x).numpy() == 1), "wrong allreduce result"
    cap, known = jitted.captured, jitted._known
    assert cap is not None and known is not None and cap.single_return is not None
    launch, one = cap.launches[0], cap.single_return
    step = cap._thunks[0]  # type: ignore[index]  # the replay's collective step: the bound call, watched
    assert known.lane is not None, "the repeated call did not take the steady lane"
    bound = launch.runner.cache[2]  # libmpi's call (mpi4py's where no libmpi was found)

    def lock() -> None:
        with realize_lock:
            pass

    pieces = {
        "mpi4py Allreduce(a, b)": lambda: MPI.COMM_SELF.Allreduce(a, b),
        "bound call (libmpi)" if w.lib else "bound call (mpi4py)": bound,
        "replay step (the bound call, watched)": step,
        "runner __call__ (eager / unthunked)": lambda: launch.runner(launch.buffers),
        "CapturedJit replay (+ counters, checks)": lambda: cap(known.inputs, known.var_vals),
        "a new returned Tensor (tensor_of_uop)": lambda: tensor_of_uop(one[0], one[1]),
        "realize_lock": lock,
        "TinyJit call, whole": lambda: jitted(x),
        "eager all_reduce(x)": lambda: all_reduce(x),
    }
    empty = best_us(lambda: None, reps, rounds)
    got = {k: best_us(fn, reps, rounds) - empty for k, fn in pieces.items()}
    print(f"allreduce of {n} float32 over COMM_SELF: best of {rounds} x {reps} calls, empty call subtracted")
    for k, v in got.items():
        print(f"  {k:42s} {v:7.3f} us")
    lane = got["TinyJit call, whole"] - got["replay step (the bound call, watched)"]
    print(f"  {'TinyJit steady lane around the step (whole - step)':42s} {lane:7.3f} us")


if __name__ == "__main__":
    main()
