"""TinyJit (docs/api.md): jitted training matches eager fusegrad exactly and torch closely, replays read new data, every
input mismatch raises JitError, and the memory planner never lets two live buffers share memory."""

import pickle
import random
from pathlib import Path
import numpy as np
import pytest
import torch
from fusegrad import Context, Tensor, TinyJit, nn
from fusegrad.engine.jit import CapturedJit, JitError
from fusegrad.engine.memory_planner import overlapping_live_pairs, plan_offsets
from fusegrad.nn.optim import SGD, Adam, AdamW, Muon
from fusegrad.nn.state import get_parameters

STEPS = 10
rng = np.random.default_rng(0)


# compiled a*b+c is one FMA, numpy rounds twice: they differ by up to an ulp of a*b, large next to a result near 0
FMA_ATOL = 1e-6


def data(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------------ training


class MLP:
    def __init__(self, w):
        self.l1, self.l2 = nn.Linear(12, 16), nn.Linear(16, 4)
        self.l1.weight, self.l1.bias, self.l2.weight, self.l2.bias = (Tensor(a) for a in w)

    def __call__(self, x):
        return self.l2(self.l1(x).relu())


class ConvNet:
    def __init__(self, w):
        self.c1, self.l1 = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4 * 3 * 3, 4)
        self.c1.weight, self.c1.bias, self.l1.weight, self.l1.bias = (Tensor(a) for a in w)

    def __call__(self, x):
        return self.l1(self.c1(x).relu().max_pool2d(2).flatten(1))


