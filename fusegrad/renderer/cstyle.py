"""Renders a linear kernel as C-family source: one statement per value, loops as for-statements.

`CStyleRenderer` holds what the C family shares, as two tables a dialect extends: `string_rewrite`, rules from a
linear UOp to its statement or expression (a PatternMatcher; ctx is the kernel being written), and `code_for_op`,
templates from an ALU op to its expression. A dialect is a subclass that overrides the class attributes (kernel prefix,
buffer address space, type names, constants, math names, vector types, thread indices) and adds or replaces rules:
`CRenderer` (C99 with GNU vector extensions, for the CPU device), `OpenCLRenderer` (OpenCL C) and `CUDARenderer`
(CUDA C) below."""

from __future__ import annotations
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable
from fusegrad.dtype import FP8_FORMATS, DType, dtypes, float_to_fp8
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat
from fusegrad.codegen.opt.packs import Pack
from fusegrad.renderer import Capabilities, Renderer


class RenderError(NotImplementedError):
    """The dialect cannot express this kernel (an op without a rule, a dtype the language lacks)."""


C_PRELUDE = """#include <math.h>
#include <string.h>
#if defined(__GNUC__) && !defined(__clang__)
#define FG_NO_IF_CONVERT __attribute__((optimize("no-tree-loop-if-convert")))
#else
#define FG_NO_IF_CONVERT
#endif
static inline float fg_bf16_to_f32(unsigned short b) { unsigned int u = (unsigned int)b << 16; \
float f; memcpy(&f, &u, 4); return f; }
static inline unsigned short fg_f32_to_bf16(float f) {
  unsigned int u; memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return (unsigned short)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
static inline float fg_fp8_to_f32(unsigned char b, int mbits, int bias, int has_inf, int fnuz, int nan_bits) {
  int top = (1 << (7 - mbits)) - 1, e = (b & 0x7F) >> mbits, m = b & ((1 << mbits) - 1);
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (fnuz ? b == 0x80 : (b & 0x7F) == nan_bits || (has_inf && e == top && m)) return copysignf(NAN, sign);
  if (has_inf && e == top) return sign * INFINITY;
  return sign * (e ? ldexpf((float)(m | (1 << mbits)), e - bias - mbits) : ldexpf((float)m, 1 - bias - mbits));
}
/* float exp as arithmetic (fg_exp_<vector type> below, lane by lane): libm's expf is a call that no loop vectorizes */
static inline __attribute__((always_inline)) float fg_expf(float x) {
  /* the clamps and the NaN guard as bit masks: under trapping math a ?: over a float compare stays a branch, and the
     loop around it scalar */
  unsigned int bits, hi = -(unsigned int)(x > 89.0f), lo = -(unsigned int)(x < -104.0f);
  memcpy(&bits, &x, 4);
  bits = (bits & ~hi & ~lo) | (0x42b20000u & hi) | (0xc2d00000u & lo); /* 89.0f, -104.0f */
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
  return p * fa * fb;
}
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
/* round to nearest even from the double; overflow saturates to max_bits or becomes inf (0x7C) */
static inline unsigned char fg_f64_to_fp8(double x, int mbits, int bias, int has_inf, int fnuz, int nan_bits,
                                          int max_bits, double max_value) {
  unsigned char sign = signbit(x) ? 0x80 : 0;
  double a = fabs(x);
  if (a != a) return fnuz ? 0x80 : (sign | nan_bits);
  if (isinf(a)) return has_inf ? (sign | 0x7C) : fnuz ? 0x80 : (sign | nan_bits);
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
"""


def _fp8_args(dt: DType) -> str:
    f = FP8_FORMATS[dt]
    return f"{f.mantissa_bits}, {f.bias}, {int(f.has_inf)}, {int(f.fnuz)}, {f.nan_bits}"


def _fp8_from(x: str, dt: DType) -> str:
    f = FP8_FORMATS[dt]
    return f"fg_f64_to_fp8({x}, {_fp8_args(dt)}, {f.max_bits}, {f.max_value!r})"


INFIX = {
    Ops.ADD: "+",
    Ops.MUL: "*",
    Ops.FDIV: "/",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.CMPEQ: "==",
    Ops.AND: "&",
    Ops.OR: "|",
    Ops.XOR: "^",
    Ops.SHL: "<<",
    Ops.SHR: ">>",
}
# the lanes of a comparison of float vectors
MASK_INT = {dtypes.float32: dtypes.int32, dtypes.float64: dtypes.int64}
MATH_FUNCTIONS = {
    Ops.SQRT: "sqrt",
    Ops.EXP: "exp",
    Ops.LOG: "log",
    Ops.EXP2: "exp2",
    Ops.LOG2: "log2",
    Ops.SIN: "sin",
    Ops.COS: "cos",
    Ops.TRUNC: "trunc",
    Ops.POW: "pow",
}


def _max(r: CStyleRenderer, dt: DType, a: list[str], srcs: tuple[UOp, ...]) -> str:
    x, y = a
    # NaN wins like torch.maximum; integers compare plainly
    return f"(({x}>{y}||{x}!={x})?{x}:{y})" if dtypes.is_float(dt) else f"(({x}>{y})?{x}:{y})"


