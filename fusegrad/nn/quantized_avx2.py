"""Decode matvecs of Q8_0 and Q4_K weights as raw C kernels of AVX2 intrinsics, for a target whose renderer has
`u8s8_pair_dot` (the CPU device on an AVX2 x86 without 8-bit dot products), and of float32 weights kept (in, out)
as a plain C kernel that streams the weight's rows (rows_matvec; measured on that target only, so chosen there).

Why hand-written: the generated matvec (nn/quantized.py's integer path) reduces each block of 32 products to one
number before scaling it, so GCC ends every block with a horizontal add and scalar float work (~23 instructions a
Q8_0 block), and it multiplies no 8-bit pair in one instruction. These kernels do what llama.cpp's AVX2 path does:
`vpmaddubsw` (unsigned x signed bytes, adjacent pairs summed into 16 bits), `vpmaddwd` by ones into eight 32-bit
sums, then one convert and one FMA a block into float lanes, summed across lanes once per row (~8 instructions a
block). No pair sum can saturate 16 bits: |w| <= 128 and |xq| <= 127 give at most 2 * 128 * 127 = 32512 (Q8_0), a
nibble 0..15 at most 2 * 15 * 127 = 3810 (Q4_K). Each launch quantizes x itself (llama.cpp's 8-bit activations per
block of 32, the same rounding as quantize_blocks), so a matvec is one kernel instead of four. The kernels split
their weight rows over the CPU threads (RawKernel.items). Every other target keeps the generated matvec."""

from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.helpers import AVX2_MATVEC
from fusegrad.tensor import Tensor
from fusegrad.uop.kernel import RawKernel

# x (n, cols) float32 -> per block of 32: xq int8 (n, cols), xs (n, blocks) with x ~ xs * xq, and (Q4_K) xm (n,
# blocks) = xs * sum(xq). Rounding as quantize_blocks: xs = max|x| * (1/127) in float32, xq = trunc(x / xs +- 0.5).
PRELUDE = r"""
#include <immintrin.h>
typedef signed char i8;
static inline float fg_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline int fg_hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}
static void fg_quantize_x(const float* x, i8* xq, float* xs, float* xm, int blocks) {
  const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int b = 0; b < blocks; b++) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
      v[k] = _mm256_loadu_ps(x + b * 32 + k * 8);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h) * (float)(1.0 / 127);
    xs[b] = s;
    __m256i q[4];
    for (int k = 0; k < 4; k++) {
      __m256 scaled = s > 0 ? _mm256_div_ps(v[k], _mm256_set1_ps(s)) : _mm256_setzero_ps();
      /* half away from zero: trunc(scaled + copysign(0.5, scaled)) */
      q[k] = _mm256_cvttps_epi32(_mm256_add_ps(scaled, _mm256_or_ps(_mm256_and_ps(scaled, sign), half)));
    }
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    packed = _mm256_permutevar8x32_epi32(packed, order);
    _mm256_storeu_si256((__m256i*)(xq + b * 32), packed);
    if (xm) {
      __m256i wide = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      xm[b] = s * (float)fg_hsum_i32(wide);
    }
  }
}
"""

# out (N, ROWS) = x (N, COLS) @ W.T, W's rows as COLS int8 values and a float32 scale per block of 32
Q8_0_KERNEL = r"""
void NAME(float* restrict out, const float* restrict x, const i8* restrict w, const float* restrict ws,
          long long start, long long end) {
  enum { N = %(n)d, ROWS = %(rows)d, COLS = %(cols)d, BLOCKS = COLS / 32 };
  i8 xq[N][COLS] __attribute__((aligned(32)));
  float xs[N][BLOCKS];
  for (int i = 0; i < N; i++) fg_quantize_x(x + i * COLS, xq[i], xs[i], 0, BLOCKS);
  const __m256i ones = _mm256_set1_epi16(1);
  for (long long r = start; r < end; r++) {
    const i8* wr = w + r * COLS;
    const float* sr = ws + r * BLOCKS;
    __m256 acc[N];
    for (int i = 0; i < N; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < BLOCKS; b++) {
      __m256i wv = _mm256_loadu_si256((const __m256i*)(wr + b * 32));
      __m256i aw = _mm256_sign_epi8(wv, wv); /* |w| as unsigned bytes (-128 -> 128), w's sign moved onto x */
      for (int i = 0; i < N; i++) {
        __m256i sx = _mm256_sign_epi8(_mm256_load_si256((const __m256i*)(xq[i] + b * 32)), wv);
        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sr[b] * xs[i][b]), acc[i]);
      }
    }
    for (int i = 0; i < N; i++) out[i * ROWS + r] = fg_hsum(acc[i]);
  }
}
"""

