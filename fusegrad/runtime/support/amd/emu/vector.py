"""Compiling vector ALU instructions (VOP1/VOP2/VOPC/VOP3/VOP3P, SDWA) into closures over the register file.

A closure computes the whole wave's result with numpy calls and writes it through EXEC: a plain assignment when
every lane is on, `np.copyto(..., where=EXEC)` otherwise.
"""

from __future__ import annotations

import numpy as np

from .machine import EXEC, HALF, NP, VCC, VGPR_BASE, WIDE, Machine, Unsupported, bits_of, mask_of
from .valu import VALU, compare, fma32, fma64

U32, U64 = np.uint32, np.uint64
_RAW = {16: np.uint16, 32: np.uint32, 64: np.uint64}


def _width(ty: str) -> int:
    return 64 if ty in WIDE else 16 if ty in HALF else 32


def _masked(m: Machine, view: np.ndarray, value) -> None:
    if m.exec_full:
        np.copyto(view, value, casting="unsafe")
    else:
        np.copyto(view, value, casting="unsafe", where=m.exec_mask)


def writer(m: Machine, vdst: int, ty: str, clamp: bool = False, high: bool = False):
    """A function storing a result of type ty into VGPR vdst through EXEC."""
    if ty in HALF:
        full = m.vview(vdst, "u32")
        if high:
            hv = m.vhigh16(vdst, "u16")
            return lambda r: _masked(m, hv, np.asarray(r, NP[ty]).view(np.uint16))
        return lambda r: _masked(m, full, np.asarray(r, NP[ty]).view(np.uint16).astype(U32))
    view = m.vview(vdst, ty)
    if clamp and ty[0] == "f":
        return lambda r: _masked(m, view, np.clip(r, 0, 1))
    return lambda r: _masked(m, view, r)


def write_lanes(m: Machine, sdst: int, bits: np.ndarray) -> int:
    """Store a per-lane condition (off lanes read 0) as the 64-bit mask in SGPR pair sdst; the mask's value."""
    if bits.shape[0] == 1:  # both operands were scalars: every on lane has the same answer
        value = m.exec_bits() if bits[0] else 0
    else:
        value = bits_of(bits & m.exec_mask)
    m.sset64(sdst, value)
    if sdst == EXEC:
        m.exec_changed()
    return value


def _modified(arr: np.ndarray, ty: str, absolute: bool, negate: bool):
    if ty[0] != "f":
        if absolute or negate:
            raise Unsupported(f"abs/neg modifiers on a {ty} operand")
        return arr
    if absolute and negate:
        return lambda: -np.abs(arr)
    if absolute:
        return lambda: np.abs(arr)
    if negate:
        return lambda: -arr
    return arr


def _sdwa_source(m: Machine, code: int, scalar: bool, sel: int, sext: bool, ty: str):
    raw = m.source(code if scalar else VGPR_BASE + code, "u32")
    if sel == 6:
        if ty in HALF:
            return lambda: (raw & U32(0xFFFF)).astype(np.uint16).view(NP[ty])
        return raw if ty == "u32" else raw.view(NP[ty])
    shift, bits = (8 * sel, 8) if sel < 4 else (16 * (sel - 4), 16)
    top = U32(1 << (bits - 1))

    def get():
        v = (raw >> U32(shift)) & U32((1 << bits) - 1)
        if sext:
            v = ((v ^ top) - top).astype(U32)
        if ty in HALF:
            return v.astype(np.uint16).view(NP[ty])
        return v.view(NP[ty]) if ty != "u32" else v

    return get


