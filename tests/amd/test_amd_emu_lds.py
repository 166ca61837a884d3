"""The emulator's DS instructions and barriers on hand-assembled words (the DS microcode format of the CDNA3 ISA
reference), checked against numpy: two-address forms, narrow and d16 accesses, atomics in lane order with their
returned values, lane permutes, LDS bounds, and two waves of one workgroup exchanging data across an s_barrier."""

from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np
import pytest

from fusegrad.runtime.support.amd.emu import isa
from fusegrad.runtime.support.amd.emu.lds import LDSFault
from fusegrad.runtime.support.amd.emu.standalone import FlatMemory, run_wave, run_workgroup
from tests.amd.test_amd_emu_isa import LANES, V, code, glob, sopp, vop2

DS_OP = {name: op for op, name in isa.DS.items()}
VOP2_OP = {name: op for op, name in isa.VOP2.items()}
FLAT_OP = {name: op for op, name in isa.FLAT_OPS.items()}
LLVM_MC = next((t for t in ("llvm-mc-19", "llvm-mc") if shutil.which(t)), None)


def ds(name, vdst=0, addr=0, data0=0, data1=0, offset0=0, offset1=0):
    return [0xD8000000 | DS_OP[name] << 17 | offset1 << 8 | offset0, vdst << 24 | data1 << 16 | data0 << 8 | addr]


@pytest.mark.skipif(LLVM_MC is None, reason="llvm-mc is not installed (apt-get install llvm-19)")
def test_every_ds_opcode_name_is_llvms():
    lines = [" ".join(f"0x{b:02x}" for b in struct.pack("<II", *ds(name))) for name in DS_OP]
    out = subprocess.run(
        [LLVM_MC, "--disassemble", "-arch=amdgcn", "-mcpu=gfx942"],
        input="\n".join(lines),
        capture_output=True,
        text=True,
    )
    got = [line.split()[0] for line in out.stdout.splitlines() if line.strip().startswith("ds_")]
    assert got == list(DS_OP), [(a, b) for a, b in zip(got, DS_OP) if a != b][:5]


def test_read2_and_write2_use_two_offsets_in_elements_and_st64_units():
    a, b = LANES.astype(np.uint32) * 7 + 1, LANES.astype(np.uint32) * 11 + 2
    prog = code(
        ds("ds_write2_b32", addr=0, data0=1, data1=2, offset0=0, offset1=64),  # [addr], [addr + 256]
        ds("ds_read2st64_b32", vdst=4, addr=0, offset0=0, offset1=1),  # [addr], [addr + 64 * 4]
        ds("ds_write2st64_b64", addr=3, data0=1, data1=1, offset0=1, offset1=2),  # 64-bit pairs at +512, +1024
        ds("ds_read2_b64", vdst=6, addr=3, offset0=64, offset1=128),
    )
    m, _ = run_wave(prog, vgprs={0: LANES * 4, 1: a, 2: b, 3: LANES * 8}, lds_bytes=2048)
    np.testing.assert_array_equal(m.V[:, 4], a)
    np.testing.assert_array_equal(m.V[:, 5], b)
    np.testing.assert_array_equal(m.V[:, 6:10], np.stack([a, b, a, b], 1))  # v[1:2] written twice, read back


def test_narrow_and_d16_accesses_keep_the_other_half():
    vals = (LANES.astype(np.uint32) << 24) | 0x00F0_8000 | LANES.astype(np.uint32)
    prog = code(
        ds("ds_write_b16_d16_hi", addr=0, data0=1),  # bits 31:16 -> [lane * 2]
        ds("ds_read_i16", vdst=2, addr=0),
        ds("ds_read_u8_d16_hi", vdst=3, addr=0),  # the low byte into bits 31:16 of v3; bits 15:0 kept
        ds("ds_write_b8", addr=4, data0=1),
        ds("ds_read_i8", vdst=5, addr=4),
    )
    m, _ = run_wave(prog, vgprs={0: LANES * 2, 1: vals, 3: np.full(64, 0x1234), 4: 256 + LANES}, lds_bytes=512)
    hi = (vals >> 16).astype(np.uint16)
    np.testing.assert_array_equal(m.V[:, 2], hi.view(np.int16).astype(np.int32).view(np.uint32))
    np.testing.assert_array_equal(m.V[:, 3], (hi & 0xFF).astype(np.uint32) << 16 | 0x1234)
    np.testing.assert_array_equal(m.V[:, 5], (vals & 0xFF).astype(np.int8).astype(np.int32).view(np.uint32))


