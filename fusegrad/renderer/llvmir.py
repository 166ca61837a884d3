"""Renders a linear kernel as LLVM IR text for the LLVM device: the same kernels, the same float semantics as C.

Loop counters and accumulators live in allocas (LLVM's mem2reg turns them into registers); the outermost global loop
runs [core_start, core_end) like the C kernels, so threads can split it. Upcast lanes that find_packs groups become
LLVM vectors, `a*b+c` with a single-use product becomes llvm.fma, and no fast-math flag is set except `reassoc` on the
single accumulator of an innermost sum loop (what the C renderer's `omp simd reduction` allows): NaN and infinity
behave as in C. Integer data arithmetic wraps (no nsw); index arithmetic is `nsw` (it cannot overflow)."""

from __future__ import annotations
import math
import struct
from collections import Counter
from dataclasses import dataclass, field
from fusegrad.dtype import DType, dtypes, float_to_bf16
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat
from fusegrad.codegen.opt.packs import Pack
from fusegrad.renderer import Capabilities, Renderer
from fusegrad.renderer.cstyle import MATH_FUNCTIONS, RenderError

# register types; bfloat16 is its bits (converted through float32 only, see codegen/decompose.py)
LLVM_TYPES = {
    dtypes.bool: "i1",
    dtypes.int8: "i8",
    dtypes.uint8: "i8",
    dtypes.int16: "i16",
    dtypes.uint16: "i16",
    dtypes.int32: "i32",
    dtypes.uint32: "i32",
    dtypes.int64: "i64",
    dtypes.uint64: "i64",
    dtypes.float16: "half",
    dtypes.bfloat16: "i16",
    dtypes.float32: "float",
    dtypes.float64: "double",
}
# llvm.<name> intrinsics carry the C math functions' names
INTRINSICS = MATH_FUNCTIONS
_INT_BINARY = {Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor", Ops.SHL: "shl"}
_FLOAT_BINARY = {Ops.ADD: "fadd", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}
_FLOAT_COMPARE = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}


def ltype(dt: DType, lanes: int = 1) -> str:
    if dt not in LLVM_TYPES:
        raise RenderError(f"the LLVM renderer does not support {dt} (supported: {', '.join(map(str, LLVM_TYPES))})")
    return LLVM_TYPES[dt] if lanes == 1 else f"<{lanes} x {LLVM_TYPES[dt]}>"


def mtype(dt: DType) -> str:
    """Type in memory: bool is a byte."""
    return "i8" if dt is dtypes.bool else ltype(dt)


def render_const(value: object, dt: DType) -> str:
    if dt is dtypes.bool:
        return "true" if value else "false"
    if dt is dtypes.bfloat16:
        return str(float_to_bf16(float(value)))  # type: ignore[arg-type]
    if dtypes.is_float(dt):
        v = float(value)  # type: ignore[arg-type]
        if dt is dtypes.float16:
            return f"0xH{struct.unpack('<H', struct.pack('<e', v))[0]:04X}"
        if dt is dtypes.float32 and not math.isnan(v):
            v = struct.unpack("<f", struct.pack("<f", v))[0]  # LLVM wants a float constant exactly representable
        bits = struct.unpack("<Q", struct.pack("<d", v))[0]
        if dt is dtypes.float32 and math.isnan(v):
            bits = 0x7FF8000000000000  # the quiet NaN float32 has (0x7FC00000), written as a double
        return f"0x{bits:016X}"
    v = int(value)  # type: ignore[call-overload]
    bits = dt.itemsize * 8
    v = (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))  # LLVM integer literals are signed
    return str(v)


