"""Edge cases where tinygrad's behaviour is defined: argument errors, per-axis pad with None, gradients at the edges
of their domains (against torch), optimizers offloading sharded parameters, DISK slices copied straight off."""

import pathlib

import numpy as np
import pytest
import torch

from fusegrad import Context, Tensor, dtypes
from fusegrad.nn.optim import LAMB, LARS


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tensor.zeros((2, 2), 2),
        lambda: Tensor.ones(2, (3,)),
        lambda: Tensor.empty(2, -1),
        lambda: Tensor.rand(-3),
        lambda: Tensor.kaiming_uniform(-2, 3),
        lambda: Tensor.kaiming_normal(3, -2),
        lambda: Tensor.ones(2, 3).repeat(2),
        lambda: Tensor([1, 2]).one_hot(-2),
        lambda: Tensor.cat(Tensor(1.0), Tensor(2.0)),
    ],
    ids=[
        "nested-shape",
        "nested-last",
        "empty",
        "rand",
        "kaiming_uniform",
        "kaiming_normal",
        "repeat",
        "one_hot",
        "cat",
    ],
)
def test_shape_and_argument_errors_are_value_errors(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("make", [lambda: Tensor.zeros(2.5), lambda: Tensor.ones("a"), lambda: Tensor.rand(2, None)])
def test_a_wrong_type_is_a_type_error(make):
    with pytest.raises(TypeError):
        make()


def test_torch_style_runtime_error_catches_still_work():
    with pytest.raises(RuntimeError, match="fewer dims"):
        Tensor.ones(2, 3).repeat(2)
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        Tensor.cat(Tensor(1.0), Tensor(2.0))


def test_stack_of_0d_tensors_is_a_1d_tensor_like_torch():
    np.testing.assert_array_equal(Tensor.stack(Tensor(1.0), Tensor(2.0)).numpy(), [1.0, 2.0])


def test_pad_with_none_for_an_axis():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(Tensor(x).pad((None, (1, 2))).numpy(), np.pad(x, ((0, 0), (1, 2))))
    np.testing.assert_array_equal(
        Tensor(x).pad(((2, 0), None), value=7).numpy(), np.pad(x, ((2, 0), (0, 0)), constant_values=7)
    )


def _grad(f, x_np):
    x = Tensor(x_np)
    f(x).sum().backward()
    tx = torch.tensor(x_np, requires_grad=True)
    f(tx).sum().backward()
    return x.grad.numpy(), tx.grad.numpy()


def test_sigmoid_like_gradients_at_plus_minus_1000_are_zero():
    x = np.array([-1000.0, 1000.0, 0.0], np.float32)
    got, want = _grad(lambda t: t.sigmoid(), x)
    np.testing.assert_array_equal(got, want)
    assert got.tolist() == [0.0, 0.0, 0.25]
    # written out, exp(x)/(1+exp(x)) is 0 with gradient 0 far left (at +1000 it is inf/inf: NaN in torch too)
    got, want = _grad(lambda t: t.exp() / (1 + t.exp()), x[[0, 2]])
    np.testing.assert_array_equal(got, want)
    assert got.tolist() == [0.0, 0.25]


POW_CASES = [(0.0, 0.0), (0.0, 2.0), (0.0, 0.5), (0.0, 3.0), (0.0, -1.0), (0.0, -2.0), (-2.0, 3.0), (-2.0, 2.0)]
POW_CASES += [(-2.0, -1.0), (2.0, 0.0), (-3.0, 0.0), (1.5, -2.5)]


def test_pow_gradients_at_zero_constant_and_negative_bases_match_torch():
    base = np.array([b for b, _ in POW_CASES], np.float32)
    exp = np.array([e for _, e in POW_CASES], np.float32)
    a, b = Tensor(base), Tensor(exp)
    (a**b).sum().backward()
    ta, tb = torch.tensor(base, requires_grad=True), torch.tensor(exp, requires_grad=True)
    (ta**tb).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-6)
    for e in (0.0, 2.0, 3.0, -1.0, 0.5):  # a constant exponent
        np.testing.assert_allclose(*_grad(lambda t: t**e, base), rtol=1e-6)
    for c in (0.0, 2.0, -2.0):  # a constant base
        np.testing.assert_allclose(*_grad(lambda t: c**t, exp), rtol=1e-6)


def test_acosh_gradient_near_one_matches_torch():
    x = np.array([1.0, 1.0000001, 1.001, 1.00001, 1.5, 30.0], np.float32)
    got, want = _grad(lambda t: t.acosh(), x)
    np.testing.assert_allclose(got, want, rtol=2e-5)  # torch rounds (x-1)(x+1) in float32
    x64 = x.astype(np.float64)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(got, 1 / np.sqrt((x64 - 1) * (x64 + 1)), rtol=1e-6)


@pytest.mark.parametrize("opt", [LAMB, LARS])
@pytest.mark.parametrize("axis", [0, None])
def test_lamb_lars_offloaded_over_sharded_params(opt, axis):
    rng = np.random.default_rng(0)
    w_np, b_np = rng.standard_normal((4, 3), dtype=np.float32), rng.standard_normal(4, dtype=np.float32)
    devs = ("CPU", "CPU:1")
    sharded = [Tensor(w_np).shard(devs, axis=axis).realize(), Tensor(b_np).shard(devs, axis=axis).realize()]
    single = [Tensor(w_np).realize(), Tensor(b_np).realize()]
    for params, kw in ((sharded, {"device": "CPU:2"}), (single, {})):
        o = opt(params, lr=0.1, **kw)
        with Context(TRAINING=1):
            for _ in range(2):
                o.zero_grad()
                ((params[0] * params[0]).sum() + (params[1] * 3).sum()).backward()
                o.step()
    for s, p in zip(sharded, single):
        np.testing.assert_allclose(s.numpy(), p.numpy(), rtol=1e-6, atol=1e-7)


def test_disk_slices_copy_straight_to_another_device(tmp_path):
    data = np.arange(24, dtype=np.float32)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    t = Tensor(pathlib.Path(path))
    np.testing.assert_array_equal(t.to("CPU").numpy(), data.view(np.uint8))
    np.testing.assert_array_equal(t[8:20].to("CPU").numpy(), data.view(np.uint8)[8:20])
    np.testing.assert_array_equal(t.reshape(4, 24)[1:3].to("CPU").numpy(), data.view(np.uint8).reshape(4, 24)[1:3])
    f = Tensor(pathlib.Path(path), dtype=dtypes.float32)
    np.testing.assert_array_equal((f[2:5].to("CPU") + 1).numpy(), data[2:5] + 1)
