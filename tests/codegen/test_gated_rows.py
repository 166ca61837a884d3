"""Kernels without a reduce that read through a gate the same for a whole row (a concat's select) get their output
row in vectors on a target whose compiler vectorizes loops; a scalar gated load along the innermost loop (a padding
pass's) gets a 64-bit loop counter; the scalar float max has no branch; values equal numpy's and torch's, NaN
included."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Tensor
from fusegrad.codegen import lower_to_linear
from fusegrad.codegen.opt import Opt, OptOps
from fusegrad.renderer.c import CRenderer
from fusegrad.renderer.gpu import OpenCLRenderer
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops
from tests.rendering import rendered


def last_ast(t: Tensor):
    items, _, _ = create_schedule([t.uop], [Device["CPU"]])
    return items[-1].ast


def concat_relu(a: Tensor, b: Tensor) -> Tensor:
    return a.relu().cat(b.relu(), dim=1)


@pytest.mark.parametrize("c, size", [(64, 55), (32, 27), (16, 16), (8, 20)])
def test_concat_row_is_upcast_by_a_vector(avx512_target, c, size):
    a, b = Tensor.rand(1, c, size, size).realize(), Tensor.rand(1, c, size, size).realize()
    # a concat read by more math is one kernel selecting each row's piece (a concat alone is a kernel per piece)
    info = lower_to_linear(last_ast(concat_relu(a, b).sqrt()), avx512_target)
    # 16 float32 lanes of 64-byte vectors; a 55-wide row ends in a tile that overlaps the one before
    assert list(info.opts) == [Opt(OptOps.UPCAST, 3, 16)], info.opts
    assert "if (" in rendered(avx512_target, "k", info.lin), "one gate per vector load"
    piece = lower_to_linear(last_ast(concat_relu(a, b)), avx512_target)
    assert "if (" not in rendered(avx512_target, "k", piece.lin), "a piece's own kernel loads without gates"


def test_no_upcast_where_the_gate_moves_along_the_row(avx512_target):
    # a pad's columns: each lane would have a gate of its own
    x = Tensor.rand(1, 16, 55, 55).realize()
    assert not lower_to_linear(last_ast(x.relu().pad((1, 1, 1, 1))), avx512_target).opts


def test_no_upcast_without_a_gate_a_loop_vectorizer_or_a_vector_of_row():
    a, b = Tensor.rand(1, 8, 20, 20).realize(), Tensor.rand(1, 8, 20, 20).realize()
    avx512 = CRenderer(CRenderer.capabilities.replace(vector_bytes=64, vector_registers=32))
    assert not lower_to_linear(last_ast((a + b).relu()), avx512).opts, "ungated: the C compiler vectorizes it"
    assert not lower_to_linear(last_ast(concat_relu(a, b)), OpenCLRenderer()).opts, "a work item per output"
    narrow = Tensor.rand(1, 8, 3, 3).realize()
    assert not lower_to_linear(last_ast(concat_relu(narrow, narrow)), avx512).opts, "a row shorter than 4 lanes"


@pytest.mark.parametrize("size, amount", [(14, 8), (7, 4), (9, 8)])
def test_a_row_shorter_than_a_vector_takes_a_narrower_one(avx512_target, size, amount):
    # an Inception module's concat at 14x14, each branch's batch norm read per channel under the branch's gate
    a, b = Tensor.rand(1, 8, size, size).realize(), Tensor.rand(1, 4, size, size).realize()
    scale = Tensor.rand(1, 8, 1, 1).realize()
    info = lower_to_linear(last_ast((a * scale + 1).relu().cat(b.relu(), dim=1)), avx512_target)
    assert list(info.opts) == [Opt(OptOps.UPCAST, 3, amount)], info.opts


@pytest.mark.parametrize("c, size", [(5, 55), (3, 17), (4, 16), (2, 40), (6, 14), (3, 7), (2, 9)])
def test_concat_and_pad_values_equal_numpy(c, size):
    rng = np.random.default_rng(c * size)
    an, bn = (rng.standard_normal((1, c, size, size), dtype=np.float32) for _ in range(2))
    got = concat_relu(Tensor(an), Tensor(bn)).numpy()
    np.testing.assert_array_equal(got, np.concatenate([np.maximum(an, 0), np.maximum(bn, 0)], axis=1))
    sn = rng.standard_normal((1, c, 1, 1), dtype=np.float32)
    got = (Tensor(an) * Tensor(sn) + 1).relu().cat(Tensor(bn).relu(), Tensor(an), dim=1).numpy()
    want = np.concatenate([np.maximum(an * sn + 1, 0), np.maximum(bn, 0), an], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    padded = Tensor(an).relu().pad((1, 1, 1, 1)).numpy()
    np.testing.assert_array_equal(padded, np.pad(np.maximum(an, 0), ((0, 0), (0, 0), (1, 1), (1, 1))))


def test_float_max_renders_without_a_short_circuit():
    # `a>b||a!=a` became a branch per element in GCC's scalar code (a max pool's row tail): 4-8x slower than a select
    info = lower_to_linear(last_ast(Tensor.rand(1, 4, 23, 23).realize().max_pool2d((3, 3), stride=2)), CRenderer())
    src = rendered(CRenderer(), "k", info.lin)
    assert "?" in src and "||" not in src


@pytest.mark.parametrize("size, stride", [(111, 2), (55, 2), (13, 1), (20, 2)])
def test_max_pool_propagates_nan_like_torch(size, stride):
    rng = np.random.default_rng(size)
    xn = rng.standard_normal((1, 3, size, size), dtype=np.float32)
    # NaN in the row's vector part, in its scalar tail, on a window's first and last tap, and a whole window of them
    for y, x in [(0, 0), (4, 5), (size - 1, size - 1), (size // 2, size - 2)]:
        xn[0, 1, y, x] = np.nan
    xn[0, 2, :3, :3] = np.nan
    xn[0, 0, 1::4, ::3] = -np.inf
    got = Tensor(xn).max_pool2d((3, 3), stride=stride).numpy()
    ref = F.max_pool2d(torch.tensor(xn), 3, stride=stride).numpy()
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


def test_maximum_nan_either_side_and_ties():
    a = np.array([np.nan, 1.0, np.nan, -0.0, 2.0, -np.inf, np.inf, 3.0], np.float32)
    b = np.array([1.0, np.nan, np.nan, 0.0, 2.0, np.nan, -np.inf, -1.0], np.float32)
    got = Tensor(a).maximum(Tensor(b)).numpy()
    np.testing.assert_array_equal(got, np.maximum(a, b))


def pool_padding(x: Tensor, s: Tensor) -> Tensor:
    # a max pool's -inf padding pass (ceil mode) of a batch norm and ReLU: a gated load along the row
    return (x * s + s).relu().pad((0, 1, 0, 1), value=float("-inf"))


def test_a_gated_scalar_load_along_the_innermost_loop_gets_a_64_bit_counter():
    # GCC 12 vectorized the load as a gather with a 32-bit index of the loop, as a masked load with a 64-bit one
    x, s = Tensor.rand(1, 8, 40, 40).realize(), Tensor.rand(1, 8, 1, 1).realize()
    src = rendered(CRenderer(), "k", lower_to_linear(last_ast(pool_padding(x, s)), CRenderer()).lin)
    loops = [line.strip() for line in src.splitlines() if line.strip().startswith("for (")]
    assert loops[-1].startswith("for (long long"), loops
    assert all(not loop.startswith("for (long long") for loop in loops[:-1]), loops
    plain = lower_to_linear(last_ast((x * s + s).relu()), CRenderer())
    assert "long long gidx" not in rendered(CRenderer(), "k", plain.lin), "no gated load: 32-bit counters"


@pytest.mark.parametrize("c, size", [(3, 40), (2, 17), (4, 112)])
def test_pool_padding_and_pool_values_equal_torch(c, size):
    rng = np.random.default_rng(size)
    xn = rng.standard_normal((1, c, size, size), dtype=np.float32)
    sn = rng.standard_normal((1, c, 1, 1), dtype=np.float32)
    padded = pool_padding(Tensor(xn), Tensor(sn))
    want = np.pad(np.maximum(xn * sn + sn, 0), ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)
    np.testing.assert_allclose(padded.numpy(), want, rtol=1e-6, atol=1e-6)
    got = padded.max_pool2d((3, 3), stride=2).numpy()
    ref = F.max_pool2d(torch.tensor(want), 3, stride=2).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_a_gather_keeps_its_32_bit_counter():
    # an index read from data: GCC gathers either way, and BERT's mask kernel ran 2x slower with a 64-bit counter
    table = Tensor.rand(50).realize()
    idx = Tensor(np.random.default_rng(0).integers(0, 50, (6, 64), dtype=np.int32)).realize()
    info = lower_to_linear(last_ast(table[idx] * 2), CRenderer())
    assert any(u.op is Ops.LOAD and len(u.src) == 3 for u in info.lin), "a gated load read at a loaded index"
    assert "long long gidx" not in rendered(CRenderer(), "k", info.lin)
    np.testing.assert_allclose((table[idx] * 2).numpy(), table.numpy()[idx.numpy()] * 2, rtol=1e-6)