@dataclass
class IRText:
    """One kernel being written: SSA names, lines, allocas, the current block and the vectors (packs) found."""

    lin: tuple[UOp, ...]
    renderer: LLVMRenderer  # the dialect: pointer types of buffers and of allocas
    packs: dict[UOp, tuple[Pack, int]]
    fused: set[UOp]  # products folded into an llvm.fma by their only user
    reassoc: set[UOp]  # accumulator updates that may reassociate (single accumulator of an innermost sum loop)
    names: dict[UOp, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    allocas: list[str] = field(default_factory=list)
    declares: set[str] = field(default_factory=set)
    globals: list[str] = field(default_factory=list)  # module-level definitions (a dialect's shared arrays)
    vec_names: dict[Pack, str] = field(default_factory=dict)
    slots: dict[UOp | Pack, str] = field(default_factory=dict)  # RANGE, DEFINE_ACC or accumulator pack -> its alloca
    loops: dict[UOp, tuple[str, str, str]] = field(default_factory=dict)  # RANGE -> (value, cond label, exit label)
    counter: int = 0
    block: str = "entry"
    outer: UOp | None = None
    reads_data: dict[UOp, bool] = field(default_factory=dict)

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, rhs: str) -> str:
        name = "%" + self.fresh()
        self.lines.append(f"  {name} = {rhs}")
        return name

    def alloca(self, prefix: str, t: str) -> str:
        slot = "%" + self.fresh(prefix)
        self.allocas.append(f"  {slot} = alloca {t}{self.renderer.alloca_suffix}")
        return slot

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name

    def acc_of(self, u: UOp) -> UOp | None:
        return u if u.op is Ops.DEFINE_ACC else u.src[0] if u.op is Ops.ACC_UPDATE else None

    def ref(self, u: UOp) -> str:
        if u.op is Ops.CONST:
            return render_const(u.arg, u.dtype)
        if u in self.packs:
            pack, lane = self.packs[u]
            if (acc := self.acc_of(u)) is not None:  # the accumulator's current value, read where it is used
                t = ltype(pack.dtype, len(pack.lanes))
                vec = self.emit(f"load {t}, {self.renderer.private_ptr} {self.slots[self.packs[acc][0]]}")
                return self.emit(f"extractelement {ltype(pack.dtype, len(pack.lanes))} {vec}, i32 {lane}")
            return self.names[u]
        if (acc := self.acc_of(u)) is not None:
            return self.emit(f"load {ltype(u.dtype)}, {self.renderer.private_ptr} {self.slots[acc]}")
        return self.names[u]

    def vref(self, u: UOp, pack: Pack) -> str:
        """u as a vector of pack's shape: its own pack, or a scalar broadcast to every lane."""
        t = ltype(pack.dtype, len(pack.lanes))
        if u in self.packs:
            if (acc := self.acc_of(u)) is not None:
                return self.emit(f"load {t}, {self.renderer.private_ptr} {self.slots[self.packs[acc][0]]}")
            return self.vec_names[self.packs[u][0]]
        one = self.emit(f"insertelement {t} poison, {ltype(u.dtype)} {self.ref(u)}, i32 0")
        return self.emit(f"shufflevector {t} {one}, {t} poison, <{len(pack.lanes)} x i32> zeroinitializer")

    def intrinsic(self, name: str, t: str, nargs: int) -> str:
        suffix = (
            t.replace("<", "v").replace(" x ", "").replace(">", "").replace("float", "f32").replace("double", "f64")
        )
        suffix = suffix.replace("half", "f16")
        fn = f"@llvm.{name}.{suffix}"
        self.declares.add(f"declare {t} {fn}({', '.join([t] * nargs)})")
        return fn


# ---- scalar rules: each emits its instructions and returns the value's SSA name ("" for statements)


def _address(ctx: IRText, u: UOp) -> str:
    buf, idx = u.src[0], u.src[1]
    g = ctx.renderer.global_ptr
    return ctx.emit(f"getelementptr inbounds {mtype(buf.dtype)}, {g} {ctx.ref(buf)}, {ltype(idx.dtype)} {ctx.ref(idx)}")


def _gated(ctx: IRText, gate: UOp, t: str, zero: str, load) -> str:
    """A load that touches memory only where the gate holds; elsewhere the value is zero (like C's `g ? p[i] : 0`)."""
    g, before = ctx.ref(gate), ctx.block
    then, join = ctx.fresh("load"), ctx.fresh("join")
    ctx.lines.append(f"  br i1 {g}, label %{then}, label %{join}")
    ctx.label(then)
    value = load()
    loaded_in = ctx.block
    ctx.lines.append(f"  br label %{join}")
    ctx.label(join)
    return ctx.emit(f"phi {t} [ {value}, %{loaded_in} ], [ {zero}, %{before} ]")


