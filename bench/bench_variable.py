"""KV-cache decode steps with a bound Variable position against concrete positions and numpy, in one process:
`python bench/bench_variable.py`.

A step writes one key/value row into a preallocated cache at `start_pos` and attends one query over
`cache[:start_pos+1]`. With a Variable every position runs the kernels compiled for the first; with a plain int each new
position is a new shape, so new kernels (compiled once, then cached on disk: the second process pays only loading).
Prints the median step time over the positions of each run and the kernels compiled."""

from __future__ import annotations
import statistics
import time
import numpy as np
from fusegrad import GlobalCounters, Tensor, Variable

MAX_LEN, DIM, STEPS = 512, 64, 48


def decode(symbolic: bool, first_pos: int) -> tuple[float, int]:
    rng = np.random.default_rng(0)
    cache_k = Tensor.zeros(MAX_LEN, DIM).contiguous().realize()
    cache_v = Tensor.zeros(MAX_LEN, DIM).contiguous().realize()
    pos_var = Variable("start_pos", 0, MAX_LEN - 1)
    compiled, times = GlobalCounters.compile_count, []
    for pos in range(first_pos, first_pos + STEPS):
        k, v, q = (Tensor(rng.standard_normal((1, DIM), dtype=np.float32)) for _ in range(3))
        st = time.perf_counter()
        sp = pos_var.bind(pos) if symbolic else pos
        cache_k.shrink(((sp, sp + 1), None)).assign(k)
        cache_v.shrink(((sp, sp + 1), None)).assign(v)
        scores = (q @ cache_k[: sp + 1].T) / DIM**0.5
        (scores.softmax(-1) @ cache_v[: sp + 1]).numpy()
        times.append(time.perf_counter() - st)
        del scores
    return statistics.median(times[1:]), GlobalCounters.compile_count - compiled


def decode_numpy(first_pos: int) -> float:
    rng = np.random.default_rng(0)
    cache_k, cache_v = np.zeros((MAX_LEN, DIM), np.float32), np.zeros((MAX_LEN, DIM), np.float32)
    times = []
    for pos in range(first_pos, first_pos + STEPS):
        k, v, q = (rng.standard_normal((1, DIM), dtype=np.float32) for _ in range(3))
        st = time.perf_counter()
        cache_k[pos], cache_v[pos] = k[0], v[0]
        s = q @ cache_k[: pos + 1].T / DIM**0.5
        e = np.exp(s - s.max(-1, keepdims=True))
        _ = (e / e.sum(-1, keepdims=True)) @ cache_v[: pos + 1]
        times.append(time.perf_counter() - st)
    return statistics.median(times[1:])


def main() -> None:
    # positions no earlier run of this script used, so the concrete run compiles (not only loads) its kernels
    first_pos = int(time.time()) % (MAX_LEN - STEPS)
    t_np = decode_numpy(first_pos)
    t_sym, n_sym = decode(True, first_pos)
    t_int, n_int = decode(False, first_pos)
    print(f"KV-cache decode, {STEPS} positions from {first_pos}, cache {MAX_LEN}x{DIM} float32, median per step:")
    print(f"  numpy                        {t_np * 1e6:9.1f} us")
    print(f"  fusegrad, Variable position  {t_sym * 1e6:9.1f} us  ({n_sym} kernels compiled or loaded in all)")
    print(f"  fusegrad, int position       {t_int * 1e6:9.1f} us  ({n_int} kernels compiled or loaded)")
    print(f"  Variable vs int position: {t_int / t_sym:.1f}x faster; vs numpy: {t_np / t_sym:.2f}x")


if __name__ == "__main__":
    main()