MODELS = {
    "mlp": (MLP, lambda: [data(16, 12), data(16), data(4, 16), data(4)], (8, 12)),
    "conv": (ConvNet, lambda: [data(4, 1, 3, 3), data(4), data(4, 36), data(4)], (8, 1, 6, 6)),
}
OPTIMIZERS = {
    "SGD": (lambda p: SGD(p, lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "Adam": (lambda p: Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "AdamW": (lambda p: AdamW(p, lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
}


def train_fusegrad(model_name, make_opt, weights, batches, jit):
    model = MODELS[model_name][0](weights)
    opt = make_opt(get_parameters(model))

    def step(x, y):
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss

    run = TinyJit(step) if jit else step
    losses = [run(Tensor(x), Tensor(y)).item() for x, y in batches]
    if jit:
        assert run.captured is not None and run.cnt == len(batches)
    params = get_parameters(model)
    train_fusegrad.grads = [p.grad.numpy() for p in params]  # the last step's, read after it
    return [p.numpy() for p in params], losses


def train_torch(model_name, make_opt, weights, batches):
    if model_name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        layers = [model[0], model[2]]
    else:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
            torch.nn.Linear(36, 4),
        )  # fmt: skip
        layers = [model[0], model[4]]
    with torch.no_grad():
        for layer, w, b in zip(layers, weights[::2], weights[1::2]):
            layer.weight.copy_(torch.tensor(w))
            layer.bias.copy_(torch.tensor(b))
    opt = make_opt(model.parameters())
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.tensor(x)), torch.tensor(y, dtype=torch.long))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    train_torch.grads = [p.grad.numpy() for layer in layers for p in (layer.weight, layer.bias)]
    return [p.detach().numpy() for layer in layers for p in (layer.weight, layer.bias)], losses


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_jitted_training_matches_eager_and_torch(model_name, opt_name):
    weights = MODELS[model_name][1]()
    xshape = MODELS[model_name][2]
    batches = [(data(*xshape), rng.integers(0, 4, xshape[0]).astype(np.int32)) for _ in range(STEPS)]
    ours, theirs = OPTIMIZERS[opt_name]
    jit_params, jit_losses = train_fusegrad(model_name, ours, weights, batches, jit=True)
    jit_grads = train_fusegrad.grads
    eager_params, eager_losses = train_fusegrad(model_name, ours, weights, batches, jit=False)
    torch_params, torch_losses = train_torch(model_name, theirs, weights, batches)
    for a, b, c in zip(jit_grads, train_fusegrad.grads, train_torch.grads):  # `.grad` holds the last step's gradient
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)
    for a, b, c in zip(jit_params, eager_params, torch_params):
        np.testing.assert_array_equal(a, b)  # the same kernels on the same data: bit for bit
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(jit_losses, eager_losses)
    np.testing.assert_allclose(jit_losses, torch_losses, rtol=1e-4, atol=1e-5)
    assert len(set(jit_losses)) == STEPS  # every step saw its own batch


def test_jitted_muon_matches_eager():
    weights = MODELS["mlp"][1]()
    batches = [(data(8, 12), rng.integers(0, 4, 8).astype(np.int32)) for _ in range(STEPS)]
    make = lambda p: Muon(p, lr=0.02)  # noqa: E731
    jit_params, jit_losses = train_fusegrad("mlp", make, weights, batches, jit=True)
    eager_params, eager_losses = train_fusegrad("mlp", make, weights, batches, jit=False)
    for a, b in zip(jit_params, eager_params):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(jit_losses, eager_losses)


# ------------------------------------------------------------------------------------------------ replay


def test_replay_reads_new_data_and_returns_fresh_values():
    w = Tensor(data(4, 3))
    f = TinyJit(lambda x, y: ((x @ w) + y).relu() * 2)
    for i in range(5):
        a, b = data(5, 4), data(5, 3)
        out = f(Tensor(a), Tensor(b))
        np.testing.assert_allclose(out.numpy(), np.maximum(a @ w.numpy() + b, 0) * 2, rtol=1e-5, atol=1e-6)
    assert f.cnt == 5 and isinstance(f.captured, CapturedJit)


def test_returned_buffers_are_reused_unless_cloned():
    f = TinyJit(lambda x: x * 3)
    outs, kept = [], []
    for i in range(4):
        outs.append(f(Tensor(np.full(3, i, np.float32))))
        kept.append(outs[-1].clone().realize())
    np.testing.assert_array_equal([k.numpy()[0] for k in kept], [0, 3, 6, 9])
    np.testing.assert_array_equal(outs[2].numpy(), [9, 9, 9])  # the same output buffer as the last replay's


def test_output_fed_back_as_input():
    f = TinyJit(lambda x: (x * 2 + 1).contiguous())
    x, ref = Tensor(np.ones(4, np.float32)), np.ones(4, np.float32)
    for _ in range(6):
        x, ref = f(x), ref * 2 + 1
        np.testing.assert_array_equal(x.numpy(), ref)


def test_nested_returns_and_views_of_inputs():
    @TinyJit
    def f(x, y):
        return {"sum": x + y, "pair": [x * y, (x - y).exp()], "view": x.reshape(2, 3)}

    for _ in range(4):
        a, b = data(6), data(6)
        out = f(Tensor(a), Tensor(b))
        np.testing.assert_allclose(out["sum"].numpy(), a + b, rtol=1e-6, atol=FMA_ATOL)
        np.testing.assert_allclose(out["pair"][0].numpy(), a * b, rtol=1e-6, atol=FMA_ATOL)
        np.testing.assert_allclose(out["pair"][1].numpy(), np.exp(a - b), rtol=1e-5, atol=FMA_ATOL)
        np.testing.assert_array_equal(out["view"].numpy(), a.reshape(2, 3))


def test_returns_none_with_state_updates():
    acc = Tensor.zeros(3).contiguous().realize()

    @TinyJit
    def add(x):
        acc.assign(acc + x)

    for i in range(5):
        assert add(Tensor(np.full(3, i, np.float32))) is None
    np.testing.assert_array_equal(acc.numpy(), [10, 10, 10])


def test_method_and_keyword_inputs():
    class Model:
        def __init__(self):
            self.w = Tensor(data(3, 3))

        @TinyJit
        def __call__(self, x, *, scale):
            return (x @ self.w) * scale["s"]

    m = Model()
    for _ in range(4):
        a, s = data(2, 3), data(1)
        np.testing.assert_allclose(
            m(Tensor(a), scale={"s": Tensor(s)}).numpy(), a @ m.w.numpy() * s, rtol=1e-5, atol=FMA_ATOL
        )
    other = Model()  # another instance captures its own kernels (methods work, docs/api.md)
    for _ in range(4):
        a, s = data(2, 3), data(1)
        np.testing.assert_allclose(
            other(Tensor(a), scale={"s": Tensor(s)}).numpy(), a @ other.w.numpy() * s, rtol=1e-5, atol=FMA_ATOL
        )
        np.testing.assert_allclose(
            m(Tensor(a), scale={"s": Tensor(s)}).numpy(), a @ m.w.numpy() * s, rtol=1e-5, atol=FMA_ATOL
        )
    assert m.__call__.captured is not other.__call__.captured and other.__call__.cnt == 4


class Trainer:
    """A training step as a jitted method: each instance replays its own capture on its own weights."""

    def __init__(self, weights, make_opt):
        self.model = MLP(weights)
        self.opt = make_opt(get_parameters(self.model))

    @TinyJit
    def step(self, x, y):
        with Context(TRAINING=1):
            self.opt.zero_grad()
            loss = self.model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            self.opt.step()
        return loss


def test_jitted_method_on_two_instances_matches_eager():
    import gc

    make_opt = OPTIMIZERS["SGD"][0]
    weights = [MODELS["mlp"][1]() for _ in range(2)]
    batches = [(data(8, 12), rng.integers(0, 4, 8).astype(np.int32)) for _ in range(STEPS)]
    trainers = [Trainer(w, make_opt) for w in weights]
    losses = [[], []]
    for x, y in batches:
        for i, t in enumerate(trainers):  # interleaved: each replay must use its own instance's buffers
            losses[i].append(t.step(Tensor(x), Tensor(y)).item())
    for i, t in enumerate(trainers):
        eager_params, eager_losses = train_fusegrad("mlp", make_opt, weights[i], batches, jit=False)
        np.testing.assert_array_equal(losses[i], eager_losses)
        for a, b in zip(get_parameters(t.model), eager_params):
            np.testing.assert_array_equal(a.numpy(), b)
        assert t.step.captured is not None and t.step.cnt == STEPS
    assert trainers[0].step.captured is not trainers[1].step.captured
    assert len(Trainer.step._instances) == 2
    del trainers, t
    gc.collect()
    assert not Trainer.step._instances  # a dead instance's capture goes with it


def test_setitem_inside_the_function():
    @TinyJit
    def f(x):
        x[0] = 7.0
        out = Tensor.zeros(4).contiguous()
        out[1:3] = x[2:4] * 2
        return out

    for _ in range(4):
        a = data(5)
        x = Tensor(a)
        out = f(x)
        expected = a.copy()
        expected[0] = 7
        np.testing.assert_array_equal(x.numpy(), expected)
        np.testing.assert_array_equal(out.numpy(), [0, a[2] * 2, a[3] * 2, 0])


def test_sharded_inputs():
    devices = ("CPU", "CPU:1")
    w = Tensor(data(4, 3)).shard(devices)
    f = TinyJit(lambda x: ((x @ w).relu() + 1).sum(axis=1))
    for _ in range(4):
        a = data(6, 4)
        out = f(Tensor(a).shard(devices, axis=0))
        np.testing.assert_allclose(out.numpy(), (np.maximum(a @ w.numpy(), 0) + 1).sum(1), rtol=1e-5, atol=FMA_ATOL)
    with pytest.raises(JitError, match="args mismatch"):
        f(Tensor(a).shard(devices, axis=1))


def test_prune_drops_kernels_without_inputs():
    w = Tensor(data(8))

    def body(x):
        scaled = (w * 3).exp().contiguous()  # depends on no input: computed once at capture when pruning
        return x * scaled

    full, pruned = TinyJit(body), TinyJit(body, prune=True)
    for _ in range(4):
        a = data(8)
        for f in (full, pruned):
            np.testing.assert_allclose(f(Tensor(a)).numpy(), a * np.exp(w.numpy() * 3), rtol=1e-5, atol=FMA_ATOL)
    assert len(pruned.captured.launches) < len(full.captured.launches)


def test_decorator_with_arguments_and_reset():
    calls = []

    @TinyJit(prune=False)
    def f(x):
        calls.append(1)
        return x + 1

    for _ in range(4):
        f(Tensor(data(3)))
    assert len(calls) == 2  # warm-up and capture run the body, replays do not
    f.reset()
    assert f.captured is None and f.cnt == 0
    for _ in range(3):
        a = data(2, 2)  # another shape: a new capture after the reset
        np.testing.assert_array_equal(f(Tensor(a)).numpy(), a + 1)
    assert len(calls) == 4


def test_jit_0_runs_the_body_and_jit_2_replays_without_graphs():
    calls = []

    def body(x):
        calls.append(1)
        return (x * 2).sqrt()

    with Context(JIT=0):
        f = TinyJit(body)
        for _ in range(4):
            a = np.abs(data(5))
            np.testing.assert_allclose(f(Tensor(a)).numpy(), np.sqrt(a * 2), rtol=1e-6, atol=FMA_ATOL)
        assert len(calls) == 4 and f.captured is None
    with Context(JIT=2):
        g = TinyJit(body)
        for _ in range(4):
            a = np.abs(data(5))
            np.testing.assert_allclose(g(Tensor(a)).numpy(), np.sqrt(a * 2), rtol=1e-6, atol=FMA_ATOL)
        assert g.captured.batches == 0 and len(calls) == 6


def test_same_input_tensors_replay_new_values_and_still_check():
    calls = []

    def body(x, y):
        calls.append(1)
        return x * y + 1

    f = TinyJit(body)
    x, y = Tensor(data(3, 4)).realize(), Tensor(data(3, 4)).realize()
    for _ in range(4):  # after the capture: the same nodes as the last call, one identity check each
        np.testing.assert_allclose(f(x, y).numpy(), x.numpy() * y.numpy() + 1, rtol=1e-6, atol=FMA_ATOL)
    x.assign(Tensor(data(3, 4))).realize()  # new values in x's buffer, a new node for the same tensor
    np.testing.assert_allclose(f(x, y).numpy(), x.numpy() * y.numpy() + 1, rtol=1e-6, atol=FMA_ATOL)
    np.testing.assert_allclose(f(x, y).numpy(), x.numpy() * y.numpy() + 1, rtol=1e-6, atol=FMA_ATOL)
    with pytest.raises(JitError, match="argument 1 has shape"):
        f(x, Tensor(data(4, 3)))
    with pytest.raises(JitError, match="argument 1 is a different view"):
        f(x, y.reshape(4, 3).T)
    with pytest.raises(JitError, match="same buffer"):
        f(x, x)
    with pytest.raises(JitError, match=r"at capture, now \['argument 0'\]"):
        f(x, 2)
    with pytest.raises(JitError, match="inputs were"):
        f(x, y=y)
    with Context(JIT=0):
        f(x, y)
    assert len(calls) == 3  # warm-up, capture and the JIT=0 call ran the body
    np.testing.assert_allclose(f(x, y).numpy(), x.numpy() * y.numpy() + 1, rtol=1e-6, atol=FMA_ATOL)


def test_tensors_left_lazy_hold_each_calls_values():
    w = Tensor(data(4, 3)).requires_grad_()
    left = {}

    @TinyJit
    def f(x):
        w.grad = None
        loss = (x @ w).relu().sum()
        loss.backward()  # w.grad stays lazy: nothing in the function realizes it
        left["exp"] = (x * 2).exp()  # a lazy tensor the function leaves behind
        return loss

    for i in range(5):
        a = data(5, 4)
        x = Tensor(a)
        loss = f(x)
        mask = (a @ w.numpy() > 0).astype(np.float32)
        np.testing.assert_allclose(loss.numpy(), np.maximum(a @ w.numpy(), 0).sum(), rtol=1e-5, atol=FMA_ATOL)
        np.testing.assert_allclose(w.grad.numpy(), a.T @ mask, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(left["exp"].numpy(), np.exp(a * 2), rtol=1e-5, atol=FMA_ATOL)
        if i >= 1:
            assert x.grad is None  # an input that asked for no gradient gets none from a jitted call
    assert len(f.captured.launches) >= 3


def test_lazy_tensor_made_before_the_capture_keeps_its_value():
    results = []
    for jit in (False, True):
        w = Tensor(np.ones(4, np.float32)).contiguous().realize()

        def body(x):
            w.assign(w + x).realize()
            return (w * 1).contiguous()

        f = TinyJit(body) if jit else body
        f(Tensor(np.ones(4, np.float32)))
        before = w * 10  # lazy, made before the capturing call: the value of w then
        for _ in range(3):
            f(Tensor(np.ones(4, np.float32)))
        results.append((before.numpy(), w.numpy()))
    (eager_before, eager_w), (jit_before, jit_w) = results
    np.testing.assert_array_equal(jit_before, np.full(4, 20, np.float32))
    np.testing.assert_array_equal(jit_before, eager_before)
    np.testing.assert_array_equal(jit_w, eager_w)


def test_input_that_requires_grad_gets_each_calls_gradient():
    w = Tensor(data(3, 2))

    @TinyJit
    def f(x):
        x.grad = None
        loss = (x @ w).square().sum()
        loss.backward()
        return loss

    x = Tensor(data(4, 3)).requires_grad_()
    tw = torch.tensor(w.numpy())
    for _ in range(4):
        a = data(4, 3)
        x.assign(Tensor(a)).realize()
        tx = torch.tensor(a, requires_grad=True)
        (tx @ tw).square().sum().backward()
        f(x)
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ errors


def captured(fn=lambda x, y=None: x * 2 + 1, x=(3, 4), **kwargs):
    f = TinyJit(fn)
    for _ in range(2):
        f(Tensor(data(*x)), **kwargs)
    return f


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda f: f(Tensor(data(4, 3))), "shape"),
        (lambda f: f(Tensor(data(3, 4)).cast("float16")), "dtype"),
        (lambda f: f(Tensor(data(3, 4), device="CPU:1")), "device"),
        (lambda f: f(Tensor(data(4, 3)).T), "view"),
        (lambda f: f(Tensor(data(3, 5))[:, :4]), "view"),
        (lambda f: f(Tensor(data(3, 4)), y=1), "argument 'y'"),
        (lambda f: f(Tensor(data(3, 4)), Tensor(data(3, 4))), "inputs were"),
        (lambda f: f(x=Tensor(data(3, 4))), "inputs were"),
    ],
)
def test_every_mismatch_raises(call, message):
    f = captured()
    with pytest.raises(JitError, match="args mismatch") as e:
        call(f)
    assert message in str(e.value)
    np.testing.assert_array_equal(f(Tensor(np.ones((3, 4), np.float32))).numpy(), np.full((3, 4), 3))


