"""Blocked (flash) scaled_dot_product_attention against torch in float64: forward and the gradients of q, k and v,
with one block and with many (small block sizes force the realized-per-block path), and its memory bound."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import GlobalCounters, Tensor, dtypes
from fusegrad.runtime.device import Buffer
import fusegrad.tensor_ops.attention as attention

# float32 against a float64 reference: the errors seen are ~1e-7, well inside
ATOL = 1e-5


def arrays(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.fixture
def small_blocks(monkeypatch):
    """Every problem in realized row blocks of 4 rows."""
    monkeypatch.setattr(attention, "FLASH_SCORE_BYTES", 0)
    monkeypatch.setattr(attention, "FLASH_BLOCK_BYTES", 1)
    monkeypatch.setattr(attention, "FLASH_MIN_BLOCK_ROWS", 4)


def check(q, k, v, mask=None, dtype=dtypes.float32, atol=ATOL, **kw):
    """Output and q/k/v gradients (from a random output gradient) against torch float64 on the same values."""
    grad_out = arrays([q.shape[:-1] + (v.shape[-1],)], seed=9)[0]
    fg = [Tensor(a).cast(dtype) for a in (q, k, v)]
    for t in fg:
        t.requires_grad = True
    fg_mask = None if mask is None else Tensor(mask)
    out = fg[0].scaled_dot_product_attention(fg[1], fg[2], attn_mask=fg_mask, **kw)
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    grads = out.gradient(*fg, gradient=Tensor(grad_out).cast(dtype))
    # the reference sees the inputs as rounded to dtype
    th = [torch.tensor(t.cast(dtypes.float32).numpy(), dtype=torch.float64, requires_grad=True) for t in fg]
    th_mask = None if mask is None else torch.tensor(mask if mask.dtype == bool else mask.astype(np.float64))
    ref = F.scaled_dot_product_attention(*th, attn_mask=th_mask, **kw)
    ref.backward(torch.tensor(grad_out, dtype=torch.float64))
    np.testing.assert_allclose(out.cast(dtypes.float32).numpy(), ref.detach().numpy(), atol=atol, rtol=atol)
    for name, g, t in zip("qkv", grads, th):
        assert g.dtype == dtype and g.shape == tuple(t.shape)
        np.testing.assert_allclose(g.cast(dtypes.float32).numpy(), t.grad.numpy(), atol=atol, rtol=atol, err_msg=name)


CASES = [  # (q shape, kv length, kv heads, value dim, kwargs)
    ((2, 3, 7, 32), 7, 3, 32, {}),
    ((2, 3, 7, 32), 7, 3, 32, {"is_causal": True}),
    ((1, 2, 1, 64), 129, 2, 64, {}),  # decode: one query against a cache
    ((1, 2, 1, 64), 129, 2, 64, {"is_causal": True}),
    ((1, 2, 129, 80), 129, 2, 80, {"is_causal": True}),
    ((1, 2, 33, 128), 70, 2, 48, {}),
    ((1, 2, 70, 64), 33, 2, 64, {"is_causal": True}),  # more queries than keys
    ((1, 4, 29, 32), 29, 2, 32, {"is_causal": True, "enable_gqa": True}),
    ((2, 6, 9, 32), 17, 2, 16, {"enable_gqa": True}),
    ((17, 32), 23, None, 32, {}),  # no batch or head dims
]


def _case_arrays(qs, kv_len, kv_heads, vd):
    lead = qs[:-3] + (kv_heads,) if kv_heads is not None else qs[:-2]
    return arrays([qs, lead + (kv_len, qs[-1]), lead + (kv_len, vd)])


@pytest.mark.parametrize("qs,kv_len,kv_heads,vd,kw", CASES)
def test_sdpa_against_torch(qs, kv_len, kv_heads, vd, kw):
    check(*_case_arrays(qs, kv_len, kv_heads, vd), **kw)


# the realized-block path compiles kernels per block shape: the short cases; the GQA ones with the slow tests (CI), GQA
# itself runs fast above
@pytest.mark.parametrize(
    "qs,kv_len,kv_heads,vd,kw",
    [pytest.param(*c, marks=pytest.mark.slow) if c[4].get("enable_gqa") else c for c in CASES if c[0][-2] <= 29],
)
def test_sdpa_in_realized_blocks_against_torch(qs, kv_len, kv_heads, vd, kw, small_blocks):
    check(*_case_arrays(qs, kv_len, kv_heads, vd), **kw)


MASK_KINDS = ["bool", "float", "bool per head", "float gqa"]


# in many blocks: the per-head masks fast, the shared ones with the slow tests (CI)
@pytest.mark.parametrize(
    "kind,blocks",
    [(k, "one") for k in MASK_KINDS]
    + [(k, "many") if k in MASK_KINDS[2:] else pytest.param(k, "many", marks=pytest.mark.slow) for k in MASK_KINDS],
)
def test_sdpa_masks(kind, blocks, request):
    if blocks == "many":
        request.getfixturevalue("small_blocks")  # 11 rows: blocks of 4, 4 and 3
    rng = np.random.default_rng(5)
    heads, kv_heads = (4, 2) if kind == "float gqa" else (3, 3)
    q, k, v = arrays([(2, heads, 11, 32), (2, kv_heads, 13, 32), (2, kv_heads, 13, 32)])
    mask_shape = (heads, 11, 13) if kind in ("bool per head", "float gqa") else (11, 13)
    mask = rng.standard_normal(mask_shape)
    mask = mask > -0.8 if kind.startswith("bool") else mask.astype(np.float32)
    if mask.dtype == bool:
        mask[..., 0] = True  # every row sees a key (a row that sees none is NaN in torch and here)
    check(q, k, v, mask, enable_gqa=kv_heads != heads)


@pytest.mark.parametrize("blocks", ["one", "many"])
def test_a_row_that_sees_no_key_is_nan_and_the_others_exact(blocks, request):
    # its max is -inf: the shift by it must keep the row's probabilities 0, so its output is 0/0 (NaN, as a softmax
    # over no key is; torch 2.13 writes 0 there instead), and the other rows equal torch's
    if blocks == "many":
        request.getfixturevalue("small_blocks")
    q, k, v = arrays([(1, 2, 9, 16), (1, 2, 7, 16), (1, 2, 7, 16)])
    mask = np.ones((9, 7), bool)
    mask[3] = False
    out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(mask)).numpy()
    ref = F.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), attn_mask=torch.tensor(mask)).numpy()
    assert np.isnan(out[..., 3, :]).all()
    keep = np.arange(9) != 3
    np.testing.assert_allclose(out[..., keep, :], ref[..., keep, :], atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("dtype,atol", [(dtypes.float16, 3e-3), (dtypes.bfloat16, 2e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_half_inputs_accumulate_in_float32(dtype, atol, causal, small_blocks):
    check(*arrays([(1, 2, 9, 64), (1, 2, 9, 64), (1, 2, 9, 64)]), dtype=dtype, atol=atol, is_causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_long_sequence(causal):
    check(*arrays([(1, 2, 1000, 64), (1, 2, 1000, 64), (1, 2, 1000, 64)]), is_causal=causal)


class AllocationLog:
    """The largest buffer allocated and the peak of GlobalCounters.mem_used while it is installed."""

    def __init__(self, monkeypatch):
        self.largest, self.peak = 0, GlobalCounters.mem_used
        allocate = Buffer.ensure_allocated

        def logged(buf):
            fresh = buf._mem is None
            out = allocate(buf)
            if fresh:
                self.largest = max(self.largest, buf.nbytes)
                self.peak = max(self.peak, GlobalCounters.mem_used)
            return out

        monkeypatch.setattr(Buffer, "ensure_allocated", logged)


def _inputs(shape):
    ts = [Tensor(a).realize() for a in arrays([shape] * 3)]
    for t in ts:
        t.requires_grad = True
    return ts


# slow (about 10 s each): the README's test line stays under 10 minutes; CI runs both
@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_scores_are_never_stored_past_the_threshold(causal, monkeypatch):
    heads, seq = 2, 512
    monkeypatch.setattr(attention, "FLASH_SCORE_BYTES", 0)
    monkeypatch.setattr(attention, "FLASH_BLOCK_BYTES", heads * 64 * seq * 4)  # 64-row blocks
    q, k, v = _inputs((1, heads, seq, 64))
    log = AllocationLog(monkeypatch)
    out = q.scaled_dot_product_attention(k, v, is_causal=causal)
    Tensor.realize(out, *out.gradient(q, k, v, gradient=Tensor.ones(out.shape)))
    # the largest buffer is one block's scores (64 rows), 8x under the whole score matrix
    assert log.largest <= heads * 64 * seq * 4 < heads * seq * seq * 4


@pytest.mark.slow
def test_peak_memory_at_seq_8192_is_under_twice_the_inputs(monkeypatch):
    q, k, v = _inputs((1, 2, 8192, 64))
    inputs = 3 * q.nbytes()
    log = AllocationLog(monkeypatch)
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    out.realize()
    assert log.peak < 2 * inputs, (log.peak, inputs)
    grads = out.gradient(q, k, v, gradient=Tensor.ones(out.shape))
    Tensor.realize(*grads)
    # the backward's own state (the output, its gradient, dq/dk/dv) is O(N·d) too
    assert log.peak < 4 * inputs, (log.peak, inputs)


def _compiles(seq: int, d: int) -> int:
    before = GlobalCounters.compile_count
    q, k, v = _inputs((1, 2, seq, d))
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    Tensor.realize(out, *out.gradient(q, k, v, gradient=Tensor.ones(out.shape)))
    return GlobalCounters.compile_count - before


@pytest.mark.slow  # 6 s of compiles; the blocked path's values are checked by the odd-length cases in the fast run
def test_realized_blocks_share_their_kernels(small_blocks):
    # a head dim no other test uses, so each count starts from an empty kernel cache for these shapes
    few, many = _compiles(32, 24), _compiles(64, 40)  # 8 and 16 blocks of 4 rows
    assert many <= few + 4, (few, many)


def test_realized_blocks_under_tinyjit_against_torch(small_blocks):
    from fusegrad import TinyJit

    step = TinyJit(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True).realize())
    for seed in range(4):  # capture, then replays on new values: every block's start is bound again
        q, k, v = arrays([(1, 2, 18, 32)] * 3, seed=seed)
        ref = F.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), is_causal=True)
        out = step(Tensor(q).realize(), Tensor(k).realize(), Tensor(v).realize())
        np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=ATOL, rtol=ATOL)


def _gradient_kernels(use_backward: bool) -> int:
    q, k, v = _inputs((1, 2, 64, 32))  # 64 keys fill whole panels of kᵀ: the packed copy is inside the graph
    out = q.scaled_dot_product_attention(k, v)
    before = GlobalCounters.kernel_count
    if use_backward:
        out.backward(Tensor.ones(out.shape))
        Tensor.realize(q.grad, k.grad, v.grad)
    else:
        Tensor.realize(*out.gradient(q, k, v, gradient=Tensor.ones(out.shape)))
    return GlobalCounters.kernel_count - before


def test_backward_takes_the_registered_gradient():
    # backward() takes every live tensor in the graph as a target: the op's own (the packed kᵀ) must not be one, or
    # the plain rules run through the blocks (the same values, many more kernels)
    assert _gradient_kernels(True) == _gradient_kernels(False)


@pytest.fixture
def blocks_of(monkeypatch):
    """Every problem in realized row blocks of the given number of rows."""

    def set_rows(rows: int) -> None:
        monkeypatch.setattr(attention, "FLASH_SCORE_BYTES", 0)
        monkeypatch.setattr(attention, "FLASH_BLOCK_BYTES", 1)
        monkeypatch.setattr(attention, "FLASH_MIN_BLOCK_ROWS", rows)

    return set_rows


# odd lengths, GQA and more keys than queries through the blocked backward (key blocks storing dk and dv, adding into
# dq in place)
@pytest.mark.parametrize(
    "qs,kv_len,kv_heads,kw",
    [
        ((1, 2, 129, 64), 129, 2, {}),
        ((1, 2, 129, 64), 129, 2, {"is_causal": True}),
        pytest.param((1, 4, 129, 32), 100, 2, {"enable_gqa": True}, marks=pytest.mark.slow),  # 6 s; GQA: the next case
        ((1, 4, 100, 32), 129, 2, {"is_causal": True, "enable_gqa": True}),
        ((1, 1, 1, 32), 129, 1, {"is_causal": True}),
    ],
)
def test_blocked_backward_odd_lengths_against_torch(qs, kv_len, kv_heads, kw, blocks_of):
    blocks_of(16)
    check(*_case_arrays(qs, kv_len, kv_heads, qs[-1]), **kw)


@pytest.mark.slow  # ~7 s: CI's slow part
def test_blocked_backward_keys_no_query_sees(blocks_of):
    # causal with 300 keys for 256 queries: the key blocks past the last query (whole causal steps of 256) are zeros
    blocks_of(32)
    check(*arrays([(1, 1, 256, 32), (1, 1, 300, 32), (1, 1, 300, 32)]), is_causal=True)


def _full_size_allocations(seq: int, monkeypatch) -> int:
    """Buffers at least as big as q that computing q, k and v's gradients allocates."""
    q, k, v = _inputs((1, 2, seq, 32))
    out = q.scaled_dot_product_attention(k, v)
    sizes: list[int] = []
    allocate = Buffer.ensure_allocated

    def logged(buf):
        if buf._mem is None:
            sizes.append(buf.nbytes)
        return allocate(buf)

    monkeypatch.setattr(Buffer, "ensure_allocated", logged)
    Tensor.realize(*out.gradient(q, k, v, gradient=Tensor.ones(out.shape)))
    monkeypatch.setattr(Buffer, "ensure_allocated", allocate)
    return sum(s >= q.nbytes() for s in sizes)


