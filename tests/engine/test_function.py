"""@function: one trace per input signature, replayed without the body; implicit reads; gradients; nesting,
methods, TinyJit, sharded inputs, precompile and bad input."""

import numpy as np
import pytest
import torch
from fusegrad import GlobalCounters, Tensor, TinyJit, Variable, dtypes, function
from fusegrad.function import function as function_by_module
from fusegrad.nn.optim import SGD
from fusegrad.helpers import Context

rng = np.random.default_rng(0)


def data(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def mlp_body(x, w, b):
    return (x @ w + b).gelu().softmax(-1)


def torch_mlp(x, w, b):
    return torch.nn.functional.gelu(x @ w + b, approximate="tanh").softmax(-1)


def test_both_import_spellings_are_one_decorator():
    assert function is function_by_module


def test_same_signature_runs_the_body_once_and_matches_the_unwrapped_function():
    calls = []

    @function
    def f(x, w, b):
        calls.append(1)
        return mlp_body(x, w, b)

    w, b = Tensor(data(4, 5)), Tensor(data(5))
    for _ in range(3):
        x = data(3, 4)
        got = f(Tensor(x), w, b).numpy()
        np.testing.assert_allclose(got, mlp_body(Tensor(x), w, b).numpy(), rtol=1e-6, atol=1e-7)
    assert len(calls) == 1


def test_a_signature_change_retraces():
    calls = []

    @function
    def f(x, scale):
        calls.append((x.shape, x.dtype, scale))
        return x * scale + 1

    x = data(2, 3)
    np.testing.assert_allclose(f(Tensor(x), 2.0).numpy(), x * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(f(Tensor(x), 2.0).numpy(), x * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(f(Tensor(x), 3.0).numpy(), x * 3 + 1, rtol=1e-6)  # a non-tensor argument
    np.testing.assert_allclose(f(Tensor(x[:1]), 3.0).numpy(), x[:1] * 3 + 1, rtol=1e-6)  # a shape
    f(Tensor(x, dtype=dtypes.float16), 3.0)  # a dtype
    assert len(calls) == 4 and calls[1][2] == 3.0 and calls[2][0] == (1, 3) and calls[3][1] is dtypes.float16
    f(Tensor(x, requires_grad=True), 3.0)  # marked for gradients (some ops then build another graph)
    with Context(TRAINING=1):  # training mode (dropout, batch statistics)
        f(Tensor(x), 3.0)
    assert len(calls) == 6


def test_forward_and_backward_match_torch_and_the_backward_is_traced_once():
    f = function(mlp_body)
    w0, b0 = data(4, 5), data(5)
    w, b = Tensor(w0), Tensor(b0)
    for _ in range(2):
        x0, seed = data(3, 4), data(3, 5)
        x = Tensor(x0)
        out = f(x, w, b)
        gx, gw, gb = (out * Tensor(seed)).sum().gradient(x, w, b)
        tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x0, w0, b0))
        ref = torch_mlp(tx, tw, tb)
        (ref * torch.tensor(seed)).sum().backward()
        np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
        for got, want in ((gx, tx), (gw, tw), (gb, tb)):
            np.testing.assert_allclose(got.numpy(), want.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert len(f.traces) == 1 and len(next(iter(f.traces.values())).backward) == 1


def test_two_outputs_each_carry_their_gradient():
    @function
    def f(a, b):
        return a * b, (a - b).exp()

    a0, b0 = data(4), data(4)
    a, b = Tensor(a0), Tensor(b0)
    p, q = f(a, b)
    ga, gb = (p.sum() + (q * 2).sum()).gradient(a, b)
    np.testing.assert_allclose(ga.numpy(), b0 + 2 * np.exp(a0 - b0), rtol=1e-5)
    np.testing.assert_allclose(gb.numpy(), a0 - 2 * np.exp(a0 - b0), rtol=1e-5)


def test_reading_a_buffer_that_is_not_an_argument_names_it():
    weight = Tensor(data(6, 2)).realize()

    @function
    def f(x):
        return x @ weight

    with pytest.raises(RuntimeError, match=r"not an argument \(shape \(6, 2\), dtype dtypes.float32, device CPU\)"):
        f(Tensor(data(1, 6)))


def test_constants_the_body_builds_itself_are_not_implicit():
    @function
    def f(x):
        return x + Tensor([1.0, 2.0, 3.0]) + Tensor.ones(3)

    x = data(3)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), x + [2.0, 3.0, 4.0], rtol=1e-6)


