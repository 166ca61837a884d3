"""The matrix-core instructions on hand-assembled VOP3P-MAI words: decoding (against llvm-mc-19's encodings for gfx942
and the gfx950 objects llvmlite's LLVM emits) and execution against numpy, with the lane layouts of AMD's ISA guide."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fusegrad.runtime.support.amd.emu import decode
from fusegrad.runtime.support.amd.emu.program import Unimplemented
from fusegrad.runtime.support.amd.emu.standalone import run_wave

ENDPGM, V, AGPR = 0xBF810000, 256, 256
OPS = {  # name: (opcode, M, K, input type, K values per lane)
    "v_mfma_f32_32x32x2_f32": (0x44, 32, 2, "f32", 1),
    "v_mfma_f32_16x16x4_f32": (0x45, 16, 4, "f32", 1),
    "v_mfma_f32_32x32x8_f16": (0x4C, 32, 8, "f16", 4),
    "v_mfma_f32_16x16x16_f16": (0x4D, 16, 16, "f16", 4),
    "v_mfma_f32_32x32x8_bf16": (0x60, 32, 8, "bf16", 4),
    "v_mfma_f32_16x16x16_bf16": (0x61, 16, 16, "bf16", 4),
    "v_mfma_f32_32x32x16_f16": (0x55, 32, 16, "f16", 8),  # gfx950
    "v_mfma_f32_16x16x32_f16": (0x54, 16, 32, "f16", 8),
    "v_mfma_f32_32x32x16_bf16": (0x37, 32, 16, "bf16", 8),
    "v_mfma_f32_16x16x32_bf16": (0x35, 16, 32, "bf16", 8),
}


def mai(op, vdst, src0, src1, src2, acc_cd=0, acc=0, cbsz=0, abid=0, blgp=0) -> list[int]:
    """A VOP3P-MAI instruction: word 0 = 0x1A7 << 23 | op << 16 | acc_cd << 15 | abid << 11 | cbsz << 8 | vdst."""
    w0 = 0xD3800000 | op << 16 | acc_cd << 15 | abid << 11 | cbsz << 8 | vdst
    return [w0, blgp << 29 | acc << 27 | src2 << 18 | src1 << 9 | src0]


def program(*insts) -> bytes:
    words = [w for i in insts for w in i] + [ENDPGM]
    return struct.pack(f"<{len(words)}I", *words)


def test_encodings_llvm_mc_prints_decode_to_their_names_and_fields():
    # llvm-mc-19 -arch=amdgcn -mcpu=gfx942 -show-encoding
    cases = {
        "v_mfma_f32_32x32x2_f32 a[0:15], v1, v2, a[0:15]": [0x00, 0x80, 0xC4, 0xD3, 0x01, 0x05, 0x02, 0x04],
        "v_mfma_f32_32x32x2_f32 v[0:15], v1, v2, 0": [0x00, 0x00, 0xC4, 0xD3, 0x01, 0x05, 0x02, 0x02],
        "v_mfma_f32_16x16x16_f16 a[0:3], v[2:3], v[4:5], a[0:3]": [0x00, 0x80, 0xCD, 0xD3, 0x02, 0x09, 0x02, 0x04],
        "v_mfma_f32_32x32x8_bf16 a[0:15], v[2:3], v[4:5], a[0:15]": [0x00, 0x80, 0xE0, 0xD3, 0x02, 0x09, 0x02, 0x04],
        "v_mfma_f32_32x32x8_f16 a[0:15], a[2:3], v[4:5], a[0:15] cbsz:1 abid:1 blgp:2": [
            0x00, 0x89, 0xCC, 0xD3, 0x02, 0x09, 0x02, 0x4C
        ],
    }  # fmt: skip
    for text, raw in cases.items():
        inst = decode(bytes(raw))
        assert inst.name == text.split()[0] and inst.size == 8
    f = decode(bytes(cases["v_mfma_f32_32x32x8_f16 a[0:15], a[2:3], v[4:5], a[0:15] cbsz:1 abid:1 blgp:2"])).f
    assert (f["cbsz"], f["abid"], f["blgp"], f["acc"], f["acc_cd"], f["src0"], f["src2"]) == (1, 1, 2, 1, 1, 258, 256)
    assert decode(bytes(cases["v_mfma_f32_32x32x2_f32 v[0:15], v1, v2, 0"])).f["src2"] == 128  # inline 0
    assert decode(struct.pack("<I", 0x7E02A502)).name == "v_accvgpr_mov_b32"  # v_accvgpr_mov_b32 a1, a2
    for name, (op, *_) in OPS.items():  # the hand assembler agrees with the table, gfx950's opcodes included
        assert decode(struct.pack("<2I", *mai(op, 0, V + 1, V + 2, 128))).name == name


def _pack(values: np.ndarray, ty: str) -> np.ndarray:
    """(64, per) values -> (64, words) uint32 registers, element 0 in the low bits."""
    if ty == "f32":
        return values.astype(np.float32).view(np.uint32)
    if ty == "f16":
        return np.ascontiguousarray(values.astype(np.float16)).view(np.uint32)
    bits = values.astype(np.float32).view(np.uint32) >> np.uint32(16)  # values are bfloat16-exact
    return np.ascontiguousarray(bits.astype(np.uint16)).view(np.uint32)


def _operands(rows: int, k: int, ty: str, per: int, rng):
    """A (rows x k), B (k x rows) exactly representable in ty, and their lanes: lane l holds A[l % rows, kk] and
    B[kk, l % rows] for kk = (l // rows) * per + v (AMD CDNA3 ISA, matrix core lane layout)."""
    a = rng.integers(-8, 8, (rows, k)) / 4
    b = rng.integers(-8, 8, (k, rows)) / 8
    la, lb = np.zeros((64, per)), np.zeros((64, per))
    for lane in range(64):
        for v in range(per):
            kk = (lane // rows) * per + v
            la[lane, v], lb[lane, v] = a[lane % rows, kk], b[kk, lane % rows]
    return a, b, _pack(la, ty), _pack(lb, ty)


def _result_registers(d: np.ndarray, rows: int) -> np.ndarray:
    """D as (64, rows*rows/64) registers: register r of lane l is D[(r//4)*(256//rows) + (l//rows)*4 + r%4, l%rows]."""
    out = np.zeros((64, rows * rows // 64), np.float32)
    for lane in range(64):
        for r in range(out.shape[1]):
            out[lane, r] = d[(r // 4) * (256 // rows) + (lane // rows) * 4 + r % 4, lane % rows]
    return out


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("accumulators", ["agpr", "vgpr"])
def test_mfma_computes_a_times_b_plus_c(name, accumulators):
    op, rows, k, ty, per = OPS[name]
    rng = np.random.default_rng(op)
    a, b, ra, rb = _operands(rows, k, ty, per, rng)
    c = rng.standard_normal((rows, rows)).astype(np.float32)
    regs, words = rows * rows // 64, ra.shape[1]
    base = AGPR if accumulators == "agpr" else 0
    cregs = _result_registers(c, rows).view(np.uint32)
    vgprs = {40 + w: ra[:, w] for w in range(words)} | {48 + w: rb[:, w] for w in range(words)}
    vgprs |= {base + r: cregs[:, r] for r in range(regs)}
    inst = mai(op, 0, V + 40, V + 48, V + 0, acc_cd=int(accumulators == "agpr"))
    m, _ = run_wave(program(inst), vgprs=vgprs)
    got = m.V[:, base : base + regs].view(np.float32)
    want = _result_registers((a @ b + c.astype(np.float64)).astype(np.float32), rows)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_inline_zero_accumulator_agpr_sources_and_the_agpr_move():
    op, rows, k, ty, per = OPS["v_mfma_f32_16x16x4_f32"]
    a, b, ra, rb = _operands(rows, k, ty, per, np.random.default_rng(3))
    # src0 from AGPR 7 (ACC bit 0), src1 from v9, C = 0 (inline 128), D in v[20:23]; then a1 <- a7
    prog = program(mai(op, 20, V + 7, V + 9, 128, acc=1), [0x7E02A507])
    m, _ = run_wave(prog, vgprs={AGPR + 7: ra[:, 0], 9: rb[:, 0]})
    np.testing.assert_allclose(m.V[:, 20:24].view(np.float32), _result_registers(a @ b, rows), rtol=1e-6)
    np.testing.assert_array_equal(m.V[:, AGPR + 1], ra[:, 0])


def test_broadcast_modifiers_stop_the_wave_by_name():
    prog = program(mai(0x4C, 0, V + 2, V + 4, V + 0, acc_cd=1, cbsz=1, abid=1))
    with pytest.raises(Unimplemented, match="v_mfma_f32_32x32x8_f16.*cbsz:1 abid:1"):
        run_wave(prog)