def _load(ctx: IRText, x: UOp) -> str:
    def load() -> str:
        raw = ctx.emit(f"load {mtype(x.dtype)}, {ctx.renderer.global_ptr} {_address(ctx, x)}, align {x.dtype.itemsize}")
        return ctx.emit(f"icmp ne i8 {raw}, 0") if x.dtype is dtypes.bool else raw

    return _gated(ctx, x.src[2], ltype(x.dtype), render_const(0, x.dtype), load) if len(x.src) == 3 else load()


def _store(ctx: IRText, x: UOp) -> str:
    value, dt = ctx.ref(x.src[2]), x.src[2].dtype
    if dt is dtypes.bool:
        value = ctx.emit(f"zext i1 {value} to i8")
    ctx.lines.append(f"  store {mtype(dt)} {value}, {ctx.renderer.global_ptr} {_address(ctx, x)}, align {dt.itemsize}")
    return ""


def _range(ctx: IRText, x: UOp, first: str = "0") -> str:
    """A loop from `first` (a dialect's lane id; 0 by default) to its end."""
    t, p = ltype(x.dtype), ctx.renderer.private_ptr
    slot = ctx.slots[x] = ctx.alloca("ctr", t)
    if x is ctx.outer:
        start, end = "%core_start", "%core_end"
        if t != "i64":
            start, end = ctx.emit(f"trunc i64 {start} to {t}"), ctx.emit(f"trunc i64 {end} to {t}")
    else:
        start, end = first, ctx.ref(x.src[0])
    ctx.lines.append(f"  store {t} {start}, {p} {slot}")
    cond, body, done = ctx.fresh("cond"), ctx.fresh("body"), ctx.fresh("exit")
    ctx.lines.append(f"  br label %{cond}")
    ctx.label(cond)
    value = ctx.emit(f"load {t}, {p} {slot}")
    go = ctx.emit(f"icmp slt {t} {value}, {end}")
    ctx.lines.append(f"  br i1 {go}, label %{body}, label %{done}")
    ctx.label(body)
    ctx.loops[x] = (value, cond, done)
    return value


def _endrange(ctx: IRText, x: UOp, step: int = 1) -> str:
    r = x.src[0]
    value, cond, done = ctx.loops[r]
    t = ltype(r.dtype)
    ctx.lines.append(
        f"  store {t} {ctx.emit(f'add nsw {t} {value}, {step}')}, {ctx.renderer.private_ptr} {ctx.slots[r]}"
    )
    ctx.lines.append(f"  br label %{cond}")
    ctx.label(done)
    return ""


def _define_acc(ctx: IRText, x: UOp) -> str:
    slot = ctx.slots[x] = ctx.alloca("acc", ltype(x.dtype))
    ctx.lines.append(f"  store {ltype(x.dtype)} {ctx.ref(x.src[0])}, {ctx.renderer.private_ptr} {slot}")
    return ""


def _fma_product(ctx: IRText, x: UOp) -> int | None:
    """Index of the operand of a float add that is a product fused into llvm.fma, or None."""
    operands = (x.src[1],) if x.op is Ops.ACC_UPDATE else x.src
    return next((i for i, s in enumerate(operands) if s in ctx.fused), None)


def _binary_float(ctx: IRText, op: Ops, t: str, a: str, b: str, flags: str = "") -> str:
    return ctx.emit(f"{_FLOAT_BINARY[op]} {flags}{t} {a}, {b}")


def _acc_update(ctx: IRText, x: UOp) -> str:
    acc, t, p = x.src[0], ltype(x.dtype), ctx.renderer.private_ptr
    slot = ctx.slots[acc]
    old = ctx.emit(f"load {t}, {p} {slot}")
    flags = "reassoc " if x in ctx.reassoc else ""
    if _fma_product(ctx, x) is not None:
        product = x.src[1]
        fn = ctx.intrinsic("fmuladd" if flags else "fma", t, 3)
        args = ", ".join(f"{t} {v}" for v in (ctx.ref(product.src[0]), ctx.ref(product.src[1]), old))
        new = ctx.emit(f"call {flags}{t} {fn}({args})")
    else:
        new = _alu(ctx, x.arg, x.dtype, [old, ctx.ref(x.src[1])], (acc, x.src[1]), wrap=True, flags=flags)
    ctx.lines.append(f"  store {t} {new}, {p} {slot}")
    return ""


