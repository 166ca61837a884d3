"""Multi-device tensors (shard, shard_, shard_like; docs/api.md, Devices): values, gradients, errors vs numpy/torch."""

import numpy as np
import pytest
import torch

from fusegrad import Device, Tensor, dtypes
from fusegrad.uop.multi import multi_axis
from fusegrad.uop.ops import Ops

DEVS = ("CPU", "CPU:1")
DEVS3 = ("CPU", "CPU:1", "CPU:2")
rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def close(t, ref, atol=1e-6, rtol=1e-3):
    ref = np.asarray(ref)
    out = t.numpy()
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, out.dtype, ref.shape, ref.dtype)
    np.testing.assert_allclose(out, ref, atol=atol, rtol=rtol)


def shards(t):
    """The realized per-device pieces of a multi-device tensor (device, numpy values)."""
    t.realize()
    assert t.uop.op is Ops.MULTI
    return [(d, Tensor(s, device=d).numpy()) for s, d in zip(t.uop.src, t.uop.arg[1])]


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_shard_values_and_device(axis):
    x = rand(6, 4)
    t = Tensor(x).shard(DEVS, axis)
    assert t.device == DEVS and t.shape == (6, 4) and t.dtype == dtypes.float32
    close(t, x)
    pieces = shards(t)
    assert [d for d, _ in pieces] == list(DEVS)
    if axis is None:
        assert all(np.array_equal(p, x) for _, p in pieces)
    else:
        np.testing.assert_array_equal(np.concatenate([p for _, p in pieces], axis=axis), x)


def test_shard_three_devices_and_int_dtype():
    x = np.arange(24, dtype=np.int32).reshape(3, 8)
    t = Tensor(x).shard(DEVS3, 0)
    assert [p.shape for _, p in shards(t)] == [(1, 8)] * 3
    close(t * 2 + 1, x * 2 + 1)
    close(t.sum(0), x.sum(0).astype(np.int32))  # int32 sums stay int32
    close((t > 5), x > 5)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_elementwise_stays_sharded(axis):
    x, y = rand(4, 6), rand(4, 6)
    a, b = Tensor(x).shard(DEVS, axis), Tensor(y).shard(DEVS, axis)
    out = (a * b + 1).exp() - a.relu() / 2
    assert out.device == DEVS
    close(out, np.exp(x * y + 1) - np.maximum(x, 0) / 2)
    out.realize()
    assert out.uop.op is Ops.MULTI and out.uop.arg[0] == (None if axis is None else axis)


def test_elementwise_mixed_axes_and_broadcast():
    x, y, z = rand(4, 6), rand(4, 6), rand(6)
    a, b, c = Tensor(x).shard(DEVS, 0), Tensor(y).shard(DEVS, 1), Tensor(z).shard(DEVS)
    close(a + b, x + y)
    close(a * c, x * z)
    close((a > 0).where(a, b), np.where(x > 0, x, y))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("red", ["sum", "max", "mean", "prod"])
def test_reduce_over_and_across_shard_axis(axis, red):
    x = rand(4, 6)
    t = Tensor(x).shard(DEVS, axis)
    for over in (0, 1, None):
        ref = getattr(torch.tensor(x), red if red != "prod" else "prod")
        want = (
            (ref() if over is None else ref(over))
            if red != "max"
            else (torch.tensor(x).max() if over is None else torch.tensor(x).max(over).values)
        )
        close(getattr(t, red)(over), want.numpy())
    out = t.sum(axis)
    out.realize()
    assert out.uop.op is Ops.MULTI and out.uop.arg[0] is None  # all-reduced: every device holds the total


def test_reduce_keeps_shard_axis_when_not_reduced():
    x = rand(4, 6)
    out = Tensor(x).shard(DEVS, 0).sum(1, keepdim=True)
    close(out, x.sum(1, keepdims=True))
    assert [p.shape for _, p in shards(out)] == [(2, 1), (2, 1)]


def test_movement_on_sharded():
    x = rand(4, 6)
    t = Tensor(x).shard(DEVS, 0)
    close(t.T, x.T)
    close(t.reshape(4, 2, 3), x.reshape(4, 2, 3))
    close(t.reshape(24), x.reshape(24))  # splits the sharded axis: gathered
    close(t[:, 1:4], x[:, 1:4])
    close(t[1:3], x[1:3])
    close(t.flip(1), x[:, ::-1])
    close(t.flip(0), x[::-1])
    close(t.pad(((0, 0), (1, 2))), np.pad(x, ((0, 0), (1, 2))))
    close(t.unsqueeze(1).expand(4, 3, 6), np.broadcast_to(x[:, None], (4, 3, 6)))
    close(t.permute(1, 0).reshape(6, 2, 2), x.T.reshape(6, 2, 2))
    out = t.T.contiguous()
    out.realize()
    assert out.uop.arg[0] == 1


