"""Optimizers against torch.optim (SGD, Adam, AdamW) and a numpy reference (LAMB, LARS) over several steps."""

import numpy as np
import pytest
import torch
from fusegrad import Context, Tensor
from fusegrad.nn.optim import LAMB, LARS, SGD, Adam, AdamW, Muon, OptimizerGroup
from fusegrad.uop.multi import multi_axis

STEPS = 5


def problem(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((4, 3)).astype(np.float32),
        rng.standard_normal(3).astype(np.float32),
        rng.standard_normal((5, 4)).astype(np.float32),
    )


def run_fusegrad(make_opt, seed=0):
    w0, b0, x0 = problem(seed)
    w, b, x = Tensor(w0), Tensor(b0), Tensor(x0)
    opt = make_opt([w, b])
    with Context(TRAINING=1):
        for _ in range(STEPS):
            opt.zero_grad()
            loss = ((x @ w + b).relu() ** 2).mean() + (w * w).sum() * 0.1
            loss.backward()
            opt.step()
    return w.numpy(), b.numpy()


def run_torch(make_opt, seed=0):
    w0, b0, x0 = problem(seed)
    w, b, x = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True), torch.tensor(x0)
    opt = make_opt([w, b])
    for _ in range(STEPS):
        opt.zero_grad()
        loss = ((x @ w + b).relu() ** 2).mean() + (w * w).sum() * 0.1
        loss.backward()
        opt.step()
    return w.detach().numpy(), b.detach().numpy()