def _int_division(ctx: IRText, op: Ops, dt: DType, a: str, b: str, divisor: UOp) -> str:
    t, signed = ltype(dt), not dtypes.is_unsigned(dt)
    name = ("sdiv" if op is Ops.IDIV else "srem") if signed else ("udiv" if op is Ops.IDIV else "urem")
    if divisor.op is Ops.CONST and divisor.arg > 0:
        return ctx.emit(f"{name} {t} {a}, {b}")
    # x / 0 is 0 (C would trap); signed x / -1 is -x wrapping and x % -1 is 0, like the C renderer
    zero = ctx.emit(f"icmp eq {t} {b}, 0")
    bad = ctx.emit(f"or i1 {zero}, {ctx.emit(f'icmp eq {t} {b}, -1')}") if signed else zero
    safe = ctx.emit(f"select i1 {bad}, {t} 1, {t} {b}")
    q = ctx.emit(f"{name} {t} {a}, {safe}")
    if signed:
        minus_one = ctx.emit(f"sub {t} 0, {a}") if op is Ops.IDIV else "0"
        q = ctx.emit(f"select i1 {ctx.emit(f'icmp eq {t} {b}, -1')}, {t} {minus_one}, {t} {q}")
    return ctx.emit(f"select i1 {zero}, {t} 0, {t} {q}")


def _alu(
    ctx: IRText, op: Ops, dt: DType, a: list[str], srcs: tuple[UOp, ...], wrap: bool = True, flags: str = ""
) -> str:
    sdt = srcs[0].dtype
    t, st = ltype(dt), ltype(sdt)
    is_float, src_float = dtypes.is_float(dt), dtypes.is_float(sdt)
    if op in INTRINSICS:
        return ctx.emit(f"call {t} {ctx.intrinsic(INTRINSICS[op], t, len(a))}({', '.join(f'{t} {v}' for v in a)})")
    if op is Ops.WHERE:
        return ctx.emit(f"select i1 {a[0]}, {t} {a[1]}, {t} {a[2]}")
    if op is Ops.NEG:
        if is_float:
            return ctx.emit(f"fneg {t} {a[0]}")
        return ctx.emit(f"xor i1 {a[0]}, true") if dt is dtypes.bool else ctx.emit(f"sub {t} 0, {a[0]}")
    if op is Ops.RECIPROCAL:
        return ctx.emit(f"fdiv {t} {render_const(1.0, dt)}, {a[0]}")
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
        if src_float:
            return ctx.emit(f"fcmp {_FLOAT_COMPARE[op]} {st} {a[0]}, {a[1]}")
        lt = "slt" if dtypes.is_int(sdt) and not dtypes.is_unsigned(sdt) else "ult"
        return ctx.emit(f"icmp {dict({Ops.CMPLT: lt, Ops.CMPNE: 'ne', Ops.CMPEQ: 'eq'})[op]} {st} {a[0]}, {a[1]}")
    if op is Ops.MAX:
        if is_float:  # NaN wins, like the C renderer's (a!=a)?a:((a>b)?a:b)
            greater = ctx.emit(f"fcmp ogt {t} {a[0]}, {a[1]}")
            take = ctx.emit(f"or i1 {greater}, {ctx.emit(f'fcmp uno {t} {a[0]}, {a[0]}')}")
        else:
            take = ctx.emit(
                f"icmp {'ugt' if dt is dtypes.bool or dtypes.is_unsigned(dt) else 'sgt'} {t} {a[0]}, {a[1]}"
            )
        return ctx.emit(f"select i1 {take}, {t} {a[0]}, {t} {a[1]}")
    if op in (Ops.IDIV, Ops.MOD):
        return _int_division(ctx, op, dt, a[0], a[1], srcs[1])
    if op is Ops.SHR:
        return ctx.emit(f"{'lshr' if dtypes.is_unsigned(dt) or dt is dtypes.bool else 'ashr'} {t} {a[0]}, {a[1]}")
    if op in _INT_BINARY:
        return ctx.emit(f"{_INT_BINARY[op]} {t} {a[0]}, {a[1]}")
    if op in (Ops.ADD, Ops.MUL):
        if is_float:
            return _binary_float(ctx, op, t, a[0], a[1], flags)
        if dt is dtypes.bool:
            return ctx.emit(f"{'or' if op is Ops.ADD else 'and'} i1 {a[0]}, {a[1]}")
        return ctx.emit(f"{'add' if op is Ops.ADD else 'mul'} {'' if wrap else 'nsw '}{t} {a[0]}, {a[1]}")
    if op is Ops.FDIV:
        return ctx.emit(f"fdiv {t} {a[0]}, {a[1]}")
    raise RenderError(f"the LLVM renderer has no rule for {op} on {dt}")