def _division(op: Ops) -> Callable[[CStyleRenderer, DType, list[str], tuple[UOp, ...]], str]:
    sym = "/" if op is Ops.IDIV else "%"

    def render(r: CStyleRenderer, dt: DType, a: list[str], srcs: tuple[UOp, ...]) -> str:
        # C traps on integer division by zero; the result is defined as 0 instead (matches the PYTHON backend)
        if srcs[1].op is Ops.CONST and srcs[1].arg > 0:
            return f"({a[0]}{sym}{a[1]})"
        if dtypes.is_unsigned(dt):
            return f"(({a[1]})==0?0:({a[0]}{sym}{a[1]}))"
        # signed MIN / -1 traps too; x / -1 is -x (wrapping) and x % -1 is 0
        neg = r.render_wrapping(Ops.NEG, dt, a[:1]) if dt in r.wrapping_types else f"(-({a[0]}))"
        return f"(({a[1]})==0?0:({a[1]})==-1?{neg if op is Ops.IDIV else '0'}:({a[0]}{sym}{a[1]}))"

    return render


def _infix(op: Ops) -> Callable[[CStyleRenderer, DType, list[str], tuple[UOp, ...]], str]:
    return lambda r, dt, a, srcs: f"({a[0]}{INFIX[op]}{a[1]})"


def _math(op: Ops) -> Callable[[CStyleRenderer, DType, list[str], tuple[UOp, ...]], str]:
    return lambda r, dt, a, srcs: f"{r.math_function(op, srcs[0].dtype)}({', '.join(a)})"


# op -> template(renderer, result dtype, operand expressions, operand UOps); bool ADD/MUL are OR/AND
CODE_FOR_OP: dict[Ops, Callable[[CStyleRenderer, DType, list[str], tuple[UOp, ...]], str]] = {
    **{op: _infix(op) for op in INFIX},
    **{op: _math(op) for op in MATH_FUNCTIONS},
    Ops.NEG: lambda r, dt, a, srcs: f"(!{a[0]})" if dt is dtypes.bool else f"(-{a[0]})",
    Ops.RECIPROCAL: lambda r, dt, a, srcs: f"(1/{a[0]})" if dt is dtypes.float64 else f"(1.0f/{a[0]})",
    Ops.MAX: _max,
    Ops.IDIV: _division(Ops.IDIV),
    Ops.MOD: _division(Ops.MOD),
    Ops.WHERE: lambda r, dt, a, srcs: f"({a[0]}?{a[1]}:{a[2]})",
}


