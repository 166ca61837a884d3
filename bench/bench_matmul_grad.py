"""Forward + backward of one matmul against torch CPU, in one process: `python bench/bench_matmul_grad.py`.

For each shape, `x @ w` (w stored (K, N)) and `x @ w.T` (w stored (N, K), nn.Linear's form): the output, x's gradient
and w's gradient from an output gradient g, under TinyJit (so Python's per-step cost is not timed). Single-threaded on
both sides by default (`NUM_CPU_THREADS=1` for fusegrad, `torch.set_num_threads(1)`): CPU time on one core is robust
when the machine is loaded. Prints median ms per step of interleaved runs and fusegrad's speed as a ratio to torch
(>1: faster). `ONLY=256,mlp` picks cases by name substring; `DEBUG=2` shows each kernel's time, `DEBUG=3` its opts."""

from __future__ import annotations
import os

os.environ.setdefault("NUM_CPU_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from fusegrad import Tensor, TinyJit  # noqa: E402
from fusegrad.helpers import NUM_CPU_THREADS  # noqa: E402
from bench_train import steps_per_second  # noqa: E402  (this script's folder is on the path)

# (name, M, K, N): x is (M, K), the output (M, N)
SHAPES = [
    ("256", 256, 256, 256),
    ("512", 512, 512, 512),
    ("1024", 1024, 1024, 1024),
    ("2048", 2048, 2048, 2048),
    ("mlp1 128x784@784x128", 128, 784, 128),
    ("mlp2 128x128@128x10", 128, 128, 10),
]


def fusegrad_step(x_np: np.ndarray, w_np: np.ndarray, g_np: np.ndarray, transposed: bool):
    x, w, g = (Tensor(a).realize() for a in (x_np, w_np, g_np))
    x.requires_grad = w.requires_grad = True  # as torch's: a matmul that is differentiated

    @TinyJit
    def step(x: Tensor, w: Tensor, g: Tensor):
        x.grad = w.grad = None  # a fresh gradient each step (requires_grad=True would accumulate)
        out = x @ (w.T if transposed else w)
        out.backward(g)
        return out.realize(), x.grad.realize(), w.grad.realize()

    return lambda: step(x, w, g)


def torch_step(x_np: np.ndarray, w_np: np.ndarray, g_np: np.ndarray, transposed: bool):
    x, w = (torch.tensor(a, requires_grad=True) for a in (x_np, w_np))
    g = torch.tensor(g_np)

    def step():
        x.grad = w.grad = None
        out = x @ (w.T if transposed else w)
        out.backward(g)
        return out

    return step


def median_ms(steppers: dict, runs: int = 7, seconds: float = 0.15) -> dict:
    """Median ms per step of each stepper, the runs taking turns (bench_train's timer)."""
    return {name: 1e3 / rate for name, rate in steps_per_second(steppers, runs, seconds).items()}


def check(x_np, w_np, g_np, transposed: bool) -> None:
    """fusegrad's output and gradients equal torch's (a wrong kernel is not timed)."""
    ours = [t.numpy() for t in fusegrad_step(x_np, w_np, g_np, transposed)()]
    x, w = (torch.tensor(a, requires_grad=True) for a in (x_np, w_np))
    out = x @ (w.T if transposed else w)
    out.backward(torch.tensor(g_np))
    for a, b in zip(ours, (out, x.grad, w.grad)):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-3, atol=1e-3 * np.sqrt(x_np.shape[1]))


def main() -> None:
    torch.set_num_threads(int(NUM_CPU_THREADS.value))
    only = [s for s in os.environ.get("ONLY", "").split(",") if s]
    rng = np.random.default_rng(0)
    threads = f"{torch.get_num_threads()} thread(s), fusegrad NUM_CPU_THREADS={NUM_CPU_THREADS.value}"
    print(f"torch {torch.__version__}, {threads}; fg/torch is fusegrad's speed over torch's (>1: faster)")
    print(f"{'case':32s} {'torch ms':>9s} {'fg ms':>9s} {'fg/torch':>9s}")
    for name, m, k, n in SHAPES:
        for transposed in (False, True):
            label = f"{name} {'x@w.T' if transposed else 'x@w'}"
            if only and not any(s in label for s in only):
                continue
            x_np = rng.standard_normal((m, k), dtype=np.float32)
            w_np = rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32)
            g_np = rng.standard_normal((m, n), dtype=np.float32)
            check(x_np, w_np, g_np, transposed)
            r = median_ms(
                {"torch": torch_step(x_np, w_np, g_np, transposed), "fg": fusegrad_step(x_np, w_np, g_np, transposed)}
            )
            print(f"{label:32s} {r['torch']:9.3f} {r['fg']:9.3f} {r['torch'] / r['fg']:8.2f}x", flush=True)


if __name__ == "__main__":
    main()
