"""One eager (no JIT) SGD step of bench_overhead.py's 784-128-10 MLP, fusegrad alone: `python bench/bench_eager_step.py
[STEPS]` prints the median CPU time of a step over 7 runs (one thread, a fresh batch of 128 each step, 20 steps of
warm-up). No torch in the process, so its heap is a plain training script's; a loop to profile (py-spy) as it is.
bench_overhead.py times the same step (mlp_sgd_step) against torch's."""

from __future__ import annotations
import statistics
import sys
import time
import numpy as np
from fusegrad import Context, Tensor, nn
from fusegrad.nn.optim import SGD
from fusegrad.nn.state import get_parameters


class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(784, 128), nn.Linear(128, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def mlp_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A 4096-row dataset of 784 features and labels 0..9, the batches the step draws from."""
    return rng.standard_normal((4096, 784), dtype=np.float32), rng.integers(0, 10, 4096).astype(np.int32)


def mlp_sgd_step(data: np.ndarray, labels: np.ndarray, rng: np.random.Generator, threads: int = 1, batch=None):
    """A fresh MLP's eager SGD step as a closure returning the loss: each call draws a batch of 128 rows as a training
    loop does, or takes `batch` (x, y tensors) every time."""
    model = MLP()
    opt = SGD(get_parameters(model), lr=0.01)

    def step() -> float:
        with Context(TRAINING=1, NUM_CPU_THREADS=threads):
            if batch is None:
                idx = rng.integers(0, 4096, 128)
                xb, yb = Tensor(data[idx]), Tensor(labels[idx])
            else:
                xb, yb = batch
            opt.zero_grad()
            loss = model(xb).sparse_categorical_crossentropy(yb)
            loss.backward()
            opt.step()
            return loss.item()

    return step


def main(steps: int) -> None:
    rng = np.random.default_rng(0)
    step = mlp_sgd_step(*mlp_data(rng), rng)
    for _ in range(20):
        step()
    per_run, times = max(steps // 7, 1), []
    for _ in range(7):
        st = time.process_time()
        for _ in range(per_run):
            step()
        times.append((time.process_time() - st) / per_run)
    print(f"eager MLP SGD step, 1 thread, cpu: {statistics.median(times) * 1e3:.3f} ms (median of 7 runs of {per_run})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 210)