@dataclass
class KernelText:
    """One kernel being written: names given to values, the lines so far, and the vectors (packs) found."""

    renderer: CStyleRenderer
    lin: tuple[UOp, ...]
    packs: dict[UOp, tuple[Pack, int]]
    names: dict[UOp, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    counters: Counter = field(default_factory=Counter)
    vec_names: dict[Pack, str] = field(default_factory=dict)
    vec_types: dict[str, str] = field(default_factory=dict)
    depth: int = 1
    outer: UOp | None = None  # the outermost global loop, which a dialect splits over threads or work items
    reads_data: dict[UOp, bool] = field(default_factory=dict)
    uses: Counter = field(default_factory=Counter)
    # a float max reduced in a simd loop (CRenderer): accumulator name -> the flag that records a NaN, and per loop
    # the lines after it that put the NaN back
    simd_max: dict[str, str] = field(default_factory=dict)
    after_loop: dict[UOp, list[str]] = field(default_factory=dict)

    def fresh(self, prefix: str) -> str:
        self.counters[prefix] += 1
        return f"{prefix}{self.counters[prefix] - 1}"

    def ref(self, u: UOp) -> str:
        return self.renderer.render_const(u.arg, u.dtype) if u.op is Ops.CONST else self.names[u]

    def line(self, s: str) -> None:
        self.lines.extend("  " * self.depth + part for part in s.split("\n"))

    def vtype(self, pack: Pack) -> str:
        # a comparison of float vectors gives integer lanes of the same width (all ones where it holds)
        dt = MASK_INT[pack.mask_of] if pack.mask_of is not None else pack.dtype
        name, definition = self.renderer.vector_type(dt, len(pack.lanes))
        if definition:
            self.vec_types[name] = definition
        return name

    def vref(self, s: UOp) -> str:
        # a pack operand is its vector; a scalar one is broadcast by the dialect's vector-scalar arithmetic
        return self.vec_names[self.packs[s][0]] if s in self.packs else self.ref(s)

    def vref_as(self, s: UOp, t: str) -> str:
        """vref, with a scalar broadcast explicitly to vector type t (where C wants both sides of that type)."""
        return self.vref(s) if s in self.packs else f"(({t}){{}} + {self.ref(s)})"

    def address(self, u: UOp, pack: Pack) -> str:
        return f"{self.ref(u.src[0])} + ({self.ref(pack.base)}+{pack.offset})"  # type: ignore[arg-type]


def _load(ctx: KernelText, x: UOp) -> str:
    load = f"{ctx.ref(x.src[0])}[{ctx.ref(x.src[1])}]"
    return f"({ctx.ref(x.src[2])}?{load}:{ctx.renderer.render_const(0, x.dtype)})" if len(x.src) == 3 else load


def _acc_update(ctx: KernelText, x: UOp) -> str:
    acc = ctx.names[x.src[0]]
    ctx.names[x] = acc
    value = ctx.renderer.render_alu(x.arg, x.dtype, [acc, ctx.ref(x.src[1])], (x.src[0], x.src[1]), wrap=True)
    return f"{acc} = {value};"


def _bitcast(ctx: KernelText, x: UOp) -> str:
    t, s = ctx.renderer.ctype(x.dtype), ctx.renderer.ctype(x.src[0].dtype)
    return f"({{ {t} bc_; {s} in_ = {ctx.ref(x.src[0])}; memcpy(&bc_, &in_, sizeof(bc_)); bc_; }})"


# statements return a line; values (LOAD, DEFINE_ACC, ALU, CAST, BITCAST) return the expression the kernel names
base_rewrite = PatternMatcher(
    [
        (UPat(Ops.DEFINE_GLOBAL, name="x"), lambda ctx, x: ctx.names.setdefault(x, f"data{x.arg[0]}") and ""),
        (UPat(Ops.RANGE, name="x"), lambda ctx, x: ctx.renderer.render_range(ctx, x)),
        (UPat(Ops.ENDRANGE), lambda ctx: "}"),
        (UPat(Ops.DEFINE_ACC, name="x"), lambda ctx, x: ctx.ref(x.src[0])),
        (UPat(Ops.ACC_UPDATE, name="x"), _acc_update),
        (UPat(Ops.LOAD, name="x"), _load),
        (UPat(Ops.STORE, name="x"), lambda ctx, x: f"{ctx.ref(x.src[0])}[{ctx.ref(x.src[1])}] = {ctx.ref(x.src[2])};"),
        (
            UPat(Ops.CAST, name="x"),
            lambda ctx, x: ctx.renderer.render_cast(ctx.ref(x.src[0]), x.src[0].dtype, x.dtype),
        ),
        (UPat(Ops.BITCAST, name="x"), _bitcast),
        (
            UPat(GroupOp.ALU, name="x"),
            lambda ctx, x: ctx.renderer.render_alu(
                x.op, x.dtype, [ctx.ref(s) for s in x.src], x.src, wrap=ctx.reads_data[x]
            ),
        ),
    ]
)

# the prefix a value's name starts with; every other op is a statement
VALUE_PREFIX = {Ops.LOAD: "val", Ops.DEFINE_ACC: "acc", Ops.CAST: "cast", Ops.BITCAST: "cast"} | {
    op: "alu" for op in GroupOp.ALU
}


class CStyleRenderer(Renderer):
    """What the C family shares. The class attributes and the two tables are the dialect's knobs; the methods below
    them are hooks a dialect overrides when a table entry is not enough. Scalar code, every loop a for-statement."""

    kernel_prefix = ""  # before the return type: "__kernel " (OpenCL C), 'extern "C" __global__ ' (CUDA C)
    buffer_prefix = ""  # address space of a buffer parameter: "__global " (OpenCL C)
    extra_params: tuple[str, ...] = ()  # scalar parameters after the buffers (C: the thread's slice of the outer loop)
    prelude = ""  # includes and helpers before the kernel
    type_map: dict[DType, str] = {dtypes.bool: "_Bool"}
    unsupported: tuple[DType, ...] = ()  # dtypes the language lacks: rendering a kernel using one raises RenderError
    float32_math_suffix = "f"  # sqrtf (C, CUDA C) or the overloaded sqrt (OpenCL C)
    nan, infinity = "NAN", "INFINITY"
    int64_suffix, uint64_suffix = "LL", "ULL"
    # integer data arithmetic that wraps: computed in the unsigned type and converted back
    wrapping_types: dict[DType, str] = {dtypes.int32: "unsigned int", dtypes.int64: "unsigned long long"}
    code_for_op = CODE_FOR_OP
    string_rewrite = base_rewrite

    # ---- hooks

    def ctype(self, dt: DType) -> str:
        return self.type_map.get(dt, dt.name)

    def math_function(self, op: Ops, dt: DType) -> str:
        return MATH_FUNCTIONS[op] + (self.float32_math_suffix if dt is dtypes.float32 else "")

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        name, t = ctx.names[u], self.ctype(u.dtype)
        return f"for ({t} {name} = 0; {name} < {ctx.ref(u.src[0])}; {name}++) {{"

    def vector_type(self, dt: DType, n: int) -> tuple[str, str]:
        """(type name, its definition or "") of n lanes of dt."""
        raise RenderError(f"{type(self).__name__} has no vector types")

    def lane(self, vector: str, i: int) -> str:
        return f"{vector}[{i}]"

    def render_prelude(self, lin: tuple[UOp, ...]) -> str:
        return self.prelude

    def function_attributes(self, lin: tuple[UOp, ...], packs: dict) -> str:
        """What stands between the kernel prefix and `void`: nothing, unless a dialect needs a per-kernel attribute."""
        return ""

    def render_float(self, s: str, dt: DType) -> str:
        """A float literal `s` (digits, or the dialect's NaN/infinity) as a constant of dt."""
        if dt is dtypes.float64 and s in (self.nan, self.infinity, f"(-{self.infinity})"):
            return f"((double){s})"
        if dt is dtypes.float16:
            return f"(({self.ctype(dt)}){s})"
        if dt is dtypes.bfloat16:
            return f"fg_f32_to_bf16({s})"
        return s

    def render_const(self, value: object, dt: DType) -> str:
        if dt is dtypes.bool:
            return "1" if value else "0"
        if dt in FP8_FORMATS:
            return f"((unsigned char){float_to_fp8(value, dt):#04x})"
        if dtypes.is_float(dt):
            v = float(value)  # type: ignore[arg-type]
            if math.isnan(v):
                s = self.nan
            elif math.isinf(v):
                s = self.infinity if v > 0 else f"(-{self.infinity})"
            else:
                s = repr(v) + ("f" if dt is not dtypes.float64 else "")
            return self.render_float(s, dt)
        v = int(value)  # type: ignore[call-overload]
        if dt is dtypes.int64:
            return f"{v}{self.int64_suffix}" if v != -(2**63) else f"(-9223372036854775807{self.int64_suffix}-1)"
        if dt is dtypes.uint64:
            return f"{v}{self.uint64_suffix}"
        if dt is dtypes.uint32:
            return f"{v}u"
        if dt is dtypes.int32 and v == -(2**31):
            return "(-2147483647-1)"
        return str(v) if v >= 0 else f"({v})"

    def render_wrapping(self, op: Ops, dt: DType, args: list[str]) -> str:
        """Signed data arithmetic that wraps like torch: computed in the unsigned type, converted back."""
        u, t = self.wrapping_types[dt], self.ctype(dt)
        if op is Ops.NEG:
            return f"(({t})(0-({u})({args[0]})))"
        if op is Ops.SHL:
            return f"(({t})(({u})({args[0]})<<({args[1]})))"
        return f"(({t})(({u})({args[0]}){INFIX[op]}({u})({args[1]})))"

    def render_alu(self, op: Ops, dt: DType, args: list[str], srcs: tuple[UOp, ...], wrap: bool = False) -> str:
        if wrap and dt in self.wrapping_types and op in (Ops.ADD, Ops.MUL, Ops.NEG, Ops.SHL):
            return self.render_wrapping(op, dt, args)
        if op is Ops.ADD and dt is dtypes.bool:
            expr = f"({args[0]}|{args[1]})"
        elif op is Ops.MUL and dt is dtypes.bool:
            expr = f"({args[0]}&{args[1]})"
        elif (template := self.code_for_op.get(op)) is not None:
            expr = template(self, dt, args, srcs)
        else:
            raise RenderError(f"{type(self).__name__} has no template for {op}")
        # C computes narrow integers as int: cast back so wrap-around matches the dtype
        if dtypes.is_int(dt) and dt.itemsize < 4 and op not in GroupOp.Comparison:
            expr = f"(({self.ctype(dt)}){expr})"
        return expr

    def render_cast(self, x: str, src: DType, dst: DType) -> str:
        if src in FP8_FORMATS:
            return f"fg_fp8_to_f32({x}, {_fp8_args(src)})"
        if dst in FP8_FORMATS:
            return _fp8_from(x, dst)
        if src is dtypes.bfloat16:
            return f"fg_bf16_to_f32({x})"
        if dst is dtypes.bfloat16:
            return f"fg_f32_to_bf16({x})"
        if dst is dtypes.bool and src is not dtypes.bool:
            return f"(({x})!=0)"  # what a cast to bool means, without the compiler's warning on (bool)(a*b)
        return f"(({self.ctype(dst)})({x}))"

    def render_vector(self, ctx: KernelText, u: UOp, pack: Pack) -> None:
        raise RenderError(f"{type(self).__name__} has no vector rules")

    def buffer_type(self, dt: DType) -> str:
        """The element type of a buffer parameter (OpenCL C forbids bool there)."""
        return self.ctype(dt)

    def render_params(self, lin: tuple[UOp, ...]) -> list[str]:
        stored = {u.src[0] for u in lin if u.op is Ops.STORE}
        return [
            f"{self.buffer_prefix}{'const ' if p not in stored else ''}{self.buffer_type(p.dtype)}* data{p.arg[0]}"
            for p in lin
            if p.op is Ops.DEFINE_GLOBAL
        ] + list(self.extra_params)

    # ---- the driver

    def render(self, name: str, lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]] | None = None) -> str:
        for u in lin:
            if u.dtype in self.unsupported:
                raise RenderError(f"{type(self).__name__} cannot render {u.dtype} (kernel {name}, {u.op})")
        packs = {} if packs is None else packs
        ctx = KernelText(self, lin, packs, uses=Counter(s for u in lin for s in u.src))
        ctx.outer = next((u for u in lin if u.op is Ops.RANGE and u.arg[1] == "global"), None)
        # integer math on loaded data wraps like torch; index math over loops cannot overflow, so it stays plain signed
        # arithmetic the compiler may assume affine (and vectorize)
        for u in lin:
            ctx.reads_data[u] = u.op in (Ops.LOAD, Ops.DEFINE_ACC, Ops.ACC_UPDATE) or any(
                ctx.reads_data.get(x, False) for x in u.src
            )
        for u in lin:
            if u in packs:
                pack, lane = packs[u]
                if pack not in ctx.vec_names:
                    self.render_vector(ctx, u, pack)
                if u.op is not Ops.STORE:
                    # a mask lane is all ones where true: a scalar user gets it as 0/1
                    lane_expr = self.lane(ctx.vec_names[pack], lane)
                    ctx.names[u] = f"({lane_expr}!=0)" if pack.mask_of is not None else lane_expr
                continue
            if u.op is Ops.CONST:
                continue
            if u.op is Ops.RANGE:
                ctx.names[u] = ctx.fresh("gidx" if u.arg[1] == "global" else "ridx")
            if u.op is Ops.ENDRANGE:
                ctx.depth -= 1
            if (text := self.string_rewrite.rewrite(u, ctx)) is None:
                raise RenderError(f"{type(self).__name__} has no rule for {u.op}")
            if (prefix := VALUE_PREFIX.get(u.op)) is None:
                if text:
                    ctx.line(text)
            # single-use integer index math is inlined so the indexing reads like the formula it is
            elif u.op in GroupOp.ALU and ctx.uses[u] == 1 and dtypes.is_int(u.dtype):
                ctx.names[u] = text
            else:
                ctx.names[u] = ctx.fresh(prefix)
                ctx.line(f"{self.ctype(u.dtype)} {ctx.names[u]} = {text};")
            if u.op is Ops.RANGE:
                ctx.depth += 1
        typedefs = "".join(t + "\n" for t in ctx.vec_types.values())
        params = ", ".join(self.render_params(lin))
        return (
            self.render_prelude(lin)
            + typedefs
            + f"{self.kernel_prefix}{self.function_attributes(lin, packs)}void {name}({params}) {{\n"
            + "\n".join(ctx.lines)
            + "\n}\n"
        )