def _alu_rule(ctx: IRText, x: UOp) -> str:
    if x in ctx.fused:
        return ""  # its user computes it inside an fma
    if x.op is Ops.ADD and (i := _fma_product(ctx, x)) is not None:
        product, other = x.src[i], x.src[1 - i]
        t = ltype(x.dtype)
        args = ", ".join(f"{t} {ctx.ref(v)}" for v in (product.src[0], product.src[1], other))
        return ctx.emit(f"call {t} {ctx.intrinsic('fma', t, 3)}({args})")
    return _alu(ctx, x.op, x.dtype, [ctx.ref(s) for s in x.src], x.src, wrap=ctx.reads_data[x])


def _bf16_to_f32(ctx: IRText, v: str) -> str:
    wide = ctx.emit(f"zext i16 {v} to i32")
    return ctx.emit(f"bitcast i32 {ctx.emit(f'shl i32 {wide}, 16')} to float")


def _f32_to_bf16(ctx: IRText, v: str) -> str:
    """Round to nearest even; NaN becomes the quiet NaN 0x7FC0 (as the C prelude's fg_f32_to_bf16)."""
    u = ctx.emit(f"bitcast float {v} to i32")
    odd = ctx.emit(f"and i32 {ctx.emit(f'lshr i32 {u}, 16')}, 1")
    biased = ctx.emit(f"add i32 {u}, 32767")
    rounded = ctx.emit(f"lshr i32 {ctx.emit(f'add i32 {biased}, {odd}')}, 16")
    nan = ctx.emit(f"fcmp uno float {v}, {v}")
    return ctx.emit(f"select i1 {nan}, i16 32704, i16 {ctx.emit(f'trunc i32 {rounded} to i16')}")


def render_cast(ctx: IRText, v: str, src: DType, dst: DType) -> str:
    if src is dtypes.bfloat16:
        if dst is not dtypes.float32:
            raise RenderError(f"the LLVM renderer converts bfloat16 only to float32, not to {dst}")
        return _bf16_to_f32(ctx, v)
    if dst is dtypes.bfloat16:
        if src is not dtypes.float32:
            raise RenderError(f"the LLVM renderer converts to bfloat16 only from float32, not from {src}")
        return _f32_to_bf16(ctx, v)
    s, d = ltype(src), ltype(dst)
    if s == d:  # signedness lives in the instructions, not the type
        return v
    if dst is dtypes.bool:
        return ctx.emit(f"fcmp une {s} {v}, 0.0" if dtypes.is_float(src) else f"icmp ne {s} {v}, 0")
    if dtypes.is_float(src) and dtypes.is_float(dst):
        return ctx.emit(f"{'fpext' if dst.itemsize > src.itemsize else 'fptrunc'} {s} {v} to {d}")
    if dtypes.is_float(src):
        return ctx.emit(f"{'fptoui' if dtypes.is_unsigned(dst) else 'fptosi'} {s} {v} to {d}")
    unsigned_src = src is dtypes.bool or dtypes.is_unsigned(src)
    if dtypes.is_float(dst):
        return ctx.emit(f"{'uitofp' if unsigned_src else 'sitofp'} {s} {v} to {d}")
    if dst.itemsize < src.itemsize:
        return ctx.emit(f"trunc {s} {v} to {d}")
    return ctx.emit(f"{'zext' if unsigned_src else 'sext'} {s} {v} to {d}")


def _bitcast(ctx: IRText, x: UOp) -> str:
    if x.src[0].dtype is dtypes.bool:  # a bool is the byte 0 or 1
        return ctx.emit(f"zext i1 {ctx.ref(x.src[0])} to {ltype(x.dtype)}")
    if x.dtype is dtypes.bool:
        return ctx.emit(f"icmp ne {ltype(x.src[0].dtype)} {ctx.ref(x.src[0])}, 0")
    return ctx.emit(f"bitcast {ltype(x.src[0].dtype)} {ctx.ref(x.src[0])} to {ltype(x.dtype)}")


