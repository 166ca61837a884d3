"""torch on `fuse` vs the same torch code on torch's CPU: digits MLP/convnet training steps/s, ResNet-18 latency.

Run: python bench/bench_torch_backend.py   (env: STEPS, REPEATS)"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fusegrad.torch_backend  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests" / "torch_backend"))
from test_models import resnet18  # noqa: E402
from train_digits_torch import convnet, digits_split, mlp  # noqa: E402


def train_steps_per_s(make, device: str, steps: int, bs: int = 64) -> float:
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y, _, _ = digits_split()
    x, y = x[: bs * 4].to(device), y[: bs * 4].to(device)

    def step(i: int) -> float:
        j = (i % 4) * bs
        loss = F.cross_entropy(model(x[j : j + bs]), y[j : j + bs])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for i in range(12):  # every batch offset compiles its kernels once
        step(i)
    t = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps / (time.perf_counter() - t)


def resnet_latency_ms(device: str, repeats: int) -> float:
    torch.manual_seed(0)
    model = resnet18().eval().to(device)
    x = torch.randn(1, 3, 64, 64).to(device)
    times = []
    with torch.no_grad():
        for _ in range(repeats + 2):
            t = time.perf_counter()
            model(x).cpu()
            times.append(time.perf_counter() - t)
    return statistics.median(times[2:]) * 1e3


def main() -> None:
    steps, repeats = int(os.environ.get("STEPS", 30)), int(os.environ.get("REPEATS", 3))
    for name, make in (("digits MLP", mlp), ("digits convnet", convnet)):
        fuse, cpu = train_steps_per_s(make, "fuse", steps), train_steps_per_s(make, "cpu", steps)
        print(f"{name} train step: fuse {fuse:.1f} steps/s, torch CPU {cpu:.1f} steps/s, ratio {fuse / cpu:.2f}x")
    fuse, cpu = resnet_latency_ms("fuse", repeats), resnet_latency_ms("cpu", repeats)
    print(f"ResNet-18 1x3x64x64 inference: fuse {fuse:.1f} ms, torch CPU {cpu:.1f} ms, ratio {cpu / fuse:.2f}x")


if __name__ == "__main__":
    main()