def _innermost_updates(r: UOp, lin: tuple[UOp, ...]) -> list[UOp] | None:
    """The accumulator updates of loop r, or None when r holds another loop."""
    body = []
    for u in lin[lin.index(r) + 1 :]:
        if u.op is Ops.ENDRANGE and u.src[0] is r:
            break
        if u.op is Ops.RANGE:
            return None
        body.append(u)
    return [u for u in body if u.op is Ops.ACC_UPDATE and r in u.src[2:]]


def _simd_reduction(r: UOp, lin: tuple[UOp, ...], names: dict[UOp, str], packs: dict) -> str | None:
    """An innermost sum loop may be vectorized: the pragma allows reassociating only its accumulators. Several
    accumulators that form no vector (a register tile of outputs whose inputs are both contiguous along the reduce,
    x @ W.T) are vectorized along the loop, each in its own vector."""
    if (updates := _innermost_updates(r, lin)) is None:
        return None
    # several accumulators are better vectorized across each other (SLP) than along the loop, when they pack
    if (
        not updates
        or (len(updates) > 1 and any(u in packs for u in updates))
        or any(
            u.arg is not Ops.ADD or u.dtype not in (dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64)
            for u in updates
        )
    ):
        return None
    accs = ", ".join(names[u.src[0]] for u in updates)
    return f"#pragma omp simd reduction(+:{accs})"