def test_other_argument_values_must_match():
    f = captured(lambda x, k: x * k, k=2)
    with pytest.raises(JitError, match=r"argument 'k' is 3, at capture argument 'k' was 2"):
        f(Tensor(data(3, 4)), k=3)


def test_constant_and_duplicate_inputs_are_refused():
    f = TinyJit(lambda x, y: x + y)
    with pytest.raises(JitError, match="constant"):
        f(Tensor.ones(3), Tensor(data(3)))
    t = Tensor(data(3))
    with pytest.raises(JitError, match="same buffer"):
        f(t, t)
    with pytest.raises(JitError, match="same buffer"):
        f(t, t.reshape(3))
    for _ in range(3):
        f(Tensor.ones(3).contiguous(), Tensor(data(3)))  # a constant made a buffer is fine
    with pytest.raises(JitError, match="same buffer"):
        f(t, t)


def test_reading_data_during_capture():
    seen = []

    @TinyJit
    def f(x):
        y = x * 2
        seen.append(y.sum().item())
        return y

    f(Tensor(data(3)))
    with pytest.raises(JitError, match="reading data"):
        f(Tensor(data(3)))
    assert f.captured is None


def test_nothing_launched_and_non_tensor_returns():
    with pytest.raises(JitError, match="didn't JIT anything"):
        captured(lambda x: x)
    with pytest.raises(JitError, match=r"return value\[1\] is <class 'int'>"):
        captured(lambda x: (x + 1, 3))


