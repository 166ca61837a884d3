"""Each layer against torch.nn with copied weights: forward values, input gradients and weight gradients."""

import numpy as np
import pytest
import torch
from fusegrad import Context, Tensor, dtypes, nn

rng = np.random.default_rng(0)


def copy_weights(ours, theirs, names):
    for name in names:
        setattr(ours, name, Tensor(getattr(theirs, name).detach().numpy().copy()))


def compare(ours, theirs, x_np, names, training=False, atol=1e-5):
    x, tx = Tensor(x_np), torch.tensor(x_np, requires_grad=True)
    with Context(TRAINING=int(training)):
        out = ours(x)
    theirs.train(training)
    tout = theirs(tx)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), atol=atol, rtol=1e-4)
    params = [getattr(ours, n) for n in names]
    grads = (
        (out * Tensor(np.linspace(-1, 1, out.numel(), dtype=np.float32).reshape(out.shape))).sum().gradient(x, *params)
    )
    (tout * torch.linspace(-1, 1, tout.numel()).reshape(tout.shape)).sum().backward()
    np.testing.assert_allclose(grads[0].numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-3)
    for n, g in zip(names, grads[1:]):
        np.testing.assert_allclose(g.numpy(), getattr(theirs, n).grad.numpy(), atol=1e-4, rtol=1e-3, err_msg=n)


def test_linear():
    ours, theirs = nn.Linear(5, 3), torch.nn.Linear(5, 3)
    copy_weights(ours, theirs, ["weight", "bias"])
    compare(ours, theirs, rng.standard_normal((4, 5), dtype=np.float32), ["weight", "bias"])
    assert nn.Linear(5, 3, bias=False).bias is None


def test_linear_init_bounds():
    layer = nn.Linear(16, 64)
    w = layer.weight.numpy()
    assert w.shape == (64, 16) and np.abs(w).max() <= 0.25 and np.abs(w).max() > 0.2


@pytest.mark.parametrize("kwargs", [{}, {"stride": 2, "padding": 1}, {"dilation": 2, "groups": 2}, {"padding": "same"}])
def test_conv2d(kwargs):
    ours, theirs = nn.Conv2d(4, 6, 3, **kwargs), torch.nn.Conv2d(4, 6, 3, **kwargs)
    copy_weights(ours, theirs, ["weight", "bias"])
    compare(ours, theirs, rng.standard_normal((2, 4, 9, 9), dtype=np.float32), ["weight", "bias"])


def test_conv1d_and_transposed():
    ours, theirs = nn.Conv1d(3, 5, 3, padding=1), torch.nn.Conv1d(3, 5, 3, padding=1)
    copy_weights(ours, theirs, ["weight", "bias"])
    compare(ours, theirs, rng.standard_normal((2, 3, 10), dtype=np.float32), ["weight", "bias"])
    ours, theirs = (
        nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
        torch.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
    )
    copy_weights(ours, theirs, ["weight", "bias"])
    compare(ours, theirs, rng.standard_normal((2, 4, 5, 5), dtype=np.float32), ["weight", "bias"])
    ours, theirs = nn.ConvTranspose1d(3, 2, 4, stride=2), torch.nn.ConvTranspose1d(3, 2, 4, stride=2)
    copy_weights(ours, theirs, ["weight", "bias"])
    compare(ours, theirs, rng.standard_normal((2, 3, 6), dtype=np.float32), ["weight", "bias"])


@pytest.mark.parametrize(
    "shape, torch_cls",
    [((4, 3), torch.nn.BatchNorm1d), ((4, 3, 5, 5), torch.nn.BatchNorm2d), ((2, 3, 2, 3, 3), torch.nn.BatchNorm3d)],
)
def test_batchnorm_train_and_eval(shape, torch_cls):
    ours, theirs = nn.BatchNorm(3), torch_cls(3)
    x = rng.standard_normal(shape, dtype=np.float32) * 2 + 1
    compare(ours, theirs, x, ["weight", "bias"], training=True)
    Tensor.realize(ours.running_mean, ours.running_var, ours.num_batches_tracked)
    np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), atol=1e-6)
    assert ours.num_batches_tracked.item() == 1 and ours.num_batches_tracked.dtype is dtypes.int64
    theirs.weight.grad = theirs.bias.grad = None
    compare(ours, theirs, x, ["weight", "bias"], training=False)