def _simd_max(ctx: KernelText, r: UOp) -> str | None:
    """An innermost loop that only takes float maxes (a row max) is vectorized too: each accumulator keeps the largest
    non-NaN value (`max` reassociates those exactly) and a flag of its own records a NaN, which after the loop becomes
    the result, as the scalar form's NaN wins. Zeros of either sign compare equal: which one a vector keeps may differ
    from the scalar order."""
    updates = _innermost_updates(r, ctx.lin)
    if not updates or any(
        u.arg is not Ops.MAX or u.dtype not in (dtypes.float32, dtypes.float64) or u in ctx.packs for u in updates
    ):
        return None
    dtypes_of = {ctx.names[u.src[0]]: u.dtype for u in updates}  # each accumulator once, in order
    flags = [ctx.simd_max.setdefault(acc, ctx.fresh("nan")) for acc in dtypes_of]
    ctx.after_loop[r] = [
        f"{acc} = {flag} ? {ctx.renderer.render_const(math.nan, dt)} : {acc};"
        for (acc, dt), flag in zip(dtypes_of.items(), flags)
    ]
    declared = "\n".join(f"int {flag} = 0;" for flag in flags)
    return f"{declared}\n#pragma omp simd reduction(max:{', '.join(dtypes_of)}) reduction(|:{', '.join(flags)})"


def _simd_max_update(ctx: KernelText, x: UOp) -> str | None:
    if (flag := ctx.simd_max.get(acc := ctx.names[x.src[0]])) is None:
        return None  # the plain update
    ctx.names[x] = acc
    v = ctx.ref(x.src[1])
    return f"{acc} = ({v}>={acc})?{v}:{acc};\n{flag} |= ({v}!={v});"


def _end_simd_max(ctx: KernelText, x: UOp) -> str | None:
    return None if (after := ctx.after_loop.pop(x.src[0], None)) is None else "\n".join(["}", *after])


def _gcc_vector_where(ctx: KernelText, u: UOp, pack: Pack, vname: str, t: str) -> str:
    # C's conditional needs both arms of the vector type: a scalar arm is broadcast explicitly
    arms = [ctx.vref_as(s, t) for s in u.src[1:]]
    if u.src[0] in ctx.packs:  # a mask: bitwise select of the arms' bits (C has no lane-wise ?:)
        mask = ctx.packs[u.src[0]][0]
        m, it = ctx.vec_names[mask], ctx.vtype(mask)
        return f"{t} {vname} = ({t})((({it}){arms[0]} & {m}) | (({it}){arms[1]} & ~{m}));"
    return f"{t} {vname} = ({ctx.ref(u.src[0])} ? {arms[0]} : {arms[1]});"


def _gcc_vector_compare(ctx: KernelText, u: UOp, pack: Pack, vname: str, t: str) -> str:
    # a comparison of float vectors gives all-ones integer lanes where it holds; a scalar side is broadcast
    if pack.mask_of is None:
        raise RenderError(f"a vector {u.op} must produce a mask pack")
    ft = ctx.vtype(ctx.packs[next(s for s in u.src if s in ctx.packs)][0])
    sides = [ctx.vref_as(s, ft) for s in u.src]
    return f"{t} {vname} = ({sides[0]}{INFIX[u.op]}{sides[1]});"


