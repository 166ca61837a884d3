"""Convolution kernels (issue 9, item 8): forward, input-gradient and weight-gradient kernels index without per-element
division or modulo in their innermost loop (any stride, padding, dilation, groups), and their values (forward and
backward, every stride/padding/dilation/groups variant) equal torch's."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.renderer.cstyle import CStyleRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import GroupOp, Ops
from fusegrad.dtype import dtypes
import fusegrad.tensor_ops.conv as conv_ops
from fusegrad.helpers import prod

CASES = [  # input shape, weight shape, conv2d kwargs
    ((2, 4, 9, 9), (8, 4, 3, 3), {"padding": 1}),
    ((2, 3, 11, 10), (4, 3, 3, 2), {"dilation": 2}),
    ((1, 4, 8, 7), (6, 2, 3, 3), {"groups": 2, "padding": (2, 1), "dilation": (1, 2)}),
    ((2, 3, 13), (5, 3, 4), {"padding": 2}),
    ((1, 2, 5, 6, 5), (3, 2, 2, 3, 2), {"padding": (1, 0, 1)}),
]
STRIDED = [
    ((2, 4, 9, 9), (8, 4, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 4, 7, 8), (6, 2, 3, 2), {"groups": 2, "stride": (2, 1), "dilation": (1, 2), "padding": (1, 2)}),
    ((1, 3, 10, 9), (2, 3, 2, 3), {"stride": 3}),
    ((1, 2, 8, 8), (2, 2, 1, 1), {"stride": 2, "padding": 1}),
    ((1, 2, 11, 12), (3, 2, 3, 3), {"stride": 2, "dilation": 2, "padding": 2}),
    ((2, 3, 17), (4, 3, 5), {"stride": 3, "dilation": 2, "padding": 3}),
    ((1, 2, 10, 13), (3, 2, 3, 2), {"stride": (4, 3), "dilation": (1, 3), "padding": (0, 2)}),
    ((1, 2, 7, 6, 5), (2, 2, 2, 3, 2), {"stride": (2, 3, 1), "padding": (1, 0, 1)}),
]


def conv_graphs(xs, ws, kw, seed=0):
    rng = np.random.default_rng(seed)
    xn, wn = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True).realize(), Tensor(wn, requires_grad=True).realize()
    out = x.conv2d(w, **kw)
    gn = rng.standard_normal(out.shape, dtype=np.float32)
    out.backward(Tensor(gn))
    return (xn, wn, gn), (out, x.grad, w.grad)


def innermost_loop_bodies(lin):
    """The instructions inside each loop that contains no other loop."""
    bodies, stack = [], []
    for u in lin:
        if u.op is Ops.RANGE:
            stack.append([u, [], False])
            if len(stack) > 1:
                stack[-2][2] = True
        elif u.op is Ops.ENDRANGE:
            r, body, has_inner = stack.pop()
            if not has_inner:
                bodies.append(body)
        elif stack:
            stack[-1][1].append(u)
    return bodies


def innermost_c_loops(src: str) -> list[str]:
    """The text of each `for` loop in src that contains no other `for`."""
    loops, lines = [], src.splitlines()
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("for ("):
            continue
        depth, body = 0, []
        for other in lines[i:]:
            depth += other.count("{") - other.count("}")
            body.append(other)
            if depth == 0:
                break
        if sum(1 for b in body if b.lstrip().startswith("for (")) == 1:
            loops.append("\n".join(body[1:]))
    return loops


@pytest.mark.parametrize("xs,ws,kw", CASES + STRIDED)
def test_conv_kernels_have_no_division_in_the_innermost_loop(xs, ws, kw, layout):
    _, tensors = conv_graphs(xs, ws, kw)
    items, _, _ = create_schedule([t.uop for t in tensors], [Device["CPU"]] * len(tensors))
    reducing = 0
    for item in items:
        # the conv kernels reduce; copies (the padded input, the channels-last gradient, the weight gradient back in
        # the weight's order, which divides by the channels per group when groups > 1) do not
        if item.ast.op is not Ops.SINK or not lower_to_linear(item.ast, Device["CPU"].renderer).name.startswith("r_"):
            continue
        for noopt in (1, 0):
            with Context(NOOPT=noopt):
                info = lower_to_linear(item.ast, Device["CPU"].renderer)
            for body in innermost_loop_bodies(info.lin):
                assert not [u.op for u in body if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides in its loop"
            src = CStyleRenderer().render(info.name, info.lin)
            for loop in innermost_c_loops(src.split(f"void {info.name}(")[1]):
                assert "/" not in loop and "%" not in loop, f"{info.name}:\n{loop}"
        reducing += info.name.startswith("r_")
    assert reducing >= 3  # forward, input gradient, weight gradient


@pytest.mark.parametrize("xs,ws,kw", [c for c in STRIDED if c[2].get("groups", 1) == 1])
def test_strided_conv_input_gradient_kernels_never_divide(xs, ws, kw, layout):
    """The stride > 1 input gradient is stride-1 sub-convolutions per phase, their sub-kernels and one interleave:
    none of its kernels, copies included, reads a zero-stuffed gradient (a division by the stride per element)."""
    _, (_, dx, _) = conv_graphs(xs, ws, kw)
    items, _, _ = create_schedule([dx.uop], [Device["CPU"]])
    kernels = [item for item in items if item.ast.op is Ops.SINK]
    for item in kernels:
        info = lower_to_linear(item.ast, Device["CPU"].renderer)
        assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    assert any(
        lower_to_linear(item.ast, Device["CPU"].renderer).name.startswith("r_") for item in kernels
    )  # the phases' convs


@pytest.fixture(params=["fused", "stored", "stored, whole batch"])
def layout(request, monkeypatch):
    """fused: every conv here is small enough to read its padding in place; stored: the padded input, the padded
    output gradient and the channels-last gradient of large convs are stored first, here for every size (the weight
    gradient summed per sample first, or, past its size limit, over the whole batch at once)."""
    if request.param != "fused":
        monkeypatch.setattr(conv_ops, "CONV_PAD_REALIZE_SIZE", 0)
        monkeypatch.setattr(conv_ops, "CONV_WEIGHT_GRAD_MATMUL_SIZE", 0)
    if request.param == "stored, whole batch":
        monkeypatch.setattr(conv_ops, "CONV_PER_SAMPLE_LIMIT", 0)
    return request.param


@pytest.mark.parametrize("xs,ws,kw", CASES + STRIDED)
def test_conv_forward_and_backward_equal_torch(xs, ws, kw, layout):
    (xn, wn, gn), (out, dx, dw) = conv_graphs(xs, ws, kw, seed=1)
    tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(ws)]
    ref = conv(tx, tw, **kw)
    ref.backward(torch.tensor(gn))
    for ours, theirs in ((out, ref), (dx, tx.grad), (dw, tw.grad)):
        assert ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), atol=1e-4, rtol=1e-4)


def test_conv_second_order_gradient_equals_torch():
    rng = np.random.default_rng(2)
    xn, wn = rng.standard_normal((1, 2, 6, 6), dtype=np.float32), rng.standard_normal((3, 2, 3, 3), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    (gx,) = (x.conv2d(w, padding=1) ** 2).sum().gradient(x)
    (gx.sum()).backward()
    tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    (tgx,) = torch.autograd.grad((F.conv2d(tx, tw, padding=1) ** 2).sum(), tx, create_graph=True)
    tgx.sum().backward()
    np.testing.assert_allclose(gx.numpy(), tgx.detach().numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), atol=1e-3, rtol=1e-4)


def test_gradient_of_a_tensor_inside_the_conv_uses_the_plain_rules():
    """A target strictly between the conv's output and its inputs (here the padded input, held by the caller) still
    gets its gradient."""
    rng = np.random.default_rng(3)
    xn, wn = rng.standard_normal((1, 2, 5, 5), dtype=np.float32), rng.standard_normal((2, 2, 3, 3), dtype=np.float32)
    x, w = Tensor(xn), Tensor(wn)
    padded = x.pad(((0, 0), (0, 0), (1, 1), (1, 1)))
    out = padded.conv2d(w)
    (gp,) = out.sum().gradient(padded)
    tp = torch.tensor(np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1))), requires_grad=True)
    F.conv2d(tp, torch.tensor(wn)).sum().backward()
    np.testing.assert_allclose(gp.numpy(), tp.grad.numpy(), atol=1e-5)


CONV_T_STRIDED = [  # input shape, weight shape, conv_transpose2d kwargs
    ((2, 4, 4, 5), (4, 3, 3, 2), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((1, 4, 3, 4), (4, 2, 3, 3), {"groups": 2, "stride": (3, 2), "dilation": (2, 2), "padding": (1, 0)}),
    ((1, 2, 5), (2, 3, 4), {"stride": 3, "padding": 2, "output_padding": 2}),
    ((1, 3, 2, 3, 2), (3, 2, 2, 1, 3), {"stride": (2, 3, 2), "padding": (0, 0, 1), "output_padding": (1, 0, 0)}),
]


@pytest.mark.parametrize("xs,ws,kw", CONV_T_STRIDED)
def test_strided_conv_transpose_equals_torch_and_never_divides(xs, ws, kw):
    """A strided transposed convolution is the input gradient of a conv: the same phase sub-convolutions, values (and
    gradients of input, weight and bias) equal to torch's, and no kernel of its forward divides."""
    rng = np.random.default_rng(4)
    xn, wn = rng.standard_normal(xs, dtype=np.float32), rng.standard_normal(ws, dtype=np.float32)
    bn = rng.standard_normal(ws[1] * kw.get("groups", 1), dtype=np.float32)
    x, w, b = (Tensor(a, requires_grad=True).realize() for a in (xn, wn, bn))
    out = x.conv_transpose2d(w, b, **kw)
    if kw.get("groups", 1) == 1:  # a grouped kernel's channel swap divides by the channels per group (a copy)
        items, _, _ = create_schedule([out.uop], [Device["CPU"]])
        for item in (i for i in items if i.ast.op is Ops.SINK):
            info = lower_to_linear(item.ast, Device["CPU"].renderer)
            assert not [u.op for u in info.lin if u.op in (Ops.IDIV, Ops.MOD)], f"{info.name} divides"
    gn = rng.standard_normal(out.shape, dtype=np.float32)
    out.backward(Tensor(gn))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xn, wn, bn))
    ref = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}[len(ws)](tx, tw, tb, **kw)
    ref.backward(torch.tensor(gn))
    for ours, theirs in ((out, ref), (x.grad, tx.grad), (w.grad, tw.grad), (b.grad, tb.grad)):
        assert ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), atol=1e-4, rtol=1e-4)