def test_matmul_batch_sharded_weight_replicated():
    x, w = rand(8, 5), rand(5, 3)
    xt, wt = Tensor(x).shard(DEVS, 0), Tensor(w).shard(DEVS)
    out = xt @ wt
    assert out.device == DEVS
    close(out, x @ w, atol=1e-5)
    assert [p.shape for _, p in shards(out)] == [(4, 3), (4, 3)]


def test_matmul_weight_sharded_on_output_axis():
    x, w = rand(4, 5), rand(5, 6)
    out = Tensor(x).shard(DEVS) @ Tensor(w).shard(DEVS, 1)
    close(out, x @ w, atol=1e-5)
    assert [p.shape for _, p in shards(out)] == [(4, 3), (4, 3)]


def test_matmul_sharded_on_contraction_axis_all_reduces():
    x, w = rand(3, 8), rand(8, 2)
    out = Tensor(x).shard(DEVS, 1) @ Tensor(w).shard(DEVS, 0)
    close(out, x @ w, atol=1e-5)
    assert all(np.allclose(p, x @ w, atol=1e-5) for _, p in shards(out))


@pytest.mark.parametrize("x_axis,w_axis", [(0, None), (None, 1), (1, 0), (0, 1)])
def test_matmul_backward(x_axis, w_axis):
    x, w = rand(4, 6), rand(6, 4)
    xt = Tensor(x).shard(DEVS, x_axis).realize()
    wt = Tensor(w).shard(DEVS, w_axis).realize()
    loss = ((xt @ wt).relu() * 0.5).sum()
    gx, gw = loss.gradient(xt, wt)
    assert gx.device == DEVS and gw.device == DEVS
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tl = ((tx @ tw).relu() * 0.5).sum()
    tl.backward()
    close(loss, tl.detach().numpy(), atol=1e-5)
    close(gx, tx.grad.numpy(), atol=1e-4)
    close(gw, tw.grad.numpy(), atol=1e-4)


def test_backward_fills_grad_and_flows_to_unsharded_source():
    x, w = rand(4, 6), rand(6, 4)
    src = Tensor(x)
    wt = Tensor(w).shard(DEVS, 1).realize()
    loss = (src.shard(DEVS, 0) @ wt).square().mean()
    loss.backward()
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    (tx @ tw).square().mean().backward()
    assert src.grad.device == "CPU" and wt.grad.device == DEVS
    close(src.grad, tx.grad.numpy(), atol=1e-4)
    close(wt.grad, tw.grad.numpy(), atol=1e-4)


def test_sgd_step_on_sharded_weight():
    from fusegrad.nn.optim import SGD

    x, w = rand(4, 6), rand(6, 2)
    wt = Tensor(w).shard(DEVS, 1).realize()
    opt = SGD([wt], lr=0.1)
    with Tensor.train():
        opt.zero_grad()
        (Tensor(x).shard(DEVS) @ wt).sum().backward()
        opt.step()
    assert wt.device == DEVS
    close(wt, w - 0.1 * x.sum(0)[:, None].repeat(2, 1), atol=1e-5)


def test_to_and_numpy_gather():
    x = rand(4, 6)
    t = Tensor(x).shard(DEVS, 1) * 2
    for dev in ("CPU", "CPU:1"):
        g = t.to(dev)
        assert g.device == dev
        close(g, x * 2)
    assert (t + 1).tolist() == (x * 2 + 1).tolist()
    assert Tensor(x).shard(DEVS, 0).sum().item() == pytest.approx(float(x.sum()), rel=1e-5)


def test_one_tuple_is_plain_to():
    x = rand(3)
    for t in (Tensor(x).shard(("CPU:1",)), Tensor(x).shard(("cpu:1",), 0), Tensor(x).to(("CPU:1",))):
        assert t.device == "CPU:1" and t.uop.op is not Ops.MULTI
        close(t, x)


def test_shard_in_place_and_shard_like():
    x, y = rand(4, 2), rand(4, 2)
    t = Tensor(x)
    assert t.shard_(DEVS, 0) is t and t.device == DEVS
    close(t, x)
    u = Tensor(y).shard_like(t * 2)
    assert u.device == DEVS and [p.shape for _, p in shards(u)] == [(2, 2), (2, 2)]
    v = Tensor(y).shard_like(Tensor(x, device="CPU:1"))
    assert v.device == "CPU:1"
    close(v, y)