def _gcc_vector_load(ctx: KernelText, u: UOp, pack: Pack, vname: str, t: str) -> str:
    if len(u.src) == 3:  # gated: zeros, and memory is read only where the gate holds
        gate = ctx.ref(u.src[2])
        return f"{t} {vname} = {{}};\nif ({gate}) __builtin_memcpy(&{vname}, {ctx.address(u, pack)}, sizeof({vname}));"
    return f"{t} {vname};\n__builtin_memcpy(&{vname}, {ctx.address(u, pack)}, sizeof({vname}));"


# exp of float lanes (C's expf has no vector form): n = round(x / ln 2), r = x - n ln 2 in two parts (Cody-Waite),
# e^r by its Taylor series to r^7 (|r| <= ln2/2: truncation ~1e-8, under float's ulp), 2^n as two factors so
# subnormal results and the overflow to inf come out of the multiplies; x is clamped first (n stays a normal
# exponent) and a NaN lane keeps its NaN
GCC_VECTOR_EXP = """static inline __attribute__((always_inline)) {t} fg_exp_{t}({t} x) {{
  {t} top = ({t}){{}} + 89.0f, bottom = ({t}){{}} - 104.0f, magic = ({t}){{}} + 12582912.0f;
  {it} hi = x > top, lo = x < bottom;
  x = ({t})((({it})x & ~hi) | (({it})top & hi));
  x = ({t})((({it})x & ~lo) | (({it})bottom & lo));
  {t} n = (x * 1.44269504088896341f + magic) - magic;
  n = ({t})(({it})n & (n == n));
  {t} r = x - n * 0.693359375f;  // ln 2 = 355/512 (exact in float) - 2.12194440e-4
  r = r + n * 2.12194440e-4f;
  {t} p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * (r * r) + r + 1.0f;
  {it} k = __builtin_convertvector(n, {it}), h = k >> 1;
  return p * ({t})((h + 127) << 23) * ({t})((k - h + 127) << 23);
}}"""


def _gcc_vector_exp(ctx: KernelText, u: UOp, pack: Pack, vname: str, t: str) -> str:
    it, definition = ctx.renderer.vector_type(dtypes.int32, len(pack.lanes))
    if definition:
        ctx.vec_types.setdefault(it, definition)
    ctx.vec_types.setdefault(f"fg_exp_{t}", GCC_VECTOR_EXP.format(t=t, it=it))
    return f"{t} {vname} = fg_exp_{t}({ctx.vref(u.src[0])});"


def _gcc_vector_max(ctx: KernelText, pack: Pack, dst: str, srcs: tuple[UOp, ...], t: str) -> str:
    # the scalar _max lane by lane (NaN wins, a tie keeps y): C has no lane-wise ?:, so a bitwise select on the mask
    x, y = (ctx.vref_as(s, t) for s in srcs)
    it, definition = ctx.renderer.vector_type(MASK_INT[pack.dtype], len(pack.lanes))
    if definition:
        ctx.vec_types.setdefault(it, definition)
    m = ctx.fresh("vmask")
    return f"{it} {m} = ({x}>{y}) | ({x}!={x});\n{dst} = ({t})((({it}){x} & {m}) | (({it}){y} & ~{m}));"


def _gcc_vector_reciprocal(ctx: KernelText, u: UOp, pack: Pack, vname: str, t: str) -> str:
    return f"{t} {vname} = ({ctx.renderer.render_const(1.0, pack.dtype)}/{ctx.vref(u.src[0])});"


# one vector instruction per pack, in GCC's vector extension: (ctx, first lane, pack, vector name, vector type) -> text
GCC_VECTOR_RULES: dict[Ops, Callable[[KernelText, UOp, Pack, str, str], str]] = {
    Ops.LOAD: _gcc_vector_load,
    Ops.DEFINE_ACC: lambda ctx, u, pack, v, t: f"{t} {v} = ({t}){{}} + {ctx.ref(u.src[0])};",
    Ops.NEG: lambda ctx, u, pack, v, t: f"{t} {v} = -{ctx.vref(u.src[0])};",
    Ops.RECIPROCAL: _gcc_vector_reciprocal,
    Ops.EXP: _gcc_vector_exp,
    Ops.WHERE: _gcc_vector_where,
    Ops.MAX: lambda ctx, u, pack, v, t: _gcc_vector_max(ctx, pack, f"{t} {v}", u.src, t),
    **{op: _gcc_vector_compare for op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE)},
    # lane-wise infix; AND/OR pack only as masks (all-ones lanes), where bitwise is logical
    **{
        op: (lambda op: lambda ctx, u, pack, v, t: f"{t} {v} = ({ctx.vref(u.src[0])}{INFIX[op]}{ctx.vref(u.src[1])});")(
            op
        )
        for op in (Ops.ADD, Ops.MUL, Ops.FDIV, Ops.AND, Ops.OR)
    },
}


# float32 math the C prelude computes inline, where libm's function is a call per element that no loop vectorizes
C_INLINE_MATH = {Ops.EXP: "fg_expf", Ops.LOG: "fg_logf"}