def _sdwa_writer(m: Machine, vdst: int, ty: str, sel: int, unused: int):
    full = m.vview(vdst, "u32")
    if sel == 6:
        return writer(m, vdst, ty)
    shift, bits = (8 * sel, 8) if sel < 4 else (16 * (sel - 4), 16)
    field = U32(((1 << bits) - 1) << shift)
    if unused == 1:
        raise Unsupported("SDWA dst_unused=UNUSED_SEXT")

    def w(r):
        arr = np.asarray(r, NP[ty])
        raw = arr.view(np.uint16).astype(U32) if ty in HALF else arr.view(_RAW[_width(ty)]).astype(U32)
        v = (raw << U32(shift)) & field
        if unused == 2:
            v = v | (full & ~field)
        _masked(m, full, v)

    return w


def _call(fn, getters):
    """A zero-argument function computing fn over the sources (arrays or zero-argument getters)."""
    if all(isinstance(g, np.ndarray) for g in getters):
        if len(getters) == 1:
            a = getters[0]
            return lambda: fn(a)
        if len(getters) == 2:
            a, b = getters
            return lambda: fn(a, b)
        a, b, c = getters
        return lambda: fn(a, b, c)
    gs = [g if callable(g) else (lambda g=g: g) for g in getters]
    return lambda: fn(*[g() for g in gs])


class Operands:
    """The decoded operand fields of one VALU instruction, normalized across VOP1/VOP2/VOPC/VOP3 and SDWA."""

    def __init__(self, m: Machine, inst):
        f, self.m, self.inst = inst.f, m, inst
        self.sdwa = f.get("ext") == 249
        if f.get("ext") == 250:
            raise Unsupported("DPP operands")
        self.vop3 = inst.fmt == "VOP3"
        self.literal = inst.literal
        if self.vop3:
            self.codes = [f["src0"], f["src1"], f["src2"]]
            self.abs, self.neg, self.opsel = f["abs"], f["neg"], f["opsel"]
            if f["omod"]:
                raise Unsupported("output modifier (omod)")
        else:
            self.codes = [f["src0"], VGPR_BASE + f.get("vsrc1", 0), None]
            self.abs = self.neg = self.opsel = 0
        self.vdst = f.get("vdst", 0)
        self.clamp = bool(f.get("clamp", 0))
        if self.sdwa:
            e = f["ext_word"]
            self.e = e
            self.codes[0] = e & 0xFF
            if inst.fmt != "VOPC":  # VOPC's SDWA word holds SDST and SD in bits 15:8 instead of the output fields
                self.clamp = bool(e >> 13 & 1)
                if e >> 14 & 3:
                    raise Unsupported("SDWA output modifier")

    def src(self, i: int, ty: str):
        if self.sdwa and i < 2:
            e = self.e
            sel, sext, neg, ab, scalar = (
                (e >> 16 & 7, e >> 19 & 1, e >> 20 & 1, e >> 21 & 1, e >> 23 & 1)
                if i == 0
                else (e >> 24 & 7, e >> 27 & 1, e >> 28 & 1, e >> 29 & 1, e >> 31 & 1)
            )
            code = self.codes[0] if i == 0 else self.codes[1] - VGPR_BASE
            g = _sdwa_source(self.m, code, bool(scalar), sel, bool(sext), ty)
            if neg or ab:
                if ty[0] != "f":
                    raise Unsupported("SDWA neg/abs on an integer operand")
                inner = g if callable(g) else (lambda g=g: g)
                sign = -1 if neg else 1
                return (lambda: sign * np.abs(inner())) if ab else (lambda: -inner())
            return g
        code = self.codes[i]
        if code is None:
            raise Unsupported(f"source {i} of a 32-bit encoding")
        arr = self.m.source(code, ty, self.literal)
        if self.vop3 and ty in HALF and self.opsel >> i & 1:
            if code < VGPR_BASE:
                raise Unsupported("op_sel on a scalar 16-bit operand")
            arr = self.m.vhigh16(code - VGPR_BASE, ty)
        return _modified(arr, ty, bool(self.abs >> i & 1), bool(self.neg >> i & 1))

    def out(self, ty: str):
        if self.sdwa:
            e = self.e
            return _sdwa_writer(self.m, self.vdst, ty, e >> 8 & 7, e >> 11 & 3)
        return writer(self.m, self.vdst, ty, self.clamp, high=self.vop3 and ty in HALF and bool(self.opsel >> 3 & 1))


