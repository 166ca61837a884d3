"""Renders a linear kernel as C-family source: one statement per value, loops as for-statements.

`CStyleRenderer` holds what the C family shares, as two tables a dialect extends: `string_rewrite`, rules from a
linear UOp to its statement or expression (a PatternMatcher; ctx is the kernel being written), and `code_for_op`,
templates from an ALU op to its expression. A dialect is a subclass that overrides the class attributes (kernel prefix,
buffer address space, type names, constants, math names, vector types, thread indices) and adds or replaces rules:
`CRenderer` (C99 with GNU vector extensions, for the CPU device) in renderer/c.py, `OpenCLRenderer` (OpenCL C) and
`CUDARenderer` (CUDA C) in renderer/gpu.py."""

from __future__ import annotations
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable
from fusegrad.dtype import FP8_FORMATS, DType, dtypes, float_to_fp8
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat
from fusegrad.codegen.opt.packs import Pack
from fusegrad.renderer import Renderer


class RenderError(NotImplementedError):
    """The dialect cannot express this kernel (an op without a rule, a dtype the language lacks)."""


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
    # NaN wins like torch.maximum, a tie keeps y; integers compare plainly. The NaN test comes first, as its own
    # select: `x>y||x!=x` short-circuits into a branch per element in GCC's scalar code (a max pool's row tail)
    return f"(({x}!={x})?{x}:(({x}>{y})?{x}:{y}))" if dtypes.is_float(dt) else f"(({x}>{y})?{x}:{y})"


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


def fits_exactly(u: UOp) -> bool:
    """Whether integer ADD/MUL u, or a sum (ACC_UPDATE) from a constant over its loops, provably stays inside its
    dtype: it then needs no wrapping, and is written as plain signed C arithmetic, whose idioms a compiler recognizes
    (GCC vectorizes a sum of 8-bit products as a dot product only so)."""
    dt = u.dtype
    if not dtypes.is_int(dt) or dt.itemsize < 4:
        return False
    if u.op is Ops.ACC_UPDATE:
        init, value = u.src[0].src[0], u.src[1]
        if u.arg is not Ops.ADD or init.op is not Ops.CONST or not (value.op is Ops.CONST or fits_exactly(value)):
            return False
        trips = math.prod(r.vmax + 1 for r in u.src[2:])
        lo, hi = init.arg + trips * min(value.vmin, 0), init.arg + trips * max(value.vmax, 0)
    elif u.op in (Ops.ADD, Ops.MUL) and all(dtypes.is_int(s.dtype) for s in u.src):
        a, b = u.src
        if u.op is Ops.ADD:
            lo, hi = a.vmin + b.vmin, a.vmax + b.vmax
        else:
            prods = [x * y for x in (a.vmin, a.vmax) for y in (b.vmin, b.vmax)]
            lo, hi = min(prods), max(prods)
    elif u.op is Ops.CAST or u.op is Ops.LOAD or u.op is Ops.CONST:
        return True  # a value of its dtype
    else:
        return False
    return dt.min <= lo and hi <= dt.max


def _acc_update(ctx: KernelText, x: UOp) -> str:
    acc = ctx.names[x.src[0]]
    ctx.names[x] = acc
    value = ctx.renderer.render_alu(
        x.arg, x.dtype, [acc, ctx.ref(x.src[1])], (x.src[0], x.src[1]), wrap=not fits_exactly(x)
    )
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
                x.op, x.dtype, [ctx.ref(s) for s in x.src], x.src, wrap=ctx.reads_data[x] and not fits_exactly(x)
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

    def render_prelude(self, lin: tuple[UOp, ...], kernel: str) -> str:
        """What comes before `kernel` (its typedefs and function): includes and helpers."""
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
        """The kernel's whole source: its prelude, then render_kernel's text."""
        kernel = self.render_kernel(name, lin, packs)
        return self.render_prelude(lin, kernel) + kernel

    def render_kernel(self, name: str, lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]] | None = None) -> str:
        """The kernel's vector typedefs and helpers, then its function."""
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
            typedefs
            + f"{self.kernel_prefix}{self.function_attributes(lin, packs)}void {name}({params}) {{\n"
            + "\n".join(ctx.lines)
            + "\n}\n"
        )