def _define_var(ctx: IRText, x: UOp) -> str:
    raise RenderError(f"the LLVM renderer has no rule for {x.op} (variables are not kernel parameters yet)")


llvm_rewrite = PatternMatcher(
    [
        (UPat(Ops.DEFINE_GLOBAL, name="x"), lambda ctx, x: f"%data{x.arg[0]}"),
        (UPat(Ops.DEFINE_VAR, name="x"), _define_var),
        (UPat(Ops.RANGE, name="x"), _range),
        (UPat(Ops.ENDRANGE, name="x"), _endrange),
        (UPat(Ops.DEFINE_ACC, name="x"), _define_acc),
        (UPat(Ops.ACC_UPDATE, name="x"), _acc_update),
        (UPat(Ops.LOAD, name="x"), _load),
        (UPat(Ops.STORE, name="x"), _store),
        (UPat(Ops.CAST, name="x"), lambda ctx, x: render_cast(ctx, ctx.ref(x.src[0]), x.src[0].dtype, x.dtype)),
        (UPat(Ops.BITCAST, name="x"), _bitcast),
        (UPat(GroupOp.ALU, name="x"), _alu_rule),
    ]
)


# ---- vector rules: one instruction per pack, emitted where its first lane stands


def _vector_address(ctx: IRText, u: UOp, pack: Pack) -> str:
    buf, base = u.src[0], pack.base
    assert base is not None
    index = ctx.ref(base)
    if pack.offset:
        index = ctx.emit(f"add nsw {ltype(base.dtype)} {index}, {pack.offset}")
    g = ctx.renderer.global_ptr
    return ctx.emit(f"getelementptr inbounds {mtype(buf.dtype)}, {g} {ctx.ref(buf)}, {ltype(base.dtype)} {index}")


def _vector(ctx: IRText, u: UOp, pack: Pack) -> str:
    t, dt = ltype(pack.dtype, len(pack.lanes)), pack.dtype
    g, p = ctx.renderer.global_ptr, ctx.renderer.private_ptr
    if u.op is Ops.LOAD:

        def load() -> str:
            return ctx.emit(f"load {t}, {g} {_vector_address(ctx, u, pack)}, align {dt.itemsize}")

        return _gated(ctx, u.src[2], t, "zeroinitializer", load) if len(u.src) == 3 else load()
    if u.op is Ops.STORE:
        value = ctx.vref(u.src[2], pack)
        ctx.lines.append(f"  store {t} {value}, {g} {_vector_address(ctx, u, pack)}, align {dt.itemsize}")
        return ""
    if u.op is Ops.DEFINE_ACC:
        slot = ctx.slots[pack] = ctx.alloca("vacc", t)
        ctx.lines.append(f"  store {t} {ctx.vref(u.src[0], pack)}, {p} {slot}")
        return slot
    if u.op is Ops.ACC_UPDATE:
        slot = ctx.slots[pack] = ctx.slots[ctx.packs[u.src[0]][0]]
        old = ctx.emit(f"load {t}, {p} {slot}")
        if _fma_product(ctx, u) is not None:
            a, b = _product_operands(ctx, u.src[1], pack)
            new = ctx.emit(f"call {t} {ctx.intrinsic('fma', t, 3)}({t} {a}, {t} {b}, {t} {old})")
        else:
            new = ctx.emit(f"fadd {t} {old}, {ctx.vref(u.src[1], pack)}")
        ctx.lines.append(f"  store {t} {new}, {p} {slot}")
        return slot
    if u in ctx.fused:
        return ""
    if u.op is Ops.ADD and (i := _fma_product(ctx, u)) is not None:
        a, b = _product_operands(ctx, u.src[i], pack)
        return ctx.emit(f"call {t} {ctx.intrinsic('fma', t, 3)}({t} {a}, {t} {b}, {t} {ctx.vref(u.src[1 - i], pack)})")
    if u.op is Ops.WHERE:
        a, b = (ctx.vref(s, pack) for s in u.src[1:])
        if u.src[0] in ctx.packs:  # a mask pack selects lane by lane
            mask = ctx.packs[u.src[0]][0]
            cond = f"{ltype(dtypes.bool, len(mask.lanes))} {ctx.vref(u.src[0], mask)}"
        else:
            cond = f"i1 {ctx.ref(u.src[0])}"
        return ctx.emit(f"select {cond}, {t} {a}, {t} {b}")
    if pack.mask_of is not None and u.op in _FLOAT_COMPARE:  # float lanes compared: a vector of i1
        floats = ctx.packs[next(s for s in u.src if s in ctx.packs)][0]
        ft, (x, y) = ltype(floats.dtype, len(floats.lanes)), (ctx.vref(s, floats) for s in u.src)
        return ctx.emit(f"fcmp {_FLOAT_COMPARE[u.op]} {ft} {x}, {y}")
    if pack.mask_of is not None and u.op in (Ops.AND, Ops.OR):
        x, y = (ctx.vref(s, pack) for s in u.src)
        return ctx.emit(f"{u.op.name.lower()} {t} {x}, {y}")
    if u.op is Ops.NEG:
        return ctx.emit(f"fneg {t} {ctx.vref(u.src[0], pack)}")
    if u.op in _FLOAT_BINARY:
        return ctx.emit(f"{_FLOAT_BINARY[u.op]} {t} {ctx.vref(u.src[0], pack)}, {ctx.vref(u.src[1], pack)}")
    raise RenderError(f"the LLVM renderer has no vector rule for {u.op}")


