"""A custom-kernel GEMM against the built-in matmul and torch, in one process: `python bench/bench_custom_kernel.py`.

The custom kernels are those of docs/custom_kernels.md: a plain GEMM (one output per loop step), a 4x4 register tile,
and a 4x16 tile walked in blocks of 8 row tiles (the tile the built-in matmul's opts pick at these sizes). Each step
is under TinyJit (Python's per-step cost is not timed), single-threaded on every side by default (`NUM_CPU_THREADS=1`,
`torch.set_num_threads(1)`). Prints the median ms per step of interleaved runs and each one's time as a ratio to the
built-in matmul's (<1: faster). `SIZES=256,512` picks the square sizes."""

from __future__ import annotations
import functools
import os
import sys

os.environ.setdefault("NUM_CPU_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "tensor_ops"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from fusegrad import Tensor, TinyJit  # noqa: E402
from fusegrad.helpers import getenv  # noqa: E402
from bench_train import steps_per_second  # noqa: E402  (this script's folder is on the path)
from custom_kernel_examples import blocked_gemm, gemm, tiled_gemm  # noqa: E402


def builtin(a: Tensor, b: Tensor):
    step = TinyJit(lambda a, b: (a @ b).realize())
    return lambda: step(a, b)


def custom(fxn, a: Tensor, b: Tensor):
    step = TinyJit(lambda a, b: Tensor.custom_kernel(Tensor.empty(a.shape[0], b.shape[1]), a, b, fxn=fxn)[0].realize())
    return lambda: step(a, b)


def main() -> None:
    torch.set_num_threads(int(os.environ["NUM_CPU_THREADS"]))
    sizes = [int(s) for s in getenv("SIZES", "256,512").split(",")]
    kernels = {"gemm": gemm, "tiled_4x4": tiled_gemm, "blocked_4x16": functools.partial(blocked_gemm, ROWS=8)}
    names = ["builtin", *kernels, "torch"]
    header = " ".join(f"{n + ' ms':>16s}" for n in names)
    print(f"{'size':>6s} {header}   ratio to builtin: {' '.join(names[1:])}")
    for n in sizes:
        rng = np.random.default_rng(0)
        a_np, b_np = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
        a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
        ta, tb = torch.tensor(a_np), torch.tensor(b_np)
        steppers = {"builtin": builtin(a, b)} | {k: custom(f, a, b) for k, f in kernels.items()}
        for name in kernels:  # the same product as the built-in one
            np.testing.assert_allclose(steppers[name]().numpy(), a_np @ b_np, rtol=1e-3, atol=1e-3)
        steppers["torch"] = lambda: ta @ tb
        ms = {k: 1e3 / v for k, v in steps_per_second(steppers, runs=5, seconds=0.1).items()}
        ratios = " ".join(f"{ms[k] / ms['builtin']:.2f}" for k in names[1:])
        print(f"{n:6d} " + " ".join(f"{ms[k]:16.3f}" for k in names) + f"   {ratios}")


if __name__ == "__main__":
    main()
