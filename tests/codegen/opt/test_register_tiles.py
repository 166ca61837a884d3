"""The register tile a matmul and a 1x1 conv get for one register budget: enough accumulators to keep two FMA pipes
busy past the FMA's latency (LATENCY_ACCUMULATORS) where the registers allow it, and values equal to numpy."""

import numpy as np
import pytest
import torch

import fusegrad.engine.realize as realize
from fusegrad import Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import OptOps
from fusegrad.codegen.opt.heuristic import COLUMN_MAX_LANES, LATENCY_ACCUMULATORS
from fusegrad.renderer.c import CRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops

AVX2 = dict(vector_bytes=32, vector_registers=16)
AVX512 = dict(vector_bytes=64, vector_registers=32)


@pytest.fixture(params=[AVX2, AVX512], ids=["avx2", "avx512"])
def target(request, monkeypatch):
    """The CPU device's renderer for one register budget (so the panel layout plans for it too)."""
    renderer = CRenderer(CRenderer.capabilities.replace(**request.param))
    monkeypatch.setattr(Device["CPU"], "renderer", renderer)
    realize._runners.clear()
    yield renderer
    realize._runners.clear()


def upcasts(t: Tensor, renderer: CRenderer) -> dict[int, int]:
    """The upcasts of t's reduce kernel (a conv's output copy comes after it)."""
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    ast = next(it.ast for it in items if any(u.op is Ops.REDUCE_AXIS for u in it.ast.toposort()))
    return {o.axis: o.amount for o in lower_to_linear(ast, renderer).opts if o.op is OptOps.UPCAST}


def test_a_matmul_tile_on_16_registers_has_enough_accumulators(target):
    a, b = Tensor.rand(192, 192).realize(), Tensor.rand(192, 192).realize()
    ups = upcasts(a @ b, target)
    vectors = max(ups[1] // target.capabilities.lanes(a.dtype), 1)
    if target.capabilities.vector_registers == 16:  # 4 rows of two vectors were 8 accumulators, 1.5x slower
        assert ups[0] * vectors >= LATENCY_ACCUMULATORS, ups
    else:  # 32 registers: the 8-row tiles measured there
        assert ups[0] == 8, ups
    np.testing.assert_allclose((a @ b).numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-4)


def test_a_wide_1x1_conv_takes_two_vectors_only_on_16_registers(target):
    x, w = Tensor.rand(1, 96, 13, 13).realize(), Tensor.rand(120, 96, 1, 1).realize()
    out = x.conv2d(w)
    lanes = target.capabilities.lanes(x.dtype)
    column_vectors = max(v for v in upcasts(out, target).values()) // lanes
    assert column_vectors == (2 if target.capabilities.vector_registers == 16 else 1)
    want = np.einsum("oc,chw->ohw", w.numpy()[:, :, 0, 0], x.numpy()[0])[None]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-4)


def test_a_long_reduce_on_16_registers_takes_a_free_tile_over_blocks_of_few_accumulators(target):
    # the reduce blocks (partial sums added in memory) take only tiles that divide the output: 128 rows give 4 x 2
    # vectors on 16 registers, where a tile free to overlap has 6 x 2 (55 -> 78 GFLOPS, one thread)
    a, b = Tensor.rand(128, 784).realize(), Tensor.rand(784, 128).realize()
    items, _, _ = create_schedule([(a @ b).uop], [Device["CPU"]])
    opts = lower_to_linear(items[-1].ast, target).opts
    blocked = any(o.op is OptOps.REDUCE_BLOCK for o in opts)
    assert blocked == (target.capabilities.vector_registers == 32), opts
    np.testing.assert_allclose((a @ b).numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-3)


def test_a_matvec_over_an_in_out_weight_keeps_enough_column_accumulators(target):
    # one input row broadcast against rows of the weight: each vector of columns is one FMA chain, so 16 lanes were
    # two chains on AVX2 (an F32 LLaMA decode's gate and up matvecs 1.7x slower)
    x, w = Tensor.rand(1, 768).realize(), Tensor.rand(768, 2048).realize()
    ups = upcasts(x @ w, target)
    assert max(ups.values()) == COLUMN_MAX_LANES, ups  # 8 vectors on AVX2, 4 on AVX-512
    np.testing.assert_allclose((x @ w).numpy(), x.numpy() @ w.numpy(), rtol=1e-4, atol=1e-3)


def test_a_conv_of_few_output_channels_on_16_registers_overlaps_rows_for_enough_accumulators(target):
    # DenseNet's 3x3 convs of 32 output channels: 4 rows of two vectors divide the rows but are 8 accumulators (46
    # GFLOPS, one thread); 6 rows, the last tile overlapping, are 12 (78)
    x, w = Tensor.rand(1, 32, 9, 9).realize(), Tensor.rand(32, 32, 3, 3).realize()
    out = x.conv2d(w, padding=1)
    ups = upcasts(out, target)
    vectors = max(max(ups.values()) // target.capabilities.lanes(x.dtype), 1)
    assert min(ups.values()) * vectors >= LATENCY_ACCUMULATORS, ups
    want = torch.nn.functional.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()), padding=1).numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
