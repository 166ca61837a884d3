"""Train a convnet on MNIST (downloaded and cached on first use) and report the test accuracy.

Run: python examples/beautiful_mnist.py   (env: STEPS, BS, LR). Needs the MNIST files: online, or already cached."""

import sys
import time
import numpy as np
from fusegrad import Context, Tensor, getenv, nn
from fusegrad.nn.datasets import mnist
from fusegrad.nn.optim import Adam
from fusegrad.nn.state import get_parameters


class Model:
    def __init__(self):
        self.layers = [
            nn.Conv2d(1, 32, 5),
            Tensor.relu,
            nn.Conv2d(32, 32, 5),
            Tensor.relu,
            nn.BatchNorm(32),
            Tensor.max_pool2d,
            nn.Conv2d(32, 64, 3),
            Tensor.relu,
            nn.Conv2d(64, 64, 3),
            Tensor.relu,
            nn.BatchNorm(64),
            Tensor.max_pool2d,
            lambda x: x.flatten(1),
            nn.Linear(576, 10),
        ]

    def __call__(self, x: Tensor) -> Tensor:
        return x.sequential(self.layers)


def main() -> None:
    try:
        X_train, Y_train, X_test, Y_test = mnist()
    except (ConnectionError, OSError) as e:
        print(
            f"MNIST is not reachable ({e}).\n"
            "Put the four IDX .gz files in the fusegrad download cache or run this online."
        )
        sys.exit(1)
    steps, bs, lr = getenv("STEPS", 70), getenv("BS", 512), getenv("LR", 0.02)
    X_train, X_test = X_train.float() / 255.0, X_test.float() / 255.0
    model = Model()
    opt = Adam(get_parameters(model), lr=lr)
    rng, start = np.random.default_rng(0), time.perf_counter()
    for i in range(steps):
        idx = Tensor(rng.integers(0, X_train.shape[0], bs).astype(np.int32))
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(X_train[idx]).sparse_categorical_crossentropy(Y_train[idx])
            loss.backward()
            opt.step()
        sys.stdout.write(f"\rstep {i + 1}/{steps} loss {loss.item():.3f} {time.perf_counter() - start:.1f}s")
        sys.stdout.flush()
    correct = sum(
        (model(X_test[j : j + 1000]).argmax(axis=1) == Y_test[j : j + 1000]).sum().item() for j in range(0, 10000, 1000)
    )
    print(f"\ntest accuracy: {correct / 100:.2f}%")


if __name__ == "__main__":
    main()
