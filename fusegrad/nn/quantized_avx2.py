"""Decode matvecs of Q8_0 and Q4_K weights as raw C kernels of AVX2 intrinsics, for a target whose renderer has
`u8s8_pair_dot` (the CPU device on an AVX2 x86 without 8-bit dot products), and of float32 weights kept (out, in)
as dot products down contiguous rows (f32_matvecs; measured on that target only, so chosen there).

Why hand-written: the generated matvec (nn/quantized.py's integer path) reduces each block of 32 products to one
number before scaling it, so GCC ends every block with a horizontal add and scalar float work (~23 instructions a
Q8_0 block), and it multiplies no 8-bit pair in one instruction. These kernels do what llama.cpp's AVX2 path does:
`vpmaddubsw` (unsigned x signed bytes, adjacent pairs summed into 16 bits), `vpmaddwd` by ones into eight 32-bit
sums, then one convert and one FMA a block into float lanes, summed across lanes once per row (~8 instructions a
block). No pair sum can saturate 16 bits: |w| <= 128 and |xq| <= 127 give at most 2 * 128 * 127 = 32512 (Q8_0), a
nibble 0..15 at most 2 * 15 * 127 = 3810 (Q4_K). Each launch quantizes x itself (llama.cpp's 8-bit activations per
block of 32, the same rounding as quantize_blocks), so a matvec is one kernel instead of four. The kernels split
their weight rows over the CPU threads (RawKernel.items). Every other target keeps the generated matvec.

A decode step's matvecs that read one x share a kernel (a layer's q, k and v; its gate and up, whose kernel gives
silu(gate) * up), and a kernel takes the rms norm of x in its prologue and the residual add in its epilogue (Fused):
a launch split over threads wakes the workers, and 244 launches a step (110M LLaMA) became 146."""

from __future__ import annotations

from dataclasses import dataclass

from fusegrad.dtype import dtypes
from fusegrad.helpers import AVX2_MATVEC
from fusegrad.lazy_numpy import np
from fusegrad.tensor import Tensor
from fusegrad.uop.kernel import RawKernel

# the headers and the float lane sum every kernel here starts with
AVX2_HEAD = r"""
#include <immintrin.h>
#include <math.h>
static inline float fg_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
"""