def test_creation_with_tuple_devices():
    for t, ref in (
        (Tensor.zeros(2, 3, device=DEVS), np.zeros((2, 3), np.float32)),
        (Tensor.ones(4, device=DEVS, dtype=dtypes.int32), np.ones(4, np.int32)),
        (Tensor.full((2, 2), 7.5, device=DEVS), np.full((2, 2), 7.5, np.float32)),
        (Tensor([[1, 2], [3, 4]], device=DEVS), np.array([[1, 2], [3, 4]], np.int32)),
        (Tensor(np.arange(4, dtype=np.float32), device=DEVS), np.arange(4, dtype=np.float32)),
    ):
        assert t.device == DEVS
        close(t, ref)
        assert all(np.array_equal(p, ref) for _, p in shards(t))  # replicated
    e = Tensor.empty(3, 2, device=DEVS)
    assert e.device == DEVS and e.shape == (3, 2) and [p.shape for _, p in shards(e)] == [(3, 2), (3, 2)]


@pytest.mark.parametrize("make", ["zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like"])
def test_like_keeps_sharding(make):
    t = Tensor(rand(4, 6)).shard(DEVS, 1)
    out = getattr(t, make)(3.0) if make == "full_like" else getattr(t, make)()
    assert out.device == DEVS and out.shape == (4, 6) and out.dtype == dtypes.float32
    assert [p.shape for _, p in shards(out)] == [(4, 3), (4, 3)]
    if make in ("zeros_like", "ones_like", "full_like"):
        close(out, np.full((4, 6), {"zeros_like": 0, "ones_like": 1, "full_like": 3}[make], np.float32))
    if make == "rand_like":
        assert ((out.numpy() >= 0) & (out.numpy() < 1)).all()


def test_errors():
    x = Tensor(rand(5, 4))
    with pytest.raises(RuntimeError, match="5"):
        x.shard(DEVS, 0)
    s = x.shard(DEVS, 1)
    with pytest.raises(RuntimeError, match="already sharded"):
        s.shard(DEVS, 0)
    with pytest.raises(RuntimeError, match="CPU"):
        s + x
    with pytest.raises(RuntimeError):
        s + Tensor(rand(5, 4)).shard(DEVS3)
    with pytest.raises(RuntimeError, match="device"):
        s.full_like(1.0, device="CPU")
    with pytest.raises(IndexError):
        x.shard(DEVS, 2)


def test_python_device_tiny():
    x, w = rand(2, 3), rand(3, 2)
    devs = ("CPU", "PYTHON")
    xt, wt = Tensor(x).shard(devs, 0), Tensor(w).shard(devs)
    out = (xt @ wt).relu()
    assert out.device == devs
    close(out, np.maximum(x @ w, 0), atol=1e-5)
    assert [d for d, _ in shards(out)] == ["CPU", "PYTHON"]
    close(xt.sum(0), x.sum(0))
    (gx,) = (xt @ wt).sum().gradient(xt)
    close(gx, np.broadcast_to(w.sum(1), (2, 3)), atol=1e-5)


def test_copy_gradient_goes_back_to_the_source_device():
    # regression: the gradient of x.to(d) used to stay on d instead of returning to x's device
    x = Tensor(rand(3, 2))
    y = x.to("CPU:1")
    (gx,) = (y * y).sum().gradient(x)
    assert gx.uop.op is Ops.COPY and gx.uop.arg == "CPU"
    close(gx, 2 * x.numpy())


def test_shard_views_edge_shapes_and_dtypes():
    x = rand(4, 6)
    close(Tensor(x).T.shard(DEVS, 0), x.T)  # non-contiguous source
    close(Tensor(x)[::-1, ::2].shard(DEVS, 0) * 1, x[::-1, ::2])  # negative-step view
    z = Tensor.zeros(0, 4).shard(DEVS, 0)  # 0-size
    assert z.shape == (0, 4)
    close(z + 1, np.zeros((0, 4), np.float32))
    close(z.sum(0), np.zeros(4, np.float32))
    s = Tensor(3.5).shard(DEVS)  # 0-d, replicated
    assert s.device == DEVS and (s * 2).item() == 7.0
    h = Tensor(x, dtype=dtypes.float16).shard(DEVS, 1)
    assert (h * 2).sum(1).dtype == dtypes.float16
    np.testing.assert_allclose((h * 2).sum(1).numpy(), (x.astype(np.float16) * 2).sum(1), atol=1e-2, rtol=1e-3)
    b = Tensor(x > 0).shard(DEVS, 0)
    close(b.any(0), (x > 0).any(0))
    close(b.all(0), (x > 0).all(0))
    close(b & ~b, np.zeros((4, 6), bool))


