"""Rows loaded through an integer index (nn.Embedding, t[idx]): values and gradients against torch, and a kernel that
reads only the picked rows (no reduce over the table)."""

import numpy as np
import pytest
import torch

from fusegrad import Device, Tensor, dtypes, nn
from fusegrad.schedule import create_schedule
from fusegrad.tensor_ops.indexing import gather_rows
from fusegrad.uop.ops import Ops


@pytest.mark.parametrize("device", [None, "PYTHON"])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_embedding_values_and_grad_match_torch(device, idx_dtype):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((11, 5)).astype(np.float32)
    idx = np.array([[3, 0, 3, 10], [7, 3, 1, 0]], idx_dtype)  # repeated rows accumulate in the gradient
    g = rng.standard_normal((2, 4, 5)).astype(np.float32)
    emb = nn.Embedding(11, 5)
    emb.weight = Tensor(w, requires_grad=True, device=device)
    out = emb(Tensor(idx, device=device))
    (out * Tensor(g, device=device)).sum().backward()
    ref_w = torch.tensor(w, requires_grad=True)
    ref = torch.nn.functional.embedding(torch.tensor(idx.astype(np.int64)), ref_w)
    (ref * torch.tensor(g)).sum().backward()
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    np.testing.assert_allclose(emb.weight.grad.numpy(), ref_w.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_gather_kernel_reads_rows_not_the_whole_table():
    """A one-hot lookup would reduce over all 30000 rows per output element; the gather kernel holds no reduce."""
    table = Tensor(np.random.default_rng(0).standard_normal((30000, 64)).astype(np.float32)).realize()
    ids = Tensor(np.array([5, 29999, 0, 17], np.int32)).realize()
    out = gather_rows(table, ids)
    items, _, _ = create_schedule([out.uop], [Device[Device.DEFAULT]])
    assert len(items) == 1
    ops = {u.op for u in items[0].ast.toposort()}
    assert Ops.GATHER in ops and Ops.REDUCE_AXIS not in ops
    np.testing.assert_array_equal(out.numpy(), table.numpy()[[5, 29999, 0, 17]])


def test_gather_of_computed_table_and_index():
    """The table a matmul (a reduce: realized before the gather reads it) plus a bias, the index an argmax."""
    rng = np.random.default_rng(1)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((9, 6), (6, 3), (3,)))
    scores = rng.standard_normal((4, 9)).astype(np.float32)
    out = gather_rows(Tensor(a) @ Tensor(b) + Tensor(bias), Tensor(scores).argmax(1))
    np.testing.assert_allclose(out.numpy(), (a @ b + bias)[scores.argmax(1)], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [(dtypes.bool, np.bool_), (dtypes.int32, np.int32), (dtypes.float16, np.float16)])
def test_getitem_rows_of_other_dtypes_and_out_of_range_reads_zero(dtype):
    x = np.arange(24).reshape(6, 4) % 3
    t = Tensor(x).cast(dtype[0])
    np.testing.assert_array_equal(t[Tensor([5, -1, 0, 2])].numpy(), x[[5, -1, 0, 2]].astype(dtype[1]))
    np.testing.assert_array_equal(gather_rows(t, Tensor([1, 6, -1])).numpy()[1:], np.zeros((2, 4), dtype[1]))


def test_gather_rows_needs_integer_indices():
    with pytest.raises(TypeError, match="integer indices, got dtypes.float32"):
        gather_rows(Tensor.ones(3, 2), Tensor([0.0, 1.0]))
