"""The host's measured peaks, the roof of VIZ's roofline: floating-point rate (a float32 matmul through numpy's BLAS,
on all cores) and memory bandwidth (a copy far larger than the caches). Measured once per machine and kept on disk."""

from __future__ import annotations
import hashlib
import json
import os
import platform
import time

from fusegrad.helpers import cache_dir

MATMUL_N = 1024  # 2 GFLOP: long enough to time, short enough at exit
COPY_BYTES = 1 << 28  # 256 MiB: past every cache level
TRIES = 5


def machine_peaks() -> dict[str, float | str]:
    """{"GFLOPS", "GB/s", "how"}: from the disk cache, or measured now (about a second) and stored there."""
    path = os.path.join(cache_dir(), "viz", f"peaks-{_machine_key()}.json")
    try:
        with open(path) as f:
            peaks = json.load(f)
        if isinstance(peaks.get("GFLOPS"), float) and isinstance(peaks.get("GB/s"), float):
            return peaks
    except (OSError, ValueError, AttributeError):
        pass  # not measured yet here, or a damaged file: measure again
    peaks = measure_peaks()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(peaks, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: measured again next time
    return peaks


def measure_peaks() -> dict[str, float | str]:
    import numpy as np

    a = np.random.default_rng(0).random((MATMUL_N, MATMUL_N), dtype=np.float32)
    flops = 2 * MATMUL_N**3 / _best_seconds(lambda: a @ a)
    src = np.ones(COPY_BYTES // 8, np.float64)
    dst = np.empty_like(src)
    moved = 2 * COPY_BYTES / _best_seconds(lambda: np.copyto(dst, src))  # each byte read once and written once
    return {
        "GFLOPS": round(flops / 1e9, 3),
        "GB/s": round(moved / 1e9, 3),
        "how": f"best of {TRIES}: numpy float32 {MATMUL_N}x{MATMUL_N} matmul, {COPY_BYTES >> 20} MiB copy{_load()}",
    }


def _best_seconds(fn) -> float:
    fn()  # warm: first touch of the pages, BLAS threads started
    best = float("inf")
    for _ in range(TRIES):
        st = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - st)
    return max(best, 1e-9)


def _load() -> str:
    """The load average when measured: a busy machine's peaks are low, and they are kept (delete the file to redo)."""
    return f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""


def _machine_key() -> str:
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln for ln in f if ln.startswith("model name")), "")
    return hashlib.sha256(f"{platform.machine()}|{cpu}|{os.cpu_count()}".encode()).hexdigest()[:16]