def test_nested_capture_raises():
    inner = TinyJit(lambda x: x + 1)
    outer = TinyJit(lambda x: inner(x) * 2)
    outer(Tensor(data(3)))
    with pytest.raises(RuntimeError, match="another TinyJit captures"):
        outer(Tensor(data(3)))


# ------------------------------------------------------------------------------------------------ memory planner


def test_plan_never_overlaps_live_buffers():
    r = random.Random(0)
    for _ in range(200):
        n = r.randint(1, 30)
        sizes = [r.choice([0, 1, 4, 64, 100, 4096, r.randint(1, 10000)]) for _ in range(n)]
        lifetimes = []
        for _ in range(n):
            first = r.randint(0, 40)
            lifetimes.append((first, first + r.choice([0, 0, 1, 2, r.randint(0, 40)])))
        offsets, total = plan_offsets(sizes, lifetimes)
        assert overlapping_live_pairs(offsets, sizes, lifetimes) == []
        assert all(o % 64 == 0 and o + s <= total for o, s in zip(offsets, sizes))
        assert total <= sum(-(-max(s, 1) // 64) * 64 for s in sizes)


def test_planned_step_equals_unplanned_under_reuse():
    def chain(x, y):
        outs = []
        for i in range(30):  # each intermediate dies one kernel later: the tightest reuse the planner can make
            x = (x * 1.5 + y).relu().contiguous()
            y = (y - x * 0.25).contiguous()
            if i % 10 == 9:
                outs.append(x.sum().contiguous())
        return outs + [x, y]

    inputs = [(data(64), data(64)) for _ in range(4)]
    results = []
    for planner_off in (0, 1):
        with Context(NO_MEMORY_PLANNER=planner_off):
            f = TinyJit(chain)
            runs = [[t.numpy() for t in f(Tensor(a), Tensor(b))] for a, b in inputs]
            results.append((runs, f.captured))
    (planned, cap), (unplanned, cap_off) = results
    a, b = inputs[-1]
    for _ in range(30):
        a = np.maximum(a * 1.5 + b, 0)
        b = b - a * 0.25
    np.testing.assert_allclose(planned[-1][-2], a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(planned[-1][-1], b, rtol=1e-4, atol=1e-5)
    for p, u in zip(planned, unplanned):
        for a, b in zip(p, u):
            np.testing.assert_array_equal(a, b)
    assert cap.planned_to < cap.planned_from / 10
    assert cap_off.planned_to == cap_off.planned_from


def test_debug_2_times_each_replayed_kernel(capsys):
    f = TinyJit(lambda x: (x.exp() + 1).sum())
    for _ in range(3):
        f(Tensor(data(16)))
    capsys.readouterr()
    with Context(DEBUG=2):
        out = f(Tensor(np.zeros(16, np.float32)))
    lines = capsys.readouterr().out.splitlines()
    assert len([ln for ln in lines if ln.strip().startswith("JIT ") and " tm " in ln]) == len(f.captured.launches)
    assert out.item() == 32.0


def test_debug_lines(capsys):
    with Context(DEBUG=2):
        captured(x=(5,))
    out = capsys.readouterr().out
    assert "captured 1 kernels into 1 batches" in out and "memory planned from" in out
    with Context(DEBUG=2):
        f = captured(x=(5,))
        f(Tensor(data(5)))
    assert "replay 1: 1 kernels in 1 calls" in capsys.readouterr().out


def test_batched_kernels_split_over_threads():
    w = Tensor(data(256, 256))
    with Context(NUM_CPU_THREADS=4):
        f = TinyJit(lambda x: ((x @ w).relu() @ w).contiguous())
        for _ in range(4):
            a = data(128, 256)
            w64 = w.numpy().astype(np.float64)
            ref = np.maximum(a @ w64, 0) @ w64
            # float32 sums of 256 products of outputs up to ~200: an entry near 0 carries the big ones' rounding
            np.testing.assert_allclose(f(Tensor(a)).numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    graphs = [s.graph for s in f.captured.steps if hasattr(s, "graph")]
    assert graphs and max(c for g in graphs for c in g.chunks) > 1  # replayed on the runner's worker threads


def scaled_tanh(x, w):
    return ((x @ w).tanh() * 2).contiguous(), (x.sum() + 1).contiguous()


@pytest.mark.slow
def test_pickled_capture_replays_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    w = Tensor(data(4, 3))
    f = TinyJit(scaled_tanh)
    for _ in range(3):
        f(Tensor(data(5, 4)), w)
    path = tmp_path / "jit.pkl"
    path.write_bytes(pickle.dumps(f))
    a, w_np = data(5, 4), w.numpy()
    script = (
        "import pickle, sys, numpy as np\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})  # the jitted function is this module's\n"
        "from fusegrad import Tensor\n"
        f"f = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        f"a, w = np.array({a.tolist()}, np.float32), np.array({w_np.tolist()}, np.float32)\n"
        "out, s = f(Tensor(a), Tensor(w))\n"
        "assert f.captured is not None and f.cnt == 4\n"
        "np.testing.assert_allclose(out.numpy(), np.tanh(a @ w) * 2, rtol=1e-5, atol=1e-6)\n"
        "np.testing.assert_allclose(s.numpy(), a.sum() + 1, rtol=1e-5, atol=1e-6)\n"
        "print('replayed')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "replayed" in done.stdout, done.stderr


class Scaled:
    def __init__(self, w):
        self.w = Tensor(w).realize()

    @TinyJit
    def apply(self, x):
        return (x * self.w + 1).contiguous()


def test_pickled_method_capture_replays():
    m = Scaled(data(3))
    for _ in range(3):
        m.apply(Tensor(data(3)))
    loaded = pickle.loads(pickle.dumps(m.apply))
    a = data(3)
    np.testing.assert_allclose(loaded(Tensor(a)).numpy(), a * m.w.numpy() + 1, rtol=1e-6, atol=FMA_ATOL)
    assert loaded.fxn is None  # the body needs its instance: the loaded capture only replays


def test_pickled_lambda_capture_replays_without_its_function():
    w = Tensor(data(3))
    f = TinyJit(lambda x: (x * w).exp())
    for _ in range(2):
        f(Tensor(data(3)))
    loaded = pickle.loads(pickle.dumps(f))
    assert loaded.fxn is None  # a lambda cannot be pickled: the capture replays alone
    a = data(3)
    np.testing.assert_allclose(loaded(Tensor(a)).numpy(), np.exp(a * w.numpy()), rtol=1e-5, atol=FMA_ATOL)
    with pytest.raises(JitError, match="args mismatch"):
        loaded(Tensor(data(4)))


# ------------------------------------------------------------------------------------------------ variables


def test_new_variable_values_replay_one_capture():
    from fusegrad import GlobalCounters, Variable

    v = Variable("n", 0, 7)
    cache = Tensor.zeros(8, 4).contiguous().realize()

    @TinyJit
    def step(x, pos):
        cache[pos : pos + 1] = x  # a write at a symbolic position
        seen = cache[: pos + 1]
        return (seen * 2).contiguous(), seen.sum(0).contiguous()

    ref = np.zeros((8, 4), np.float32)
    for val in range(7):
        x = data(1, 4)
        ref[val] = x
        compiled = GlobalCounters.compile_count
        doubled, total = step(Tensor(x), v.bind(val))
        if val >= 2:
            assert GlobalCounters.compile_count == compiled  # a replay compiles nothing for a new value
        assert doubled.shape[0].expr == "(n+1)" and doubled.shape[0].vmax == 8
        np.testing.assert_allclose(
            doubled.shrink(((0, val + 1), None)).numpy(), ref[: val + 1] * 2, rtol=1e-6, atol=FMA_ATOL
        )
        np.testing.assert_allclose(total.numpy(), ref[: val + 1].sum(0), rtol=1e-5, atol=FMA_ATOL)
    assert step.cnt == 7 and len(step.captured.var_slots) >= 2
    with pytest.raises(JitError, match="args mismatch"):
        step(Tensor(data(1, 4)), Variable("m", 0, 7).bind(2))


def test_inputs_of_symbolic_shape():
    from fusegrad import Variable

    v = Variable("rows", 1, 6)
    f = TinyJit(lambda x: (x.exp().sum(0) + 1).contiguous())
    base = Tensor(data(6, 3))
    for val in (2, 5, 1, 6, 3):
        out = f(base[: v.bind(val)])
        np.testing.assert_allclose(out.numpy(), np.exp(base.numpy()[:val]).sum(0) + 1, rtol=1e-5, atol=FMA_ATOL)
    assert f.cnt == 5 and f.captured is not None


@pytest.mark.parametrize("read_old_after", [False, True])
def test_state_whose_assign_copied_on_write(read_old_after):
    """A live lazy reader of a weight makes its assign write a new buffer during the capture: the replay must still
    update the weight's own storage (in place where safe, else by a copy at the end) and read the old value where the
    function did."""
    start = data(4)
    results = []
    for jit in (False, True):
        w, held = Tensor(start).contiguous().realize(), []

        def body(x):
            old = w * 1  # lazy: still reads the old value when the assign runs
            held.append(old)
            w.assign(w + x).realize()
            held.clear()  # (a lazy tensor left alive would be realized in the capture, reading the old value)
            return (old * 2 + w).contiguous() if read_old_after else (w * 2).contiguous()

        f = TinyJit(body) if jit else body
        outs = [f(Tensor(np.full(4, i, np.float32))).numpy() for i in range(5)]
        results.append((outs, w.numpy()))
        if jit:
            copies = [la for la in f.captured.launches if la.runner is None]
            assert len(copies) == int(read_old_after)  # the weight is written in place unless the old value is read
    (eager_outs, eager_w), (jit_outs, jit_w) = results
    np.testing.assert_array_equal(jit_w, eager_w)
    expected = start.copy()
    for i in range(5):
        expected += np.float32(i)  # the same float32 rounding as five assigns
    np.testing.assert_array_equal(jit_w, expected)
    for a, b in zip(jit_outs, eager_outs):
        np.testing.assert_array_equal(a, b)


def test_random_numbers_are_new_on_every_replay():
    def body(x):
        with Context(TRAINING=1):
            return (x.dropout(0.5) + Tensor.randn(3, 4)).contiguous()

    runs = []
    for jit in (False, True):
        Tensor.manual_seed(3)
        f = TinyJit(body) if jit else body
        outs = [f(Tensor(np.ones((3, 4), np.float32))).numpy() for _ in range(5)]
        runs.append(outs + [Tensor.rand(4).numpy()])  # eager draws after the replays continue the same sequence
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert len({a.tobytes() for a in runs[1]}) == len(runs[1])  # every replay drew new numbers


def test_jitbeam_applies_only_to_the_capture():
    from fusegrad.helpers import BEAM

    seen = []

    def body(x):
        seen.append(int(BEAM.value))
        return x * 2

    with Context(JITBEAM=2, NOOPT=1):  # NOOPT wins over BEAM: the capture compiles without a search here
        f = TinyJit(body)
        for _ in range(3):
            f(Tensor(data(3)))
    assert seen == [0, 2]  # the warm-up runs with BEAM as set, the capture with JITBEAM


def test_batchnorm_running_stats_and_sharded_parameters_match_eager():
    devices = ("CPU", "CPU:1")
    batches = [(data(8, 2, 6, 6), rng.integers(0, 3, 8).astype(np.int32), data(4, 6)) for _ in range(5)]
    w0 = data(6, 4)
    results = []
    for jit in (False, True):
        Tensor.manual_seed(1)
        conv, bn, head = nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Linear(64, 3)
        opt = Adam(get_parameters([conv, bn, head]), lr=0.01)
        w = Tensor(w0).shard(devices)  # a replicated parameter on two devices, its own optimizer
        w.requires_grad = True
        sharded_opt = SGD([w], lr=0.1, momentum=0.9)

        def step(x, y, z):
            with Context(TRAINING=1):
                opt.zero_grad()
                sharded_opt.zero_grad()
                loss = head(bn(conv(x)).relu().flatten(1)).sparse_categorical_crossentropy(y)
                sharded_loss = (z @ w).relu().sum()
                (loss + sharded_loss.to("CPU")).backward()
                opt.step()
                sharded_opt.step()
            return loss, sharded_loss

        f = TinyJit(step) if jit else step
        losses = [[t.item() for t in f(Tensor(x), Tensor(y), Tensor(z).shard(devices, axis=0))] for x, y, z in batches]
        state = [t.numpy() for t in [*get_parameters([conv, bn, head]), bn.running_mean, bn.running_var, w]]
        results.append((losses, state))
    (eager_losses, eager_state), (jit_losses, jit_state) = results
    np.testing.assert_array_equal(jit_losses, eager_losses)
    for a, b in zip(jit_state, eager_state):
        np.testing.assert_array_equal(a, b)


def test_one_variable_bound_twice_in_a_call():
    from fusegrad import Variable

    v = Variable("k", 1, 4)
    f = TinyJit(lambda x, a, b: x[:a].sum() + x[:b].sum())
    with pytest.raises(JitError, match="bound to both 2 and 3"):
        f(Tensor(data(4)), v.bind(2), v.bind(3))


def test_kernel_with_many_buffers_in_a_batch():
    f = TinyJit(lambda *xs: sum(xs).contiguous())
    for _ in range(3):
        arrays = [data(5) for _ in range(70)]
        out = f(*(Tensor(a) for a in arrays))
        np.testing.assert_allclose(out.numpy(), sum(arrays), rtol=1e-4, atol=1e-4)
    graphs = [s.graph for s in f.captured.steps if hasattr(s, "graph")]
    assert graphs and max(graphs[0].nargs) > 70  # one launch with every input, from the C runner's switch


def test_index_checks_are_replayed():
    table = Tensor(data(5, 3))
    with Context(CHECK_OOB=1):
        f = TinyJit(lambda idx: table[idx].sum(1).contiguous())
        for _ in range(3):
            idx = rng.integers(0, 5, 4).astype(np.int32)
            np.testing.assert_allclose(f(Tensor(idx)).numpy(), table.numpy()[idx].sum(1), rtol=1e-5, atol=FMA_ATOL)
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            f(Tensor(np.array([0, 7, 1, 2], np.int32)))
        idx = np.array([4, 0, 3, 3], np.int32)
        np.testing.assert_allclose(f(Tensor(idx)).numpy(), table.numpy()[idx].sum(1), rtol=1e-5, atol=FMA_ATOL)
        loaded = pickle.loads(pickle.dumps(f))  # the check travels with a pickled capture
        np.testing.assert_allclose(loaded(Tensor(idx)).numpy(), table.numpy()[idx].sum(1), rtol=1e-5, atol=FMA_ATOL)
        with pytest.raises(IndexError, match="index -9 is out of bounds"):
            loaded(Tensor(np.array([0, -9, 1, 2], np.int32)))


def test_replays_kernel_by_kernel_without_the_graph_runner(monkeypatch):
    from fusegrad.runtime import cpu_runner

    monkeypatch.setattr(cpu_runner, "graph_library", lambda: None)  # as where no C compiler builds the runner
    w = Tensor(data(4, 4))
    f = TinyJit(lambda x: (x @ w).relu().contiguous() * 2)
    for _ in range(4):
        a = data(3, 4)
        np.testing.assert_allclose(f(Tensor(a)).numpy(), np.maximum(a @ w.numpy(), 0) * 2, rtol=1e-5, atol=FMA_ATOL)
    assert f.captured.batches == 0 and len(f.captured.steps) == len(f.captured.launches)
