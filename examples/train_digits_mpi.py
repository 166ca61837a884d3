"""train_digits.py, data parallel: every rank trains on its shard of each batch and averages gradients with the
others, so `mpirun -n 2` learns what one process learns with the same global batch (and the same accuracy).

Run: mpirun -n 2 python examples/train_digits_mpi.py   (or plainly, as one rank; env: EPOCHS, BS (global), LR, SEED)"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import ConvNet, progress  # noqa: E402

import fusegrad.distributed as dist  # noqa: E402
from fusegrad import Context, Tensor, TinyJit, getenv  # noqa: E402
from fusegrad.nn.datasets import digits  # noqa: E402
from fusegrad.nn.optim import Adam  # noqa: E402
from fusegrad.nn.state import get_parameters  # noqa: E402


def main() -> None:
    dist.init()
    epochs, bs, lr, seed = getenv("EPOCHS", 12), getenv("BS", 128), getenv("LR", 5e-3), getenv("SEED", 0)
    if bs % dist.size():
        raise ValueError(f"the global batch BS={bs} must split evenly over {dist.size()} ranks")
    local_bs = bs // dist.size()
    Tensor.manual_seed(seed)
    X_train, Y_train, X_test, Y_test = digits()
    X_train, X_test = X_train.float() / 16.0, X_test.float() / 16.0
    model = ConvNet()
    params = get_parameters(model)
    dist.broadcast_parameters(params)  # every rank starts from rank 0's weights
    opt = dist.DistributedOptimizer(Adam(params, lr=lr))
    sampler = dist.DistributedSampler(int(Y_train.shape[0]), seed=seed)

    @TinyJit
    def train_step(idx: Tensor) -> tuple[Tensor, Tensor]:
        x, y = X_train[idx], Y_train[idx]
        with Context(TRAINING=1):
            opt.zero_grad()
            out = model(x)
            loss = out.sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss, (out.argmax(axis=-1) == y).float().mean()

    steps_per_epoch = len(sampler) // local_bs
    total, step, start, lead = epochs * steps_per_epoch, 0, time.perf_counter(), dist.rank() == 0
    if lead:
        print(f"digits on {dist.size()} rank(s): global batch {bs}, {epochs} epochs of {steps_per_epoch} steps")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = sampler.indices()
        for i in range(steps_per_epoch):
            loss, acc = train_step(Tensor(order[i * local_bs : (i + 1) * local_bs].astype(np.int32)))
            step += 1
            if lead and (step % 5 == 0 or step == total):
                elapsed = time.perf_counter() - start
                progress(step, total, f"loss {loss.item():.3f} batch acc {acc.item() * 100:5.1f}% {elapsed:5.1f}s")
    test_acc = (model(X_test).argmax(axis=-1) == Y_test).float().mean().item()
    if lead:
        print(f"\ntest accuracy: {test_acc * 100:.2f}% after {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
