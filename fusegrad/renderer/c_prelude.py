"""What a C kernel needs before its function: only the helpers it calls, and declarations of the C library functions
it calls instead of <math.h> and <string.h> (parsing the two headers was about a sixth of a small kernel's compile)."""

from __future__ import annotations
import re

# gcc 12 if-converts two gated loads of one buffer wrongly (CRenderer.function_attributes); a kernel so marked keeps
# its branches
NO_IF_CONVERT = """#if defined(__GNUC__) && !defined(__clang__)
#define FG_NO_IF_CONVERT __attribute__((optimize("no-tree-loop-if-convert")))
#else
#define FG_NO_IF_CONVERT
#endif
"""

# the inline helpers, by the name a kernel calls them by
HELPERS = {
    "fg_bf16_to_f32": """\
static inline float fg_bf16_to_f32(unsigned short b) { unsigned int u = (unsigned int)b << 16; \
float f; memcpy(&f, &u, 4); return f; }
""",
    "fg_f32_to_bf16": """\
static inline unsigned short fg_f32_to_bf16(float f) {
  unsigned int u; memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return (unsigned short)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
""",
    "fg_fp8_to_f32": """\
static inline float fg_fp8_to_f32(unsigned char b, int mbits, int bias, int has_inf, int fnuz, int nan_bits) {
  int top = (1 << (7 - mbits)) - 1, e = (b & 0x7F) >> mbits, m = b & ((1 << mbits) - 1);
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (fnuz ? b == 0x80 : (b & 0x7F) == nan_bits || (has_inf && e == top && m)) return copysignf(NAN, sign);
  if (has_inf && e == top) return sign * INFINITY;
  return sign * (e ? ldexpf((float)(m | (1 << mbits)), e - bias - mbits) : ldexpf((float)m, 1 - bias - mbits));
}
""",
    # c ? a : b by bit masks, both already computed: a ?: stays a branch under trapping math, and its loop scalar
    **{
        name: f"""\
static inline __attribute__((always_inline)) {t} {name}(_Bool c, {t} a, {t} b) {{
  {bits} m = -({bits})c, x, y;
  memcpy(&x, &a, {size});
  memcpy(&y, &b, {size});
  x = (x & m) | (y & ~m);
  memcpy(&a, &x, {size});
  return a;
}}
"""
        for name, t, bits, size in (
            ("fg_selectf", "float", "unsigned int", 4),
            ("fg_select", "double", "unsigned long long", 8),
        )
    },
    "fg_expf": """\
/* float exp as arithmetic (fg_exp_<vector type> below, lane by lane): libm's expf is a call that no loop vectorizes */
static inline __attribute__((always_inline)) float fg_expf(float x) {
  /* the clamp and the NaN guard as bit masks: under trapping math a ?: over a float compare stays a branch, and the
     loop around it scalar; a lane below -104 is computed from 0 and masked to 0 at the end (from -104 its multiplies
     underflowed through subnormals, 3x slower) */
  unsigned int bits, hi = -(unsigned int)(x > 89.0f), lo = -(unsigned int)(x < -104.0f);
  memcpy(&bits, &x, 4);
  bits = (bits & ~hi & ~lo) | (0x42b20000u & hi); /* 89.0f */
  memcpy(&x, &bits, 4);
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  unsigned int number = -(unsigned int)(n == n);
  memcpy(&bits, &n, 4);
  bits &= number;
  memcpy(&n, &bits, 4);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * (r * r) + r + 1.0f;
  int k = (int)n, h = k >> 1, a = (h + 127) << 23, b = (k - h + 127) << 23;
  float fa, fb;
  memcpy(&fa, &a, 4);
  memcpy(&fb, &b, 4);
  float y = p * fa * fb;
  memcpy(&bits, &y, 4);
  bits &= ~lo;
  memcpy(&y, &bits, 4);
  return y;
}
""",
    "fg_logf": """\
/* float log as arithmetic: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172,
   by its series to s^9 (the next term is under 1e-8 of the result); e ln 2 in two parts as in fg_expf */
static inline __attribute__((always_inline)) float fg_logf(float x) {
  int sub = x < 1.17549435e-38f;  /* subnormal (or not positive: replaced at the end) */
  float xs = x * (1.0f + (float)sub * 8388607.0f);
  unsigned int u;
  memcpy(&u, &xs, 4);
  int e = (int)((u >> 23) & 0xff) - 127 - 23 * sub;
  unsigned int mu = (u & 0x007fffffu) | 0x3f800000u;
  float m;
  memcpy(&m, &mu, 4);
  int big = m > 1.41421356f;
  m = m * (1.0f - 0.5f * (float)big);
  float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  float p = s2 * (1.0f / 9) + 1.0f / 7;
  p = p * s2 + 1.0f / 5;
  p = p * s2 + 1.0f / 3;
  float fe = (float)(e + big);
  float r = fe * 0.693359375f + (fe * -2.12194440e-4f + (2.0f * s + (2.0f * s) * s2 * p));
  /* zero -> -inf, inf -> inf, negative or NaN -> NaN, chosen by bit masks: a ?: over the division would be a branch
     the compiler may not speculate, and the loop would stay scalar */
  unsigned int bits, normal = -(unsigned int)((x > 0.0f) & (x < INFINITY)), zero = -(unsigned int)(x == 0.0f);
  unsigned int inf = -(unsigned int)(x == INFINITY);
  unsigned int special = (0x7fc00000u & ~zero & ~inf) | (0xff800000u & zero) | (0x7f800000u & inf);
  memcpy(&bits, &r, 4);
  bits = (bits & normal) | (special & ~normal);
  memcpy(&r, &bits, 4);
  return r;
}
""",
    "fg_f64_to_fp8": """\
/* round to nearest even from the double; overflow saturates to max_bits or becomes inf (0x7C) */
static inline unsigned char fg_f64_to_fp8(double x, int mbits, int bias, int has_inf, int fnuz, int nan_bits,
                                          int max_bits, double max_value) {
  unsigned char sign = __builtin_signbit(x) ? 0x80 : 0;
  double a = fabs(x);
  if (a != a) return fnuz ? 0x80 : (sign | nan_bits);
  if (__builtin_isinf(a)) return has_inf ? (sign | 0x7C) : fnuz ? 0x80 : (sign | nan_bits);
  int e, min_e = 1 - bias;
  frexp(a, &e);
  e = (a == 0.0 || e - 1 < min_e) ? min_e : e - 1;
  double q = ldexp(1.0, e - mbits), r = nearbyint(a / q) * q;
  if (r > max_value) return sign | (has_inf ? 0x7C : max_bits);
  int bits;
  if (r < ldexp(1.0, min_e)) {
    bits = (int)(r / ldexp(1.0, min_e - mbits));
  } else {
    frexp(r, &e);
    bits = ((e - 2 + bias) << mbits) + (int)(r / ldexp(1.0, e - 1 - mbits));
  }
  return (fnuz && bits == 0) ? 0 : (sign | bits);
}
""",
}