@pytest.mark.slow  # about 6 s; the odd-length backward tests cover the blocked backward in the fast run
def test_blocked_backward_sums_no_gradient_through_memory(blocks_of, monkeypatch):
    # each key block writes its own rows of dk and dv and adds its part of dq into dq in place: the buffers the size
    # of a whole gradient do not grow with the number of blocks (a gradient summed into new buffers would be 1 or 2 per
    # block)
    blocks_of(16)
    assert _full_size_allocations(128, monkeypatch) == _full_size_allocations(512, monkeypatch)


# the blocked forward and backward walk one head at a time: key/value heads shared by every query head (their
# gradients summed over the heads), a batch axis as the one walked, per-head masks sliced with their heads
@pytest.mark.parametrize(
    "q_shape,kv_shape,mask_shape,kw",
    [
        ((1, 3, 37, 16), (1, 1, 29, 16), None, {}),
        ((1, 3, 37, 16), (1, 1, 37, 16), None, {"is_causal": True}),
        ((3, 1, 37, 16), (3, 1, 29, 16), None, {}),
        ((2, 3, 37, 16), (2, 3, 29, 16), (3, 37, 29), {}),
    ],
)
def test_blocked_heads_one_at_a_time_against_torch(q_shape, kv_shape, mask_shape, kw, blocks_of):
    blocks_of(16)
    q, k, v = arrays([q_shape, kv_shape, kv_shape])
    mask = None
    if mask_shape is not None:
        mask = np.random.default_rng(3).standard_normal(mask_shape) > -0.8
        mask[..., 0] = True  # every row sees a key
    check(q, k, v, mask, **kw)


