"""Train a small convnet on scikit-learn's bundled 8x8 digits with Adam and report the test accuracy.

Run: python examples/train_digits.py   (env: EPOCHS, BS, LR, SEED)"""

import sys
import time
import numpy as np
from fusegrad import Context, Tensor, TinyJit, getenv, nn
from fusegrad.nn.datasets import digits
from fusegrad.nn.optim import Adam
from fusegrad.nn.state import get_parameters


class ConvNet:
    def __init__(self):
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.l1 = nn.Linear(32 * 4 * 4, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.c1(x).relu()
        x = self.c2(x).relu().max_pool2d(2)
        return self.l1(x.flatten(1))


def progress(step: int, total: int, text: str) -> None:
    bar = ("#" * (30 * step // total)).ljust(30, ".")
    sys.stdout.write(f"\r[{bar}] {step}/{total} {text}")
    sys.stdout.flush()


def main() -> None:
    epochs, bs, lr = getenv("EPOCHS", 12), getenv("BS", 128), getenv("LR", 5e-3)
    Tensor.manual_seed(getenv("SEED", 0))
    X_train, Y_train, X_test, Y_test = digits()
    # data, not parameters: backward leaves them without a .grad (the gather's one-hot gradient cost 3x a step)
    X_train, X_test = (X_train.float() / 16.0).requires_grad_(False), X_test.float() / 16.0
    Y_train_np = Y_train.numpy()
    model = ConvNet()
    opt = Adam(get_parameters(model), lr=lr)

    @TinyJit
    def train_step(idx: Tensor) -> tuple[Tensor, Tensor]:
        # captured on its second call, then replayed: no graph building or scheduling per step
        x, y = X_train[idx], Y_train[idx]
        with Context(TRAINING=1):
            opt.zero_grad()
            out = model(x)
            loss = out.sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss, (out.argmax(axis=-1) == y).float().mean()

    rng = np.random.default_rng(getenv("SEED", 0))
    steps_per_epoch = len(Y_train_np) // bs
    total, step, start = epochs * steps_per_epoch, 0, time.perf_counter()
    print(
        f"digits: {X_train.shape[0]} train / {X_test.shape[0]} test images, {epochs} epochs of {steps_per_epoch} steps"
    )
    for _ in range(epochs):
        order = rng.permutation(len(Y_train_np))
        for i in range(steps_per_epoch):
            loss, acc = train_step(Tensor(order[i * bs : (i + 1) * bs].astype(np.int32)))
            step += 1
            if step % 5 == 0 or step == total:
                elapsed = time.perf_counter() - start
                progress(
                    step,
                    total,
                    f"loss {loss.item():.3f} batch acc {acc.item() * 100:5.1f}% {elapsed:5.1f}s "
                    f"{step / elapsed:6.1f} steps/s",
                )
    test_acc = (model(X_test).argmax(axis=-1) == Y_test).float().mean().item()
    print(f"\ntest accuracy: {test_acc * 100:.2f}% after {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
