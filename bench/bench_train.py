"""Training throughput against torch CPU, measured in one process: `python bench/bench_train.py`.

Three cases on random data of the real shapes: a 784-128-10 MLP (batch 128) with SGD and with Adam, and the digits
convnet of examples/train_digits.py (batch 128, 1x8x8) with Adam. Each runs in torch eager (2 threads), fusegrad eager
and fusegrad under TinyJit (torch also on 1 thread: on a loaded machine its 2 threads can lose more to waiting on each
other than they gain); prints median steps/s and fusegrad's ratios to torch. `ONLY=jit` skips fusegrad eager."""

from __future__ import annotations
import os
import statistics
import sys
import time
from pathlib import Path
import numpy as np
import torch
from fusegrad import Context, Tensor, TinyJit, nn
from fusegrad.nn.optim import SGD, Adam
from fusegrad.nn.state import get_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_digits import ConvNet  # noqa: E402


class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(784, 128), nn.Linear(128, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def steps_per_second(steppers: dict, runs: int = 9, seconds: float = 0.2) -> dict:
    """Median steps/s of each stepper; the runs take turns, so load from elsewhere hits every stepper alike."""
    counts = {}
    for name, step in steppers.items():
        for _ in range(3):  # warm-up (and, under TinyJit, the capture)
            step()
        st, n = time.perf_counter(), 0
        while time.perf_counter() - st < seconds or n < 2:
            step()
            n += 1
        counts[name] = n
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for _ in range(runs):
        for name, step in steppers.items():
            st = time.perf_counter()
            for _ in range(counts[name]):
                step()
            times[name].append((time.perf_counter() - st) / counts[name])
    return {name: 1 / statistics.median(t) for name, t in times.items()}


def fusegrad_step(model, opt_name: str, x_np: np.ndarray, y_np: np.ndarray, jit: bool):
    params = get_parameters(model)
    opt = SGD(params, lr=1e-3) if opt_name == "SGD" else Adam(params, lr=1e-3)
    x, y = Tensor(x_np).realize(), Tensor(y_np).realize()

    def train(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss

    run = TinyJit(train) if jit else train

    def step():
        # the loss stays on the device, as torch's does: reading it back each step would time the sync, not the step
        return run(x, y)

    return step


def torch_step(model: torch.nn.Module, opt_name: str, x_np: np.ndarray, y_np: np.ndarray, threads: int):
    params = model.parameters()
    opt = torch.optim.SGD(params, lr=1e-3) if opt_name == "SGD" else torch.optim.Adam(params, lr=1e-3)
    x, y = torch.tensor(x_np), torch.tensor(y_np, dtype=torch.long)

    def step():
        if torch.get_num_threads() != threads:  # switched once per run of steps, not per step
            torch.set_num_threads(threads)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def main() -> None:
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)

    def torch_conv():
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(512, 10),
        )

    def torch_mlp():
        return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    mnist_x = rng.random((128, 784), dtype=np.float32)
    cases = [
        ("MLP 784-128-10 SGD, bs 128", MLP, torch_mlp, "SGD", mnist_x),
        ("MLP 784-128-10 Adam, bs 128", MLP, torch_mlp, "Adam", mnist_x),
        ("digits convnet Adam, bs 128", ConvNet, torch_conv, "Adam", rng.random((128, 1, 8, 8), dtype=np.float32)),
    ]
    only_jit = os.environ.get("ONLY") == "jit"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; steps/s, medians of 9 interleaved runs")
    print(
        f"{'case':30s} {'torch':>9s} {'torch 1t':>9s} {'fg eager':>9s} {'fg jit':>9s} {'eager/torch':>12s}"
        f" {'eager/torch 1t':>15s} {'jit/torch':>10s} {'jit/torch 1t':>13s}"
    )
    for name, ours, theirs, opt_name, x in cases:
        y = rng.integers(0, 10, len(x)).astype(np.int32)
        steppers = {
            "torch": torch_step(theirs(), opt_name, x, y, 2),
            "torch 1t": torch_step(theirs(), opt_name, x, y, 1),
        }
        if not only_jit:
            steppers["eager"] = fusegrad_step(ours(), opt_name, x, y, jit=False)
        steppers["jit"] = fusegrad_step(ours(), opt_name, x, y, jit=True)
        r = steps_per_second(steppers)
        th, th1, eager, jit = r["torch"], r["torch 1t"], r.get("eager", float("nan")), r["jit"]
        print(
            f"{name:30s} {th:9.1f} {th1:9.1f} {eager:9.1f} {jit:9.1f} {eager / th:11.2f}x {eager / th1:14.2f}x"
            f" {jit / th:9.2f}x {jit / th1:12.2f}x"
        )


if __name__ == "__main__":
    main()