@pytest.mark.parametrize(
    "name, ours, theirs",
    [
        ("sgd", lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
        (
            "sgd_momentum_wd",
            lambda p: SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
        ),
        (
            "sgd_nesterov",
            lambda p: SGD(p, lr=0.05, momentum=0.8, nesterov=True),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
        ),
        ("adam", lambda p: Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
        (
            "adam_betas",
            lambda p: Adam(p, lr=0.02, b1=0.8, b2=0.99, eps=1e-6),
            lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6),
        ),
        (
            "adamw",
            lambda p: AdamW(p, lr=0.01, weight_decay=0.1),
            lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
        ),
    ],
)
def test_matches_torch(name, ours, theirs):
    for a, b in zip(run_fusegrad(ours), run_torch(theirs)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def numpy_steps(update):
    """Same problem with gradients from torch autograd and the update rule written in numpy."""
    w0, b0, x0 = problem()
    params = [w0.astype(np.float64), b0.astype(np.float64)]
    state: dict = {}
    for step in range(1, STEPS + 1):
        w, b = torch.tensor(params[0], requires_grad=True), torch.tensor(params[1], requires_grad=True)
        loss = ((torch.tensor(x0, dtype=torch.float64) @ w + b).relu() ** 2).mean() + (w * w).sum() * 0.1
        loss.backward()
        params = [update(i, p, g.numpy(), step, state) for i, (p, g) in enumerate(zip(params, (w.grad, b.grad)))]
    return params


def lamb_ref(lr=0.01, b1=0.9, b2=0.999, eps=1e-6, wd=0.01):
    def update(i, p, g, t, state):
        m, v = state.get(("m", i), 0.0), state.get(("v", i), 0.0)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        state[("m", i)], state[("v", i)] = m, v
        up = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p
        r1, r2 = np.linalg.norm(p), np.linalg.norm(up)
        return p - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * up

    return update


def lars_ref(lr=0.01, momentum=0.9, wd=1e-4, tcoef=0.001):
    def update(i, p, g, t, state):
        wn, gn = np.linalg.norm(p), np.linalg.norm(g)
        ratio = tcoef * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
        g = (g + wd * p) * ratio * lr
        b = momentum * state.get(("b", i), 0.0) + g
        state[("b", i)] = b
        return p - b

    return update


@pytest.mark.parametrize(
    "ours, ref",
    [
        (lambda p: LAMB(p, lr=0.01, weight_decay=0.01), lamb_ref()),
        (lambda p: LARS(p, lr=0.01), lars_ref()),
    ],
)
def test_matches_numpy_reference(ours, ref):
    for a, b in zip(run_fusegrad(ours), numpy_steps(ref)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_lr_is_a_tensor_a_schedule_can_change():
    w = Tensor([1.0, 2.0])
    opt = SGD([w], lr=0.5)
    with Context(TRAINING=1):
        (w * w).sum().backward()
        opt.step()
        np.testing.assert_allclose(w.numpy(), [0.0, 0.0])
        opt.lr.assign(Tensor(0.25))
        opt.zero_grad()
        w.assign(Tensor([1.0, 2.0]))
        (w * w).sum().backward()
        opt.step()
    np.testing.assert_allclose(w.numpy(), [0.5, 1.0])


def test_optimizer_group_and_buffers():
    a, b = Tensor([1.0]), Tensor([2.0])
    stat = Tensor([5.0]).is_param_(False)
    group = OptimizerGroup(SGD([a, stat], lr=1.0), SGD([b], lr=0.5))
    assert group[1].params == [b] and group[0].buffers == [stat]
    with Context(TRAINING=1):
        (a * 3 + b * 4).sum().backward()
        group.step()
    assert a.item() == pytest.approx(-2.0) and b.item() == pytest.approx(0.0) and stat.item() == 5.0
    group.zero_grad()
    assert a.grad is None and b.grad is None


def test_errors():
    with pytest.raises(ValueError, match="-1"):
        SGD([Tensor([1.0])], lr=-1)
    with pytest.raises(AssertionError):
        SGD([Tensor([1.0]).is_param_(False)])
    w = Tensor([1.0])
    opt = Adam([w])
    with pytest.raises(RuntimeError, match="TRAINING"):
        opt.step()
    with Context(TRAINING=1):
        with pytest.raises(RuntimeError, match=r"parameter 0 \(shape \(1,\)\) has no .grad"):
            opt.step()


def newton_schulz_ref(x, steps, coefficients, eps=1e-7):
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (np.sqrt((x * x).sum()) + eps)
    a, b, c = coefficients
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def muon_ref(lr=0.02, momentum=0.95, wd=0.1, steps=5, coefficients=(3.4445, -4.775, 2.0315)):
    def update(i, p, g, t, state):
        b = momentum * state.get(("b", i), 0.0) + g
        state[("b", i)] = b
        u = g + momentum * b
        if p.ndim >= 2:
            u = newton_schulz_ref(u.reshape(p.shape[0], -1), steps, coefficients).reshape(p.shape)
        return p * (1 - lr * wd) - lr * u

    return update


def test_muon_matches_numpy_reference():
    from fusegrad.nn.optim import Muon

    for a, b in zip(run_fusegrad(lambda p: Muon(p, lr=0.02)), numpy_steps(muon_ref())):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="fused"):
        Muon([Tensor([[1.0]])], fused=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda p, fused: SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, fused=fused),
        lambda p, fused: Adam(p, lr=0.01, fused=fused),
        lambda p, fused: AdamW(p, lr=0.01, weight_decay=0.1, fused=fused),
    ],
)
def test_fused_update_matches_per_tensor(make):
    for a, b in zip(run_fusegrad(lambda p: make(p, True)), run_fusegrad(lambda p: make(p, False))):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6)
    opt = make([Tensor([[1.0, 2.0]]), Tensor([3.0])], True)
    assert len(opt.slot_shapes) == 1 and opt.slot_shapes[0] == (3,)


def test_fused_env_and_per_tensor_rules():
    from fusegrad.helpers import Context as Ctx

    with Ctx(FUSE_OPTIM=1):
        assert SGD([Tensor([1.0])]).fused
    for make in (lambda: LARS([Tensor([1.0])], fused=True), lambda: LAMB([Tensor([1.0])], fused=True)):
        with pytest.raises(ValueError, match="fused"):
            make()


DEVS = ("CPU", "CPU:1")


def moved(t, device):
    return t if t.device == device else t.to(device)