def test_allow_implicit_sees_the_weights_an_optimizer_updates():
    w0, xs = data(4, 2), [data(3, 4) for _ in range(3)]

    def train(wrap):
        w = Tensor(w0, requires_grad=True)
        step = wrap(lambda x: (x @ w).relu().sum())
        opt = SGD([w], lr=0.1)
        losses = []
        with Context(TRAINING=1):
            for x in xs:
                opt.zero_grad()
                loss = step(Tensor(x))
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, w.numpy()

    plain_losses, plain_w = train(lambda f: f)
    traced_losses, traced_w = train(function(allow_implicit=True))
    np.testing.assert_allclose(traced_losses, plain_losses, rtol=1e-6)
    np.testing.assert_allclose(traced_w, plain_w, rtol=1e-6)
    assert not np.allclose(plain_w, w0)


def test_an_implicit_tensor_that_changes_dtype_retraces():
    w = Tensor(data(3))
    calls = []

    @function(allow_implicit=True)
    def f(x):
        calls.append(1)
        return x * w

    x = data(3)
    f(Tensor(x)).realize()
    w.replace(Tensor(data(3)).half())
    np.testing.assert_allclose(f(Tensor(x)).numpy(), x * w.numpy().astype(np.float32), rtol=1e-6)
    assert len(calls) == 2


def test_grad_fxn_replaces_the_body_backward():
    @function(grad_fxn=lambda g, x: (g * 3,))
    def straight_through(x):
        return x.round()

    x0 = data(5)
    x = Tensor(x0)
    out = straight_through(x)
    (gx,) = (out * Tensor(np.arange(5, dtype=np.float32))).sum().gradient(x)
    np.testing.assert_allclose(out.numpy(), np.round(x0), atol=0)
    np.testing.assert_allclose(gx.numpy(), 3 * np.arange(5), rtol=1e-6)


def test_nested_functions_trace_each_once():
    calls = {"inner": 0, "outer": 0}

    @function
    def inner(a):
        calls["inner"] += 1
        return a.tanh() * 2

    @function
    def outer(a, b):
        calls["outer"] += 1
        return inner(a) + inner(b) * b

    for _ in range(2):
        a0, b0 = data(3), data(3)
        a, b = Tensor(a0), Tensor(b0)
        out = outer(a, b)
        ga, gb = out.sum().gradient(a, b)
        np.testing.assert_allclose(out.numpy(), np.tanh(a0) * 2 + np.tanh(b0) * 2 * b0, rtol=1e-5)
        np.testing.assert_allclose(ga.numpy(), 2 * (1 - np.tanh(a0) ** 2), rtol=1e-5)
        np.testing.assert_allclose(gb.numpy(), 2 * np.tanh(b0) + 2 * b0 * (1 - np.tanh(b0) ** 2), rtol=1e-5)
    assert calls == {"inner": 1, "outer": 1}


class Scale:
    calls = 0

    def __init__(self, n):
        self.w = Tensor(data(n))

    @function(allow_implicit=True)
    def __call__(self, x):
        Scale.calls += 1
        return x * self.w


def test_a_method_traces_once_per_instance_and_reads_its_weights():
    first, second = Scale(4), Scale(4)
    x = data(4)
    for _ in range(2):
        np.testing.assert_allclose(first(Tensor(x)).numpy(), x * first.w.numpy(), rtol=1e-6)
        np.testing.assert_allclose(second(Tensor(x)).numpy(), x * second.w.numpy(), rtol=1e-6)
    first.w.assign(first.w * 0 + 5).realize()
    np.testing.assert_allclose(first(Tensor(x)).numpy(), x * 5, rtol=1e-6)
    assert Scale.calls == 2


