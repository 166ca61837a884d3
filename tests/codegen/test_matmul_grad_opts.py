"""Opts of a matmul's gradient kernels (issues 9 and 10): the input gradient g @ W.T (both inputs contiguous along the
reduce) gets a tile of dot products vectorized along the reduce, a weight gradient stored transposed keeps its reduce
blocks, and a matmul that may be differentiated keeps the plain layout instead of panels. Values equal NOOPT=1 and
torch, forward and backward, on primes, 1 and sizes the tiles do not divide."""

import numpy as np
import pytest
import torch

import fusegrad.engine.realize as realize
from fusegrad import Context, Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptOps, blockable_sum
from fusegrad.codegen.lowerer import output_value
from fusegrad.renderer.c import CRenderer
from fusegrad.schedule import create_schedule
from fusegrad.runtime.device import Device
from fusegrad.uop.ops import Ops
from tests.rendering import rendered


SHAPES = [(1, 33, 7), (13, 40, 17), (37, 64, 5), (8, 97, 1), (31, 128, 33), (64, 256, 64)]


def asts_of(*ts: Tensor):
    items, _, _ = create_schedule([t.uop for t in ts], [Device["CPU"]])
    return [it.ast for it in items]


def dot_ast(m: int, k: int, n: int):
    """out[i, j] = sum_r a[i, r] * b[j, r]: both inputs contiguous along the reduce."""
    a, b = Tensor.rand(m, k).realize(), Tensor.rand(n, k).realize()
    return asts_of((a.reshape(m, 1, k) * b.reshape(1, n, k)).sum(-1))[-1]


def test_dot_products_get_a_tile_on_both_output_axes(avx512_target):
    opts = lower_to_linear(dot_ast(64, 256, 64), avx512_target).opts
    ups = {o.axis: o.amount for o in opts if o.op is OptOps.UPCAST}
    assert set(ups) == {0, 1} and all(a >= 2 for a in ups.values())


def test_dot_tile_is_vectorized_along_the_reduce_over_every_accumulator(avx512_target):
    info = lower_to_linear(dot_ast(16, 256, 16), avx512_target)
    src = rendered(avx512_target, "k", info.lin)
    pragma = next(line for line in src.splitlines() if "omp simd reduction" in line)
    ups = [o.amount for o in info.opts if o.op is OptOps.UPCAST]
    assert pragma.count("acc") == ups[0] * ups[1]


def test_an_avx2_register_budget_tiles_dot_products_on_one_axis():
    # 16 registers: two rows of vector accumulators would leave none for the loaded vectors
    avx2 = CRenderer(CRenderer.capabilities.replace(vector_bytes=32, vector_registers=16))
    assert lower_to_linear(dot_ast(64, 256, 64), avx2).opts == (Opt(OptOps.UPCAST, 0, 4),)


def test_short_dot_products_and_one_sided_reduces_get_no_dot_tile():
    # a reduce shorter than two vectors keeps its plain loop
    assert not [o for o in lower_to_linear(dot_ast(64, 8, 64), Device["CPU"].renderer).opts if o.op is OptOps.UPCAST]


def test_weight_gradient_stored_transposed_is_a_blockable_sum(avx512_target):
    x, g = Tensor.rand(512, 64).realize(), Tensor.rand(512, 48).realize()
    w = Tensor.rand(64, 48).realize()
    x.requires_grad = w.requires_grad = True
    (x @ w).backward(g)
    ast = asts_of(w.grad)[-1]
    assert blockable_sum(output_value(ast)) is not None
    assert any(o.op is OptOps.REDUCE_BLOCK for o in lower_to_linear(ast, avx512_target).opts)


def forward_backward(xn, wn, gn, transposed, device="CPU"):
    x, w, g = (Tensor(a, device=device) for a in (xn, wn, gn))
    x.requires_grad = w.requires_grad = True
    out = x @ (w.T if transposed else w)
    out.backward(g)
    return [t.numpy() for t in (out, x.grad, w.grad)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_forward_backward_equal_noopt_and_torch(m, k, n, transposed):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    xn = rng.standard_normal((m, k), dtype=np.float32)
    wn = rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32)
    gn = rng.standard_normal((m, n), dtype=np.float32)
    realize._runners.clear()
    got = forward_backward(xn, wn, gn, transposed)
    with Context(NOOPT=1):
        realize._runners.clear()
        plain = forward_backward(xn, wn, gn, transposed)
    realize._runners.clear()
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    out = xt @ (wt.T if transposed else wt)
    out.backward(torch.tensor(gn))
    for a, b, t in zip(got, plain, (out, xt.grad, wt.grad)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a, t.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_a_differentiated_matmul_packs_its_forward_only():
    """The panel layout is the scheduler's choice on the graph it is given: the forward's matmul reads its weight in
    panels, and the gradients, built on the plain matmul, keep the layouts their own tiles serve."""
    x, w = Tensor.rand(1024, 1024).realize(), Tensor.rand(1024, 1024, requires_grad=True).realize()
    with Context(TRAINING=1):
        out = x @ w
        assert len([i for i in out.schedule_linear() if i.ast.op is Ops.SINK]) == 2  # the copy, the product
        out.sum().backward()
        assert len([i for i in w.grad.schedule_linear() if i.ast.op is Ops.SINK]) == 1