def run_placed(make_opt, place_w, place_b):
    """run_fusegrad with the parameters placed (sharded / on other devices); returns values and the optimizer."""
    w0, b0, x0 = problem()
    w, b = place_w(Tensor(w0)).realize(), place_b(Tensor(b0)).realize()
    layout = [(t.device, multi_axis(t.uop)) for t in (w, b)]
    x = Tensor(x0).shard(w.device) if isinstance(w.device, tuple) else Tensor(x0).to(w.device)
    opt = make_opt([w, b])
    with Context(TRAINING=1):
        for _ in range(STEPS):
            opt.zero_grad()
            loss = ((moved(x @ w, b.device) + b).relu() ** 2).mean() + moved((w * w).sum() * 0.1, b.device)
            loss.backward()
            opt.step()
    assert [(t.device, multi_axis(t.uop)) for t in (w, b)] == layout  # the parameters stay where they were
    return (w.numpy(), b.numpy()), opt


OPTIMIZERS = {
    "sgd_momentum_wd": lambda p, **kw: SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, **kw),
    "sgd_nesterov_fused": lambda p, **kw: SGD(p, lr=0.05, momentum=0.8, nesterov=True, fused=True, **kw),
    "adam": lambda p, **kw: Adam(p, lr=0.01, **kw),
    "adamw_fused": lambda p, **kw: AdamW(p, lr=0.01, weight_decay=0.1, fused=True, **kw),
    "lamb": lambda p, **kw: LAMB(p, lr=0.01, weight_decay=0.01, **kw),
    "lars": lambda p, **kw: LARS(p, lr=0.01, **kw),
    "muon": lambda p, **kw: Muon(p, lr=0.01, **kw),
}
PLACEMENTS = {
    # w split over its rows: LAMB/LARS norms and Muon's matmuls must all-reduce across the shards
    "sharded": (lambda t: t.shard(DEVS, 0), lambda t: t.shard(DEVS), {}),
    "two_devices": (lambda t: t.to("CPU:1"), lambda t: t, {}),
    "offloaded_state": (lambda t: t.to("CPU:1"), lambda t: t.to("CPU:1"), {"device": "CPU"}),
}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_placed_parameters_match_single_device(name, placement):
    place_w, place_b, kw = PLACEMENTS[placement]
    make = OPTIMIZERS[name]
    (w, b), opt = run_placed(lambda p: make(p, **kw), place_w, place_b)
    for ours, ref in zip((w, b), run_fusegrad(make)):
        np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=1e-5)
    state = [s for attr in ("b", "m", "v") for s in getattr(opt, attr, [])]
    assert state
    if "device" in kw or opt.fused:  # state lives on the optimizer's device, updates are copied back
        assert all(s.device == opt.device for s in state)
    else:  # state lives next to its parameter, sharded like it
        assert [s.device for s in state] == [p.device for p in opt.params] * (len(state) // 2)
        assert [multi_axis(s.uop) for s in state] == [multi_axis(p.uop) for p in opt.params] * (len(state) // 2)


def test_adam_makes_its_bias_corrections_once_per_step_not_per_parameter():
    from fusegrad.uop.ops import Ops, UOp

    params = [Tensor(np.ones((3, 4), np.float32)) for _ in range(3)]
    opt = Adam(params, lr=0.01)
    for p in params:
        p.grad = Tensor(np.full((3, 4), 0.5, np.float32))
    with Context(TRAINING=1):
        updates = opt.schedule_step()
    nodes = UOp(Ops.SINK, src=tuple(t.uop for t in updates)).toposort()
    sqrts = [u for u in nodes if u.op is Ops.SQRT]
    # one sqrt(v) per parameter and one sqrt(1 - b2**t) for the step
    assert len(sqrts) == len(params) + 1
    assert sum(u.shape == (3, 4) for u in sqrts) == len(params)
    Tensor.realize(*updates)
    # first step: m = 0.1 g, v = 0.001 g^2, step = lr * m / (1 - b1) / (sqrt(v / (1 - b2)) + eps) = lr (sign of g)
    np.testing.assert_allclose(params[0].numpy(), 1.0 - 0.01, rtol=1e-6)