def test_strided_conv_transpose_with_no_output_raises():
    x, w = Tensor.empty(1, 2, 1, 1), Tensor.empty(2, 2, 1, 1)
    with pytest.raises(RuntimeError, match=r"output size \(-1, -1\)"):
        x.conv_transpose2d(w, stride=2, padding=1)


def small_convnet(xn, w1n, w2n, b2n):
    """conv -> relu -> conv + bias -> relu -> max pool 2, the digits convnet's shape of graph."""
    x, w1, w2, b2 = (Tensor(v, requires_grad=True) for v in (xn, w1n, w2n, b2n))
    h = x.conv2d(w1, padding=1).relu().conv2d(w2, b2, padding=1).relu().max_pool2d(2)
    return (x, w1, w2, b2), h


@pytest.mark.parametrize("shape", [(3, 2, 6, 6), (1, 1, 5, 7), (2, 3, 4, 4)])
def test_small_convnet_forward_and_backward_equal_torch(shape, layout):
    rng = np.random.default_rng(4)
    cin = shape[1]
    xn = rng.standard_normal(shape, dtype=np.float32)
    w1n = rng.standard_normal((5, cin, 3, 3), dtype=np.float32)
    w2n = rng.standard_normal((7, 5, 3, 3), dtype=np.float32)
    b2n = rng.standard_normal(7, dtype=np.float32)
    ours, h = small_convnet(xn, w1n, w2n, b2n)
    gn = rng.standard_normal(h.shape, dtype=np.float32)
    h.backward(Tensor(gn))
    theirs = [torch.tensor(v, requires_grad=True) for v in (xn, w1n, w2n, b2n)]
    tx, tw1, tw2, tb2 = theirs
    th = F.max_pool2d(F.relu(F.conv2d(F.relu(F.conv2d(tx, tw1, padding=1)), tw2, tb2, padding=1)), 2)
    th.backward(torch.tensor(gn))
    np.testing.assert_allclose(h.numpy(), th.detach().numpy(), atol=1e-4, rtol=1e-4)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=2e-4, rtol=1e-4)


