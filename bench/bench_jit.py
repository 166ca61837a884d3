"""What a TinyJit replay costs, measured in one process: `python bench/bench_jit.py`.

A tiny op (`x + y` on 16 float32) per call: torch eager, fusegrad eager (realize each call) and fusegrad under TinyJit;
a chain of 100 dependent tiny kernels replayed as one step (batched C calls vs `JIT=2`, one Python call per
kernel), per kernel; and a jitted MLP 784-128-10 training step (batch 128, SGD and Adam) against torch eager, both on
one thread and timed in this process's CPU time, which a machine shared with other work distorts far less than wall
time of two threads each. Medians of interleaved runs."""

from __future__ import annotations
import statistics
import sys
import time
from pathlib import Path
import numpy as np
import torch
from fusegrad import Context, Tensor, TinyJit


def per_call_us(fns: dict, calls: int = 2000, runs: int = 7, clock=time.perf_counter) -> dict:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(3):
            f()
    for _ in range(runs):
        for name, f in fns.items():
            st = clock()
            for _ in range(calls):
                f()
            times[name].append((clock() - st) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def train_step_ratio(opt_name: str, runs: int = 9, steps: int = 20) -> tuple[float, float]:
    """Median CPU seconds per training step of fusegrad under TinyJit and of torch eager, one thread each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_train import MLP, fusegrad_step, torch_step

    rng = np.random.default_rng(0)
    x, y = rng.random((128, 784), dtype=np.float32), rng.integers(0, 10, 128).astype(np.int32)
    with Context(NUM_CPU_THREADS=1):
        ours = fusegrad_step(MLP(), opt_name, x, y, jit=True)
        for _ in range(3):
            ours()  # warm-up and capture (its graph splits no kernel over threads)
    mlp = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    theirs = torch_step(mlp, opt_name, x, y, 1)
    times: dict[str, list[float]] = {"fusegrad": [], "torch": []}
    for _ in range(runs):
        for name, step in (("fusegrad", ours), ("torch", theirs)):
            st = time.process_time()
            for _ in range(steps):
                step()
            times[name].append((time.process_time() - st) / steps)
    torch.set_num_threads(2)
    return statistics.median(times["fusegrad"]), statistics.median(times["torch"])


def chain(x: Tensor) -> Tensor:
    for _ in range(100):
        x = (x * 1.0001 + 0.5).contiguous()  # one kernel each
    return x


def main() -> None:
    torch.set_num_threads(2)
    a, b = np.ones(16, np.float32), np.full(16, 2, np.float32)
    x, y = Tensor(a).realize(), Tensor(b).realize()
    tx, ty = torch.tensor(a), torch.tensor(b)
    add = TinyJit(lambda p, q: p + q)
    for clock in (time.perf_counter, time.process_time):  # wall time, and CPU time (less distorted by other work)
        tiny = per_call_us(
            {"torch": lambda: tx + ty, "eager": lambda: (x + y).realize(), "jit": lambda: add(x, y)},
            calls=500,
            clock=clock,
        )
        print(
            f"tiny op x + y (16 float32), us per call ({'wall' if clock is time.perf_counter else 'CPU'}): torch"
            f" {tiny['torch']:.1f}, fusegrad eager {tiny['eager']:.1f}, fusegrad TinyJit {tiny['jit']:.1f}"
        )
    batched = TinyJit(chain)
    with Context(JIT=2):
        unbatched = TinyJit(chain)
        for _ in range(3):
            unbatched(x)
    steps = per_call_us({"batched": lambda: batched(x), "unbatched": lambda: unbatched(x)}, calls=50)
    print(
        f"100-kernel chain replay, us per kernel: batched {steps['batched'] / 100:.2f}"
        f" ({batched.captured.batches} C calls), JIT=2 {steps['unbatched'] / 100:.2f} (one Python call each)"
    )
    for opt_name in ("SGD", "Adam"):
        ours, theirs = train_step_ratio(opt_name)
        print(
            f"MLP 784-128-10 {opt_name} step, bs 128, 1 thread, CPU ms: fusegrad TinyJit {ours * 1e3:.2f}, torch"
            f" {theirs * 1e3:.2f}: {theirs / ours:.2f}x torch's steps/s"
        )


if __name__ == "__main__":
    main()
