"""C99 with GNU extensions for the CPU device: explicit vectors (GCC vector extensions) where codegen packed lanes,
simd pragmas on innermost reduce loops, and the outermost global loop split over threads ([core_start, core_end))."""

from __future__ import annotations
import math
from collections import Counter
from typing import Callable
from fusegrad.codegen.opt.packs import Pack
from fusegrad.dtype import DType, dtypes
from fusegrad.renderer import Capabilities
from fusegrad.renderer.c_prelude import c_prelude
from fusegrad.renderer.cstyle import (
    CODE_FOR_OP,
    INFIX,
    MASK_INT,
    CStyleRenderer,
    KernelText,
    RenderError,
    base_rewrite,
    fits_exactly,
)
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat


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
    # an integer sum that cannot overflow is left to GCC's own loop vectorizer, which recognizes a sum of 8-bit
    # products as a dot product (vpdpbusd where the target has VNNI) only without the pragma
    if updates and all(u.dtype in (dtypes.int32, dtypes.int64) and fits_exactly(u) for u in updates):
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


def _gated_load_along(r: UOp, lin: tuple[UOp, ...], packs: dict) -> bool:
    """Whether r is an innermost loop that a scalar gated load (a padding pass's) indexes along. Its counter is then
    rendered 64-bit: GCC 12 vectorizes such a load whose index is a 32-bit expression of the loop as a gather, and as
    a masked load when the index is 64-bit (a max pool's -inf padding pass of 64x113x113: 507 -> 254 us)."""
    start = next(i for i, u in enumerate(lin) if u is r)
    for u in lin[start + 1 :]:
        if u.op is Ops.RANGE:
            return False
        if u.op is Ops.ENDRANGE and u.src[0] is r:
            break
    # an index read from data (a gather's) stays 32-bit: BERT's mask kernel, its loads gathered either way, ran 2x
    # slower with a 64-bit counter
    return any(
        u.op is Ops.LOAD
        and len(u.src) == 3
        and u not in packs
        and r in (index := u.src[1].toposort())
        and not any(x.op is Ops.LOAD for x in index)
        for u in lin[start + 1 :]
    )


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
    # a flag starts set when the accumulator is NaN already (an earlier row's loop found one): the reduction's combine
    # step at the loop's end would drop it
    declared = "\n".join(f"int {flag} = ({acc}!={acc});" for acc, flag in zip(dtypes_of, flags))
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
# subnormal results and the overflow to inf come out of the multiplies; x is clamped above first (n stays a normal
# exponent) and a NaN lane keeps its NaN. A lane below -104 (a masked score's -inf) is 0, by a mask on the result:
# computed from -104 its multiplies underflowed through subnormals, 3x slower (a causal softmax's masked half)
GCC_VECTOR_EXP = """static inline __attribute__((always_inline)) {t} fg_exp_{t}({t} x) {{
  {t} top = ({t}){{}} + 89.0f, bottom = ({t}){{}} - 104.0f, magic = ({t}){{}} + 12582912.0f;
  {it} hi = x > top, lo = x < bottom;
  x = ({t})((({it})x & ~hi & ~lo) | (({it})top & hi));
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
  return ({t})(({it})(p * ({t})((h + 127) << 23) * ({t})((k - h + 127) << 23)) & ~lo);
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
# a float select over an arm that is arithmetic as a bit-mask blend (the prelude's fg_selectf): under trapping math
# GCC sinks that arithmetic into a branch of ?: and leaves the loop scalar (silu(gate) * up over 128x2048 floats: 2.8
# -> 0.31 ms); a select of loaded or constant values stays ?:, which scalar code runs faster than integer masks (a
# ReLU's where under a 2x2 max pool: 88 -> 200 us as a blend)
C_FLOAT_SELECT = {dtypes.float32: "fg_selectf", dtypes.float64: "fg_select"}


def _c_where(r: CStyleRenderer, dt: DType, a: list[str], srcs: tuple[UOp, ...]) -> str:
    if (select := C_FLOAT_SELECT.get(dt)) is not None and any(s.op in GroupOp.ALU for s in srcs[1:]):
        return f"{select}({a[0]}, {a[1]}, {a[2]})"
    return CODE_FOR_OP[Ops.WHERE](r, dt, a, srcs)


class CRenderer(CStyleRenderer):
    """C99 with GNU extensions for the CPU device: explicit vectors (GCC vector extensions) where the opts upcast, and
    the outermost global loop runs [core_start, core_end) so threads can split it."""

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
    code_for_op = {**CODE_FOR_OP, Ops.WHERE: _c_where}
    # SSE2-sized vectors without a device; the CPU device passes its compiler's -march=native values
    capabilities = Capabilities(
        vector_types=True,
        weight_panels=True,
        loop_vectorizer=True,
        vector_math=frozenset(
            {(Ops.RECIPROCAL, dtypes.float32), (Ops.RECIPROCAL, dtypes.float64), (Ops.EXP, dtypes.float32)}
            | {(Ops.MAX, dtypes.float32), (Ops.MAX, dtypes.float64)}
        ),
    )

    def render_prelude(self, lin: tuple[UOp, ...], kernel: str) -> str:
        return c_prelude(kernel)

    def render_params(self, lin: tuple[UOp, ...]) -> list[str]:
        # a kernel reads the buffer it writes (an in-place assign) only at the element it writes: the scheduler stores
        # a value that reads its own target shifted into a temporary first, and the JIT's memory plan overlaps no two
        # other buffers of a launch; so `restrict` promises nothing a load can see. With it GCC vectorizes a gated
        # load (a pad's) as a masked load, which it cannot version for aliasing
        return [p.replace("* data", "* restrict data", 1) for p in super().render_params(lin)]

    def function_attributes(self, lin: tuple[UOp, ...], packs: dict) -> str:
        # GCC 12's loop vectorizer miscompiles two if-converted loads of one buffer in a loop that strides over them
        # (an upcast over a padded axis: each lane's gate and offset), reading the wrong elements; such kernels keep
        # their conditional loads as branches (tests/renderer/test_cstyle.py holds the smallest such kernel)
        gated = Counter(u.src[0] for u in lin if u.op is Ops.LOAD and len(u.src) == 3 and u not in packs)
        return "FG_NO_IF_CONVERT " if any(n >= 2 for n in gated.values()) else ""

    def buffer_type(self, dt: DType) -> str:
        # bool buffers as bytes: GCC vectorizes no select whose condition is loaded through a _Bool pointer (a stored
        # mask's where ran 17x slower than an add on AVX2); a byte loaded into a _Bool value is the same 0 or 1
        return "unsigned char" if dt is dtypes.bool else self.ctype(dt)

    def render_cast(self, x: str, src: DType, dst: DType) -> str:
        # a bool to a number as a select of constants: GCC's vectorizer takes no conversion from a 1-bit type and left
        # the loop scalar (a ReLU's backward mask times the gradient: 2.9 -> 1.9 ms for 4M floats on AVX2)
        if src is dtypes.bool and (dtypes.is_int(dst) or dst in (dtypes.float16, dtypes.float32, dtypes.float64)):
            return f"(({x})?({self.ctype(dst)})1:({self.ctype(dst)})0)"
        return super().render_cast(x, src, dst)

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
        if u.dtype is dtypes.int32 and _gated_load_along(u, ctx.lin, ctx.packs):
            loop = loop.replace(f"for ({t} ", "for (long long ", 1)
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