def test_padded_input_of_a_small_conv_is_stored_so_its_tile_loads_are_ungated():
    """A one-channel 8x8 input padded by 1 (the digits convnet's first conv): stored padded, the conv kernel's loads
    need no bounds checks (a check per lane keeps a register tile's loads from being vectors)."""
    x, w = Tensor.empty(64, 1, 8, 8), Tensor.empty(16, 1, 3, 3)
    items, _, _ = create_schedule([x.conv2d(w, padding=1).uop], [Device["CPU"]])
    conv = [
        lower_to_linear(item.ast, Device["CPU"].renderer)
        for item in items
        if any(u.op is Ops.REDUCE_AXIS for u in item.ast.toposort())
    ]
    assert len(conv) == 1 and len(items) == 2
    loads = [u for u in conv[0].lin if u.op is Ops.LOAD]
    assert loads and all(len(u.src) == 2 for u in loads)


def test_computed_conv_input_is_stored_before_the_padding_copy():
    """A ReLU of the first conv feeding the second: the ReLU is stored in a pass of its own (which vectorizes) and the
    stored padded copy only moves values (its bounds check per element made computing the ReLU there twice as slow)."""
    x, w1, w2 = Tensor.empty(64, 2, 8, 8), Tensor.empty(4, 2, 3, 3), Tensor.empty(6, 4, 3, 3)
    h = x.conv2d(w1, padding=1).relu().conv2d(w2, padding=1)
    items, _, _ = create_schedule([h.uop], [Device["CPU"]])
    padded = [item for item in items if item.buffers[0].size == 64 * 4 * 10 * 10]
    assert len(padded) == 1
    float_alu = [u for u in padded[0].ast.toposort() if u.op in GroupOp.ALU and u.dtype == dtypes.float32]
    assert float_alu == []


