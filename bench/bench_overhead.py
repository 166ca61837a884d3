"""Eager (non-JIT) Python overhead against torch CPU, measured in one process: `python bench/bench_overhead.py`.

Three cases, each timed as the median of several runs: a tiny op realized per call (`(x + y).realize()` on 16
float32 elements, x and y realized; then, CPU time only, ops whose graph is more than one op: `x - y`, `x * 2`,
`x.relu()`, `(x * y).sum()`, `x.max()`), a chain of 100 tiny ops realized once (per op), and one SGD training step of a
784-128-10 MLP at batch 128 without a JIT (steps/s), each step on a fresh batch drawn from a 4096-row dataset as a
training loop does: on two threads and on one thread (torch's two threads spin against the machine's other work, so on
a loaded machine only the latter compares the steps). A last case reuses one unmarked batch tensor every step: fusegrad
then fills and accumulates `x.grad` (as tinygrad code expects), which costs it a third matmul a step that torch, whose
batch has no gradient, never does. Prints fusegrad, torch and their ratio for each, then the three ratios the eager
targets name.

`python bench/bench_overhead.py mlp` runs the one-thread MLP step alone, first thing in the process (the heap then is a
training script's, not the one the cases before it leave behind)."""

from __future__ import annotations
import statistics
import sys
import time
import numpy as np
import torch
from fusegrad import Tensor
from bench_eager_step import mlp_data, mlp_sgd_step  # this script's folder is on the path


def median_seconds(fn, warmup: int = 5, runs: int = 9, repeat: int = 20, clock=time.perf_counter) -> float:
    """Median over `runs` of the mean time of `repeat` calls, on `clock` (wall, or this process's CPU time, which a
    machine shared with other work inflates less)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        st = clock()
        for _ in range(repeat):
            fn()
        times.append((clock() - st) / repeat)
    return statistics.median(times)


CLOCKS = (time.perf_counter, time.process_time)


def tiny_op() -> tuple[tuple[float, float], ...]:
    x, y = Tensor(np.arange(16, dtype=np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    tx, ty = torch.arange(16, dtype=torch.float32), torch.ones(16)
    fg, th = lambda: (x + y).realize(), lambda: tx + ty
    return tuple(
        (median_seconds(fg, repeat=200, clock=clock), median_seconds(th, repeat=2000, clock=clock)) for clock in CLOCKS
    )


def other_tiny_ops() -> list[tuple[str, float, float]]:
    """(name, fusegrad, torch) CPU seconds per realized op for eager ops whose graph is more than one op on realized
    tensors: a constant operand, `x - y` (x + -y), relu, reductions."""
    x, y = Tensor(np.arange(16, dtype=np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    tx, ty = torch.arange(16, dtype=torch.float32), torch.ones(16)
    cases = [
        ("x - y", lambda a, b: a - b),
        ("x * 2", lambda a, b: a * 2),
        ("x.relu()", lambda a, b: a.relu()),
        ("(x * y).sum()", lambda a, b: (a * b).sum()),
        ("x.max()", lambda a, b: a.max()),
    ]
    out = []
    for name, op in cases:
        fg = median_seconds(lambda: op(x, y).realize(), repeat=200, clock=time.process_time)
        th = median_seconds(lambda: op(tx, ty), repeat=2000, clock=time.process_time)
        out.append((name, fg, th))
    return out


def chain_of_100() -> tuple[tuple[float, float], ...]:
    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    tx = torch.arange(16, dtype=torch.float32)

    def fusegrad_chain():
        out = x
        for i in range(100):
            out = out * 1.01 if i % 2 else out + 0.5
        out.realize()

    def torch_chain():
        out = tx
        for i in range(100):
            out = out * 1.01 if i % 2 else out + 0.5
        return out

    return tuple(
        (median_seconds(fusegrad_chain, repeat=5, clock=c) / 100, median_seconds(torch_chain, repeat=50, clock=c) / 100)
        for c in CLOCKS
    )


def mlp_step(threads: int = 2, fresh: bool = True) -> tuple[tuple[float, float], ...]:
    rng = np.random.default_rng(0)
    data, labels = mlp_data(rng)
    fixed = rng.integers(0, 4096, 128)
    x, y = Tensor(data[fixed]).realize(), Tensor(labels[fixed]).realize()
    fusegrad_step = mlp_sgd_step(data, labels, rng, threads, None if fresh else (x, y))

    torch_model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    torch_opt = torch.optim.SGD(torch_model.parameters(), lr=0.01)
    tx, ty = torch.from_numpy(data[fixed]), torch.from_numpy(labels[fixed]).long()

    def torch_step():
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if fresh:
            idx = rng.integers(0, 4096, 128)
            xb, yb = torch.from_numpy(data[idx]), torch.from_numpy(labels[idx]).long()
        else:
            xb, yb = tx, ty
        torch_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(torch_model(xb), yb)
        loss.backward()
        torch_opt.step()
        return loss.item()

    return tuple(
        (1 / median_seconds(fusegrad_step, repeat=5, clock=c), 1 / median_seconds(torch_step, repeat=20, clock=c))
        for c in CLOCKS
    )


def mlp_alone() -> None:
    torch.set_num_threads(1)
    (_, _), (fg, th) = mlp_step(1)
    print(
        f"MLP 784-128-10 SGD step without JIT, alone, 1 thread, cpu: fusegrad {fg:6.1f}/s, torch {th:6.1f}/s "
        f"({fg / th:.2f}x torch's steps/s)"
    )


def main() -> None:
    if sys.argv[1:] == ["mlp"]:
        mlp_alone()
        return
    torch.set_num_threads(2)
    us = 1e6
    tiny, others, chain = tiny_op(), other_tiny_ops(), chain_of_100()
    mlps = [
        ("2 threads", mlp_step(2)),
        ("1 thread", mlp_step(1)),
        ("1 thread, one batch reused", mlp_step(1, fresh=False)),
    ]
    for (fg, th), clock in zip(tiny, ("wall", "cpu")):
        print(
            f"tiny op (x + y on 16), per realize, {clock}: fusegrad {fg * us:6.1f} us, torch {th * us:5.2f} us"
            f" ({fg / th:.1f}x torch's time)"
        )
    for name, fg, th in others:
        print(
            f"tiny op ({name} on 16), per realize, cpu: fusegrad {fg * us:6.1f} us, torch {th * us:5.2f} us"
            f" ({fg / th:.1f}x torch's time)"
        )
    for (fg, th), clock in zip(chain, ("wall", "cpu")):
        print(
            f"chain of 100 tiny ops realized once, per op, {clock}: fusegrad {fg * us:5.1f} us, torch {th * us:5.2f} us"
            f" ({fg / th:.2f}x torch's time)"
        )
    for name, mlp in mlps:
        for (fg, th), clock in zip(mlp, ("wall", "cpu")):
            print(
                f"MLP 784-128-10 SGD step without JIT, {name}, {clock}: fusegrad {fg:6.1f}/s, torch {th:6.1f}/s "
                f"({fg / th:.2f}x torch's steps/s)"
            )
    # the three eager targets side by side (CPU time, one thread each: what the machine's other work distorts least)
    (fg_t, th_t), (fg_c, th_c), (fg_m, th_m) = tiny[1], chain[1], mlps[1][1][1]
    print(
        f"eager ratios (cpu): tiny op {fg_t / th_t:.1f}x torch's time (target <= 10), chain {fg_c / th_c:.2f}x per op"
        f" (target <= 2), MLP SGD step on 1 thread {fg_m / th_m:.2f}x torch's steps/s (target >= 0.8)"
    )


if __name__ == "__main__":
    main()