# x (n, cols) float32 -> per block of 32: xq int8 (n, cols), xs (n, blocks) with x ~ xs * xq, and (Q4_K) xm (n,
# blocks) = xs * sum(xq). Rounding as quantize_blocks: xs = max|x| * (1/127) in float32, xq = trunc(x / xs +- 0.5).
PRELUDE = (
    AVX2_HEAD
    + r"""typedef signed char i8;
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
)


# Fusions a decode step's kernels take on (Fused): `norm` rms-normalizes x in the entry's prologue (x * rsqrt(mean(x^2)
# + eps) * weight, the norm's weight an input after x), so the norm is no kernel of its own; `residual` adds an input
# (n, outputs) to the outputs (the layer's residual sum: its add is no kernel either).
@dataclass(frozen=True)
class Fused:
    swiglu: bool = False
    norm_eps: float | None = None
    residual: bool = False

    def tag(self) -> str:
        """The entry name's part that tells fused kernels apart."""
        return (
            ("swiglu" if self.swiglu else "matvec")
            + ("_norm" if self.norm_eps is not None else "")
            + ("_res" if self.residual else "")
        )

    def params(self) -> str:
        """The entry's parameters after x for the fusions' inputs."""
        norm = " const float* restrict nw," if self.norm_eps is not None else ""
        return norm + (" const float* restrict res," if self.residual else "")

    def entry(self, name: str, weights: str, widths: tuple[int, ...]) -> str:
        """The entry's signature and opening brace: out, x, the fusions' inputs, the weights' parameters (one matrix
        of `widths` outputs each), the item range."""
        if self.swiglu:
            assert len(widths) == 2 and widths[0] == widths[1], "swiglu multiplies a gate and an up of one shape"
        return (
            f"void {name}(float* restrict out, const float* restrict x_in,{self.params()} {weights}, long long start, "
            "long long end) {\n"
        )

    @classmethod
    def of(cls, swiglu: bool, norm: tuple[Tensor, float] | None, residual: Tensor | None) -> Fused:
        """The fusions asked of a launch by its norm (weight, eps) and residual inputs."""
        return cls(swiglu, None if norm is None else norm[1], residual is not None)

    def prologue(self, width: str) -> str:
        """C that makes `x` the entry's input rows (`x_in`, N rows of `width`), normalized where asked."""
        if self.norm_eps is None:
            return "  const float* restrict x = x_in;\n"
        return (
            f"  float xn[N * {width}] __attribute__((aligned(32)));\n"
            f"  fg_rms_norm(x_in, nw, xn, N, {width}, {float(np.float32(self.norm_eps))!r}f);\n"
            "  const float* restrict x = xn;\n"
        )

    def store(self, out: str, value: str) -> str:
        """C that stores `value` at out[`out`] (adding the residual's element there where asked)."""
        return f"out[{out}] = res[{out}] + {value};" if self.residual else f"out[{out}] = {value};"


# x (n rows of width) -> out = x * (1 / sqrt(mean(x^2) + eps)) * w, as models' rms_norm (sums in eight lanes)
RMS_NORM = r"""
static inline void fg_rms_norm(const float* x, const float* w, float* out, int n, int width, float eps) {
  for (int i = 0; i < n; i++) {
    const float* v = x + (long long)i * width;
    __m256 ss8 = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= width; j += 8) ss8 = _mm256_fmadd_ps(_mm256_loadu_ps(v + j), _mm256_loadu_ps(v + j), ss8);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(ss8), _mm256_extractf128_ps(ss8, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    float ss = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    for (; j < width; j++) ss += v[j] * v[j];
    const float scale = 1.0f / sqrtf(ss / (float)width + eps);
    for (j = 0; j < width; j++) out[(long long)i * width + j] = v[j] * scale * w[j];
  }
}
"""


# Each format's kernel is an entry that quantizes x once (file-scope N rows of COLS values), then runs its rows
# through the format's row function (`fg_row`: row r of one matrix's planes -> its N dot products). An entry reads
# one matrix, or several: `stacked`, their rows one after another in one output (a layer's q, k and v), or
# `swiglu`, two of the same shape whose row results give silu(gate) * up (a layer's gate and up).

# row r of W (COLS int8 values and a float32 scale per block of 32) against x quantized per 32
Q8_0_ROW = r"""
enum { BLOCKS = COLS / 32, XSPAN = 32 };
#define FG_PLANES(m) const i8* restrict w##m, const float* restrict ws##m
#define FG_ARGS(m) w##m, ws##m
static inline __attribute__((always_inline)) void fg_row(float* res, const i8 (*xq)[COLS],
    const float (*xs)[COLS / XSPAN], const short (*sums)[BLOCKS],
    const i8* restrict w, const float* restrict ws, long long r) {
  (void)sums;
  const __m256i ones = _mm256_set1_epi16(1);
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
  for (int i = 0; i < N; i++) res[i] = fg_hsum(acc[i]);
}
"""

# row r of W as COLS / 2 bytes: chunk c of 32 holds sub-block 2c in its low nibbles and 2c + 1 in its high ones,
# value d * sc_s * q - dmin * m_s (Q4_K as stored: sc and m 6-bit bytes per sub-block, d and dmin float32 per block
# of 256). x is quantized per 256 (llama.cpp's Q8_K), so vpmaddwd multiplies each sub-block's pair sums by its sc
# and a block of 256 sums in integers: one convert and FMA a block of 256
Q4_K_ROW = r"""
enum { BLOCKS = COLS / 32, SUPERS = COLS / 256, XSPAN = 256 };
#define FG_PLANES(m) const unsigned char* restrict w##m, const unsigned char* restrict sc##m, \
    const unsigned char* restrict mins##m, const float* restrict d##m, const float* restrict dmin##m
#define FG_ARGS(m) w##m, sc##m, mins##m, d##m, dmin##m
static inline __attribute__((always_inline)) void fg_row(float* res, const i8 (*xq)[COLS],
    const float (*xs)[COLS / XSPAN], const short (*sums)[BLOCKS],
    const unsigned char* restrict w, const unsigned char* restrict sc,
    const unsigned char* restrict mins, const float* restrict d, const float* restrict dmin, long long r) {
  const __m256i low = _mm256_set1_epi8(15);
  const unsigned char* wr = w + r * (COLS / 2);
  __m256 acc[N];
  __m128 mins_acc[N]; /* the mins' part, in four float lanes summed once a row (a sum a block cost ~10 ops) */
  for (int i = 0; i < N; i++) acc[i] = _mm256_setzero_ps(), mins_acc[i] = _mm_setzero_ps();
  for (int s = 0; s < SUPERS; s++) {
    const long long at = r * BLOCKS + s * 8;
    const __m128i sc16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)(sc + at)));
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)(mins + at)));
    const __m256i scales = _mm256_broadcastsi128_si256(sc16);
    const float dd = d[r * SUPERS + s], dm = dmin[r * SUPERS + s];
    for (int i = 0; i < N; i++) {
      __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 4 /* constant shuffle controls: rolled, each chunk built its two in ~8 scalar ops */
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
      mins_acc[i] = _mm_fmadd_ps(_mm_cvtepi32_ps(pm), _mm_set1_ps(dm * xs[i][s]), mins_acc[i]);
    }
  }
  for (int i = 0; i < N; i++) res[i] = fg_hsum(_mm256_sub_ps(acc[i], _mm256_set_m128(_mm_setzero_ps(), mins_acc[i])));
}
"""

# the entry's x quantized into arrays on its stack (with each 32's sum of xq for the formats that need it)
QUANTIZE_X = r"""
  i8 xq[N][COLS] __attribute__((aligned(32)));
  float xs[N][COLS / XSPAN];
  short sums[N][BLOCKS] __attribute__((aligned(16)));
  for (int i = 0; i < N; i++)
    fg_quantize_x(x + i * COLS, xq[i], xs[i], XSPAN == 256 ? sums[i] : 0, COLS / XSPAN, XSPAN);
"""


def matvec_source(ggml_type: int, entry: str, n: int, cols: int, rows: tuple[int, ...], fused: Fused = Fused()) -> str:
    """C source of `entry`: out = x (n, cols) @ W.T for each matrix W of `rows` rows (their planes in order after
    out, x and the fusions' inputs), items over the rows of all of them. One matrix: out (n, rows). Several: out (n,
    sum(rows)), each matrix's columns after the previous ones'. swiglu (two matrices, gate then up): out (n, rows) =
    silu(gate) * up."""
    row = {8: Q8_0_ROW, 12: Q4_K_ROW}[ggml_type]
    head = fused.entry(entry, ", ".join(f"FG_PLANES({m})" for m in range(len(rows))), rows)
    if fused.swiglu:
        body = f"""
  for (long long r = start; r < end; r++) {{
    float g[N], u[N];
    fg_row(g, xq, xs, sums, FG_ARGS(0), r);
    fg_row(u, xq, xs, sums, FG_ARGS(1), r);
    for (int i = 0; i < N; i++) {fused.store(f"i * {rows[0]} + r", "g[i] / (1.0f + expf(-g[i])) * u[i]")}
  }}"""
    else:
        ends = [sum(rows[: m + 1]) for m in range(len(rows))]
        calls = [f"fg_row(res_, xq, xs, sums, FG_ARGS({m}), r - {e - rows[m]});" for m, e in enumerate(ends)]
        pick = " else ".join([f"if (r < {e}) {call}" for e, call in zip(ends, calls[:-1])] + calls[-1:])
        body = f"""
  for (long long r = start; r < end; r++) {{
    float res_[N];
    {pick}
    for (int i = 0; i < N; i++) {fused.store(f"i * {ends[-1]} + r", "res_[i]")}
  }}"""
    return (
        f"{PRELUDE}{RMS_NORM}\nenum {{ N = {n}, COLS = {cols} }};\n{row}\n{head}{fused.prologue('COLS')}{QUANTIZE_X}"
        f"{body}\n}}\n"
    )


def avx2_kernels(device: str) -> bool:
    """Whether device's decode matvecs run the kernels here: its renderer's `u8s8_pair_dot` (C for AVX2), unless
    AVX2_MATVEC=0."""
    from fusegrad.engine.realize import u8s8_pair_dot  # the engine entry point the tensor has loaded

    return bool(AVX2_MATVEC.value) and u8s8_pair_dot(device)


KERNELS = {8: ("q8_0", 32), 12: ("q4_k", 256)}  # ggml type -> (name, column step)


def has_avx2_matvec(ggml_type: int, cols: int) -> bool:
    """Whether a kernel here multiplies this type at this width (whole blocks; Q4_K's offsets in eights)."""
    return ggml_type in KERNELS and cols % KERNELS[ggml_type][1] == 0


def _kernel_planes(ggml_type: int, planes: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The planes a kernel reads: Q4_K's packed nibbles and stored scales (its float32 scale planes are prefill's)."""
    return planes[:1] + planes[3:] if ggml_type == 12 else planes


def avx2_matvec(ggml_type: int, planes: tuple[Tensor, ...], x: Tensor) -> Tensor:
    """x (n, cols) @ W.T -> (n, rows) float32, W as its planes: Q8_0's (int8 values, float32 scales), Q4_K's (packed
    nibbles, float32 scales, float32 offsets), each (rows, ...)."""
    return avx2_matvecs(ggml_type, [planes], x)


def avx2_matvecs(
    ggml_type: int,
    matrices: list[tuple[Tensor, ...]],
    x: Tensor,
    swiglu: bool = False,
    norm: tuple[Tensor, float] | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """One kernel for x (n, cols) @ W.T of each matrix (its planes, as avx2_matvec takes them), which reads x once:
    (n, sum of their rows), each matrix's outputs after the previous one's; swiglu (gate and up of one shape):
    silu(x @ gate.T) * (x @ up.T), (n, rows). norm (weight, eps): x rms-normalized first; residual (n, outputs):
    added to the outputs."""
    (n, cols), rows = x.shape, tuple(planes[0].shape[0] for planes in matrices)
    fused = Fused.of(swiglu, norm, residual)
    entry = f"fg_{KERNELS[ggml_type][0]}_{fused.tag()}_{n}_{'_'.join(map(str, rows))}_{cols}"
    src = matvec_source(ggml_type, entry, n, cols, rows, fused)
    weights = [p for planes in matrices for p in _kernel_planes(ggml_type, planes)]
    out_rows = rows[0] if swiglu else sum(rows)
    # no .contiguous(): the scheduler gives the kernel a lazy or strided input as a buffer of its own, and a realized
    # plane (or a reshape of one) as it is, where .contiguous() would copy it every launch
    raw = RawKernel(src, entry, items=out_rows, ops=2 * n * sum(rows) * cols)
    return _launch(raw, (n, out_rows), x, *_fusion_inputs(norm, residual), *weights)


def _fusion_inputs(norm: tuple[Tensor, float] | None, residual: Tensor | None) -> list[Tensor]:
    """The fusions' inputs in the entry's order, as float32."""
    return [t.cast(dtypes.float32) for t in ((None if norm is None else norm[0]), residual) if t is not None]


def _launch(raw: RawKernel, shape: tuple[int, int], x: Tensor, *weights: Tensor) -> Tensor:
    """The float32 (n, outputs) result of a raw matvec kernel over x (as float32) and the weight's tensors."""
    out = Tensor.empty(*shape, dtype=dtypes.float32, device=x.device)
    return Tensor.custom_kernel(out, x.cast(dtypes.float32), *weights, fxn=lambda *_: raw)[0]


# x (N, K) @ W.T, W (rows, K) float32 row-major (a float linear's weight as the GGUF file stores it, (out, in)): each
# output is a dot product down one contiguous row, R rows at a time against each row of x (the x vector loaded once
# for R weight vectors; R * N accumulators, R weight and one x vector within AVX2's 16 registers). Rows that run past
# the item range repeat its last row and are not stored. Rows streamed whole, as llama.cpp's are, replaced a kernel
# over W (in, out) that read each row in 2 KB spans 8 KB apart: a 110M F32 decode step on one thread (Zen 3) went
# from ~26 to ~22 ms of CPU time (the layers' matvecs ~18 -> ~21 GB/s)
F32_DOTS = r"""
enum { N = %(n)d, K = %(k)d, R = %(r)d };
/* res[j][i] = w[j] . x[i] for the R rows w[j] (K floats each) and the N rows of x */
static inline __attribute__((always_inline)) void fg_dots(float (*res)[N], const float* restrict x,
    const float* const* w) {
  __m256 acc[R][N];
#pragma GCC unroll 16
  for (int j = 0; j < R; j++)
#pragma GCC unroll 8
    for (int i = 0; i < N; i++) acc[j][i] = _mm256_setzero_ps();
  long long k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[R];
#pragma GCC unroll 16
    for (int j = 0; j < R; j++) wv[j] = _mm256_loadu_ps(w[j] + k);
#pragma GCC unroll 8
    for (int i = 0; i < N; i++) {
      const __m256 xv = _mm256_loadu_ps(x + i * K + k);
#pragma GCC unroll 16
      for (int j = 0; j < R; j++) acc[j][i] = _mm256_fmadd_ps(wv[j], xv, acc[j][i]);
    }
  }
  for (int j = 0; j < R; j++)
    for (int i = 0; i < N; i++) {
      float s = fg_hsum(acc[j][i]);
      for (long long t = k; t < K; t++) s += w[j][t] * x[i * K + t];
      res[j][i] = s;
    }
}
"""
VECTOR_REGISTERS = 16  # AVX2's: a step's R * N accumulators, R weight vectors and one of x
# weight rows read at once: 4 streams run at the memory's rate (a 110M F32 decode step on one thread: 6 and 8 rows
# within noise of 4, a software prefetch 256 floats ahead 20 % slower)
MAX_DOT_ROWS = 4


def dot_rows(n: int, swiglu: bool = False) -> int:
    """Weight rows one step of an f32 kernel reads (R) for n rows of x: gate and up rows in pairs for swiglu."""
    rows = max(1, min(MAX_DOT_ROWS, (VECTOR_REGISTERS - 1) // (n + 1)))
    return 2 * max(1, rows // 2) if swiglu else rows


def f32_source(entry: str, n: int, k: int, rows: tuple[int, ...], fused: Fused = Fused()) -> str:
    """C source of `entry`: out = x (n, k) @ W.T for each W (rows[m], k) (their pointers in order after out, x and
    the fusions' inputs), items over the rows of all of them. One matrix: out (n, rows). Several: out (n,
    sum(rows)), each matrix's outputs after the previous one's. swiglu (gate and up of one shape): out (n, rows) =
    silu(x @ gate.T) * (x @ up.T)."""
    r = dot_rows(n, fused.swiglu)
    head = fused.entry(entry, ", ".join(f"const float* restrict w{m}" for m in range(len(rows))), rows)
    if fused.swiglu:
        half = r // 2
        pick = f"w[j] = w0 + row * K, w[j + {half}] = w1 + row * K;"
        step, total = half, rows[0]
        value = f"dots[j][i] / (1.0f + expf(-dots[j][i])) * dots[j + {half}][i]"
    else:
        ends = [sum(rows[: m + 1]) for m in range(len(rows))]
        ptrs = [f"w{m} + (row - {e - c}) * K" for m, (e, c) in enumerate(zip(ends, rows))]
        pick = "w[j] = " + "".join(f"row < {e} ? {p} : " for e, p in zip(ends[:-1], ptrs[:-1])) + ptrs[-1] + ";"
        step, total, value = r, ends[-1], "dots[j][i]"
    loop = f"""
  for (long long r0 = start; r0 < end; r0 += {step}) {{
    const float* w[R];
    for (int j = 0; j < {step}; j++) {{
      const long long row = r0 + j < end ? r0 + j : end - 1;
      {pick}
    }}
    float dots[R][N]; /* not `res`: the residual input's name */
    fg_dots(dots, x, w);
    for (int j = 0; j < {step} && r0 + j < end; j++)
      for (int i = 0; i < N; i++) {{
        const long long row = r0 + j;
        {fused.store(f"i * {total} + row", value)}
      }}
  }}
}}
"""
    return AVX2_HEAD + RMS_NORM + F32_DOTS % {"n": n, "k": k, "r": r} + head + fused.prologue("K") + loop


def f32_matvec(x: Tensor, w: Tensor) -> Tensor:
    """x (n, k) @ w.T -> (n, rows) float32 for a few rows of x (a decode step), w float32 (rows, k): (out, in)."""
    return f32_matvecs(x, [w])


def f32_matvecs(
    x: Tensor,
    ws: list[Tensor],
    swiglu: bool = False,
    norm: tuple[Tensor, float] | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """One kernel for x (n, k) @ w.T of each w (rows, k) float32 (out, in), for a few rows of x: (n, sum of their
    rows), each w's outputs after the previous one's; swiglu (gate and up of one shape): silu(x @ gate.T) * (x @
    up.T). norm and residual as avx2_matvecs takes them."""
    (n, k), rows = x.shape, tuple(w.shape[0] for w in ws)
    fused = Fused.of(swiglu, norm, residual)
    entry = f"fg_f32_dots_{fused.tag()}_{n}_{k}_{'_'.join(map(str, rows))}"
    out_rows = rows[0] if swiglu else sum(rows)
    raw = RawKernel(f32_source(entry, n, k, rows, fused), entry, items=out_rows, ops=2 * n * k * sum(rows))
    return _launch(raw, (n, out_rows), x, *_fusion_inputs(norm, residual), *(w.cast(dtypes.float32) for w in ws))