def test_conv_of_a_stored_computed_input_reads_it_in_place():
    """A conv whose padded input is a stored value computed from data (a ReLU's output, padded and stored) reads its
    windows from that buffer: the broadcast of the windows is not costed as recomputing the ReLU, so no 3x3 = 9 times
    larger copy of the windows (an im2col buffer) is made, in the forward or the input gradient (the explicit
    columns layout of small convs, `_window_columns`, turned off)."""
    rng = np.random.default_rng(5)
    xn = rng.standard_normal((4, 3, 16, 16), dtype=np.float32)
    w1n, w2n = rng.standard_normal((8, 3, 3, 3), dtype=np.float32), rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_ops, "WINDOW_COLUMNS_MAX_POSITIONS", 0)
        mp.setattr(conv_ops, "CONV_PAD_REALIZE_SIZE", 0)
        mp.setattr(conv_ops, "CONV_WEIGHT_GRAD_MATMUL_SIZE", 0)
        ours, h = small_convnet(xn, w1n, w2n, np.zeros(8, np.float32))
        h.sum().backward()
        tensors = [h] + [t.grad for t in ours]
        items, _, _ = create_schedule([t.uop for t in tensors], [Device["CPU"]] * len(tensors))
    window_copy = 4 * 8 * 16 * 16 * 9
    sizes = [item.buffers[0].size for item in items]
    assert window_copy not in sizes, sizes


def test_computed_output_gradient_is_stored_once():
    """The output gradient of the second conv (a ReLU's and a max pool's backward) is computed in one kernel that the
    input-gradient and weight-gradient kernels read, not again in each (through the pool's window index arithmetic);
    the pool's backward neither divides the gradient among tied taps nor indexes by division."""
    rng = np.random.default_rng(6)
    xn = rng.standard_normal((2, 2, 8, 8), dtype=np.float32)
    w1n, w2n = rng.standard_normal((4, 2, 3, 3), dtype=np.float32), rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    ours, h = small_convnet(xn, w1n, w2n, np.zeros(6, np.float32))
    h.sum().backward()
    tensors = [t.grad for t in ours]
    items, _, _ = create_schedule([t.uop for t in tensors], [Device["CPU"]] * len(tensors))
    kernels = [lower_to_linear(item.ast, Device["CPU"].renderer) for item in items if item.ast.op is Ops.SINK]
    dividing = [k.name for k in kernels if any(u.op in (Ops.FDIV, Ops.IDIV, Ops.MOD) for u in k.lin)]
    assert dividing == []
    # the gradient's reduces (input, weight, bias) read it from buffers the elementwise kernels stored: all one buffer
    size = prod((2, 6, 8, 8))
    stored = {
        item.buffers[0]
        for item in items
        if item.buffers[0].size == size and not any(u.op is Ops.REDUCE_AXIS for u in item.ast.toposort())
    }
    reduces = [item for item in items if any(u.op is Ops.REDUCE_AXIS for u in item.ast.toposort())]
    read = [{b for b in item.buffers[1:] if b in stored} for item in reduces]
    assert len(set().union(*read)) == 1 and sum(1 for r in read if r) >= 3, read


def test_biased_conv_gradients_and_second_order_equal_torch():
    """The bias added inside the conv (its gradient summed from the stored output gradient): first and second order
    gradients of input, weight and bias equal torch's; a bias of another dtype takes the plain add."""
    rng = np.random.default_rng(7)
    xn, wn = rng.standard_normal((2, 3, 5, 6), dtype=np.float32), rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    bn = rng.standard_normal(4, dtype=np.float32)
    x, w, b = (Tensor(v, requires_grad=True) for v in (xn, wn, bn))
    (gx,) = (x.conv2d(w, b, padding=1).relu() ** 2).sum().gradient(x)
    (gx * gx).sum().backward()
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (xn, wn, bn))
    (tgx,) = torch.autograd.grad((F.relu(F.conv2d(tx, tw, tb, padding=1)) ** 2).sum(), tx, create_graph=True)
    (tgx * tgx).sum().backward()
    np.testing.assert_allclose(gx.numpy(), tgx.detach().numpy(), atol=1e-4, rtol=1e-4)
    for ours, theirs in ((w, tw), (b, tb)):
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-2, rtol=1e-4)
    x64 = Tensor(xn.astype(np.float64), requires_grad=True)
    b16 = Tensor(bn.astype(np.float16), requires_grad=True)
    x64.conv2d(Tensor(wn.astype(np.float64)), b16, padding=1).sum().backward()
    np.testing.assert_allclose(b16.grad.numpy(), np.full(4, 2 * 5 * 6, np.float16))
