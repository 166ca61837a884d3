"""Training throughput against torch CPU, measured in one process: `python bench/bench_train.py`.

Two models, each trained with Adam on random data of the real shapes: the digits convnet of examples/train_digits.py
(batch 128, 1x8x8) and a 784-128-10 MLP (batch 128). Prints median steps/s of both and fusegrad's ratio to torch."""

from __future__ import annotations
import statistics
import sys
import time
from pathlib import Path
import numpy as np
import torch
from fusegrad import Context, Tensor, nn
from fusegrad.nn.optim import Adam
from fusegrad.nn.state import get_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_digits import ConvNet  # noqa: E402


class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(784, 128), nn.Linear(128, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def steps_per_second(step, warmup: int = 3, runs: int = 7, steps: int = 5) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(runs):
        st = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - st) / steps)
    return 1 / statistics.median(times)


def fusegrad_step(model, x_np: np.ndarray, y_np: np.ndarray):
    opt = Adam(get_parameters(model), lr=1e-3)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()

    def step():
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss.item()

    return step


def torch_step(model: torch.nn.Module, x_np: np.ndarray, y_np: np.ndarray):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.tensor(x_np), torch.tensor(y_np, dtype=torch.long)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def main() -> None:
    rng = np.random.default_rng(0)
    torch_conv = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(512, 10),
    )
    torch_mlp = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    cases = [
        ("digits convnet, batch 128", ConvNet(), torch_conv, rng.random((128, 1, 8, 8), dtype=np.float32)),
        ("MLP 784-128-10, batch 128", MLP(), torch_mlp, rng.random((128, 784), dtype=np.float32)),
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'model':28s} {'fusegrad':>12s} {'torch':>12s} {'ratio':>8s}")
    for name, ours, theirs, x in cases:
        y = rng.integers(0, 10, len(x)).astype(np.int32)
        fg = steps_per_second(fusegrad_step(ours, x, y))
        th = steps_per_second(torch_step(theirs, x, y))
        print(f"{name:28s} {fg:8.1f} st/s {th:8.1f} st/s {fg / th:7.2f}x")


if __name__ == "__main__":
    main()