def test_atomics_on_one_address_apply_in_lane_order_and_return_the_old_values():
    prog = code(
        ds("ds_add_rtn_u32", vdst=2, addr=0, data0=1),
        ds("ds_max_i32", addr=0, data0=3, offset0=4),
        ds("ds_add_f32", addr=0, data0=4, offset0=8),
        ds("ds_read_b32", vdst=5, addr=0),
        ds("ds_read_b32", vdst=6, addr=0, offset0=4),
        ds("ds_read_b32", vdst=7, addr=0, offset0=8),
        ds("ds_cmpst_rtn_b32", vdst=8, addr=9, data0=10, data1=1),  # lane i: swap in 1 + i where [i] == 2i
    )
    signed = (LANES - 40).astype(np.int32)
    floats = np.linspace(-1, 1, 64, dtype=np.float32)
    vg = {0: np.zeros(64), 1: LANES + 1, 3: signed, 4: floats, 9: 16 + LANES * 4, 10: LANES * 2 * (LANES % 2)}
    m, _ = run_wave(prog, vgprs=vg, exec_mask=(1 << 64) - 1, lds_bytes=512)
    np.testing.assert_array_equal(m.V[:, 2], np.concatenate([[0], np.cumsum(LANES + 1)[:-1]]))  # prefix sums
    assert int(m.V[0, 5]) == (LANES + 1).sum() and int(m.V[0, 6]) == 23
    want = np.float32(0)
    for f in floats:  # float adds round one after another, in lane order
        want = np.float32(want + f)
    assert m.V[0, 7].view(np.float32) == want
    # the LDS starts zeroed: [16 + 4i] == 0 == 2i only for lane 0 (odd lanes compare against 2i, even ones 0)
    np.testing.assert_array_equal(m.V[:, 8], 0)


def test_bpermute_reads_the_lane_its_address_names():
    vals = LANES.astype(np.uint32) * 9
    prog = code(ds("ds_bpermute_b32", vdst=2, addr=0, data0=1))
    m, _ = run_wave(prog, vgprs={0: ((LANES + 5) % 64) * 4, 1: vals}, exec_mask=(1 << 64) - 1 - 1)
    want = vals[(LANES + 5) % 64] * ((LANES + 5) % 64 != 0)  # lane 0 is off: it gives 0
    np.testing.assert_array_equal(m.V[1:, 2], want[1:])
    assert int(m.V[0, 2]) == 0  # an off lane's destination is kept


def test_an_access_past_the_lds_allocation_stops_the_wave():
    with pytest.raises(LDSFault, match=r"LDS access of 4 bytes at 0x200, outside the workgroup's 512-byte"):
        run_wave(code(ds("ds_read_b32", vdst=1, addr=0)), vgprs={0: 260 + LANES * 4}, lds_bytes=512)


def _exchange_program() -> bytes:
    """Each work-item writes 3 * id to LDS[id], waits at the barrier, reads LDS[127 - id] and stores it to global
    memory at 64 + 4 * id."""
    return code(
        vop2(VOP2_OP["v_lshlrev_b32"], 1, 130, 0),  # v1 = id * 4
        vop2(VOP2_OP["v_mul_u32_u24"], 4, 131, 0),  # v4 = id * 3
        ds("ds_write_b32", addr=1, data0=4),
        sopp(12, 0),  # s_waitcnt 0
        sopp(10),  # s_barrier
        [0x7E0A02FF, 508],  # v_mov_b32 v5, 508
        vop2(VOP2_OP["v_sub_u32"], 5, V + 5, 1),  # v5 = 508 - id * 4
        ds("ds_read_b32", vdst=6, addr=5),
        vop2(VOP2_OP["v_add_u32"], 2, 192, 1),  # v2 = 64 + id * 4 (v3 = 0: the address's high half)
        sopp(12, 0),
        glob(FLAT_OP["store_dword"], 6, 2, store=True),
    )


@pytest.mark.parametrize("threads", [128, 100])
def test_two_waves_exchange_data_through_lds_across_a_barrier(threads):
    mem = FlatMemory(4096)
    _, steps = run_workgroup(_exchange_program(), threads, lds_bytes=512, memory=mem)
    got = mem.data[64 : 64 + 4 * 128].view(np.uint32)
    ids = np.arange(128)
    partner = 127 - ids
    want = np.where((ids < threads) & (partner < threads), 3 * partner, 0)  # unwritten LDS reads as 0
    np.testing.assert_array_equal(got, want)  # the work-items past `threads` stored nothing
    assert steps == 2 * 12  # both waves ran every instruction (s_endpgm included)
