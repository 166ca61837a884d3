"""Instruction-level tests of the CDNA3 emulator on hand-assembled words (encodings from the ISA reference's
microcode formats), each checked against numpy: EXEC masking, VCC carries, 64-bit addresses, conversions."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fusegrad.runtime.support.amd.emu import decode
from fusegrad.runtime.support.amd.emu.program import Unimplemented
from fusegrad.runtime.support.amd.emu.standalone import FlatMemory, run_wave

V, ENDPGM, VCC, EXEC = 256, 0xBF810000, 106, 126
LANES = np.arange(64)


def vop1(op, vdst, src0):
    return [0x7E000000 | vdst << 17 | op << 9 | src0]


def vop2(op, vdst, src0, vsrc1):
    return [op << 25 | vdst << 17 | vsrc1 << 9 | src0]


def vopc(op, src0, vsrc1):
    return [0x7C000000 | op << 17 | vsrc1 << 9 | src0]


def vop3(op, vdst, src0, src1, src2=0, sdst=None, neg=0, abs_=0):
    mid = sdst << 8 if sdst is not None else abs_ << 8
    return [0xD0000000 | op << 16 | mid | vdst, neg << 29 | src2 << 18 | src1 << 9 | src0]


def sop2(op, sdst, s0, s1):
    return [0x80000000 | op << 23 | sdst << 16 | s1 << 8 | s0]


def sop1(op, sdst, s0):
    return [0xBE800000 | sdst << 16 | op << 8 | s0]


def sopc(op, s0, s1):
    return [0xBF000000 | op << 16 | s1 << 8 | s0]


def sopp(op, imm=0):
    return [0xBF800000 | op << 16 | imm & 0xFFFF]


def smem(op, sdata, sbase, offset):
    return [0xC0000000 | op << 18 | 1 << 17 | sdata << 6 | sbase // 2, offset]


def glob(op, vdst_or_data, addr, saddr=0x7F, offset=0, store=False):
    data, vdst = (vdst_or_data, 0) if store else (0, vdst_or_data)
    return [0xDC000000 | op << 18 | 2 << 14 | offset & 0x1FFF, vdst << 24 | saddr << 16 | data << 8 | addr]


def code(*parts) -> bytes:
    words = [w for p in parts for w in p] + [ENDPGM]
    return struct.pack(f"<{len(words)}I", *words)


def lanes_on(mask: int) -> np.ndarray:
    return np.array([mask >> i & 1 for i in range(64)], bool)


def test_hand_assembled_words_decode_to_their_mnemonics():
    cases = {
        "v_add_f32": vop2(1, 0, V + 1, 2),
        "v_fmac_f32": vop2(59, 0, V + 1, 2),
        "v_addc_co_u32": vop2(28, 0, V + 1, 2),
        "v_cvt_f16_f32": vop1(10, 0, V + 1),
        "v_cmp_lt_f32": vopc(0x41, V + 1, 2),
        "v_mad_u64_u32": vop3(0x1E8, 0, V + 1, V + 2, V + 4, sdst=VCC),
        "s_addc_u32": sop2(4, 0, 1, 2),
        "s_and_saveexec_b64": sop1(32, 0, 2),
        "s_cmp_lg_u32": sopc(7, 0, 128),
        "s_cbranch_scc1": sopp(5, 3),
        "s_load_dwordx2": smem(1, 4, 0, 8),
        "global_load_dword": glob(20, 1, 2),
        "global_store_dwordx2": glob(29, 1, 2, store=True),
    }
    for name, words in cases.items():
        assert decode(struct.pack(f"<{len(words)}I", *words)).name == name


def test_exec_masking_keeps_the_off_lanes_registers():
    a, b = np.linspace(-1, 1, 64, dtype=np.float32), np.full(64, 0.25, np.float32)
    old = np.arange(64, dtype=np.float32)
    mask = 0xF0F0_0000_FFFF_0001
    m, steps = run_wave(code(vop2(1, 3, V + 1, 2)), vgprs={1: a, 2: b, 3: old}, exec_mask=mask)
    on = lanes_on(mask)
    np.testing.assert_array_equal(m.V[:, 3].view(np.float32), np.where(on, a + b, old))
    assert steps == 2


def test_vcc_carries_chain_a_64_bit_add_across_two_registers():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**64 - 1, 64, dtype=np.uint64, endpoint=True)
    y = rng.integers(0, 2**64 - 1, 64, dtype=np.uint64, endpoint=True)
    y[:8] = np.uint64(2**64 - 1) - x[:8]  # sums at the edge: no carry out of the high word
    lo, hi = lambda v: (v & np.uint64(0xFFFFFFFF)).astype(np.uint32), lambda v: (v >> np.uint64(32)).astype(np.uint32)  # noqa: E731
    prog = code(vop2(25, 4, V + 0, 2), vop2(28, 5, V + 1, 3))  # v_add_co_u32 v4, v0, v2; v_addc_co_u32 v5, v1, v3
    m, _ = run_wave(prog, vgprs={0: lo(x), 1: hi(x), 2: lo(y), 3: hi(y)})
    got = m.V[:, 4].astype(np.uint64) | m.V[:, 5].astype(np.uint64) << np.uint64(32)
    np.testing.assert_array_equal(got, x + y)
    carry = int(m.S[VCC]) | int(m.S[VCC + 1]) << 32
    want = sum(1 << i for i in range(64) if int(x[i]) + int(y[i]) >= 2**64)
    assert carry == want


def test_vop3_carry_out_goes_to_the_named_sgpr_pair_and_only_for_on_lanes():
    a = np.full(64, 0xFFFFFFFF, np.uint32)
    b = np.ones(64, np.uint32)
    m, _ = run_wave(code(vop3(0x119, 2, V + 0, V + 1, sdst=10)), vgprs={0: a, 1: b}, exec_mask=0xFF)
    assert int(m.S[10]) == 0xFF and int(m.S[11]) == 0
    assert (m.V[:8, 2] == 0).all() and (m.V[8:, 2] == 0).all()


def test_global_loads_and_stores_with_64_bit_and_scalar_base_addresses():
    mem = FlatMemory(1 << 16)
    base = 0x2000
    mem.data[base : base + 256] = np.arange(64, dtype=np.float32).view(np.uint8)
    addr = (base + 4 * ((LANES * 7) % 64)).astype(np.uint64)
    prog = code(
        glob(20, 3, 0),  # global_load_dword v3, v[0:1], off
        vop2(1, 3, 242, 3),  # v_add_f32 v3, 1.0, v3
        glob(28, 3, 4, saddr=6, offset=-16, store=True),  # global_store_dword v4, v3, s[6:7] offset:-16
    )
    m, _ = run_wave(
        prog,
        sgprs={6: 0x3000 + 16, 7: 0},
        vgprs={
            0: (addr & np.uint64(0xFFFFFFFF)).astype(np.uint32),
            1: (addr >> np.uint64(32)).astype(np.uint32),
            4: 4 * LANES,
        },
        memory=mem,
    )
    out = mem.data[0x3000 : 0x3000 + 256].view(np.float32)
    np.testing.assert_array_equal(out, ((LANES * 7) % 64).astype(np.float32) + 1)


def test_scalar_loads_loop_and_branch():
    mem = FlatMemory(1 << 14)
    mem.data[0x100:0x108] = np.array([5, 0x10], np.uint32).view(np.uint8)
    prog = code(
        smem(1, 4, 0, 0x100),  # s_load_dwordx2 s[4:5], s[0:1], 0x100
        sop2(0, 6, 6, 5),  # loop: s_add_u32 s6, s6, s5
        sop2(1, 4, 4, 129),  # s_sub_u32 s4, s4, 1
        sopc(7, 4, 128),  # s_cmp_lg_u32 s4, 0
        sopp(5, -4),  # s_cbranch_scc1 loop
    )
    m, steps = run_wave(prog, sgprs={0: 0, 1: 0}, memory=mem)
    assert int(m.S[6]) == 5 * 0x10 and int(m.S[4]) == 0
    assert steps == 1 + 5 * 4 + 1


def test_compare_writes_vcc_and_cmpx_narrows_exec():
    a = np.linspace(-2, 2, 64, dtype=np.float32)
    a[5] = np.nan
    m, _ = run_wave(code(vopc(0x41, V + 0, 1)), vgprs={0: a, 1: np.zeros(64, np.float32)}, exec_mask=(1 << 64) - 1)
    want = sum(1 << i for i in range(64) if a[i] < 0)
    assert m.sget64(VCC) == want
    m, _ = run_wave(code(vopc(0x5E, V + 0, 1)), vgprs={0: a, 1: np.zeros(64, np.float32)})  # v_cmpx_nlt_f32
    assert m.exec_bits() == sum(1 << i for i in range(64) if not a[i] < 0)


def test_cndmask_selects_by_vcc():
    a, b = np.zeros(64, np.float32), np.ones(64, np.float32)
    m, _ = run_wave(code(vop2(0, 2, V + 0, 1)), sgprs={VCC: 0xAAAAAAAA, VCC + 1: 0x1}, vgprs={0: a, 1: b})
    sel = lanes_on(0x1_AAAAAAAA)
    np.testing.assert_array_equal(m.V[:, 2].view(np.float32), np.where(sel, b, a))


def test_float_conversions_round_and_clamp_like_the_isa():
    x = np.array([0.1, 1 / 3, 65504.0, 65520.0, 1e-7, 6e-8, -2.5, np.nan, np.inf, -1e10, 3e9, 2.5], np.float32)
    x = np.resize(x, 64).astype(np.float32)
    m, _ = run_wave(code(vop1(10, 1, V + 0), vop1(8, 2, V + 0), vop1(7, 3, V + 0), vop1(30, 4, V + 0)), vgprs={0: x})
    half = m.V[:, 1].astype(np.uint16).view(np.float16)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(
            half, x.astype(np.float16)
        )  # round to nearest even, denormals and overflow to inf
    assert (m.V[:, 1] >> 16 == 0).all()  # a 16-bit result zeroes the high half
    with np.errstate(invalid="ignore"):
        want_i = np.clip(np.nan_to_num(x.astype(np.float64), nan=0), -(2**31), 2**31 - 1)
    np.testing.assert_array_equal(m.V[:, 2].view(np.int32), np.trunc(want_i).astype(np.int32))
    want_u = np.clip(np.nan_to_num(x.astype(np.float64), nan=0, posinf=2**32 - 1), 0, 2**32 - 1)
    np.testing.assert_array_equal(m.V[:, 3], np.trunc(want_u).astype(np.uint32))
    np.testing.assert_array_equal(m.V[:, 4].view(np.float32), np.rint(x))  # v_rndne: ties to even (2.5 -> 2)
    m, _ = run_wave(code(vop1(11, 1, V + 0)), vgprs={0: np.arange(64, dtype=np.uint16).view(np.uint16)})
    np.testing.assert_array_equal(
        m.V[:, 1].view(np.float32), np.arange(64, dtype=np.uint16).view(np.float16).astype(np.float32)
    )


def test_sdwa_selects_the_high_word_of_each_operand():
    a = (np.arange(64, dtype=np.uint32) << 16) | 7
    b = (np.full(64, 3, np.uint32) << 16) | 9
    old = np.full(64, 0xDEAD0000, np.uint32)
    # v_add_u32_sdwa v2, v0, v1 dst_sel:WORD0 dst_unused:UNUSED_PRESERVE src0_sel:WORD1 src1_sel:WORD1
    ext = 0 | 4 << 8 | 2 << 11 | 5 << 16 | 5 << 24
    m, _ = run_wave(code([52 << 25 | 2 << 17 | 1 << 9 | 249, ext]), vgprs={0: a, 1: b, 2: old})
    np.testing.assert_array_equal(m.V[:, 2], 0xDEAD0000 | (np.arange(64, dtype=np.uint32) + 3))


def test_fma_and_division_sequence_match_float32_division():
    rng = np.random.default_rng(3)
    n, d = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32) * 10
    d[0], n[1], d[2] = 0, 0, np.inf
    prog = code(  # LLVM's fdiv expansion for f32 with denormals on
        vop3(0x1E0, 2, V + 1, V + 1, V + 0, sdst=0),  # v_div_scale_f32 v2, s[0:1], v1, v1, v0
        vop3(0x1E0, 3, V + 0, V + 1, V + 0, sdst=VCC),  # v_div_scale_f32 v3, vcc, v0, v1, v0
        vop1(34, 4, V + 2),  # v_rcp_f32 v4, v2
        vop3(0x1CB, 5, V + 2, V + 4, 242, neg=1),  # v_fma_f32 v5, -v2, v4, 1.0
        vop3(0x1CB, 4, V + 5, V + 4, V + 4),  # v_fma_f32 v4, v5, v4, v4
        vop2(5, 5, V + 3, 4),  # v_mul_f32 v5, v3, v4
        vop3(0x1CB, 6, V + 2, V + 5, V + 3, neg=1),  # v_fma_f32 v6, -v2, v5, v3
        vop3(0x1CB, 5, V + 6, V + 4, V + 5),  # v_fma_f32 v5, v6, v4, v5
        vop3(0x1CB, 2, V + 2, V + 5, V + 3, neg=1),  # v_fma_f32 v2, -v2, v5, v3
        vop3(0x1E2, 2, V + 2, V + 4, V + 5),  # v_div_fmas_f32 v2, v2, v4, v5
        vop3(0x1DE, 0, V + 2, V + 1, V + 0),  # v_div_fixup_f32 v0, v2, v1, v0
    )
    m, _ = run_wave(prog, vgprs={0: n, 1: d})
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(m.V[:, 0].view(np.float32), n / d)


def test_an_unimplemented_opcode_names_itself_and_its_encoding():
    with pytest.raises(Unimplemented, match=r"v_mfma_f32_32x32x4_2b_f16 \(VOP3P opcode 0x48\) at offset 0x0"):
        run_wave(code([0xD3C80000, 0x04020100]))  # a two-block MFMA (the single-block ones run)
    with pytest.raises(Unimplemented, match=r"vop1 opcode 0x7f"):
        run_wave(code(vop1(0x7F, 0, V)))


def test_lds_write_then_read_round_trips():
    def ds(op, vdst, addr, data0, offset=0):
        return [0xD8000000 | op << 17 | offset, vdst << 24 | data0 << 8 | addr]

    vals = np.arange(64, dtype=np.uint32) * 3 + 1
    prog = code(ds(13, 0, 0, 1, offset=4), ds(54, 2, 3, 0, offset=4))  # ds_write_b32; ds_read_b32 (reversed)
    m, _ = run_wave(prog, vgprs={0: LANES * 4, 1: vals, 3: (63 - LANES) * 4}, lds_bytes=512)
    np.testing.assert_array_equal(m.V[:, 2], vals[::-1])


def test_readlane_and_writelane_move_one_lane_whatever_exec_says():
    vals = np.arange(64, dtype=np.uint32) * 5
    prog = code(
        vop3(0x289, 7, V + 0, 133),  # v_readlane_b32 s7, v0, 5
        vop3(0x28A, 1, 7, 2),  # v_writelane_b32 v1, s7, s2
    )
    m, _ = run_wave(prog, sgprs={2: 40}, vgprs={0: vals}, exec_mask=1)
    assert int(m.S[7]) == 25
    assert int(m.V[40, 1]) == 25 and (np.delete(m.V[:, 1], 40) == 0).all()


def test_bcnt_counts_bits_and_adds():
    x = np.random.default_rng(5).integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    m, _ = run_wave(code(vop3(0x28B, 1, V + 0, 131)), vgprs={0: x})  # v_bcnt_u32_b32 v1, v0, 3
    np.testing.assert_array_equal(m.V[:, 1], [bin(int(v)).count("1") + 3 for v in x])


def test_bitset_sets_and_clears_one_bit():
    m, _ = run_wave(
        code(sop1(26, 4, 133), sop1(24, 5, 128)), sgprs={4: 0x10, 5: 0xFF}
    )  # s_bitset1 s4, 5; s_bitset0 s5, 0
    assert int(m.S[4]) == 0x30 and int(m.S[5]) == 0xFE


def test_agpr_moves_byte_dot_products_and_the_legacy_16_bit_mad():
    def words(*encodings):  # little-endian bytes as llvm-mc-19 -show-encoding prints them for gfx942
        return [int.from_bytes(bytes(e[i : i + 4]), "little") for e in encodings for i in range(0, len(e), 4)]

    prog = code(
        words(
            [0x03, 0x40, 0xD9, 0xD3, 0x01, 0x01, 0x00, 0x18],  # v_accvgpr_write_b32 a3, v1
            [0x02, 0x40, 0xD8, 0xD3, 0x03, 0x01, 0x00, 0x18],  # v_accvgpr_read_b32 v2, a3
            [0x04, 0x40, 0xA9, 0xD3, 0x01, 0x0B, 0x1A, 0x1C],  # v_dot4_u32_u8 v4, v1, v5, v6
            [0x07, 0x40, 0xA8, 0xD3, 0x01, 0x0B, 0x1A, 0x1C],  # v_dot4_i32_i8 v7, v1, v5, v6
            [0x08, 0x00, 0xEB, 0xD1, 0x01, 0x0B, 0x1A, 0x04],  # v_mad_legacy_u16 v8, v1, v5, v6
        )
    )
    rng = np.random.default_rng(8)
    a, b = rng.integers(0, 2**32, 64, dtype=np.uint64), rng.integers(0, 2**32, 64, dtype=np.uint64)
    c = rng.integers(0, 2**32, 64, dtype=np.uint64)
    m, _ = run_wave(prog, vgprs={1: a, 5: b, 6: c}, exec_mask=(1 << 64) - 2)  # lane 0 off
    on = slice(1, None)
    np.testing.assert_array_equal(m.V[on, 2], a[on].astype(np.uint32))  # through AGPR 3 and back
    assert int(m.V[0, 2]) == 0 and int(m.V[0, 256 + 3]) == 0
    ua, ub = a.astype(np.uint32).view(np.uint8).reshape(64, 4), b.astype(np.uint32).view(np.uint8).reshape(64, 4)
    dot_u = (ua.astype(np.int64) * ub).sum(1) + c.astype(np.int64)
    np.testing.assert_array_equal(m.V[on, 4], (dot_u % 2**32)[on])
    sa, sb = ua.view(np.int8).astype(np.int64), ub.view(np.int8).astype(np.int64)
    dot_s = (sa * sb).sum(1) + c.astype(np.uint32).view(np.int32)
    np.testing.assert_array_equal(m.V[on, 7], (dot_s % 2**32)[on])
    mad = (a % 2**16) * (b % 2**16) + c % 2**16
    np.testing.assert_array_equal(m.V[on, 8], (mad % 2**16)[on])  # the high half zeroed


def test_a_float_inline_constant_of_a_64_bit_operand_is_a_double_whatever_the_type():
    # found by the op suite: v_mov_b64 v[4:5], 1.0 set 0x3F800000 (float32 bits), so a select of 1.0 gave ~5e-315
    prog = code([0xBE8001F2], [0x7E0870F2], [0x7E0C02F2])  # s_mov_b64 s[0:1], 1.0; v_mov_b64 v[4:5], 1.0; v_mov_b32
    m, _ = run_wave(prog)
    assert m.sget64(0) == 0x3FF0000000000000
    assert (m.V[:, 4:6].copy().view(np.uint64)[:, 0] == 0x3FF0000000000000).all()
    assert (m.V[:, 6] == 0x3F800000).all()  # a 32-bit operand: the float32 bits
