"""Where host blocks start, seen by MPI: mpi4py's own `Allreduce` of 64 MB on 4 ranks (loopback, `--oversubscribe`)
on numpy's arrays, on fusegrad's host blocks, and on blocks that all start on a huge page boundary (how fusegrad
placed them before their colors). Run: `python bench/bench_host_blocks.py` (it starts mpirun itself; env MB, RANKS).
Prints each placement's median and best time over alternating rounds, rank 0's view."""

from __future__ import annotations
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"PYTHONPATH": ROOT, "NUM_CPU_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def aligned_block(nbytes: int, huge_page: int) -> np.ndarray:
    """A block on transparent huge pages starting exactly on a huge page boundary."""
    region = mmap.mmap(-1, nbytes + huge_page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, np.uint8)
    offset = (-whole.ctypes.data) % huge_page
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE, offset, nbytes - nbytes % huge_page)
    return whole[offset : offset + nbytes]


def worker() -> None:
    from mpi4py import MPI
    from fusegrad.runtime.device import HUGE_PAGE, HostAllocator

    comm, n = MPI.COMM_WORLD, int(os.environ.get("MB", "64")) * 2**20 // 4
    pairs = {
        "numpy arrays": (np.ones(n, np.float32), np.empty(n, np.float32)),
        "fusegrad host blocks": tuple(HostAllocator._fresh(4 * n).view(np.float32) for _ in range(2)),
        "huge page aligned blocks": tuple(aligned_block(4 * n, HUGE_PAGE).view(np.float32) for _ in range(2)),
    }
    for src, _ in pairs.values():
        src[:] = 1
    times: dict[str, list[float]] = {k: [] for k in pairs}
    for r in range(4):
        for name in list(pairs) if r % 2 == 0 else list(reversed(pairs)):
            for _ in range(3):
                comm.Barrier()
                st = time.perf_counter()
                comm.Allreduce(*pairs[name])
                times[name].append(time.perf_counter() - st)
    assert all(np.all(dst == comm.size) for _, dst in pairs.values()), "wrong allreduce result"
    if comm.rank == 0:
        print(f"mpi4py Allreduce of {4 * n >> 20} MB float32 on {comm.size} ranks, 12 calls per placement")
        for name, t in times.items():
            print(f"  {name:26s} median {statistics.median(t) * 1e3:7.1f} ms   best {min(t) * 1e3:7.1f} ms")


def main() -> None:
    launcher = shutil.which("mpirun")
    assert launcher, "mpirun not found: pip install 'fusegrad[mpi]'"
    ranks = os.environ.get("RANKS", "4")
    cmd = [launcher, "--oversubscribe", "-n", ranks, sys.executable, __file__, "worker"]
    subprocess.run(cmd, env={**os.environ, **ENV}, check=True, timeout=600)


if __name__ == "__main__":
    worker() if sys.argv[1:] == ["worker"] else main()
