"""Whole torch models on `fuse` against torch's CPU: digits training, a transformer layer, ResNet-18 inference."""

import pathlib
import sys

import pytest
import torch
import torch.nn as nn

import fusegrad.torch_backend  # noqa: F401
from fusegrad.helpers import GlobalCounters

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "examples"))
from train_digits_torch import train  # noqa: E402


@pytest.mark.slow  # a whole training run (CI); the torch device's layer tests run fast
def test_digits_mlp_trains_to_cpu_accuracy():
    fuse, cpu = train("mlp", "fuse", epochs=1), train("mlp", "cpu", epochs=1)
    assert cpu > 0.7 and abs(fuse - cpu) <= 0.01, (fuse, cpu)


@pytest.mark.slow
def test_digits_convnet_trains_to_cpu_accuracy():
    fuse, cpu = train("conv", "fuse", epochs=1), train("conv", "cpu", epochs=1)
    assert cpu > 0.7 and abs(fuse - cpu) <= 0.01, (fuse, cpu)


@pytest.mark.slow  # about 4 s of compiles (CI)
def test_transformer_encoder_layer_forward_backward():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True)
    twin = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True)
    twin.load_state_dict(layer.state_dict())
    twin.to("fuse")
    x = torch.randn(2, 5, 16, requires_grad=True)
    fx = x.detach().to("fuse").requires_grad_()
    out, fout = layer(x), twin(fx)
    torch.testing.assert_close(fout.cpu(), out, rtol=1e-4, atol=1e-5)
    out.square().sum().backward()
    fout.square().sum().backward()
    torch.testing.assert_close(fx.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    for (name, p), fp in zip(layer.named_parameters(), twin.parameters()):
        torch.testing.assert_close(fp.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4, msg=name)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return (out + (x if self.down is None else self.down(x))).relu()


def resnet18(classes: int = 1000) -> nn.Module:
    """ResNet-18 (He et al. 2015) in plain torch.nn: torchvision 0.28.0 does not import beside this torch wheel."""
    layers, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        *layers,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, classes),
    )


@pytest.mark.slow
def test_resnet18_forward_matches_cpu():
    torch.manual_seed(0)
    model = resnet18().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
        model.to("fuse")
        fx = x.to("fuse")
        model(fx).cpu()
        before = GlobalCounters.kernel_count
        actual = model(fx).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    # the whole forward is one lazy graph: each conv with its batchnorm, residual add and relu fuse; the 7 strided
    # convs also store their input's stride phases and the re-cut weight, and the small stride-1 convs copy their
    # windows into columns (77 measured)
    assert GlobalCounters.kernel_count - before <= 80