def test_second_cpu_is_its_own_device():
    assert Device.canonicalize("cpu:1") == "CPU:1" and Device["CPU:1"] is not Device["CPU"]


def test_realize_sharded_and_single_device_roots_together():
    # regression: lowering the sink that groups the roots mixed a single-device root into the multi-device ones
    a, b = rand(6, 4), rand(6)
    x, y = Tensor(a).shard(DEVS, 0).to("CPU").shard(DEVS, 1), Tensor(b).to("CPU:1") * 2
    Tensor.realize(x, y)
    close(x, a)
    close(y, b * 2)
    assert multi_axis(x.uop) == 1 and y.device == "CPU:1"


def model_placed(placement):
    """name -> tensor of a small model; placement maps name -> (devices, axis) or a device string."""
    shapes = {"w1": (6, 4), "b1": (6,), "w2": (2, 6), "scale": ()}
    out = {}
    for k, shape in shapes.items():
        t = Tensor.zeros(shape).contiguous().realize()
        p = placement.get(k, "CPU")
        out[k] = t.shard(*p).realize() if isinstance(p, tuple) else t.to(p).realize()
    return out


STATE = {"w1": rand(6, 4), "b1": rand(6), "w2": rand(2, 6), "scale": rand(1)}
SHARDED_MODEL = {"w1": (DEVS, 0), "b1": (DEVS, None), "w2": (DEVS, 1), "scale": (DEVS, None)}


@pytest.mark.parametrize(
    "dict_placement",
    [
        {},  # a single-device state dict
        {"w1": (DEVS, 1), "b1": (DEVS, 0), "w2": (DEVS, 0)},  # sharded on other axes than the model
        {"w1": (DEVS, 0), "w2": (DEVS, 1), "b1": (DEVS3, 0)},  # sharded like the model / over other devices
        {"w1": "CPU:1", "b1": "CPU:2"},
    ],
)
@pytest.mark.parametrize("model_placement", [SHARDED_MODEL, {}, {"w1": "CPU:1", "w2": (DEVS3, 1)}])
def test_load_state_dict_across_placements(dict_placement, model_placement):
    from fusegrad.nn.state import load_state_dict

    def placed(k):
        t = Tensor(STATE[k])
        p = dict_placement.get(k, "CPU")
        return t.shard(*p) if isinstance(p, tuple) else t.to(p)

    state = {k: placed(k) for k in STATE}
    model = model_placed(model_placement)
    layout = {k: (v.device, multi_axis(v.uop)) for k, v in model.items()}
    load_state_dict(model, state, verbose=False)
    single = model_placed({})  # the same load into a single-device model is the reference
    load_state_dict(single, {k: Tensor(v) for k, v in STATE.items()}, verbose=False)
    for k, v in model.items():
        assert (v.device, multi_axis(v.uop)) == layout[k], k  # the model keeps its placement
        close(v, single[k].numpy())
        close(v, STATE[k].reshape(v.shape))
    before = {k: v.numpy() for k, v in state.items()}
    for v in model.values():  # the model never aliases the state dict
        v.assign(v + 1).realize()
    for k, v in state.items():
        np.testing.assert_array_equal(v.numpy(), before[k])


def test_load_state_dict_sharded_casts_and_refuses_bad_shapes():
    from fusegrad.nn.state import load_state_dict

    model = {"w": Tensor.zeros(4, 2, dtype=dtypes.float16).contiguous().shard(DEVS, 0).realize()}
    load_state_dict(model, {"w": Tensor(STATE["w1"][:4, :2]).shard(DEVS, 1)}, verbose=False)
    assert model["w"].dtype == dtypes.float16 and multi_axis(model["w"].uop) == 0
    close(model["w"], STATE["w1"][:4, :2].astype(np.float16), atol=1e-3)
    with pytest.raises(ValueError, match=r"w: model \(4, 2\), state dict \(2, 4\)"):
        load_state_dict(model, {"w": Tensor(rand(2, 4)).shard(DEVS, 0)}, verbose=False)
    close(model["w"], STATE["w1"][:4, :2].astype(np.float16), atol=1e-3)
