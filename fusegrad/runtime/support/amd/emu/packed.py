"""VOP3P: packed math on two 16-bit halves of a VGPR (v_pk_*_f16/i16/u16), on two 32-bit halves of a register pair
(v_pk_fma/mul/add/mov_f32/b32, gfx90a+), and the mixed-precision FMAs (v_fma_mix*). op_sel picks the half each
source gives the low result, op_sel_hi the half for the high result; neg/neg_hi negate them."""

from __future__ import annotations

import numpy as np

from .machine import HALF, NP, VGPR_BASE, Machine, Unsupported
from .valu import VALU, fma32
from .vector import _masked

U32 = np.uint32
_PK32 = {"v_pk_fma_f32": (3, fma32), "v_pk_mul_f32": (2, np.multiply), "v_pk_add_f32": (2, np.add)}


def _dot4(signed: bool):
    """sum over the 4 bytes of a * b, plus c (32-bit wrap-around; clamp is refused)."""
    t = np.int8 if signed else np.uint8

    def dot(a, b, c):
        x = np.broadcast_to(a, (64,)).astype(U32).view(t).reshape(64, 4).astype(np.int64)
        y = np.broadcast_to(b, (64,)).astype(U32).view(t).reshape(64, 4).astype(np.int64)
        return ((x * y).sum(1) + np.broadcast_to(c, (64,)).astype(U32).view(np.int32 if signed else U32)).astype(U32)

    return dot


_DOT = {"v_dot4_i32_i8": _dot4(True), "v_dot4_u32_u8": _dot4(False)}


def _halves32(m: Machine, code: int):
    if code >= VGPR_BASE:
        r = code - VGPR_BASE
        return m.vview(r, "f32"), m.vview(r + 1, "f32")
    if code <= 127:
        return m.sview(code, "f32"), m.sview(code + 1, "f32")
    c = m.source(code, "f32")
    return c, c


def _halves16(m: Machine, code: int, ty: str):
    if code >= VGPR_BASE:
        r = code - VGPR_BASE
        return m.vview(r, ty), m.vhigh16(r, ty)
    if code <= 127:
        s = m.S[code : code + 1].view(np.uint16)
        return s[0:1].view(NP[ty]), s[1:2].view(NP[ty])
    c = m.source(code, ty)
    return c, c


def compile_vop3p(m: Machine, inst, nxt: int):
    f, name = inst.f, inst.name
    codes = [f["src0"], f["src1"], f["src2"]]
    opsel, opsel_hi = f["opsel"], f["opsel_hi"] | f["opsel_hi2"] << 2
    neg, neg_hi = f["neg"], f["neg_hi"]
    if f["clamp"]:
        raise Unsupported("clamp on packed math")
    if name in _PK32 or name == "v_pk_mov_b32":
        lo_d, hi_d = m.vview(f["vdst"], "f32"), m.vview(f["vdst"] + 1, "f32")
        if name == "v_pk_mov_b32":
            a, b = _halves32(m, codes[0]), _halves32(m, codes[1])
            x, y = a[opsel & 1], b[opsel >> 1 & 1]

            def run():
                lo, hi = x.copy(), y.copy()
                _masked(m, lo_d, lo)
                _masked(m, hi_d, hi)
                return nxt

            return run
        n, fn = _PK32[name]
        pairs = [_halves32(m, codes[i]) for i in range(n)]
        lo_src = [(pairs[i][opsel >> i & 1], neg >> i & 1) for i in range(n)]
        hi_src = [(pairs[i][opsel_hi >> i & 1], neg_hi >> i & 1) for i in range(n)]

        def run():
            lo = fn(*[-a if ng else a for a, ng in lo_src])
            hi = fn(*[-a if ng else a for a, ng in hi_src])
            _masked(m, lo_d, lo)
            _masked(m, hi_d, hi)
            return nxt

        return run
    if name in _DOT:
        if f["clamp"]:
            raise Unsupported("clamp on a dot product")
        fn = _DOT[name]
        a, b, c = (m.source(code, "u32", inst.literal) for code in codes)
        dst = m.vview(f["vdst"], "u32")

        def dot():
            _masked(m, dst, fn(a, b, c))
            return nxt

        return dot
    if name in ("v_accvgpr_read_b32", "v_accvgpr_write_b32"):
        # write: AGPR vdst from a VGPR or constant; read: VGPR vdst from the AGPR src0 names (its code 256 + n is
        # AGPR n's column in the register file, 256 + n)
        src = m.V[:, codes[0]] if name.endswith("read_b32") else m.source(codes[0], "u32", inst.literal)
        dst = m.vview(f["vdst"] + (256 if name.endswith("write_b32") else 0), "u32")

        def move():
            _masked(m, dst, np.broadcast_to(src, (64,)).copy())
            return nxt

        return move
    if name.startswith("v_fma_mix"):
        return _mix(m, inst, codes, opsel, opsel_hi, neg, neg_hi, nxt)
    if name.startswith("v_pk_"):
        base = "v_" + name[5:]
        if base not in VALU or VALU[base][0] not in HALF:
            raise Unsupported(name)
        dty, stys, fn = VALU[base]
        n = len(stys)
        pairs = [_halves16(m, codes[i], stys[i]) for i in range(n)]
        lo_src = [(pairs[i][opsel >> i & 1], neg >> i & 1) for i in range(n)]
        hi_src = [(pairs[i][opsel_hi >> i & 1], neg_hi >> i & 1) for i in range(n)]
        dst = m.vview(f["vdst"], "u32")

        def run():
            lo = np.asarray(fn(*[-a if ng else a for a, ng in lo_src]), NP[dty]).view(np.uint16).astype(U32)
            hi = np.asarray(fn(*[-a if ng else a for a, ng in hi_src]), NP[dty]).view(np.uint16).astype(U32)
            _masked(m, dst, lo | (hi << U32(16)))
            return nxt

        return run
    raise Unsupported(name)


def _mix(m: Machine, inst, codes, opsel, opsel_hi, neg, absolute, nxt):
    srcs = []
    for i, code in enumerate(codes):
        if opsel_hi >> i & 1:  # a float16 operand, from the half op_sel names
            lo, hi = _halves16(m, code, "f16")
            arr = hi if opsel >> i & 1 else lo
        else:
            arr = m.source(code, "f32")
        srcs.append((arr, neg >> i & 1, absolute >> i & 1))
    vdst = inst.f["vdst"]
    name = inst.name

    def operand(arr, ng, ab):
        x = arr.astype(np.float32)
        x = np.abs(x) if ab else x
        return -x if ng else x

    if name == "v_fma_mix_f32":
        dst = m.vview(vdst, "f32")
    else:
        dst = m.vhigh16(vdst, "f16") if name == "v_fma_mixhi_f16" else m.vview(vdst, "f16")

    def run():
        r = fma32(*[operand(*s) for s in srcs])
        _masked(m, dst, r if name == "v_fma_mix_f32" else r.astype(np.float16))
        return nxt

    return run