def _product_operands(ctx: IRText, product: UOp, pack: Pack) -> tuple[str, str]:
    """The operands of a fused product's first lane as vectors: each is a pack (lane by lane) or a shared scalar."""
    return ctx.vref(product.src[0], pack), ctx.vref(product.src[1], pack)


class LLVMRenderer(Renderer):
    """Linear UOps -> one LLVM IR function `void @name(ptr %data0, ..., i64 %core_start, i64 %core_end)`.
    capabilities.vector_bytes: the width of the target's vector registers (upcast lanes are packed into vectors that
    wide).
    A dialect (llvmir_amdgpu.py) overrides the class attributes and hooks below, nothing else."""

    global_ptr = "ptr"  # type of a buffer pointer
    private_ptr = "ptr"  # type of a pointer to an alloca
    alloca_suffix = ""  # e.g. ", addrspace(5)"
    calling_convention = ""  # e.g. "amdgpu_kernel "
    capabilities = Capabilities(vector_types=True, weight_panels=True)

    def __init__(self, capabilities: Capabilities | None = None, triple: str = "", data_layout: str = ""):
        super().__init__(capabilities)
        self.triple, self.data_layout = triple, data_layout
        self.string_rewrite = llvm_rewrite

    def check(self, lin: tuple[UOp, ...]) -> None:
        """Raise RenderError for what the target cannot compile (nothing on the host)."""

    def outer_range(self, lin: tuple[UOp, ...]) -> UOp | None:
        """The loop that runs [core_start, core_end) so threads can split it."""
        return next((u for u in lin if u.op is Ops.RANGE and u.arg[1] == "global"), None)

    def params(self, lin: tuple[UOp, ...]) -> list[str]:
        return [f"ptr %data{u.arg[0]}" for u in lin if u.op is Ops.DEFINE_GLOBAL] + [
            "i64 %core_start",
            "i64 %core_end",
        ]

    def render(self, name: str, lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]] | None = None) -> str:
        self.check(lin)
        packs = {} if packs is None else packs
        uses = Counter(s for u in lin for s in u.src)
        ctx = IRText(lin, self, packs, _fusable_products(lin, packs, uses), _reassociable(lin))
        ctx.outer = self.outer_range(lin)
        for u in lin:
            ctx.reads_data[u] = u.op in (Ops.LOAD, Ops.DEFINE_ACC, Ops.ACC_UPDATE) or any(
                ctx.reads_data.get(x, False) for x in u.src
            )
        users: dict[UOp, list[UOp]] = {}
        for u in lin:
            for s in u.src:
                users.setdefault(s, []).append(u)
        for u in lin:
            if u.op is Ops.CONST:
                continue
            if u in packs:
                pack = packs[u][0]
                if pack not in ctx.vec_names:
                    ctx.vec_names[pack] = _vector(ctx, u, pack)
                    _extract_used_lanes(ctx, pack, users)
                continue
            if (value := self.string_rewrite.rewrite(u, ctx)) is None:
                raise RenderError(f"the LLVM renderer has no rule for {u.op}")
            if value:
                ctx.names[u] = value
        head = (f'target triple = "{self.triple}"\n' if self.triple else "") + (
            f'target datalayout = "{self.data_layout}"\n' if self.data_layout else ""
        )
        body = ["entry:", *ctx.allocas, *ctx.lines, "  ret void"]
        return (
            head
            + "".join(g + "\n" for g in ctx.globals)
            + f"define {self.calling_convention}void @{name}({', '.join(self.params(lin))}) "
            + f"{self.function_attributes(lin)}{{\n"
            + "\n".join(body)
            + "\n}\n"
            + "".join(d + "\n" for d in sorted(ctx.declares))
            + self.module_trailer(lin)
        )

    def function_attributes(self, lin: tuple[UOp, ...]) -> str:
        """What follows the parameter list of the definition (attributes, metadata attachments)."""
        return "nounwind "

    def module_trailer(self, lin: tuple[UOp, ...]) -> str:
        """Text after the declarations (the metadata nodes the attachments name)."""
        return ""