# out (N, ROWS) = x (N, COLS) @ W.T, W's rows as COLS / 2 bytes: chunk c of 32 holds sub-block 2c in its low nibbles
# and 2c + 1 in its high ones, value scale_s * q + offset_s (float32 planes per sub-block of 32)
Q4_K_KERNEL = r"""
void NAME(float* restrict out, const float* restrict x, const unsigned char* restrict w, const float* restrict scale,
          const float* restrict offset, long long start, long long end) {
  enum { N = %(n)d, ROWS = %(rows)d, COLS = %(cols)d, BLOCKS = COLS / 32 };
  i8 xq[N][COLS] __attribute__((aligned(32)));
  float xs[N][BLOCKS] __attribute__((aligned(32))), xm[N][BLOCKS] __attribute__((aligned(32)));
  for (int i = 0; i < N; i++) fg_quantize_x(x + i * COLS, xq[i], xs[i], xm[i], BLOCKS);
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(15);
  for (long long r = start; r < end; r++) {
    const unsigned char* wr = w + r * (COLS / 2);
    const float *sr = scale + r * BLOCKS, *orow = offset + r * BLOCKS;
    __m256 acc[N];
    for (int i = 0; i < N; i++) acc[i] = _mm256_setzero_ps();
    for (int c = 0; c < BLOCKS / 2; c++) {
      __m256i q = _mm256_loadu_si256((const __m256i*)(wr + c * 32));
      __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      for (int i = 0; i < N; i++) {
        __m256i x0 = _mm256_load_si256((const __m256i*)(xq[i] + c * 64));
        __m256i x1 = _mm256_load_si256((const __m256i*)(xq[i] + c * 64 + 32));
        __m256i d0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), ones);
        __m256i d1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), ones);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(sr[2 * c] * xs[i][2 * c]), acc[i]);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_set1_ps(sr[2 * c + 1] * xs[i][2 * c + 1]), acc[i]);
      }
    }
    /* the offsets: sum over sub-blocks of offset_s * xs_s * sum(xq_s), eight sub-blocks a vector */
    for (int i = 0; i < N; i++)
      for (int b = 0; b < BLOCKS; b += 8)
        acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(orow + b), _mm256_load_ps(xm[i] + b), acc[i]);
    for (int i = 0; i < N; i++) out[i * ROWS + r] = fg_hsum(acc[i]);
  }
}
"""


def avx2_kernels(device: str) -> bool:
    """Whether device's decode matvecs run the kernels here: its renderer's `u8s8_pair_dot` (C for AVX2), unless
    AVX2_MATVEC=0."""
    from fusegrad.engine.realize import u8s8_pair_dot  # the engine entry point the tensor has loaded

    return bool(AVX2_MATVEC.value) and u8s8_pair_dot(device)


KERNELS = {8: ("q8_0", Q8_0_KERNEL, 32), 12: ("q4_k", Q4_K_KERNEL, 256)}  # ggml type -> (name, source, column step)


def has_avx2_matvec(ggml_type: int, cols: int) -> bool:
    """Whether a kernel here multiplies this type at this width (whole blocks; Q4_K's offsets in eights)."""
    return ggml_type in KERNELS and cols % KERNELS[ggml_type][2] == 0


