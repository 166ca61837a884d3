"""Train a plain torch MLP or convnet on scikit-learn's 8x8 digits with torch.optim.Adam, on `fuse` or torch's CPU.

Run: python examples/train_digits_torch.py [mlp|conv] [fuse|cpu]   (env: EPOCHS, BS, LR, SEED)"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import fusegrad.torch_backend  # noqa: F401  (registers the fuse device)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


def digits_split(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """The digits as (N, 1, 8, 8) floats in [0, 1]: a seeded 80/20 train/test split."""
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def train(kind: str, device: str, epochs: int = 8, bs: int = 64, lr: float = 3e-3, seed: int = 0) -> float:
    """Train from seeded weights (the same on every device) and return the test accuracy."""
    torch.manual_seed(seed)
    model = (mlp if kind == "mlp" else convnet)().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x_train, y_train, x_test, y_test = digits_split(seed)
    x_train, y_train = x_train.to(device), y_train.to(device)
    batches = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(seed)).split(bs)
    for _ in range(epochs):
        for idx in batches:
            if len(idx) < bs:
                continue
            loss = F.cross_entropy(model(x_train[idx.to(device)]), y_train[idx.to(device)])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = model(x_test.to(device)).argmax(1).cpu()
    return (pred == y_test).float().mean().item()


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "mlp"
    device = sys.argv[2] if len(sys.argv) > 2 else "fuse"
    if kind not in ("mlp", "conv") or device not in ("fuse", "cpu"):
        raise SystemExit(f"usage: train_digits_torch.py [mlp|conv] [fuse|cpu], got {kind!r} {device!r}")
    epochs, bs, lr = int(os.environ.get("EPOCHS", 8)), int(os.environ.get("BS", 64)), float(os.environ.get("LR", 3e-3))
    t = time.perf_counter()
    acc = train(kind, device, epochs, bs, lr, int(os.environ.get("SEED", 0)))
    print(f"{kind} on {device}: test accuracy {acc:.4f} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