def compile_valu(m: Machine, inst, nxt: int):
    name = inst.name
    ops = Operands(m, inst)
    if name.startswith(("v_cmp_", "v_cmpx_")):
        return _compile_cmp(m, inst, ops, nxt)
    special = _SPECIAL.get(name)
    if special is not None:
        return special(m, inst, ops, nxt)
    if name not in VALU or VALU[name][2] is None:
        raise Unsupported(name)
    dty, stys, fn = VALU[name]
    if name in ("v_fmac_f32", "v_fmac_f64", "v_mac_f32", "v_dot4c_i32_i8"):
        srcs = [ops.src(0, stys[0]), ops.src(1, stys[1]), m.vview(ops.vdst, stys[2])]
    elif name == "v_fmamk_f32":
        srcs = [ops.src(0, "f32"), m.source(255, "f32", inst.literal), ops.src(1, "f32")]
    elif name == "v_fmaak_f32":
        srcs = [ops.src(0, "f32"), ops.src(1, "f32"), m.source(255, "f32", inst.literal)]
    else:
        srcs = [ops.src(i, t) for i, t in enumerate(stys)]
    fast = _ufunc_into(m, fn, srcs, ops, dty, nxt) or _direct(m, fn, srcs, ops, dty, nxt)
    if fast is not None:
        return fast
    compute, write = _call(fn, srcs), ops.out(dty)

    def run():
        write(compute())
        return nxt

    return run


def _ufunc_into(m: Machine, fn, srcs, ops: Operands, dty: str, nxt: int):
    """The fast path of a plain numpy ufunc on register/constant operands: computed straight into the destination
    when every lane is on."""
    if not isinstance(fn, np.ufunc) or ops.sdwa or ops.clamp or dty in HALF or ops.opsel:
        return None
    if not all(isinstance(s, np.ndarray) and s.dtype == NP[dty] for s in srcs):
        return None
    view = m.vview(ops.vdst, dty)
    if len(srcs) == 1:
        (a,) = srcs

        def run1():
            if m.exec_full:
                fn(a, out=view)
            else:
                np.copyto(view, fn(a), where=m.exec_mask)
            return nxt

        return run1
    if len(srcs) != 2:
        return None
    a, b = srcs

    def run2():
        if m.exec_full:
            fn(a, b, out=view)
        else:
            np.copyto(view, fn(a, b), where=m.exec_mask)
        return nxt

    return run2


def _direct(m: Machine, fn, srcs, ops: Operands, dty: str, nxt: int):
    """Any function of three register/constant operands with a 32/64-bit result, in one closure."""
    if ops.sdwa or ops.clamp or dty in HALF or ops.opsel or len(srcs) != 3:
        return None
    if not all(isinstance(s, np.ndarray) for s in srcs):
        return None
    view = m.vview(ops.vdst, dty)
    a, b, c = srcs

    def run3():
        r = fn(a, b, c)
        if m.exec_full:
            view[...] = r
        else:
            np.copyto(view, r, casting="unsafe", where=m.exec_mask)
        return nxt

    return run3


def _compile_cmp(m: Machine, inst, ops: Operands, nxt: int):
    found = compare(inst.name)
    if found is None:
        raise Unsupported(inst.name)
    ty, pred = found
    a = ops.src(0, ty)
    b = ops.src(1, "u32" if inst.name.startswith(("v_cmp_class", "v_cmpx_class")) else ty)
    compute = _call(pred, [a, b])
    if ops.sdwa:
        e = ops.e
        sdst = (e >> 8 & 0x7F) if e >> 15 & 1 else VCC
    else:
        sdst = ops.vdst if ops.vop3 else VCC
    to_exec = inst.name.startswith("v_cmpx")

    def run():
        value = write_lanes(m, sdst, compute())
        if to_exec:
            m.sset64(EXEC, value)
            m.exec_changed()
        return nxt

    return run