def avx2_matvec(ggml_type: int, planes: tuple[Tensor, ...], x: Tensor) -> Tensor:
    """x (n, cols) @ W.T -> (n, rows) float32, W as its planes: Q8_0's (int8 values, float32 scales), Q4_K's (packed
    nibbles, float32 scales, float32 offsets), each (rows, ...)."""
    name, template, _ = KERNELS[ggml_type]
    (n, cols), rows = x.shape, planes[0].shape[0]
    entry = f"fg_{name}_matvec_{n}_{rows}_{cols}"
    src = PRELUDE + template.replace("NAME", entry) % {"n": n, "rows": rows, "cols": cols}
    raw = RawKernel(src, entry, items=rows, ops=2 * n * rows * cols)
    out = Tensor.empty(n, rows, dtype=dtypes.float32, device=x.device)
    # no .contiguous(): the scheduler gives the kernel a lazy or strided input as a buffer of its own, and a realized
    # plane (or a reshape of one) as it is, where .contiguous() would copy it every launch
    inputs = (out, x.cast(dtypes.float32), *planes)
    return Tensor.custom_kernel(*inputs, fxn=lambda *_: raw)[0]


# out (N, COLS) = x (N, K) @ W, W (K, COLS) float32 row-major (a float linear's weight kept (in, out)): each item is a
# run of up to SPAN columns, whose sums stay in an L1 array while W's rows stream past it four at a time. A register
# tile of columns instead reads one cache line of each of K rows 8 KB apart, which kept a decode step's float
# matvecs at ~17 GB/s against ~25 GB/s for these sequential rows (768x2048, one thread, Zen 3)
ROWS_KERNEL = r"""
void NAME(float* restrict out, const float* restrict x, const float* restrict w, long long start, long long end) {
  enum { N = %(n)d, K = %(k)d, COLS = %(cols)d, SPAN = %(span)d };
  for (long long item = start; item < end; item++) {
    const long long c0 = item * SPAN, width = COLS - c0 < SPAN ? COLS - c0 : SPAN;
    float acc[N][SPAN] __attribute__((aligned(32)));
    for (int r = 0; r < N; r++)
      for (long long j = 0; j < width; j++) acc[r][j] = 0;
    int i = 0;
    for (; i + 4 <= K; i += 4) {
      const float *w0 = w + (long long)i * COLS + c0, *w1 = w0 + COLS, *w2 = w1 + COLS, *w3 = w2 + COLS;
      for (int r = 0; r < N; r++) {
        const float x0 = x[r * K + i], x1 = x[r * K + i + 1], x2 = x[r * K + i + 2], x3 = x[r * K + i + 3];
        for (long long j = 0; j < width; j++) acc[r][j] += x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j];
      }
    }
    for (; i < K; i++)
      for (int r = 0; r < N; r++)
        for (long long j = 0; j < width; j++) acc[r][j] += x[r * K + i] * w[(long long)i * COLS + c0 + j];
    for (int r = 0; r < N; r++)
      for (long long j = 0; j < width; j++) out[r * COLS + c0 + j] = acc[r][j];
  }
}
"""
SPAN = 512  # columns an item sums: 2 KB of each weight row read in sequence, the sums 2 KB of L1 a row of x


def rows_matvec(x: Tensor, w: Tensor) -> Tensor:
    """x (n, k) @ w (k, cols) -> (n, cols) float32 for a few rows of x (a decode step), w float32 (in, out)."""
    (n, k), cols = x.shape, w.shape[1]
    entry = f"fg_f32_rows_matvec_{n}_{k}_{cols}"
    src = ROWS_KERNEL.replace("NAME", entry) % {"n": n, "k": k, "cols": cols, "span": SPAN}
    raw = RawKernel(src, entry, items=-(-cols // SPAN), ops=2 * n * k * cols)
    out = Tensor.empty(n, cols, dtype=dtypes.float32, device=x.device)
    return Tensor.custom_kernel(out, x.cast(dtypes.float32), w.cast(dtypes.float32), fxn=lambda *_: raw)[0]
