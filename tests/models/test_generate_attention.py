"""The decoders' attention over a KV cache (models/generate.attention) against a float64 numpy reference: grouped
query heads, a causal chunk, and a slot count given by a bound Variable under TinyJit."""

import math

import numpy as np
import pytest

from fusegrad import Tensor, TinyJit
from fusegrad.models.generate import QUERY_BLOCK, KVCache, attention, causal_mask, start_position


def reference(q, k, v, start):
    """q (1, heads, t, d) at positions start..start+t-1 over k, v (1, kv_heads, start+t, d), causal."""
    heads, t, d = q.shape[1:]
    rep = heads // k.shape[1]
    out = np.zeros(q.shape)
    for h in range(heads):
        s = q[0, h].astype(np.float64) @ k[0, h // rep].T.astype(np.float64) / math.sqrt(d)
        s = np.where(np.arange(s.shape[1])[None] <= start + np.arange(t)[:, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[0, h] = (p / p.sum(-1, keepdims=True)) @ v[0, h // rep]
    return out


# grouped rows (heads / kv_heads * chunk) under 16 take the scores as queries x slots, from 16 as slots x queries
@pytest.mark.parametrize(
    "heads,kv_heads,chunk", [(6, 2, 1), (6, 2, 3), (4, 4, 2), (3, 1, 1), (6, 2, 16), (4, 4, 17), (8, 2, 5)]
)
def test_attention_matches_reference(heads, kv_heads, chunk):
    rng = np.random.default_rng(0)
    start, d = 5, 8
    q = rng.standard_normal((1, heads, chunk, d)).astype(np.float32)
    k = rng.standard_normal((1, kv_heads, start + chunk, d)).astype(np.float32)
    v = rng.standard_normal((1, kv_heads, start + chunk, d)).astype(np.float32)
    mask = None if chunk == 1 else Tensor(np.arange(start + chunk)[None] <= start + np.arange(chunk)[:, None])
    got = attention(Tensor(q), Tensor(k), Tensor(v), mask).numpy()
    np.testing.assert_allclose(got, reference(q, k, v, start), rtol=1e-5, atol=1e-5)


def jitted_over_a_cache(chunk: int, steps: int, heads: int, kv_heads: int, d: int, ctx: int, seed: int, causal=False):
    """A TinyJit step writing a chunk into a KV cache and attending over it, run at positions 0, chunk, ... and
    checked against the reference at each; returns the TinyJit."""
    rng = np.random.default_rng(seed)
    cache = KVCache(1, kv_heads, ctx, d)

    def step(q, k, v, start):
        keys, values = cache.write(k, v, start)
        return attention(q, keys, values, causal_mask(start, chunk, ctx), causal=causal).realize()

    jitted = TinyJit(step)
    ks, vs = np.zeros((1, kv_heads, 0, d), np.float32), np.zeros((1, kv_heads, 0, d), np.float32)
    for pos in range(0, steps * chunk, chunk):
        q = rng.standard_normal((1, heads, chunk, d)).astype(np.float32)
        k = rng.standard_normal((1, kv_heads, chunk, d)).astype(np.float32)
        v = rng.standard_normal((1, kv_heads, chunk, d)).astype(np.float32)
        ks, vs = np.concatenate([ks, k], 2), np.concatenate([vs, v], 2)
        got = jitted(Tensor(q), Tensor(k), Tensor(v), start_position(pos, chunk, ctx)).numpy()
        np.testing.assert_allclose(got, reference(q, ks, vs, pos), rtol=1e-5, atol=1e-5)
    return jitted


@pytest.mark.parametrize("chunk", [2, 8])
def test_attention_over_a_cache_at_a_bound_position_replays_one_capture(chunk):
    jitted = jitted_over_a_cache(chunk, 5, heads=4, kv_heads=2, d=8, ctx=48, seed=1)
    assert jitted.cnt == 5 and jitted.captured is not None


def test_attention_rejects_heads_that_do_not_group():
    x = Tensor.zeros(1, 3, 1, 4)
    with pytest.raises(ValueError, match=r"query heads \(3\).*key/value heads \(2\)"):
        attention(x, Tensor.zeros(1, 2, 2, 4), Tensor.zeros(1, 2, 2, 4), None)


@pytest.mark.parametrize("chunk", [256, 384, 200])
def test_a_causal_chunk_attends_in_query_blocks_over_a_growing_cache(chunk):
    """causal=True: a chunk of whole QUERY_BLOCKs attends block by block, each block against the slots up to its own
    last query's (200 queries are one block); the same values as the reference at each bound position, one capture."""
    d = 16
    jitted = jitted_over_a_cache(chunk, 3, heads=6, kv_heads=2, d=d, ctx=3 * chunk, seed=chunk, causal=True)
    assert jitted.captured is not None
    blocks = chunk // QUERY_BLOCK if chunk % QUERY_BLOCK == 0 else 1
    # each block's scores are a kernel of its own: (kv heads, slots, rep * QUERY_BLOCK) rows against its queries
    names = [la.runner.info.name for la in jitted.captured.launches if hasattr(la.runner, "info")]
    scores = [k for k in names if k.startswith("r_") and k.endswith(f"_{d}")]
    assert len(scores) == blocks, names
