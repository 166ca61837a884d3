"""Linear UOps -> LLVM IR for amdgcn-amd-amdhsa: one work-item runs the whole loop nest (correct, not fast).

Kernel arguments are the buffers as `ptr addrspace(1)`, in DEFINE_GLOBAL order, so the kernarg segment is one
8-byte pointer per buffer. Loop counters and accumulators live in allocas that `opt -O2` promotes to registers.
It lives beside the AMD driver package, which stays stdlib-only and never imports it.
"""

from __future__ import annotations

import math
import struct

from fusegrad.dtype import DType, dtypes
from fusegrad.uop.ops import GroupOp, Ops, UOp

TRIPLE = "amdgcn-amd-amdhsa"
_TYPES = {
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
    dtypes.float32: "float",
    dtypes.float64: "double",
}
_FMATH = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.COS: "cos", Ops.TRUNC: "trunc"}
_FMATH |= {Ops.EXP: "exp", Ops.LOG: "log"}


class RenderError(NotImplementedError):
    """A kernel uses something this LLVM IR renderer does not support (named in the message)."""


def ltype(dt: DType) -> str:
    if (t := _TYPES.get(dt)) is None:
        raise RenderError(f"the AMD LLVM IR renderer has no type for {dt!r}")
    return t


def mtype(dt: DType) -> str:
    """Type in memory (bool is a byte)."""
    return "i8" if dt is dtypes.bool else ltype(dt)


def const(value: object, dt: DType) -> str:
    if dt is dtypes.bool:
        return "true" if value else "false"
    if dtypes.is_float(dt):
        v = float(value)  # type: ignore[arg-type]
        if dt is dtypes.float32 and math.isfinite(v):
            v = struct.unpack("<f", struct.pack("<f", v))[0]  # LLVM wants a float constant exact in float
        if dt is dtypes.float16 and math.isfinite(v):
            v = struct.unpack("<e", struct.pack("<e", v))[0]
        return f"0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016X}"
    return str(int(value))  # type: ignore[call-overload]