@pytest.mark.parametrize(
    "q_shape,kv_shape,gqa,axis",
    [
        ((1, 8, 64, 16), (1, 8, 64, 16), False, 1),  # the heads
        ((1, 8, 64, 16), (1, 1, 64, 16), False, 1),  # one key head for all: still the query heads
        ((1, 8, 64, 16), (1, 2, 64, 16), True, 1),  # GQA: the key/value heads (each with its group), not the group
        ((4, 1, 64, 16), (4, 1, 64, 16), False, 0),  # the batch where the heads are one
        ((64, 16), (64, 16), False, None),  # no leading axis: the row blocks alone
    ],
)
def test_the_axis_walked_one_head_at_a_time(q_shape, kv_shape, gqa, axis):
    q, k = Tensor.empty(*q_shape), Tensor.empty(*kv_shape)
    group = q_shape[-3] // kv_shape[-3] if gqa else 1
    if group > 1:  # the problem's GQA layout: q as (kv heads, group), k as (kv heads, 1)
        q = q.reshape(q_shape[:-3] + (kv_shape[-3], group) + q_shape[-2:])
        k = k.reshape(kv_shape[:-3] + (kv_shape[-3], 1) + kv_shape[-2:])
    problem = attention._Problem(q, k, k, None, 1.0, False)
    assert attention._head_axis(problem) == axis


@pytest.mark.slow  # ~6 s: CI's slow part
def test_blocked_heads_backward_in_key_blocks(monkeypatch):
    # all heads' scores past the threshold, one head's under it: each head's backward still runs in key blocks. As one
    # key block of all 1024 keys its in-place dq update (dq + dSᵀ·K, a reduce over the 1024 keys) ran in reduce
    # chunks that each re-read dq (seq 1024 x 8 heads: dq ~10x off)
    monkeypatch.setattr(attention, "FLASH_SCORE_BYTES", 2 * 1024 * 1024 * 4 - 1)
    check(*arrays([(1, 2, 1024, 64)] * 3))
