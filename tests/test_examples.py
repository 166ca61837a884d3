"""The examples run: the digits demo learns, and the MNIST model trains a step on MNIST-shaped data."""

import os
import subprocess
import sys
from pathlib import Path
import numpy as np
import pytest
from fusegrad import Context, Tensor
from fusegrad.nn.optim import Adam
from fusegrad.nn.state import get_parameters

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow  # the README's demo line runs it; CI too
def test_train_digits_learns():
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_digits.py")],
        env={**os.environ, "EPOCHS": "3"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    accuracy = float(out.stdout.strip().splitlines()[-1].split("test accuracy:")[1].split("%")[0])
    assert accuracy > 85.0


def test_hello_demo_matches_numpy():
    out = subprocess.run([sys.executable, str(EXAMPLES / "hello.py")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "matches numpy: True" in out.stdout and "void r_" in out.stdout


@pytest.mark.slow  # three Adam steps of a full-size convnet, compiled cold: CI (train_digits stays)
def test_mnist_model_trains_a_step():
    sys.path.insert(0, str(EXAMPLES))
    from beautiful_mnist import Model

    model = Model()
    opt = Adam(get_parameters(model), lr=1e-3)
    x = Tensor(np.random.default_rng(0).random((4, 1, 28, 28), dtype=np.float32))
    y = Tensor(np.array([1, 2, 3, 4], np.int32))
    with Context(TRAINING=1):
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert model(x).shape == (4, 10) and losses[-1] < losses[0]
