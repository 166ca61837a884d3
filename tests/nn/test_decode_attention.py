"""A decode step's attention kernel (nn/decode_attention.py): values against a float64 softmax over the slots written,
for grouped-query shapes and positions on both sides of its blocks, replayed under TinyJit at new positions, split
over threads; the online softmax where later slots raise the max; one launch; and the cases it leaves to tensor ops."""

import numpy as np
import pytest

from fusegrad import Context, GlobalCounters, Tensor, TinyJit, Variable
from fusegrad.dtype import dtypes
from fusegrad.engine.realize import u8s8_pair_dot
from fusegrad.nn.decode_attention import BLOCK, decode_attention, decode_attention_serves, decode_slot

needs_avx2 = pytest.mark.skipif(not u8s8_pair_dot("CPU"), reason="the CPU device's target has no AVX2")
CONTEXT = 3 * BLOCK + 11


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, slot: int) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v in float64 over slots 0 .. slot; q (heads, d), keys/values (kv_heads, context, d)."""
    heads, d = q.shape
    rep = heads // keys.shape[0]
    out = np.empty((heads, d))
    for h in range(heads):
        k, v = keys[h // rep, : slot + 1].astype(np.float64), values[h // rep, : slot + 1].astype(np.float64)
        s = k @ q[h].astype(np.float64) / np.sqrt(d)
        e = np.exp(s - s.max())
        out[h] = e @ v / e.sum()
    return out


def cache(kv_heads: int, d: int, seed: int, growth: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((kv_heads, CONTEXT, d)).astype(np.float32)
    keys *= (1 + growth * np.arange(CONTEXT, dtype=np.float32))[None, :, None]  # later slots score higher
    return keys, rng.standard_normal((kv_heads, CONTEXT, d)).astype(np.float32)


@needs_avx2
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("heads, kv_heads, d", [(12, 4, 64), (8, 8, 32), (6, 2, 80), (4, 1, 128)])
def test_decode_attention_equals_a_float64_softmax_at_every_position(heads, kv_heads, d, threads):
    keys, values = cache(kv_heads, d, seed=heads + d)
    k, v = (Tensor(a.reshape(1, kv_heads, CONTEXT, d)).realize() for a in (keys, values))

    @TinyJit
    def step(q: Tensor, start) -> Tensor:
        return decode_attention(q, k, v, decode_slot(start, "CPU")).realize()

    rng = np.random.default_rng(d)
    with Context(NUM_CPU_THREADS=threads):
        # the first block's first slot, either side of each block edge, the last slot, and back to an early one
        for slot in (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 7, CONTEXT - 1, 5):
            q = (rng.standard_normal((heads, d)) * 2).astype(np.float32)
            start = Variable("start_pos", 0, CONTEXT - 1).bind(slot)
            got = step(Tensor(q).reshape(1, heads, 1, d), start).numpy()
            assert got.shape == (1, heads * d)
            np.testing.assert_allclose(got.reshape(heads, d), reference(q, keys, values, slot), rtol=1e-5, atol=1e-5)
    assert step.captured is not None  # the later positions replayed one capture


@needs_avx2
def test_later_blocks_raising_the_max_rescale_what_was_summed():
    # scores up to ~80 in the last block against ~1 in the first: the running sum is rescaled by exp(old - new)
    # (e^-80 underflows its first block's share to nothing, as it does in float64 within the tolerance)
    keys, values = cache(2, 64, seed=3, growth=0.2)
    k, v = (Tensor(a.reshape(1, 2, CONTEXT, 64)).realize() for a in (keys, values))
    q = np.random.default_rng(4).standard_normal((6, 64)).astype(np.float32)
    for slot in (BLOCK + 3, CONTEXT - 1):
        slot_t = decode_slot(Variable("start_pos", 0, CONTEXT - 1).bind(slot), "CPU")
        got = decode_attention(Tensor(q).reshape(1, 6, 1, 64), k, v, slot_t).numpy()
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got.reshape(6, 64), reference(q, keys, values, slot), rtol=1e-5, atol=1e-5)


@needs_avx2
def test_decode_attention_is_one_launch_storing_no_score():
    k, v = (Tensor.rand(1, 4, CONTEXT, 64).realize() for _ in range(2))
    q = Tensor.rand(1, 12, 1, 64).realize()
    slot = decode_slot(Variable("start_pos", 0, CONTEXT - 1).bind(100), "CPU")
    out = decode_attention(q, k, v, slot)
    GlobalCounters.reset()
    out.realize()
    assert GlobalCounters.kernel_count == 1  # the inputs realized: no kernel of scores, max, exps or sums


@pytest.mark.parametrize(
    "why, q_shape, cache_shape, dtype",
    [
        ("a head dim that is not whole vectors", (1, 4, 1, 36), (1, 2, 32, 36), dtypes.float32),
        ("two query tokens (a chunk)", (1, 4, 2, 64), (1, 2, 32, 64), dtypes.float32),
        ("a batch of two", (2, 4, 1, 64), (2, 2, 32, 64), dtypes.float32),
        ("heads that are no multiple of the kv heads", (1, 5, 1, 64), (1, 2, 32, 64), dtypes.float32),
        ("float16", (1, 4, 1, 64), (1, 2, 32, 64), dtypes.float16),
    ],
)
def test_cases_the_kernel_does_not_serve_are_left_to_tensor_ops(why, q_shape, cache_shape, dtype):
    q, k = Tensor.zeros(*q_shape, dtype=dtype), Tensor.zeros(*cache_shape, dtype=dtype)
    slot = decode_slot(Variable("start_pos", 0, 31).bind(3), "CPU")
    assert decode_attention(q, k, k, slot) is None, why


def test_without_the_avx2_kernels_the_caller_builds_the_attention():
    q, k = Tensor.zeros(1, 4, 1, 64), Tensor.zeros(1, 2, 32, 64)
    slot = decode_slot(Variable("start_pos", 0, 31).bind(3), "CPU")
    with Context(AVX2_MATVEC=0):
        assert decode_attention(q, k, k, slot) is None
        assert not decode_attention_serves(4, 2, 64, "CPU")  # so LLaMA makes no slot tensor (no kernel) for it


@needs_avx2
def test_the_serving_check_agrees_with_the_kernel():
    assert decode_attention_serves(12, 4, 64, "CPU") and decode_attention_serves(6, 2, 80, "CPU")
    assert not decode_attention_serves(4, 2, 36, "CPU") and not decode_attention_serves(5, 2, 64, "CPU")