def test_a_call_inside_tinyjit_replays():
    f = function(mlp_body)
    w, b = Tensor(data(4, 5)), Tensor(data(5))
    step = TinyJit(lambda x: f(x, w, b).realize())
    for _ in range(4):
        x = data(3, 4)
        np.testing.assert_allclose(
            step(Tensor(x)).numpy(), torch_mlp(*map(torch.tensor, (x, w.numpy(), b.numpy()))), rtol=1e-5, atol=1e-6
        )
    assert step.captured is not None and len(f.traces) == 1


def test_sharded_inputs():
    devices = ("CPU:0", "CPU:1")
    calls = []

    @function
    def f(x, w):
        calls.append(1)
        return (x * w).sum(1) + 1

    w0 = data(4)
    w = Tensor(w0).shard(devices)
    for _ in range(2):
        x0, seed = data(6, 4), data(6)
        x = Tensor(x0).shard(devices, axis=0)
        out = f(x, w)
        assert out.device == x.device and len(out.device) == 2
        np.testing.assert_allclose(out.numpy(), (x0 * w0).sum(1) + 1, rtol=1e-5)
        (gx,) = (out * Tensor(seed).shard(devices, axis=0)).sum().gradient(x)
        np.testing.assert_allclose(gx.numpy(), seed[:, None] * w0, rtol=1e-5)
    assert len(calls) == 1


def test_precompile_compiles_at_trace_time():
    @function(precompile=True)
    def f(x):
        return (x * 1.5).exp2().sum(0)

    x = Tensor(data(37, 29)).realize()
    before = GlobalCounters.compile_count
    out = f(x)
    compiled_at_trace = GlobalCounters.compile_count - before
    out.realize()
    assert compiled_at_trace >= 1 and GlobalCounters.compile_count - before == compiled_at_trace
    np.testing.assert_allclose(out.numpy(), np.exp2(x.numpy() * 1.5).sum(0), rtol=1e-5)


def test_contiguous_results_of_two_calls_are_separate_buffers():
    f = function(lambda x: (x + 1).contiguous())
    x = Tensor(data(3)).realize()
    a, b = f(x).realize(), f(x).realize()
    a.assign(a * 0).realize()
    np.testing.assert_allclose(b.numpy(), x.numpy() + 1, rtol=1e-6)


def test_bad_input_errors():
    with pytest.raises(TypeError, match="wraps a callable, got int"):
        function(3)
    with pytest.raises(TypeError, match="grad_fxn must be callable"):
        function(lambda x: x, grad_fxn=1)
    with pytest.raises(TypeError, match=r"argument \{1, 2\} of type set is neither a Tensor nor hashable"):
        function(lambda x, d: x + 1)(Tensor(data(2)), {"k": {1, 2}})
    with pytest.raises(TypeError, match="must return a Tensor or a tuple of Tensors, got float"):
        function(lambda x: 1.0)(Tensor(data(2)))
    with pytest.raises(RuntimeError, match=r"realizes or reads a value computed from its arguments \(shape \(2,\)"):
        function(lambda x: (x + 1).realize())(Tensor(data(2)))
    with pytest.raises(RuntimeError, match="realizes or reads"):
        function(lambda x: x * (x.sum().item()))(Tensor(data(2)))
    bound = Variable("n", 1, 4).bind(2)
    with pytest.raises(ValueError, match="tensor argument 0 has a symbolic shape"):
        function(lambda x: x + 1)(Tensor.ones(4)[:bound])
    with pytest.raises(RuntimeError, match="the body draws random numbers, which a replay would repeat"):
        function(lambda x: x + Tensor.rand(2))(Tensor(data(2)))
    with pytest.raises(ValueError, match="grad_fxn returned 1 gradients for 2 tensor arguments"):
        function(lambda a, b: a * b, grad_fxn=lambda g, a, b: (g,))(Tensor(data(2)), Tensor(data(2)))
    with pytest.raises(ValueError, match=r"grad_fxn's gradient 0 is \(3,\), its argument has shape \(2,\)"):
        function(lambda a: a * 2, grad_fxn=lambda g, a: (Tensor.ones(3),))(Tensor(data(2)))