def test_batchnorm_stats_are_buffers_not_params():
    bn = nn.BatchNorm(2)
    assert not bn.running_mean.is_param and not bn.running_var.is_param and bn.weight.is_param
    assert not hasattr(nn.BatchNorm(2, track_running_stats=False), "running_mean")


@pytest.mark.parametrize(
    "ours, theirs, shape",
    [
        (lambda: nn.LayerNorm(5), lambda: torch.nn.LayerNorm(5), (3, 4, 5)),
        (lambda: nn.LayerNorm((4, 5)), lambda: torch.nn.LayerNorm((4, 5)), (3, 4, 5)),
        (lambda: nn.GroupNorm(2, 4), lambda: torch.nn.GroupNorm(2, 4), (3, 4, 3, 3)),
        (lambda: nn.InstanceNorm(4), lambda: torch.nn.InstanceNorm2d(4, affine=True), (3, 4, 3, 3)),
        (lambda: nn.RMSNorm(5), lambda: torch.nn.RMSNorm(5, eps=1e-6), (3, 5)),
    ],
)
def test_norm_layers(ours, theirs, shape):
    o, t = ours(), theirs()
    with torch.no_grad():
        t.weight.copy_(torch.linspace(0.5, 1.5, t.weight.numel()).reshape(t.weight.shape))
        if getattr(t, "bias", None) is not None:
            t.bias.copy_(torch.linspace(-1, 1, t.bias.numel()).reshape(t.bias.shape))
    names = ["weight"] + (["bias"] if getattr(t, "bias", None) is not None else [])
    copy_weights(o, t, names)
    compare(o, t, rng.standard_normal(shape, dtype=np.float32), names)


def test_layernorm2d():
    ours = nn.LayerNorm2d(3)
    x = rng.standard_normal((2, 3, 4, 4), dtype=np.float32)
    ref = torch.nn.functional.layer_norm(torch.tensor(x).permute(0, 2, 3, 1), (3,)).permute(0, 3, 1, 2)
    np.testing.assert_allclose(ours(Tensor(x)).numpy(), ref.numpy(), atol=1e-5)


def test_embedding():
    ours, theirs = nn.Embedding(10, 4), torch.nn.Embedding(10, 4)
    copy_weights(ours, theirs, ["weight"])
    idx = np.array([[1, 3, 3], [9, 0, 1]], np.int32)
    out, tout = ours(Tensor(idx)), theirs(torch.tensor(idx, dtype=torch.long))
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), atol=1e-6)
    (g,) = out.sum().gradient(ours.weight)
    tout.sum().backward()
    np.testing.assert_allclose(g.numpy(), theirs.weight.grad.numpy())
    with pytest.raises(TypeError, match="float32"):
        ours(Tensor([1.0]))


def test_lstm_cell():
    ours, theirs = nn.LSTMCell(3, 4), torch.nn.LSTMCell(3, 4)
    copy_weights(ours, theirs, ["weight_ih", "weight_hh", "bias_ih", "bias_hh"])
    x = rng.standard_normal((2, 3), dtype=np.float32)
    h, c = ours(Tensor(x))
    th, tc = theirs(torch.tensor(x))
    np.testing.assert_allclose(h.numpy(), th.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(c.numpy(), tc.detach().numpy(), atol=1e-6)
    h2, c2 = ours(Tensor(x), (h, c))
    th2, tc2 = theirs(torch.tensor(x), (th, tc))
    np.testing.assert_allclose(h2.numpy(), th2.detach().numpy(), atol=1e-6)
    g = (h2.sum() + c2.sum()).gradient(ours.weight_hh)[0]
    (th2.sum() + tc2.sum()).backward()
    np.testing.assert_allclose(g.numpy(), theirs.weight_hh.grad.numpy(), atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="valid"):
        nn.Conv2d(2, 2, 3, padding="valid")
    with pytest.raises(ValueError, match="groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="num_groups"):
        nn.GroupNorm(3, 4)
    with pytest.raises(AssertionError):
        nn.LayerNorm(4)(Tensor.zeros(2, 5))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        nn.BatchNorm(3)(Tensor.zeros(3))
