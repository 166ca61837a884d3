"""A decode step's attention (one query token against the KV cache) as one raw C kernel of AVX2 intrinsics, for the
target of the AVX2 decode matvecs (nn/quantized_avx2.py).

Why hand-written: generated, a decode layer's attention was seven kernels (the grouped query, the scores, their max,
the exponentials, their sum, the product with the values, the division), each a launch of a few microseconds of
work split over the threads; a 110M LLaMA decode step at 2 threads spent ~0.9 of ~6 ms in them (Zen 3). This kernel
does them in one pass per kv head, blocks of BLOCK slots at a time with an online softmax (a running max and sum per
query head, the output rescaled when the max grows), so it stores no score outside a block's stack array and reads
each cached key and value row once for the query heads that share it (grouped-query attention)."""

from __future__ import annotations

import functools
import math

from fusegrad.dtype import dtypes
from fusegrad.nn.quantized_avx2 import AVX2_HEAD, avx2_kernels
from fusegrad.tensor import Tensor
from fusegrad.uop.kernel import RawKernel
from fusegrad.uop.ops import UOp

# slots scored per block: their scores fit a stack array of REP x BLOCK floats, and BLOCK value rows (16 KB at head
# dim 64) stay in L1 for the product
BLOCK = 64

SOURCE = r"""
typedef float fg_f8 __attribute__((vector_size(32)));
typedef int fg_i8 __attribute__((vector_size(32)));
%(exp)s
enum { REP = %(rep)d, HD = %(hd)d, CTX = %(ctx)d, LANES = HD / 8, BLOCK = %(block)d };
/* out (heads * HD) = softmax(q k^T * scale) v for query heads g*REP .. g*REP+REP-1 of each kv head g in [start, end),
   over the cache's slots 0 .. pos[0] */
void %(entry)s(float* restrict out, const float* restrict q, const float* restrict kc, const float* restrict vc,
    const int* restrict pos, long long start, long long end) {
  const int n = pos[0] < 0 ? 1 : pos[0] >= CTX ? CTX : pos[0] + 1; /* a slot outside the cache reads none past it */
  const __m256 scale = _mm256_set1_ps(%(scale)r);
  for (long long g = start; g < end; g++) {
    const float* keys = kc + g * (long long)CTX * HD;
    const float* values = vc + g * (long long)CTX * HD;
    __m256 qv[REP][LANES], acc[REP][LANES];
    float top[REP], total[REP];
    for (int r = 0; r < REP; r++) {
      for (int l = 0; l < LANES; l++) {
        qv[r][l] = _mm256_mul_ps(_mm256_loadu_ps(q + (g * REP + r) * HD + l * 8), scale);
        acc[r][l] = _mm256_setzero_ps();
      }
      top[r] = -INFINITY, total[r] = 0.0f;
    }
    for (int j0 = 0; j0 < n; j0 += BLOCK) {
      const int nb = n - j0 < BLOCK ? n - j0 : BLOCK;
      float s[REP][BLOCK] __attribute__((aligned(32)));
      for (int j = 0; j < nb; j++) {
        const float* key = keys + (long long)(j0 + j) * HD;
        __m256 d[REP];
        for (int r = 0; r < REP; r++) d[r] = _mm256_setzero_ps();
        for (int l = 0; l < LANES; l++) {
          const __m256 k = _mm256_loadu_ps(key + l * 8);
          for (int r = 0; r < REP; r++) d[r] = _mm256_fmadd_ps(qv[r][l], k, d[r]);
        }
        for (int r = 0; r < REP; r++) s[r][j] = fg_hsum(d[r]);
      }
      const int padded = (nb + 7) & ~7;
      for (int r = 0; r < REP; r++) {
        float m = top[r];
        for (int j = 0; j < nb; j++) m = s[r][j] > m ? s[r][j] : m;
        for (int j = nb; j < padded; j++) s[r][j] = -INFINITY; /* exp gives 0 */
        /* the block raised the running max: what was summed so far is rescaled by exp(old - new) (0 at the start) */
        const float shrink = fg_exp_fg_f8((fg_f8){} + (top[r] - m))[0];
        top[r] = m;
        for (int l = 0; l < LANES; l++) acc[r][l] = _mm256_mul_ps(acc[r][l], _mm256_set1_ps(shrink));
        fg_f8 sum = {};
        for (int j = 0; j < padded; j += 8) {
          const fg_f8 p = fg_exp_fg_f8((fg_f8)_mm256_load_ps(&s[r][j]) - m);
          _mm256_store_ps(&s[r][j], (__m256)p);
          sum += p;
        }
        total[r] = total[r] * shrink + fg_hsum((__m256)sum);
        for (int j = 0; j < nb; j++) {
          const __m256 p = _mm256_set1_ps(s[r][j]);
          const float* value = values + (long long)(j0 + j) * HD;
          for (int l = 0; l < LANES; l++) acc[r][l] = _mm256_fmadd_ps(p, _mm256_loadu_ps(value + l * 8), acc[r][l]);
        }
      }
    }
    for (int r = 0; r < REP; r++) {
      const __m256 inv = _mm256_set1_ps(1.0f / total[r]);
      for (int l = 0; l < LANES; l++) _mm256_storeu_ps(out + (g * REP + r) * HD + l * 8, _mm256_mul_ps(acc[r][l], inv));
    }
  }
}
"""