def render(name: str, lin: tuple[UOp, ...]) -> str:
    out: list[str] = []
    decls: set[str] = set()
    names: dict[UOp, str] = {}
    slots: dict[UOp, str] = {}  # RANGE / DEFINE_ACC -> alloca
    counter = [0]

    def tmp() -> str:
        counter[0] += 1
        return f"%t{counter[0]}"

    def v(u: UOp) -> str:
        if u.op is Ops.CONST:
            return const(u.arg, u.dtype)
        if u in slots:
            r = tmp()
            out.append(f"  {r} = load {ltype(u.dtype)}, ptr addrspace(5) {slots[u]}")
            return r
        return names[u]

    def alu(op: Ops, dt: DType, a: list[str], srcs: tuple[UOp, ...]) -> str:
        sdt = srcs[0].dtype
        t, st = ltype(dt), ltype(sdt)
        fl, signed = dtypes.is_float(sdt), not dtypes.is_unsigned(sdt)
        r = tmp()
        if op in _FMATH:
            decls.add(f"declare {t} @llvm.{_FMATH[op]}.{'f32' if t == 'float' else 'f64'}({t})")
            out.append(f"  {r} = call {t} @llvm.{_FMATH[op]}.{'f32' if t == 'float' else 'f64'}({t} {a[0]})")
        elif op is Ops.NEG:
            out.append(f"  {r} = fneg {t} {a[0]}" if fl else f"  {r} = {'xor' if t == 'i1' else 'sub'} {t} 0, {a[0]}")
            if t == "i1":
                out[-1] = f"  {r} = xor i1 {a[0]}, true"
        elif op is Ops.RECIPROCAL:
            out.append(f"  {r} = fdiv {t} {const(1.0, dt)}, {a[0]}")
        elif op in (Ops.ADD, Ops.MUL) and t == "i1":
            out.append(f"  {r} = {'or' if op is Ops.ADD else 'and'} i1 {a[0]}, {a[1]}")
        elif op in (Ops.ADD, Ops.MUL, Ops.FDIV):
            name = {Ops.ADD: "add", Ops.MUL: "mul", Ops.FDIV: "div"}[op]
            out.append(f"  {r} = {'f' + name if fl else name} {t} {a[0]}, {a[1]}")
        elif op in (Ops.IDIV, Ops.MOD):
            instr = ("sdiv" if signed else "udiv") if op is Ops.IDIV else ("srem" if signed else "urem")
            z, d, q = tmp(), tmp(), tmp()
            out.append(f"  {z} = icmp eq {t} {a[1]}, 0")  # division by zero is defined as 0 (as on the CPU)
            out.append(f"  {d} = select i1 {z}, {t} 1, {t} {a[1]}")
            out.append(f"  {q} = {instr} {t} {a[0]}, {d}")
            out.append(f"  {r} = select i1 {z}, {t} 0, {t} {q}")
        elif op is Ops.MAX:
            c = tmp()
            cmp = "fcmp ugt" if fl else ("icmp sgt" if signed else "icmp ugt")
            out.append(f"  {c} = {cmp} {t} {a[0]}, {a[1]}")
            out.append(f"  {r} = select i1 {c}, {t} {a[0]}, {t} {a[1]}")
        elif op in GroupOp.Comparison:
            pred = {Ops.CMPLT: ("olt", "slt" if signed else "ult"), Ops.CMPNE: ("une", "ne"), Ops.CMPEQ: ("oeq", "eq")}
            f, i = pred[op]
            out.append(f"  {r} = {'fcmp ' + f if fl else 'icmp ' + i} {st} {a[0]}, {a[1]}")
        elif op in (Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR):
            instr = {Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor", Ops.SHL: "shl"}.get(op) or (
                "ashr" if signed else "lshr"
            )
            out.append(f"  {r} = {instr} {t} {a[0]}, {a[1]}")
        elif op is Ops.WHERE:
            out.append(f"  {r} = select i1 {a[0]}, {t} {a[1]}, {t} {a[2]}")
        elif op is Ops.POW and fl:
            suffix = "f32" if t == "float" else "f64"
            decls.add(f"declare {t} @llvm.pow.{suffix}({t}, {t})")
            out.append(f"  {r} = call {t} @llvm.pow.{suffix}({t} {a[0]}, {t} {a[1]})")
        else:
            raise RenderError(f"the AMD LLVM IR renderer cannot render {op} on {dt!r}")
        return r

    def cast(x: str, src: DType, dst: DType) -> str:
        s, d = ltype(src), ltype(dst)
        if s == d:
            return x
        r = tmp()
        sf, df = dtypes.is_float(src), dtypes.is_float(dst)
        if dst is dtypes.bool:
            out.append(f"  {r} = {'fcmp une' if sf else 'icmp ne'} {s} {x}, {const(0, src)}")
        elif sf and df:
            out.append(f"  {r} = {'fpext' if dst.itemsize > src.itemsize else 'fptrunc'} {s} {x} to {d}")
        elif sf:
            out.append(f"  {r} = {'fptoui' if dtypes.is_unsigned(dst) else 'fptosi'} {s} {x} to {d}")
        elif df:
            ext = "uitofp" if dtypes.is_unsigned(src) or src is dtypes.bool else "sitofp"
            out.append(f"  {r} = {ext} {s} {x} to {d}")
        elif dst.itemsize > src.itemsize or src is dtypes.bool:
            out.append(f"  {r} = {'zext' if dtypes.is_unsigned(src) or src is dtypes.bool else 'sext'} {s} {x} to {d}")
        else:
            out.append(f"  {r} = trunc {s} {x} to {d}")
        return r

    params = sorted((u for u in lin if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg[0])
    for u in params:
        names[u] = f"%b{u.arg[0]}"
    body_start = len(out)
    labels = 0
    loop_labels: dict[UOp, tuple[str, str, str]] = {}
    for u in lin:
        op, dt = u.op, u.dtype
        if op in (Ops.DEFINE_GLOBAL, Ops.CONST):
            continue
        if op in (Ops.RANGE, Ops.DEFINE_ACC):
            slot = f"%s{len(slots)}"
            slots[u] = slot
            out.insert(body_start, f"  {slot} = alloca {ltype(dt)}, addrspace(5)")
            init = const(0, dt) if op is Ops.RANGE else v(u.src[0])
            out.append(f"  store {ltype(dt)} {init}, ptr addrspace(5) {slot}")
            if op is Ops.RANGE:
                labels += 1
                head, body, end = f"L{labels}h", f"L{labels}b", f"L{labels}e"
                loop_labels[u] = (head, body, end)
                out.append(f"  br label %{head}\n{head}:")
                c = tmp()
                out.append(f"  {c} = icmp slt {ltype(dt)} {v(u)}, {v(u.src[0])}")
                out.append(f"  br i1 {c}, label %{body}, label %{end}\n{body}:")
        elif op is Ops.ENDRANGE:
            rng = u.src[0]
            head, _, end = loop_labels[rng]
            nxt = tmp()
            out.append(f"  {nxt} = add {ltype(rng.dtype)} {v(rng)}, 1")
            out.append(f"  store {ltype(rng.dtype)} {nxt}, ptr addrspace(5) {slots[rng]}")
            out.append(f"  br label %{head}\n{end}:")
        elif op is Ops.ACC_UPDATE:
            acc = u.src[0]
            r = alu(u.arg, acc.dtype, [v(acc), v(u.src[1])], (acc, u.src[1]))
            out.append(f"  store {ltype(acc.dtype)} {r}, ptr addrspace(5) {slots[acc]}")
            slots[u] = slots[acc]  # read after the loop too, where this block's SSA value does not dominate
        elif op in (Ops.LOAD, Ops.STORE):
            buf = u.src[0]
            idx, idt = v(u.src[1]), ltype(u.src[1].dtype)
            if op is Ops.LOAD and len(u.src) == 3:  # a gated load reads element 0 instead, then selects zero
                g = v(u.src[2])
                safe = tmp()
                out.append(f"  {safe} = select i1 {g}, {idt} {idx}, {idt} 0")
                idx = safe
            p = tmp()
            out.append(f"  {p} = getelementptr inbounds {mtype(buf.dtype)}, ptr addrspace(1) {v(buf)}, {idt} {idx}")
            if op is Ops.LOAD:
                r = tmp()
                out.append(f"  {r} = load {mtype(dt)}, ptr addrspace(1) {p}")
                if dt is dtypes.bool:
                    b = tmp()
                    out.append(f"  {b} = icmp ne i8 {r}, 0")
                    r = b
                if len(u.src) == 3:
                    s = tmp()
                    out.append(f"  {s} = select i1 {v(u.src[2])}, {ltype(dt)} {r}, {ltype(dt)} {const(0, dt)}")
                    r = s
                names[u] = r
            else:
                val, vdt = v(u.src[2]), u.src[2].dtype
                if buf.dtype is dtypes.bool:
                    z = tmp()
                    out.append(f"  {z} = zext i1 {val} to i8")
                    val = z
                out.append(f"  store {mtype(vdt)} {val}, ptr addrspace(1) {p}")
        elif op is Ops.CAST:
            names[u] = cast(v(u.src[0]), u.src[0].dtype, dt)
        elif op is Ops.BITCAST:
            r = tmp()
            out.append(f"  {r} = bitcast {ltype(u.src[0].dtype)} {v(u.src[0])} to {ltype(dt)}")
            names[u] = r
        elif op in GroupOp.ALU:
            names[u] = alu(op, dt, [v(s) for s in u.src], u.src)
        else:
            raise RenderError(f"the AMD LLVM IR renderer cannot render {op}")

    args = ", ".join(f"ptr addrspace(1) noalias %b{u.arg[0]}" for u in params)
    return "\n".join(
        [
            f'target triple = "{TRIPLE}"',
            *sorted(decls),
            f"define amdgpu_kernel void @{name}({args}) {{",
            "entry:",
            *out,
            "  ret void",
            "}",
            "",
        ]
    )