def _extract_used_lanes(ctx: IRText, pack: Pack, users: dict[UOp, list[UOp]]) -> None:
    """Lanes that something outside the vectors reads get their scalar right where the vector is made (dominating
    every later use); accumulator lanes are read from their alloca at each use instead."""
    if pack.lanes[0].op in (Ops.STORE, Ops.DEFINE_ACC, Ops.ACC_UPDATE) or pack.lanes[0] in ctx.fused:
        return
    t = ltype(pack.dtype, len(pack.lanes))
    for i, lane in enumerate(pack.lanes):
        if any(user not in ctx.packs for user in users.get(lane, [])):
            ctx.names[lane] = ctx.emit(f"extractelement {t} {ctx.vec_names[pack]}, i32 {i}")


def _fusable_products(lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]], uses: Counter) -> set[UOp]:
    """Float products whose only user is an add (or accumulator add) of the same kind, scalar with scalar or vector
    lane by lane with vector: the add computes them with llvm.fma."""
    fused: set[UOp] = set()
    for u in lin:
        if not dtypes.is_float(u.dtype) or u.dtype is dtypes.bfloat16:
            continue
        if u.op is Ops.ADD:
            operands = list(u.src)
        elif u.op is Ops.ACC_UPDATE and u.arg is Ops.ADD:
            operands = [u.src[1]]
        else:
            continue
        for s in operands:
            if s.op is not Ops.MUL or uses[s] != 1 or s.dtype is not u.dtype or (s in packs) != (u in packs):
                continue
            if u in packs and not _lane_aligned(u, s, packs):
                continue
            fused.add(s)
            break
    return fused


def _lane_aligned(u: UOp, s: UOp, packs: dict[UOp, tuple[Pack, int]]) -> bool:
    """The product's pack is exactly the add's operand pack: lane i of one feeds lane i of the other, and the
    product's own operands are packs or shared scalars (so they can be rebuilt as vectors)."""
    (upack, ulane), (spack, slane) = packs[u], packs[s]
    if ulane != slane or len(upack.lanes) != len(spack.lanes):
        return False
    return all(
        lane_s in (lane_u.src if lane_u.op is Ops.ADD else lane_u.src[1:2])
        for lane_u, lane_s in zip(upack.lanes, spack.lanes)
    )


def _reassociable(lin: tuple[UOp, ...]) -> set[UOp]:
    """The single add-accumulator update of an innermost loop may reassociate (so LLVM vectorizes the sum), as C's
    `#pragma omp simd reduction` allows."""
    out: set[UOp] = set()
    for i, r in enumerate(lin):
        if r.op is not Ops.RANGE:
            continue
        body = []
        for u in lin[i + 1 :]:
            if u.op is Ops.ENDRANGE and u.src[0] is r:
                break
            body.append(u)
        if any(u.op is Ops.RANGE for u in body):
            continue
        updates = [u for u in body if u.op is Ops.ACC_UPDATE and r in u.src[2:]]
        if len(updates) == 1 and updates[0].arg is Ops.ADD and updates[0].dtype in (dtypes.float32, dtypes.float64):
            out.add(updates[0])
    return out
