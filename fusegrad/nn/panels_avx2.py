"""A prefill chunk's Q8_0 or Q4_K weight dequantized into float32 panels by a raw C kernel of AVX2 intrinsics, for
the targets that run nn/quantized_avx2.py's decode kernels (QuantizedMatrix.panels; its planes are theirs).

Why hand-written: a panel holds PANEL weight rows as columns, contiguous over the input dim, so the copy transposes
the stored (rows, cols) values. The generated kernel (QuantizedMatrix.panels' graph) does it with 8x8 tiles of
scalar loads, converts and stores (~2 cycles an element: ~1 ms for a 768x2048 weight, 8 % of a 512-token Q8_0
prefill on one thread). Here each 8x8 tile is 8 loads of 8 bytes, widened, scaled (Q4_K: a nibble of each byte and
an FMA with its sub-block's scale and offset) and transposed in registers (24 shuffles), stored as 8 whole vectors."""

from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor
from fusegrad.uop.kernel import RawKernel

# out (rows / PANEL, COLS, PANEL) float32 from a weight's planes (rows first); item p writes panel p. A format gives
# FG_PLANES (the planes' parameters) and fg_row8 (8 values of a row from column k, k a multiple of 8, scaled)
PANELS = r"""
#include <immintrin.h>
enum { COLS = %(cols)d, PANEL = %(panel)d };
%(format)s
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
void %(entry)s(float* restrict out, FG_PLANES, long long start, long long end) {
  for (long long p = start; p < end; p++) {
    float* panel = out + p * COLS * PANEL;
    for (int h = 0; h < PANEL; h += 8) {  /* 8 rows of the panel: 8 of its columns */
      for (int k = 0; k < COLS; k += 8) {
        __m256 v[8];
        for (int i = 0; i < 8; i++) v[i] = fg_row8(FG_ARGS, p * PANEL + h + i, k);
        fg_transpose8(v);
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(panel + (k + j) * PANEL + h, v[j]);
      }
    }
  }
}
"""

# int8 values (rows, COLS) and a float32 scale per block of 32 (rows, COLS / 32)
Q8_0_ROW8 = r"""
#define FG_PLANES const signed char* restrict w, const float* restrict ws
#define FG_ARGS w, ws
static inline __attribute__((always_inline)) __m256 fg_row8(FG_PLANES, long long r, int k) {
  __m128i bytes = _mm_loadl_epi64((const __m128i*)(w + r * COLS + k));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), _mm256_set1_ps(ws[r * (COLS / 32) + k / 32]));
}
"""

# packed nibbles (rows, COLS / 2): chunk c of 32 bytes holds sub-block 2c in its low nibbles and 2c + 1 in its high
# ones; a float32 scale and offset per sub-block of 32 (rows, COLS / 32): value = nibble * scale + offset
Q4_K_ROW8 = r"""
#define FG_PLANES const unsigned char* restrict w, const float* restrict ws, const float* restrict wo
#define FG_ARGS w, ws, wo
static inline __attribute__((always_inline)) __m256 fg_row8(FG_PLANES, long long r, int k) {
  __m128i bytes = _mm_loadl_epi64((const __m128i*)(w + r * (COLS / 2) + k / 64 * 32 + k % 32));
  __m128i nibbles = _mm_and_si128(k % 64 < 32 ? bytes : _mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
  long long s = r * (COLS / 32) + k / 32;
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibbles)), _mm256_set1_ps(ws[s]),
                         _mm256_set1_ps(wo[s]));
}
"""

# ggml type -> (name, its fg_row8, the planes of QuantizedMatrix it reads, the column step)
FORMATS = {8: ("q8_0", Q8_0_ROW8, 2, 32), 12: ("q4_k", Q4_K_ROW8, 3, 64)}


def panels_fit(ggml_type: int, rows: int, cols: int, panel: int) -> bool:
    """Whether a kernel here writes these panels: a format it knows, whole panels of whole 8-row halves, whole
    blocks."""
    return ggml_type in FORMATS and panel % 8 == 0 and rows % panel == 0 and cols % FORMATS[ggml_type][3] == 0


def avx2_panels(ggml_type: int, planes: tuple[Tensor, ...], shape: tuple[int, int], panel: int) -> Tensor:
    """(rows / panel, cols, panel) float32 panels of the quantized weight of `shape` whose planes (QuantizedMatrix's,
    rows first) are given: panel p holds rows p * panel .. p * panel + panel - 1 as its columns."""
    (rows, cols), count = shape, shape[0] // panel
    if not panels_fit(ggml_type, rows, cols, panel):
        raise ValueError(f"no panels of {panel} for a weight of type {ggml_type} and shape {shape}")
    name, row8, used, _ = FORMATS[ggml_type]
    entry = f"fg_{name}_panels_{rows}_{cols}_{panel}"
    src = PANELS % {"cols": cols, "panel": panel, "format": row8, "entry": entry}
    raw = RawKernel(src, entry, items=count, ops=rows * cols)
    out = Tensor.empty(count, cols, panel, dtype=dtypes.float32, device=planes[0].device)
    return Tensor.custom_kernel(out, *planes[:used], fxn=lambda *_: raw)[0]
