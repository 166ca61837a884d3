"""A prefill chunk's Q8_0 weight dequantized into float32 panels by a raw C kernel of AVX2 intrinsics, for the targets
that run nn/quantized_avx2.py's decode kernels.

Why hand-written: a panel holds PANEL weight rows as columns, contiguous over the input dim, so the copy transposes
the stored (rows, cols) values. The generated kernel (QuantizedMatrix.panels' graph) does it with 8x8 tiles of
scalar loads, converts and stores (~2 cycles an element: ~1 ms for a 768x2048 weight, 8 % of a 512-token Q8_0
prefill on one thread). Here each 8x8 tile is 8 loads of 8 bytes, a widening convert and one multiply by the block's
scale per row, and an 8x8 transpose in registers (24 shuffles), stored as 8 whole vectors."""

from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor
from fusegrad.uop.kernel import RawKernel

# out (rows / PANEL, COLS, PANEL) float32 from w (rows, COLS) int8 and ws (rows, COLS / 32) float32 scales; item p
# writes panel p
Q8_0_PANELS = r"""
#include <immintrin.h>
enum { COLS = %(cols)d, PANEL = %(panel)d, BLOCKS = COLS / 32 };
/* the 8x8 floats of v (rows) as columns: v[i] becomes lane i of every output vector */
static inline __attribute__((always_inline)) void fg_transpose8(__m256* v) {
  __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
  __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
  __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
  __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
  __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
  __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
  __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
  v[0] = _mm256_permute2f128_ps(s0, s4, 0x20), v[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  v[2] = _mm256_permute2f128_ps(s2, s6, 0x20), v[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  v[4] = _mm256_permute2f128_ps(s0, s4, 0x31), v[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  v[6] = _mm256_permute2f128_ps(s2, s6, 0x31), v[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}
void %(entry)s(float* restrict out, const signed char* restrict w, const float* restrict ws, long long start,
    long long end) {
  for (long long p = start; p < end; p++) {
    float* panel = out + p * COLS * PANEL;
    for (int h = 0; h < PANEL; h += 8) {  /* 8 rows of the panel: 8 of its columns */
      const signed char* rows = w + (p * PANEL + h) * (long long)COLS;
      const float* scales = ws + (p * PANEL + h) * (long long)BLOCKS;
      for (int k = 0; k < COLS; k += 8) {
        __m256 v[8];
        for (int i = 0; i < 8; i++) {
          __m128i bytes = _mm_loadl_epi64((const __m128i*)(rows + i * COLS + k));
          v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
                               _mm256_set1_ps(scales[i * BLOCKS + k / 32]));
        }
        fg_transpose8(v);
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(panel + (k + j) * PANEL + h, v[j]);
      }
    }
  }
}
"""


def q8_0_panels_fit(rows: int, cols: int, panel: int) -> bool:
    """Whether the kernel writes these panels: whole panels of whole 8-row halves, whole blocks of 32."""
    return panel % 8 == 0 and rows % panel == 0 and cols % 32 == 0


def q8_0_panels(values: Tensor, scales: Tensor, panel: int) -> Tensor:
    """(rows / panel, cols, panel) float32 panels of the Q8_0 weight whose int8 values (rows, cols) and float32 block
    scales (rows, cols / 32) are given: panel p holds rows p * panel .. p * panel + panel - 1 as its columns."""
    (rows, cols), count = values.shape, values.shape[0] // panel
    if not q8_0_panels_fit(rows, cols, panel) or scales.shape != (rows, cols // 32):
        raise ValueError(f"no Q8_0 panels of {panel} for values {values.shape} and scales {scales.shape}")
    entry = f"fg_q8_0_panels_{rows}_{cols}_{panel}"
    src = Q8_0_PANELS % {"cols": cols, "panel": panel, "entry": entry}
    raw = RawKernel(src, entry, items=count, ops=rows * cols)
    out = Tensor.empty(count, cols, panel, dtype=dtypes.float32, device=values.device)
    return Tensor.custom_kernel(out, values, scales.cast(dtypes.float32), fxn=lambda *_: raw)[0]