def _lane_mask(m: Machine, ops: Operands, carry_index: int):
    """Per-lane condition input: VCC for 32-bit encodings, the SGPR pair in src2 for VOP3."""
    if not ops.vop3:
        return lambda: mask_of(m.sget64(VCC))
    code = ops.codes[carry_index]
    if code >= VGPR_BASE or code > EXEC:
        raise Unsupported("a lane mask that is not an SGPR pair")
    return lambda: mask_of(m.sget64(code))


def _cndmask(m, inst, ops, nxt):
    ty = "f32" if ops.vop3 and (ops.abs or ops.neg) else "u32"  # float modifiers on a select
    a, b = ops.src(0, ty), ops.src(1, ty)
    ga = a if callable(a) else (lambda a=a: a)
    gb = b if callable(b) else (lambda b=b: b)
    cond, write = _lane_mask(m, ops, 2), ops.out(ty)

    def run():
        write(np.where(cond(), gb(), ga()))
        return nxt

    return run


def _carry_op(kind: str, with_in: bool):
    def build(m, inst, ops, nxt):
        a, b = ops.src(0, "u32"), ops.src(1, "u32")
        ga = a if callable(a) else (lambda a=a: a)
        gb = b if callable(b) else (lambda b=b: b)
        cin = _lane_mask(m, ops, 2) if with_in else None
        sdst = inst.f["sdst"] if ops.vop3 else VCC
        write = ops.out("u32")

        def run():
            x, y = ga().astype(U64), gb().astype(U64)
            if kind == "subrev":
                x, y = y, x
            c = cin().astype(U64) if cin is not None else U64(0)
            if kind == "add":
                r = x + y + c
                carry = r >> U64(32)
            else:
                r = x - y - c
                carry = (y + c) > x
            write(r.astype(U32))
            write_lanes(m, sdst, np.asarray(carry).astype(bool))
            return nxt

        return run

    return build


def _readfirstlane(m, inst, ops, nxt):
    src = ops.src(0, "u32")
    sdst = ops.vdst

    def run():
        mask = m.exec_mask
        lane = int(mask.argmax()) if mask.any() else 0
        v = src() if callable(src) else src
        m.S[sdst] = v[lane if v.shape[0] > 1 else 0]
        return nxt

    return run


def _lane_select(m: Machine, ops: Operands):
    code = ops.codes[1]
    if code >= VGPR_BASE:
        raise Unsupported("a lane select in a VGPR")
    sel = m.source(code, "u32", ops.literal)
    return lambda: int(sel[0]) & 63


def _readlane(m, inst, ops, nxt):  # SGPR = one lane of a VGPR, whatever EXEC says (SGPR spills use it)
    src, lane, sdst = m.vview(ops.codes[0] - VGPR_BASE, "u32"), _lane_select(m, ops), ops.vdst

    def run():
        m.S[sdst] = src[lane()]
        return nxt

    return run


def _writelane(m, inst, ops, nxt):  # one lane of a VGPR = an SGPR or constant, whatever EXEC says
    value, lane, dst = m.source(ops.codes[0], "u32", ops.literal), _lane_select(m, ops), m.vview(ops.vdst, "u32")

    def run():
        dst[lane()] = value[0]
        return nxt

    return run


def _div_scale(ty: str):
    def build(m, inst, ops, nxt):
        s0 = ops.src(0, ty)
        g0 = s0 if callable(s0) else (lambda: s0)
        write, sdst = ops.out(ty), inst.f["sdst"]

        def run():  # no pre-scaling: the quotient's range stays inside what the fixup's special cases cover
            write(g0())
            write_lanes(m, sdst, np.zeros(1, bool))
            return nxt

        return run

    return build