class CRenderer(CStyleRenderer):
    """C99 with GNU extensions for the CPU device: explicit vectors (GCC vector extensions) where the opts upcast, and
    the outermost global loop runs [core_start, core_end) so threads can split it."""

    prelude = C_PRELUDE
    string_rewrite = (
        PatternMatcher(
            [(UPat(Ops.ACC_UPDATE, name="x"), _simd_max_update), (UPat(Ops.ENDRANGE, name="x"), _end_simd_max)]
        )
        + base_rewrite
    )
    extra_params = ("long long core_start", "long long core_end")
    type_map = {dtypes.bool: "_Bool", dtypes.float16: "_Float16", dtypes.bfloat16: "unsigned short"} | {
        dt: "unsigned char" for dt in dtypes.fp8s
    }
    vector_rules = GCC_VECTOR_RULES
    # SSE2-sized vectors without a device; the CPU device passes its compiler's -march=native values
    capabilities = Capabilities(
        vector_types=True,
        vector_math=frozenset(
            {(Ops.RECIPROCAL, dtypes.float32), (Ops.RECIPROCAL, dtypes.float64), (Ops.EXP, dtypes.float32)}
            | {(Ops.MAX, dtypes.float32), (Ops.MAX, dtypes.float64)}
        ),
    )

    def function_attributes(self, lin: tuple[UOp, ...], packs: dict) -> str:
        # GCC 12's loop vectorizer miscompiles two if-converted loads of one buffer in a loop that strides over them
        # (an upcast over a padded axis: each lane's gate and offset), reading the wrong elements; such kernels keep
        # their conditional loads as branches (tests/renderer/test_cstyle.py holds the smallest such kernel)
        gated = Counter(u.src[0] for u in lin if u.op is Ops.LOAD and len(u.src) == 3 and u not in packs)
        return "FG_NO_IF_CONVERT " if any(n >= 2 for n in gated.values()) else ""

    def math_function(self, op: Ops, dt: DType) -> str:
        # float exp and log inline (fg_expf, fg_logf): a loop over them vectorizes; exp's values are the vector exp's
        if dt is dtypes.float32 and (inline := C_INLINE_MATH.get(op)) is not None:
            return inline
        return super().math_function(op, dt)

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        name, t = ctx.names[u], self.ctype(u.dtype)
        if u is ctx.outer:
            return f"for ({t} {name} = core_start; {name} < core_end; {name}++) {{"
        loop = super().render_range(ctx, u)
        pragma = _simd_reduction(u, ctx.lin, ctx.names, ctx.packs) or _simd_max(ctx, u)
        return f"{pragma}\n{loop}" if pragma else loop

    def vector_type(self, dt: DType, n: int) -> tuple[str, str]:
        name = f"fg_{dt.name.replace(' ', '_')}x{n}"  # one identifier: int64 is "long long"
        return name, f"typedef {self.ctype(dt)} {name} __attribute__((vector_size({n * dt.itemsize})));"

    def render_vector(self, ctx: KernelText, u: UOp, pack: Pack) -> None:
        if u.op is Ops.STORE:
            value = ctx.vec_names[pack] = ctx.vec_names[ctx.packs[u.src[2]][0]]
            ctx.line(f"__builtin_memcpy({ctx.address(u, pack)}, &{value}, sizeof({value}));")
        elif u.op is Ops.ACC_UPDATE:
            acc = ctx.vec_names[pack] = ctx.vec_names[ctx.packs[u.src[0]][0]]
            if u.arg is Ops.MAX:
                ctx.line(_gcc_vector_max(ctx, pack, acc, u.src[:2], ctx.vtype(pack)))
            elif u.arg is Ops.ADD:
                ctx.line(f"{acc} = {acc} + {ctx.vref(u.src[1])};")
            else:
                raise RenderError(f"{type(self).__name__} has no vector accumulator update for {u.arg}")
        elif (rule := self.vector_rules.get(u.op)) is not None:
            vname = ctx.vec_names[pack] = ctx.fresh("vec")
            ctx.line(rule(ctx, u, pack, vname, ctx.vtype(pack)))
        else:
            raise RenderError(f"{type(self).__name__} has no vector rule for {u.op}")


# ---- GPU dialects: one work item per iteration of the outermost global loop; the launch's global size is its trip
# count (KernelInfo.outer_size). Rendering only here: the devices that compile and run them bring their runtimes.


def _uses(lin: tuple[UOp, ...], dt: DType) -> bool:
    return any(u.dtype is dt or (u.op is Ops.CAST and u.src[0].dtype is dt) for u in lin)


