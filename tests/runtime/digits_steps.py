"""The digits demo's model and optimizer trained a few steps on a device: what the backend tests compare to CPU."""

import sys
from pathlib import Path

import numpy as np
from fusegrad import Context, Tensor


def train_digits_steps(device: str, steps: int, accuracy: bool = False) -> tuple[list[float], float | None]:
    """Losses over `steps` batches of 64 on `device` (same seed, same batches), and the test accuracy when asked."""
    from fusegrad import nn
    from fusegrad.nn.datasets import digits
    from fusegrad.nn.optim import Adam
    from fusegrad.nn.state import get_parameters

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from train_digits import ConvNet

    with Context(DEV=device):
        Tensor.manual_seed(0)
        X, Y, X_test, Y_test = digits()
        X, X_test = X.float() / 16.0, X_test.float() / 16.0
        model = ConvNet()
        assert isinstance(model.c1, nn.Conv2d) and model.c1.weight.device == device
        opt = Adam(get_parameters(model), lr=5e-3)
        losses = []
        for i in range(steps):
            idx = Tensor((np.arange(64, dtype=np.int32) * 7 + i * 64) % X.shape[0])
            with Context(TRAINING=1):
                opt.zero_grad()
                loss = model(X[idx]).sparse_categorical_crossentropy(Y[idx])
                loss.backward()
                opt.step()
            losses.append(loss.item())
        score = (model(X_test).argmax(axis=-1) == Y_test).float().mean().item() if accuracy else None
    return losses, score