def _div_fmas(ty: str):
    fma = fma32 if ty == "f32" else fma64

    def build(m, inst, ops, nxt):
        srcs = [ops.src(i, ty) for i in range(3)]
        compute, write = _call(fma, srcs), ops.out(ty)
        scale = np.array(2.0**32 if ty == "f32" else 2.0**64, NP[ty])

        def run():
            r = compute()
            vcc = mask_of(m.sget64(VCC))
            write(np.where(vcc, r * scale, r) if vcc.any() else r)
            return nxt

        return run

    return build


def _div_fixup(ty: str):
    def fixup(q, den, num):
        q, den, num = np.broadcast_arrays(q, den, num)
        sign = np.signbit(den) ^ np.signbit(num)
        inf = np.where(sign, -np.inf, np.inf).astype(q.dtype)
        zero = np.where(sign, -0.0, 0.0).astype(q.dtype)
        out = np.where(sign, -np.abs(q), np.abs(q)).astype(q.dtype)
        out = np.where((den == 0) | np.isinf(num), inf, out)
        out = np.where(np.isinf(den) | (num == 0), zero, out)
        bad = ((den == 0) & (num == 0)) | (np.isinf(den) & np.isinf(num))
        out = np.where(bad | np.isnan(den) | np.isnan(num), np.array(np.nan, q.dtype), out)
        return out

    def build(m, inst, ops, nxt):
        compute, write = _call(fixup, [ops.src(i, ty) for i in range(3)]), ops.out(ty)

        def run():
            write(compute())
            return nxt

        return run

    return build


def _mad64(signed: bool):
    def build(m, inst, ops, nxt):
        ity = "i32" if signed else "u32"
        a, b, c = ops.src(0, ity), ops.src(1, ity), ops.src(2, "u64")
        compute = _call(lambda a, b, c: (a.astype(np.int64 if signed else U64), b, c), [a, b, c])
        write, sdst = ops.out("u64"), inst.f["sdst"]

        def run():
            x, y, z = compute()
            prod = (x * y.astype(x.dtype)).astype(U64)
            r = prod + z
            write(r)
            write_lanes(m, sdst, r < z)
            return nxt

        return run

    return build


def _pkrtz(m, inst, ops, nxt):
    def cvt(x):  # round toward zero: take the nearest float16, step one toward zero if it is farther out
        h = x.astype(np.float16)
        over = np.abs(h.astype(np.float32)) > np.abs(x)
        h = np.where(over & np.isfinite(x), np.nextafter(h, np.float16(0)), h).astype(np.float16)
        return h.view(np.uint16).astype(U32)

    compute = _call(lambda a, b: cvt(a) | (cvt(b) << U32(16)), [ops.src(0, "f32"), ops.src(1, "f32")])
    write = ops.out("u32")

    def run():
        write(compute())
        return nxt

    return run


_SPECIAL = {
    "v_cndmask_b32": _cndmask,
    "v_add_co_u32": _carry_op("add", False),
    "v_sub_co_u32": _carry_op("sub", False),
    "v_subrev_co_u32": _carry_op("subrev", False),
    "v_addc_co_u32": _carry_op("add", True),
    "v_subb_co_u32": _carry_op("sub", True),
    "v_subbrev_co_u32": _carry_op("subrev", True),
    "v_readfirstlane_b32": _readfirstlane,
    "v_readlane_b32": _readlane,
    "v_writelane_b32": _writelane,
    "v_div_scale_f32": _div_scale("f32"),
    "v_div_scale_f64": _div_scale("f64"),
    "v_div_fmas_f32": _div_fmas("f32"),
    "v_div_fmas_f64": _div_fmas("f64"),
    "v_div_fixup_f32": _div_fixup("f32"),
    "v_div_fixup_f64": _div_fixup("f64"),
    "v_div_fixup_f16": _div_fixup("f16"),
    "v_mad_u64_u32": _mad64(False),
    "v_mad_i64_i32": _mad64(True),
    "v_cvt_pkrtz_f16_f32": _pkrtz,
}