OPENCL_BF16 = """inline float fg_bf16_to_f32(ushort b) { return as_float((uint)b << 16); }
inline ushort fg_f32_to_bf16(float f) {
  uint u = as_uint(f);
  if (f != f) return 0x7FC0;
  return (ushort)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
"""


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C: `__kernel` functions over `__global` buffers, work item i runs iteration i of the outer loop; native
    vector types (float4) loaded with vload/vstore; half through cl_khr_fp16."""

    kernel_prefix = "__kernel "
    buffer_prefix = "__global "
    type_map = {
        dtypes.bool: "bool",
        dtypes.float16: "half",
        dtypes.bfloat16: "ushort",
        dtypes.int8: "char",
        dtypes.uint8: "uchar",
        dtypes.uint16: "ushort",
        dtypes.uint32: "uint",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
    }
    unsupported = dtypes.fp8s
    float32_math_suffix = ""  # the math builtins are overloaded
    int64_suffix, uint64_suffix = "L", "UL"
    wrapping_types = {dtypes.int32: "uint", dtypes.int64: "ulong"}
    capabilities = Capabilities(vector_bytes=16, vector_types=True)  # float4 / double2
    string_rewrite = (
        PatternMatcher(
            [(UPat(Ops.BITCAST, name="x"), lambda ctx, x: f"as_{ctx.renderer.ctype(x.dtype)}({ctx.ref(x.src[0])})")]
        )
        + base_rewrite
    )

    def buffer_type(self, dt: DType) -> str:
        return "uchar" if dt is dtypes.bool else self.ctype(dt)

    def render_prelude(self, lin: tuple[UOp, ...]) -> str:
        half = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" if _uses(lin, dtypes.float16) else ""
        fp64 = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if _uses(lin, dtypes.float64) else ""
        return half + fp64 + (OPENCL_BF16 if _uses(lin, dtypes.bfloat16) else "")

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        if u is not ctx.outer:
            return super().render_range(ctx, u)
        name = ctx.names[u]
        return f"{self.ctype(u.dtype)} {name} = get_global_id(0);\nif ({name} < {ctx.ref(u.src[0])}) {{"

    def vector_type(self, dt: DType, n: int) -> tuple[str, str]:
        return f"{self.ctype(dt)}{n}", ""

    def lane(self, vector: str, i: int) -> str:
        return f"{vector}.s{i:x}"

    def render_vector(self, ctx: KernelText, u: UOp, pack: Pack) -> None:
        n = len(pack.lanes)
        if u.op is Ops.STORE:
            value = ctx.vec_names[pack] = ctx.vec_names[ctx.packs[u.src[2]][0]]
            ctx.line(f"vstore{n}({value}, 0, {ctx.address(u, pack)});")
            return
        if u.op is Ops.ACC_UPDATE:
            if u.arg is not Ops.ADD:  # only sums pack here (MAX is not in this dialect's vector_math)
                raise RenderError(f"{type(self).__name__} has no vector accumulator update for {u.arg}")
            acc = ctx.vec_names[pack] = ctx.vec_names[ctx.packs[u.src[0]][0]]
            ctx.line(f"{acc} = {acc} + {ctx.vref(u.src[1])};")
            return
        v, t = ctx.fresh("vec"), ctx.vtype(pack)
        ctx.vec_names[pack] = v
        if u.op is Ops.LOAD:
            zero = f"({t})({self.render_const(0, pack.dtype)})"
            load = f"vload{n}(0, {ctx.address(u, pack)})"
            ctx.line(f"{t} {v} = {f'({ctx.ref(u.src[2])}?{load}:{zero})' if len(u.src) == 3 else load};")
        elif u.op is Ops.DEFINE_ACC:
            ctx.line(f"{t} {v} = ({t})({ctx.ref(u.src[0])});")
        elif u.op is Ops.NEG:
            ctx.line(f"{t} {v} = -{ctx.vref(u.src[0])};")
        elif u.op is Ops.WHERE:
            arms = [ctx.vref(s) if s in ctx.packs else f"({t})({ctx.ref(s)})" for s in u.src[1:]]
            if u.src[0] in ctx.packs:  # a mask pack selects lane by lane (select takes lanes whose top bit is set)
                ctx.line(f"{t} {v} = select({arms[1]}, {arms[0]}, {ctx.vec_names[ctx.packs[u.src[0]][0]]});")
            else:
                ctx.line(f"{t} {v} = ({ctx.ref(u.src[0])} ? {arms[0]} : {arms[1]});")
        elif u.op in INFIX:
            ctx.line(f"{t} {v} = ({ctx.vref(u.src[0])}{INFIX[u.op]}{ctx.vref(u.src[1])});")
        else:
            raise RenderError(f"{type(self).__name__} has no vector rule for {u.op}")


CUDA_PRELUDE = """#include <cuda_fp16.h>
__device__ inline float fg_bf16_to_f32(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
__device__ inline unsigned short fg_f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if (f != f) return 0x7FC0;
  return (unsigned short)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
template <class T, class F> __device__ inline T fg_bitcast(F x) { T y; memcpy(&y, &x, sizeof(y)); return y; }
"""


class CUDARenderer(CStyleRenderer):
    """CUDA C: `extern "C" __global__` kernels, thread blockIdx.x * blockDim.x + threadIdx.x runs that iteration of the
    outer loop; half from cuda_fp16.h; NaN/infinity from their bits (no math.h macros in device code); scalar code."""

    kernel_prefix = 'extern "C" __global__ '
    prelude = CUDA_PRELUDE
    type_map = {dtypes.bool: "bool", dtypes.float16: "half", dtypes.bfloat16: "unsigned short"}
    unsupported = dtypes.fp8s
    nan, infinity = "__int_as_float(0x7fc00000)", "__int_as_float(0x7f800000)"
    string_rewrite = (
        PatternMatcher(
            [
                (
                    UPat(Ops.BITCAST, name="x"),
                    lambda ctx, x: f"fg_bitcast<{ctx.renderer.ctype(x.dtype)}>({ctx.ref(x.src[0])})",
                )
            ]
        )
        + base_rewrite
    )

    def render_float(self, s: str, dt: DType) -> str:
        if dt is dtypes.float64 and s in (self.nan, self.infinity, f"(-{self.infinity})"):
            return s.replace("__int_as_float(0x7fc00000)", "__longlong_as_double(0x7ff8000000000000LL)").replace(
                "__int_as_float(0x7f800000)", "__longlong_as_double(0x7ff0000000000000LL)"
            )
        return super().render_float(s, dt)

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        if u is not ctx.outer:
            return super().render_range(ctx, u)
        name, t = ctx.names[u], self.ctype(u.dtype)
        index = f"({t})blockIdx.x * blockDim.x + threadIdx.x"
        return f"{t} {name} = {index};\nif ({name} < {ctx.ref(u.src[0])}) {{"