# C library functions a kernel or helper may call, declared as the headers would (gcc and clang treat them as builtins)
_MATH_1 = ("sqrt", "exp", "log", "exp2", "log2", "sin", "cos", "trunc", "fabs", "floor", "ceil", "nearbyint")
_MATH_2 = ("pow", "copysign", "fmax", "fmin")
DECLARATIONS = (
    {f"{f}f": f"float {f}f(float);" for f in _MATH_1}
    | {f: f"double {f}(double);" for f in _MATH_1}
    | {f"{f}f": f"float {f}f(float, float);" for f in _MATH_2}
    | {f: f"double {f}(double, double);" for f in _MATH_2}
    | {"ldexpf": "float ldexpf(float, int);", "ldexp": "double ldexp(double, int);"}
    | {"frexp": "double frexp(double, int *);", "memcpy": "void *memcpy(void *, const void *, __SIZE_TYPE__);"}
)
MACROS = {"NAN": '#define NAN __builtin_nanf("")', "INFINITY": "#define INFINITY __builtin_inff()"}
# names followed by "(" that are no calls of a library function
_NOT_CALLS = frozenset(
    {"if", "for", "while", "switch", "return", "sizeof", "defined", "__attribute__", "optimize", "vector_size"}
    | {"aligned", "always_inline", "noinline", "__typeof__", "__alignof__"}
)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
# comments and preprocessor lines (a simd pragma's reduction(+:acc)) hold no calls
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|^[ \t]*#[^\n]*", re.S | re.M)
_DEFINED = re.compile(r"\b[A-Za-z_]\w*\s+\**\s*([A-Za-z_]\w*)\s*\([^;{()]*\)\s*\{")


def c_prelude(kernel: str) -> str:
    """The text before `kernel`: the helpers it calls and what they call, then declarations of the library functions
    and macros all of that uses; both headers instead when it calls anything else (the headers know every name)."""
    helpers: list[str] = []
    pending = [kernel]
    while pending:
        text = pending.pop()
        for name in _CALL.findall(_COMMENT.sub(" ", text)):
            if name in HELPERS and name not in helpers:
                helpers.append(name)
                pending.append(HELPERS[name])
    helpers = [h for h in HELPERS if h in helpers]  # HELPERS lists a helper before any helper that calls it
    code = _COMMENT.sub(" ", "".join(HELPERS[h] for h in helpers) + kernel)
    defined = set(_DEFINED.findall(code)) | set(helpers)
    calls = {c for c in _CALL.findall(code) if c not in _NOT_CALLS | defined and not c.startswith("__builtin_")}
    words = set(_WORD.findall(code))
    head = NO_IF_CONVERT if "FG_NO_IF_CONVERT" in words else ""
    if calls - DECLARATIONS.keys():
        head = "#include <math.h>\n#include <string.h>\n" + head
    else:
        head += "".join(DECLARATIONS[c] + "\n" for c in sorted(calls))
        head += "".join(MACROS[m] + "\n" for m in MACROS if m in words)
    return head + "".join(HELPERS[h] for h in helpers)


# a top-level item of a kernel's text before its function: a typedef line, or a helper from "static" to its "}"
_ITEM = re.compile(r"^typedef [^\n]*\n|^static [^\n]*\{\n.*?^\}\n", re.S | re.M)


def c_unit(kernels: list[tuple[str, str]]) -> str:
    """One translation unit holding several kernels, given as (function name, render_kernel text): one prelude, each
    typedef and vector helper once, then every function. Compiling it once costs about what one kernel alone costs."""
    items: dict[str, None] = {}
    functions = []
    for name, text in kernels:
        start = re.search(rf"^.*\bvoid {re.escape(name)}\(", text, re.M)
        if start is None:
            raise ValueError(f"kernel {name}: its text has no function named {name}")
        head = text[: start.start()]
        found = _ITEM.findall(head)
        if "".join(found) != head:
            raise ValueError(f"kernel {name}: its text before the function is not typedefs and static helpers")
        items.update(dict.fromkeys(found))
        functions.append(text[start.start() :])
    body = "".join(items) + "".join(functions)
    return c_prelude(body) + body
