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
/* x (spans * span floats, span 32 or 256) -> xq and one scale a span (xs), rounded as quantize_blocks; sums (if
   given): each 32 values' sum of xq */
static void fg_quantize_x(const float* x, i8* xq, float* xs, short* sums, int spans, int span) {
  const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int b = 0; b < spans; b++) {
    const float* v = x + b * span;
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < span / 8; k++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + k * 8)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float s = _mm_cvtss_f32(h) * (float)(1.0 / 127);
    xs[b] = s;
    for (int g = 0; g < span / 32; g++) {
      __m256i q[4];
      for (int k = 0; k < 4; k++) {
        __m256 val = _mm256_loadu_ps(v + g * 32 + k * 8);
        __m256 scaled = s > 0 ? _mm256_div_ps(val, _mm256_set1_ps(s)) : _mm256_setzero_ps();
        /* half away from zero: trunc(scaled + copysign(0.5, scaled)) */
        q[k] = _mm256_cvttps_epi32(_mm256_add_ps(scaled, _mm256_or_ps(_mm256_and_ps(scaled, sign), half)));
      }
      __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256((__m256i*)(xq + b * span + g * 32), _mm256_permutevar8x32_epi32(packed, order));
      if (sums)
        sums[b * (span / 32) + g] =
            (short)fg_hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
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
  for (int i = 0; i < N; i++) fg_quantize_x(x + i * COLS, xq[i], xs[i], 0, BLOCKS, 32);
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
# and 2c + 1 in its high ones, value d * sc_s * q - dmin * m_s (Q4_K as stored: sc and m 6-bit bytes per sub-block,
# d and dmin float32 per block of 256). x is quantized per 256 (llama.cpp's Q8_K), so vpmaddwd multiplies each
# sub-block's pair sums by its sc and a block of 256 sums in integers: one convert and FMA a block of 256
Q4_K_KERNEL = r"""
void NAME(float* restrict out, const float* restrict x, const unsigned char* restrict w,
          const unsigned char* restrict sc, const unsigned char* restrict mins, const float* restrict d,
          const float* restrict dmin, long long start, long long end) {
  enum { N = %(n)d, ROWS = %(rows)d, COLS = %(cols)d, BLOCKS = COLS / 32, SUPERS = COLS / 256 };
  i8 xq[N][COLS] __attribute__((aligned(32)));
  float xs[N][SUPERS];
  short sums[N][BLOCKS] __attribute__((aligned(16)));
  for (int i = 0; i < N; i++) fg_quantize_x(x + i * COLS, xq[i], xs[i], sums[i], SUPERS, 256);
  const __m256i low = _mm256_set1_epi8(15);
  for (long long r = start; r < end; r++) {
    const unsigned char* wr = w + r * (COLS / 2);
    __m256 acc[N];
    float mins_sum[N];
    for (int i = 0; i < N; i++) acc[i] = _mm256_setzero_ps(), mins_sum[i] = 0;
    for (int s = 0; s < SUPERS; s++) {
      const long long at = r * BLOCKS + s * 8;
      const __m128i sc16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)(sc + at)));
      const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)(mins + at)));
      const __m256i scales = _mm256_broadcastsi128_si256(sc16);
      const float dd = d[r * SUPERS + s], dm = dmin[r * SUPERS + s];
      for (int i = 0; i < N; i++) {
        __m256i isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
          __m256i q = _mm256_loadu_si256((const __m256i*)(wr + s * 128 + c * 32));
          __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
          const i8* xb = xq[i] + s * 256 + c * 64;
          /* sub-block k's scale in every 16-bit lane: bytes 2k, 2k + 1 of the widened scales */
          __m256i s0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
          __m256i s1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
          __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256((const __m256i*)xb)), s0);
          __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_load_si256((const __m256i*)(xb + 32))), s1);
          isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
        }
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dd * xs[i][s]), acc[i]);
        /* the mins: dmin * xs * sum_k m_k * sum(xq_k) */
        __m128i pm = _mm_madd_epi16(m16, _mm_load_si128((const __m128i*)(sums[i] + s * 8)));
        pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0x4e));
        pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0xb1));
        mins_sum[i] += dm * xs[i][s] * (float)_mm_cvtsi128_si32(pm);
      }
    }
    for (int i = 0; i < N; i++) out[i * ROWS + r] = fg_hsum(acc[i]) - mins_sum[i];
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
    if ggml_type == 12:  # the packed nibbles and the stored scales (the float32 scale planes are prefill's)
        planes = planes[:1] + planes[3:]
    # no .contiguous(): the scheduler gives the kernel a lazy or strided input as a buffer of its own, and a realized
    # plane (or a reshape of one) as it is, where .contiguous() would copy it every launch
    return _launch(RawKernel(src, entry, items=rows, ops=2 * n * rows * cols), (n, rows), x, *planes)


def _launch(raw: RawKernel, shape: tuple[int, int], x: Tensor, *weights: Tensor) -> Tensor:
    """The float32 (n, outputs) result of a raw matvec kernel over x (as float32) and the weight's tensors."""
    out = Tensor.empty(*shape, dtype=dtypes.float32, device=x.device)
    return Tensor.custom_kernel(out, x.cast(dtypes.float32), *weights, fxn=lambda *_: raw)[0]


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
    return _launch(raw, (n, cols), x, w.cast(dtypes.float32))