@functools.cache  # every layer of every eager decode step asks for the same few
def decode_attention_source(entry: str, rep: int, head_dim: int, context: int) -> str:
    """C source of `entry`: one query token's attention over kv heads [start, end) (the item range)."""
    from fusegrad.engine.realize import c_vector_exp  # the engine entry point the tensor has loaded

    exp = c_vector_exp("fg_f8", "fg_i8")  # the generated kernels' exp of float lanes: the same values
    scale = 1 / math.sqrt(head_dim)
    fields = {"exp": exp, "rep": rep, "hd": head_dim, "ctx": context, "block": BLOCK, "entry": entry, "scale": scale}
    return AVX2_HEAD + SOURCE % fields


def decode_attention_serves(heads: int, kv_heads: int, head_dim: int, device: str) -> bool:
    """Whether decode_attention runs one float32 token's attention of these heads and head dim on device."""
    return head_dim % 8 == 0 and heads % kv_heads == 0 and avx2_kernels(device)


def decode_slot(start: UOp, device: str) -> Tensor:
    """The query token's slot, start (a bound Variable), as the (1,) int32 tensor decode_attention reads: realized
    once, so the layers of a step share its one kernel (a replay under TinyJit computes it for the new value)."""
    return Tensor(start, device=device).cast(dtypes.int32).reshape(1).realize()


def decode_attention(q: Tensor, cache_k: Tensor, cache_v: Tensor, slot: Tensor) -> Tensor | None:
    """softmax(q keys^T / sqrt(head_dim)) values for one query token q (1, heads, 1, head_dim) over the slots 0 ..
    slot of the cache (1, kv_heads, context, head_dim) each, written up to its slot (decode_slot): (1, heads *
    head_dim) float32, the heads side by side as the output projection reads them; query head h reads kv head h //
    (heads / kv_heads). None where this kernel does not serve (another device, dtype or shape): the caller then
    builds the attention from tensor ops."""
    b, heads, t, hd = q.shape
    if not (b == 1 and t == 1 and cache_k.shape == cache_v.shape and cache_k.shape[0] == 1):
        return None
    kv_heads, context = cache_k.shape[1], cache_k.shape[2]
    if (
        cache_k.shape[3] != hd
        or not isinstance(context, int)
        or any(x.dtype != dtypes.float32 for x in (q, cache_k, cache_v))
    ):
        return None
    if not decode_attention_serves(heads, kv_heads, hd, q.device):
        return None
    rep = heads // kv_heads
    entry = f"fg_decode_attention_{rep}_{hd}_{context}"
    # one kv head's work per item, split over the threads where the cache is long enough to pay for waking them
    # (how many slots are written is known only when it runs)
    source = decode_attention_source(entry, rep, hd, context)
    raw = RawKernel(source, entry, items=kv_heads, ops=4 * heads * hd * context)
    out = Tensor.empty(1, heads * hd, dtype=dtypes.float32, device=q.device)
    return Tensor.custom_kernel(out, q.reshape(heads * hd), cache_k, cache_v, slot, fxn=lambda *_: raw)[0]
