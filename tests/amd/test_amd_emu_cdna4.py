"""CDNA4 (gfx950) additions the emulator runs: v_bitop3_b32/b16, on a hand-assembled word (the one LLVM 22 emits for
a ^ (~b & c)) and end to end in a gfx950 kernel on the simulated GPU."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.runtime.support.amd.codeobj import parse_code_object
from fusegrad.runtime.support.amd.emu import decode, decode_all
from fusegrad.runtime.support.amd.emu.elf import text
from fusegrad.runtime.support.amd.emu.standalone import run_wave

ENDPGM = 0xBF810000


def test_bitop3_word_decodes_its_truth_table_and_runs_it():
    word = 0x941E0D08D2340303  # v_bitop3_b32 v3, v8, v6, v7 bitop3:0x9c (LLVM 22, gfx950)
    inst = decode(struct.pack("<Q", word))
    assert (inst.name, inst.f["bitop3"], inst.f["src0"], inst.f["vdst"]) == ("v_bitop3_b32", 0x9C, 256 + 8, 3)
    rng = np.random.default_rng(0)
    s0, s1, s2 = (rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    m, _ = run_wave(struct.pack("<QI", word, ENDPGM), vgprs={8: s0, 6: s1, 7: s2}, exec_mask=(1 << 64) - 2)
    want = s1 ^ (s0 & ~s2)  # bit (s0 s1 s2) of 0x9c
    np.testing.assert_array_equal(m.V[1:, 3], want[1:])
    assert int(m.V[0, 3]) == 0  # lane 0 off
    half = struct.pack("<QI", word & ~(0xFFF << 16) | 0x233 << 16, ENDPGM)  # the b16 form: low halves
    m, _ = run_wave(half, vgprs={8: s0, 6: s1, 7: s2})
    np.testing.assert_array_equal(m.V[:, 3], want & 0xFFFF)


def test_a_gfx950_kernel_with_bitop3_runs_on_the_simulated_gpu(simulated_amd, monkeypatch):
    from fusegrad.runtime.device import Device

    dev = Device["AMD"]
    monkeypatch.setattr(dev, "arch", "gfx950")
    rng = np.random.default_rng(1)
    a, b, c = (rng.integers(-(2**31), 2**31, 50, dtype=np.int64).astype(np.int32) for _ in range(3))
    before = len(dev.built)
    ta, tb, tc = (Tensor(x, device="AMD") for x in (a, b, c))
    out = (ta ^ (~tb & tc)).numpy()
    np.testing.assert_array_equal(out, a ^ (~b & c))
    names = set()
    for prog in dev.built[before:]:
        addr, code = text(prog.elf)
        start = parse_code_object(prog.elf, prog.info.name).entry_offset - addr
        names |= {inst.name for _, inst in decode_all(code, start)}
    if "v_bitop3_b32" not in names:
        pytest.fail(f"LLVM emitted no v_bitop3_b32 for a ^ (~b & c) on gfx950: {sorted(names)}")


def test_cvt_pk_rounds_two_floats_into_halves():
    # v_cvt_pk_f16_f32 v2, v4, v5 and v_cvt_pk_bf16_f32 v3, v4, v5 (LLVM 22's gfx950 words)
    prog = struct.pack("<QQI", 0x20B04D2670002, 0x20B04D2680003, ENDPGM)
    assert [decode(prog, o).name for o in (0, 8)] == ["v_cvt_pk_f16_f32", "v_cvt_pk_bf16_f32"]
    rng = np.random.default_rng(2)
    x = rng.standard_normal(64).astype(np.float32) * 1e3
    y = np.concatenate([[np.nan, np.inf, -0.0, 1 + 2**-8, 1 + 3 * 2**-8, 65520.0], rng.standard_normal(58)])
    y = y.astype(np.float32)
    m, _ = run_wave(prog, vgprs={4: x, 5: y})
    halves = m.V[:, 2].copy().view(np.float16).reshape(64, 2)
    np.testing.assert_array_equal(halves[:, 0], x.astype(np.float16))
    with np.errstate(over="ignore"):  # 65520 rounds to inf in float16, as the instruction does
        np.testing.assert_array_equal(halves[:, 1], y.astype(np.float16))  # NaN matches NaN in array_equal
    bf = m.V[:, 3].copy().view(np.uint16).reshape(64, 2).astype(np.uint32) << 16
    got = bf.view(np.float32)
    assert got[1, 1] == np.inf and np.isnan(got[0, 1]) and np.signbit(got[2, 1])
    assert got[3, 1] == 1.0 and got[4, 1] == 1 + 2**-6  # ties to even: 1+2^-8 -> 1, 1+3*2^-8 -> 1+2^-6
    np.testing.assert_allclose(got[:, 0], x, rtol=2**-8)
