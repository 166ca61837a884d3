"""EMULATED_DTYPES against the native narrow floats and torch, in one process: `python bench/bench_emulated.py`.

Prints the median of several runs for each case (native, emulated, torch on as many threads) and the ratios
native/emulated and torch/emulated (>1 means emulation is faster)."""

from __future__ import annotations
import statistics
import time
import numpy as np
import torch
from fusegrad import Context, Tensor, dtypes
from fusegrad.helpers import NUM_CPU_THREADS

EMULATED = "half,bfloat16,fp8e4m3,fp8e5m2"
N = 1 << 20


def median_time(fn, repeats: int = 9) -> float:
    fn()  # warm-up: compiles and allocates
    times = []
    for _ in range(repeats):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(int(NUM_CPU_THREADS.value) or 1)
    rng = np.random.default_rng(0)
    x32, y32 = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
    a32, b32 = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
    tdt = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16, dtypes.fp8e4m3: torch.float8_e4m3fn}
    print(f"{'case':28s} {'native':>10s} {'emulated':>10s} {'torch':>10s} {'nat/emu':>8s} {'torch/emu':>9s}")
    for dt in (dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3):
        cases = {
            "x*y+x": (
                lambda x, y, a, b: (x * y + x).realize(),
                lambda x, y, a, b: (x.float() * y.float() + x.float()).to(x.dtype),
            ),
            "cast to and back": (
                lambda x, y, a, b: x.cast(dtypes.float32).mul(3).cast(dt).realize(),
                lambda x, y, a, b: (x.float() * 3).to(x.dtype),
            ),
            "matmul 256": (
                lambda x, y, a, b: (a @ b).realize(),
                lambda x, y, a, b: (a.float() @ b.float()).to(a.dtype),
            ),
        }
        for name, (fg, tf) in cases.items():
            args = [Tensor(v).cast(dt).realize() for v in (x32, y32, a32, b32)]
            native = median_time(lambda: fg(*args))
            with Context(EMULATED_DTYPES=EMULATED):
                args = [Tensor(v).cast(dt).realize() for v in (x32, y32, a32, b32)]
                emulated = median_time(lambda: fg(*args))
            targs = [torch.tensor(v).to(tdt[dt]) for v in (x32, y32, a32, b32)]
            tt = median_time(lambda: tf(*targs))
            row = f"{dt.name + ' ' + name:28s} {native * 1e3:8.2f}ms {emulated * 1e3:8.2f}ms {tt * 1e3:8.2f}ms"
            print(f"{row} {native / emulated:7.2f}x {tt / emulated:8.2f}x")


if __name__ == "__main__":
    main()
