"""Core pipeline benchmarks against numpy, measured in one process: `python bench/bench_core.py`.

Prints the median of several runs for each case and fusegrad's speed as a ratio to numpy (>1 means faster)."""

from __future__ import annotations
import statistics
import time
import numpy as np
from fusegrad import Tensor


def median_time(fn, repeats: int = 7) -> float:
    fn()  # warm-up: compiles and allocates
    times = []
    for _ in range(repeats):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def main() -> None:
    n = 16 * 1024 * 1024
    rng = np.random.default_rng(0)
    an, bn, cn = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    a, b, c = (Tensor(x).realize() for x in (an, bn, cn))
    rows = []

    # results are assigned into an output buffer: a repeated identical expression would otherwise be served from
    # the realized-value cache without running anything
    out = Tensor.empty(n).realize()
    t_np = median_time(lambda: np.maximum(an * bn + cn, 0))
    t_fg = median_time(lambda: out.assign((a * b + c).relu()).realize())
    rows.append(("fused (a*b+c).relu(), 16M f32", t_fg, t_np))

    t_np = median_time(lambda: an.sum())
    out_sum = Tensor.empty(()).realize()
    t_fg = median_time(lambda: out_sum.assign(a.sum()).realize())
    rows.append(("a.sum(), 16M f32", t_fg, t_np))

    m = 1024
    xn, yn = rng.standard_normal((m, m), dtype=np.float32), rng.standard_normal((m, m), dtype=np.float32)
    x, y = Tensor(xn).realize(), Tensor(yn).realize()
    t_np = median_time(lambda: xn @ yn, repeats=3)
    out_mm = Tensor.empty(m, m).realize()
    t_fg = median_time(lambda: out_mm.assign(x @ y).realize(), repeats=3)
    rows.append((f"matmul {m}x{m} f32", t_fg, t_np))

    print(f"{'case':34s} {'fusegrad':>12s} {'numpy':>12s} {'speed vs numpy':>15s}")
    for name, fg, npt in rows:
        print(f"{name:34s} {fg * 1e3:10.2f}ms {npt * 1e3:10.2f}ms {npt / fg:14.2f}x")
    print(f"matmul GFLOPS: fusegrad {2 * m**3 / rows[-1][1] / 1e9:.2f}, numpy {2 * m**3 / rows[-1][2] / 1e9:.2f}")

    small = Tensor(rng.standard_normal(16, dtype=np.float32)).realize()
    out_small = Tensor.empty(16).realize()

    def chain():
        t = small
        for _ in range(5):
            t = t * 1.5 + 0.5
        return out_small.assign(t).realize()

    t_chain = median_time(chain, repeats=51)
    print(
        f"python overhead: build + realize a 10-op chain on 16 elements: {t_chain * 1e6 / 10:.1f} us per op"
        f" ({t_chain * 1e6:.0f} us total)"
    )


if __name__ == "__main__":
    main()
