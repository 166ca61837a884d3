"""Register database: generated from the facts, resolved against discovery bases, fields encoded per the headers."""

from __future__ import annotations
import pytest
from fusegrad.runtime.support.amd import gen_regdb
from fusegrad.runtime.support.amd.discovery import MI350X_VF_IPS, Discovery
from fusegrad.runtime.support.amd.ipregs import IPRegisters, resolve, sh_register
from fusegrad.runtime.support.amd.regdb import REGISTERS
from fusegrad.runtime.support.amd.sim import open_sim

DISC = Discovery((1, 0), 4, MI350X_VF_IPS, None, ())


def test_generated_module_matches_the_facts():
    assert gen_regdb.parse() == REGISTERS


def test_duplicate_or_overlapping_facts_are_rejected():
    with pytest.raises(ValueError, match="twice"):
        gen_regdb.parse("GC A 0x1 0\nGC A 0x2 0")
    with pytest.raises(ValueError, match="overlaps"):
        gen_regdb.parse("GC A 0x1 0 X:0:3 Y:3:4")


def test_offsets_resolve_against_the_discovery_segment_bases():
    table = resolve(DISC)
    gc_base0 = DISC.find("GC").bases[0]
    # gc_9_4_3_offset.h: regCP_HQD_ACTIVE 0x1247, regVM_INVALIDATE_ENG17_REQ 0x0894 (segment 0)
    assert table["GC", "CP_HQD_ACTIVE"].dword == gc_base0 + 0x1247
    assert table["GC", "VM_INVALIDATE_ENG17_REQ"].dword == gc_base0 + 0x0894
    # osssys_4_4_2_offset.h: regIH_RB_CNTL 0x0080; sdma_4_4_2_offset.h: regSDMA_GFX_DOORBELL 0x0092
    assert table["OSSSYS", "IH_RB_CNTL"].dword == DISC.find("OSSSYS").bases[0] + 0x80
    assert table["SDMA0", "SDMA_GFX_DOORBELL"].dword == DISC.find("SDMA0").bases[0] + 0x92
    # no two registers of different IPs land on one dword
    dwords = [r.dword for r in table.values()]
    assert len(dwords) == len(set(dwords))


def test_fields_encode_and_reject_values_that_do_not_fit():
    r = resolve(DISC)["GC", "CP_HQD_PQ_DOORBELL_CONTROL"]
    assert r.encode(DOORBELL_OFFSET=0x10, DOORBELL_EN=1) == 0x10 << 2 | 1 << 30
    assert r.decode(0x10 << 2 | 1 << 30)["DOORBELL_OFFSET"] == 0x10
    with pytest.raises(ValueError, match="does not fit"):
        r.encode(DOORBELL_EN=2)
    with pytest.raises(ValueError, match="no field 'BOGUS'"):
        r.encode(BOGUS=1)
    assert sh_register("COMPUTE_PGM_LO").dword == 0x20C  # SET_SH_REG offset of 0x2E0C


def test_named_writes_reach_the_bar_and_the_gate_can_refuse():
    with open_sim(vf=False) as pci:
        refused: list[str] = []

        def gate(what: str) -> None:
            if "HQD" in what:
                refused.append(what)
                raise PermissionError(what)

        regs = IPRegisters(pci.map_registers(), DISC, gate)
        regs.write("GC", "VM_CONTEXT0_CNTL", ENABLE_CONTEXT=1, PAGE_TABLE_DEPTH=3)
        assert pci.map_registers().read32(regs.reg("GC", "VM_CONTEXT0_CNTL").dword) == 0b111
        with pytest.raises(PermissionError):
            regs.write("GC", "CP_HQD_ACTIVE", 1)
        assert refused == ["write GC.CP_HQD_ACTIVE"]
        assert regs.writes() == [("GC.VM_CONTEXT0_CNTL", 0b111)]
        with pytest.raises(KeyError, match="no register GC.NOPE"):
            regs.reg("GC", "NOPE")


def test_nbio_names_agree_with_the_absolute_offsets_detection_uses():
    # detection and the mailbox run before discovery, on absolute dwords (facts §2-§3); with NBIF segment 2 at 0xD20
    # the named registers must land on exactly those dwords
    from fusegrad.runtime.support.amd import regs as R

    table = resolve(DISC)
    assert table["NBIF", "RCC_IOV_FUNC_IDENTIFIER"].dword == R.RCC_IOV_FUNC_IDENTIFIER == 0xDE5
    assert table["NBIF", "RCC_CONFIG_MEMSIZE"].dword == R.RCC_CONFIG_MEMSIZE
    assert table["NBIF", "BIF_BX_PF0_MAILBOX_MSGBUF_TRN_DW0"].dword == R.MAILBOX_TRN_DW0
    assert table["NBIF", "BIF_BX_PF0_MAILBOX_MSGBUF_RCV_DW0"].dword == R.MAILBOX_RCV_DW0
    control = table["NBIF", "BIF_BX_PF0_MAILBOX_CONTROL"]
    assert control.dword == R.MAILBOX_CONTROL
    assert control.encode(TRN_MSG_VALID=1, RCV_MSG_ACK=1) == R.TRN_MSG_VALID | R.RCV_MSG_ACK << 8
