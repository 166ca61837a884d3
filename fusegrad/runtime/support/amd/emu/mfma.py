"""The matrix cores: VOP3P-MAI `v_mfma_*` instructions, a wave's whole D = A x B + C as one numpy matmul.

The encoding (CDNA3 ISA, "VOP3P-MAI"; the same on CDNA4): word 0 has VDST [7:0], CBSZ [10:8], ABID [14:11], ACC_CD
[15] (vdst and src2 are AGPRs), OP [22:16]; word 1 has SRC0 [8:0], SRC1 [17:9], SRC2 [26:18], ACC [28:27] (src0,
src1 are AGPRs) and BLGP [31:29]. AGPR n is column 256 + n of the register file (the gfx90a+ unified file).

Lane layouts, for the non-blocked shapes M x N x K with M = N = 16 or 32 (CDNA3 ISA "Dependent Arithmetic / Matrix
Core" section and AMD's Matrix Instruction Calculator): the wave's 64 lanes form 64/M groups of M; lane l holds
`per` consecutive K values of row l % M of A, k = (l // M) * per + v (v the element within the lane's registers,
low half first), and the same K values of column l % N of B. D and C take M*N/64 registers: register r of lane l is
D[(r // 4) * (4 * 64 / M) + (l // M) * 4 + r % 4][l % N].

Products are exact in float64 and summed in float64, then rounded to float32 once: the hardware's f32 accumulation
order is not specified, so results agree to float32 rounding. The broadcast modifiers (CBSZ, ABID, BLGP) and the
multi-block shapes (`_2b`, `_4b`, `_16b`) stop the dispatch as unimplemented.
"""

from __future__ import annotations

import numpy as np

from .machine import VGPR_BASE, Machine, Unsupported, inline_constant

AGPR = 256
# name -> (M, N, K, input type, K values per lane)
MFMA = {
    "v_mfma_f32_32x32x2_f32": (32, 32, 2, "f32", 1),
    "v_mfma_f32_16x16x4_f32": (16, 16, 4, "f32", 1),
    "v_mfma_f32_32x32x8_f16": (32, 32, 8, "f16", 4),
    "v_mfma_f32_16x16x16_f16": (16, 16, 16, "f16", 4),
    "v_mfma_f32_32x32x8_bf16": (32, 32, 8, "bf16", 4),
    "v_mfma_f32_16x16x16_bf16": (16, 16, 16, "bf16", 4),
    "v_mfma_i32_32x32x16_i8": (32, 32, 16, "i8", 8),
    "v_mfma_i32_16x16x32_i8": (16, 16, 32, "i8", 8),
    # CDNA4 (gfx950)
    "v_mfma_f32_32x32x16_f16": (32, 32, 16, "f16", 8),
    "v_mfma_f32_16x16x32_f16": (16, 16, 32, "f16", 8),
    "v_mfma_f32_32x32x16_bf16": (32, 32, 16, "bf16", 8),
    "v_mfma_f32_16x16x32_bf16": (16, 16, 32, "bf16", 8),
}
_BITS = {"f32": 32, "f16": 16, "bf16": 16, "i8": 8}


def layout(m_rows: int, per: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row of A / column of B, k) per (lane, element), and (row, column) of D per (lane, register)."""
    lane = np.arange(64)[:, None]
    rc, k = np.broadcast_to(lane % m_rows, (64, per)), (lane // m_rows) * per + np.arange(per)[None, :]
    regs = m_rows * m_rows // 64
    r = np.arange(regs)[None, :]
    di = (r // 4) * (4 * 64 // m_rows) + (lane // m_rows) * 4 + r % 4
    dj = np.broadcast_to(lane % m_rows, (64, regs))
    return rc, k, di, dj


def _elements(raw: np.ndarray, ty: str) -> np.ndarray:
    """(64, words) uint32 registers -> (64, per) values as float64 (int64 for i8), low half / byte first."""
    raw = np.ascontiguousarray(raw)
    if ty == "f32":
        return raw.view(np.float32).astype(np.float64)
    if ty == "f16":
        return raw.view(np.float16).astype(np.float64)
    if ty == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return raw.view(np.int8).astype(np.int64)


def _column(code: int, agpr: bool, what: str) -> int:
    if code < VGPR_BASE:
        raise Unsupported(f"{what} operand code {code} (MFMA sources are registers)")
    return code - VGPR_BASE + (AGPR if agpr else 0)


def compile_mfma(m: Machine, inst, nxt: int):
    f, name = inst.f, inst.name
    if name not in MFMA:
        raise Unsupported(f"{name} (a multi-block or xf32 shape)")
    if f["cbsz"] or f["abid"] or f["blgp"]:
        raise Unsupported(f"broadcast modifiers cbsz:{f['cbsz']} abid:{f['abid']} blgp:{f['blgp']}")
    rows, _, k_total, ty, per = MFMA[name]
    words, regs = per * _BITS[ty] // 32 or 1, rows * rows // 64
    a_col = _column(f["src0"], bool(f["acc"] & 1), "src0")
    b_col = _column(f["src1"], bool(f["acc"] & 2), "src1")
    d_col = f["vdst"] + (AGPR if f["acc_cd"] else 0)
    integer = ty == "i8"
    acc_ty = np.int32 if integer else np.float32
    if f["src2"] >= VGPR_BASE:
        c_col = _column(f["src2"], bool(f["acc_cd"]), "src2")
        c_get = lambda: m.V[:, c_col : c_col + regs].view(acc_ty)  # noqa: E731
    else:
        bits = inline_constant(f["src2"], "i32" if integer else "f32", inst.literal)
        c_const = np.full((64, regs), bits, np.uint32).view(acc_ty)
        c_get = lambda: c_const  # noqa: E731
    rc, k, di, dj = layout(rows, per)
    dt = np.int64 if integer else np.float64
    dst = m.V[:, d_col : d_col + regs].view(acc_ty)
    V = m.V

    def run():
        a, b = np.zeros((rows, k_total), dt), np.zeros((k_total, rows), dt)
        a[rc, k] = _elements(V[:, a_col : a_col + words], ty)
        b[k, rc] = _elements(V[:, b_col : b_col + words], ty)
        d = (a @ b)[di, dj] + c_get().astype(dt)
        _write(m, dst, d.astype(np.int64).astype(np.int32) if integer else d.astype(np.float32))
        return nxt

    return run


def compile_accvgpr_mov(m: Machine, inst, nxt: int):
    """v_accvgpr_mov_b32 (VOP1): AGPR to AGPR; src0's code 256 + n names AGPR n here."""
    src = _column(inst.f["src0"], True, "src0")
    src_view, dst = m.V[:, src], m.V[:, AGPR + inst.f["vdst"]]

    def move():
        _write(m, dst, src_view.copy())
        return nxt

    return move


def _write(m: Machine, dst: np.ndarray, value: np.ndarray) -> None:
    """Registers of the lanes EXEC has on (dst is (64,) or (64, registers))."""
    if m.exec_full:
        dst[...] = value
    else:
        np.copyto(dst, value, where=m.exec_mask.reshape((64,) + (1,) * (dst.ndim - 1)))
