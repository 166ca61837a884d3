"""Generates regdb.py from the register facts below: `python -m fusegrad.runtime.support.amd.gen_regdb`.

Facts only (names, dword offsets within an IP's register segment, segment index, bit fields), taken from AMD's public
register headers as shipped in Linux (drivers/gpu/drm/amd/include/asic_reg/...). Only registers the driver uses.
Sources: `gc_9_4_3_offset.h` (GC; tinygrad and amdgpu use it for GC 9.5.0 too), `sdma_4_4_2_offset.h`,
`osssys_4_4_2_offset.h`, read for this file; NBIO 7.9 segment-2 registers from `nbio_7_9_0_offset.h` (facts sheet §2-§3
and a trimmed public copy for the HDP flush registers). HDP 4.4.2 itself has no register this driver needs: on NBIO
7.9 the HDP flush request/done pair lives in NBIO. MMHUB offsets follow the mmhub_1_x layout (a public trimmed copy; not
checked against mmhub_1_8_0 itself). Field layouts are the gfx9-family sh_mask values, UNCONFIRMED on gfx950.
SH registers are given as SET_SH_REG offsets (dword address minus 0x2C00), which is how PM4 names them.
"""

from __future__ import annotations

import sys
from pathlib import Path

# IP  register  offset  segment  [field:lo:hi ...]; a line starting with + continues the fields
FACTS = """
GC GRBM_GFX_CNTL 0x0022 0 PIPEID:0:1 MEID:2:3 VMID:4:7 QUEUEID:8:10
GC VM_CONTEXT0_CNTL 0x0860 0 ENABLE_CONTEXT:0:0 PAGE_TABLE_DEPTH:1:2 PAGE_TABLE_BLOCK_SIZE:3:6
GC VM_INVALIDATE_ENG17_SEM 0x0882 0
GC VM_INVALIDATE_ENG17_REQ 0x0894 0 PER_VMID_INVALIDATE_REQ:0:15 FLUSH_TYPE:16:18 INVALIDATE_L2_PTES:19:19
+ INVALIDATE_L2_PDE0:20:20 INVALIDATE_L2_PDE1:21:21 INVALIDATE_L2_PDE2:22:22 INVALIDATE_L1_PTES:23:23
GC VM_INVALIDATE_ENG17_ACK 0x08a6 0 PER_VMID_INVALIDATE_ACK:0:15
GC VM_CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32 0x08cb 0
GC VM_CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32 0x08cc 0
GC VM_CONTEXT0_PAGE_TABLE_START_ADDR_LO32 0x08eb 0
GC VM_CONTEXT0_PAGE_TABLE_START_ADDR_HI32 0x08ec 0
GC VM_CONTEXT0_PAGE_TABLE_END_ADDR_LO32 0x090b 0
GC VM_CONTEXT0_PAGE_TABLE_END_ADDR_HI32 0x090c 0
GC CP_MEC_DOORBELL_RANGE_LOWER 0x105c 0
GC CP_MEC_DOORBELL_RANGE_UPPER 0x105d 0
GC CP_MQD_BASE_ADDR 0x1245 0
GC CP_MQD_BASE_ADDR_HI 0x1246 0
GC CP_HQD_ACTIVE 0x1247 0 ACTIVE:0:0
GC CP_HQD_VMID 0x1248 0 VMID:0:3
GC CP_HQD_PQ_BASE 0x124d 0
GC CP_HQD_PQ_BASE_HI 0x124e 0
GC CP_HQD_PQ_RPTR 0x124f 0
GC CP_HQD_PQ_RPTR_REPORT_ADDR 0x1250 0
GC CP_HQD_PQ_RPTR_REPORT_ADDR_HI 0x1251 0
GC CP_HQD_PQ_WPTR_POLL_ADDR 0x1252 0
GC CP_HQD_PQ_WPTR_POLL_ADDR_HI 0x1253 0
GC CP_HQD_PQ_DOORBELL_CONTROL 0x1254 0 DOORBELL_OFFSET:2:27 DOORBELL_EN:30:30 DOORBELL_HIT:31:31
GC CP_HQD_PQ_CONTROL 0x1256 0 QUEUE_SIZE:0:5 RPTR_BLOCK_SIZE:8:13 UNORD_DISPATCH:28:28 PRIV_STATE:30:30 KMD_QUEUE:31:31
GC CP_HQD_DEQUEUE_REQUEST 0x125d 0 DEQUEUE_REQ:0:1
GC CP_HQD_EOP_BASE_ADDR 0x126a 0
GC CP_HQD_EOP_BASE_ADDR_HI 0x126b 0
GC CP_HQD_EOP_CONTROL 0x126c 0 EOP_SIZE:0:5
GC CP_HQD_PQ_WPTR_LO 0x127b 0
GC CP_HQD_PQ_WPTR_HI 0x127c 0
SH COMPUTE_DISPATCH_INITIATOR 0x200 0 COMPUTE_SHADER_EN:0:0 FORCE_START_AT_000:2:2
SH COMPUTE_START_X 0x204 0
SH COMPUTE_START_Y 0x205 0
SH COMPUTE_START_Z 0x206 0
SH COMPUTE_NUM_THREAD_X 0x207 0
SH COMPUTE_NUM_THREAD_Y 0x208 0
SH COMPUTE_NUM_THREAD_Z 0x209 0
SH COMPUTE_PGM_LO 0x20c 0
SH COMPUTE_PGM_HI 0x20d 0
SH COMPUTE_PGM_RSRC1 0x212 0
SH COMPUTE_PGM_RSRC2 0x213 0 USER_SGPR:1:5
SH COMPUTE_RESOURCE_LIMITS 0x215 0
SH COMPUTE_TMPRING_SIZE 0x218 0
SH COMPUTE_USER_DATA_0 0x240 0
SH COMPUTE_USER_DATA_1 0x241 0
MMHUB MMVM_CONTEXT0_CNTL 0x06c0 0 ENABLE_CONTEXT:0:0 PAGE_TABLE_DEPTH:1:2 PAGE_TABLE_BLOCK_SIZE:3:6
MMHUB MMVM_INVALIDATE_ENG17_SEM 0x06e2 0
MMHUB MMVM_INVALIDATE_ENG17_REQ 0x06f4 0 PER_VMID_INVALIDATE_REQ:0:15 FLUSH_TYPE:16:18 INVALIDATE_L2_PTES:19:19
+ INVALIDATE_L2_PDE0:20:20 INVALIDATE_L2_PDE1:21:21 INVALIDATE_L2_PDE2:22:22 INVALIDATE_L1_PTES:23:23
MMHUB MMVM_INVALIDATE_ENG17_ACK 0x0706 0 PER_VMID_INVALIDATE_ACK:0:15
MMHUB MMVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_LO32 0x072b 0
MMHUB MMVM_CONTEXT0_PAGE_TABLE_BASE_ADDR_HI32 0x072c 0
MMHUB MMVM_CONTEXT0_PAGE_TABLE_START_ADDR_LO32 0x074b 0
MMHUB MMVM_CONTEXT0_PAGE_TABLE_START_ADDR_HI32 0x074c 0
MMHUB MMVM_CONTEXT0_PAGE_TABLE_END_ADDR_LO32 0x076b 0
MMHUB MMVM_CONTEXT0_PAGE_TABLE_END_ADDR_HI32 0x076c 0
SDMA0 SDMA_GFX_RB_CNTL 0x0080 0 RB_ENABLE:0:0 RB_SIZE:1:6 RPTR_WRITEBACK_ENABLE:12:12
SDMA0 SDMA_GFX_RB_BASE 0x0081 0
SDMA0 SDMA_GFX_RB_BASE_HI 0x0082 0
SDMA0 SDMA_GFX_RB_RPTR 0x0083 0
SDMA0 SDMA_GFX_RB_RPTR_HI 0x0084 0
SDMA0 SDMA_GFX_RB_WPTR 0x0085 0
SDMA0 SDMA_GFX_RB_WPTR_HI 0x0086 0
SDMA0 SDMA_GFX_RB_RPTR_ADDR_HI 0x0088 0
SDMA0 SDMA_GFX_RB_RPTR_ADDR_LO 0x0089 0
SDMA0 SDMA_GFX_IB_CNTL 0x008a 0 IB_ENABLE:0:0
SDMA0 SDMA_GFX_DOORBELL 0x0092 0 ENABLE:28:28
SDMA0 SDMA_GFX_DOORBELL_OFFSET 0x00ab 0 OFFSET:2:27
SDMA0 SDMA_GFX_RB_WPTR_POLL_ADDR_HI 0x00b2 0
SDMA0 SDMA_GFX_RB_WPTR_POLL_ADDR_LO 0x00b3 0
SDMA0 SDMA_GFX_MINOR_PTR_UPDATE 0x00b5 0
NBIF RCC_CONFIG_MEMSIZE 0x00c3 2
NBIF RCC_IOV_FUNC_IDENTIFIER 0x00c5 2 FUNC_IDENTIFIER:0:0 IOV_ENABLE:31:31
NBIF BIF_BX_PF0_HDP_MEM_COHERENCY_FLUSH_CNTL 0x00f7 2
NBIF BIF_BX_PF0_GPU_HDP_FLUSH_REQ 0x0106 2 CP0:0:0 CP1:1:1 CP2:2:2 CP3:3:3 CP4:4:4 CP5:5:5 CP6:6:6 CP7:7:7
+ CP8:8:8 CP9:9:9 SDMA0:10:10
NBIF BIF_BX_PF0_GPU_HDP_FLUSH_DONE 0x0107 2 CP0:0:0 CP1:1:1 CP2:2:2 CP3:3:3 CP4:4:4 CP5:5:5 CP6:6:6 CP7:7:7
+ CP8:8:8 CP9:9:9 SDMA0:10:10
NBIF BIF_BX_PF0_MAILBOX_MSGBUF_TRN_DW0 0x0136 2
NBIF BIF_BX_PF0_MAILBOX_MSGBUF_RCV_DW0 0x013a 2
NBIF BIF_BX_PF0_MAILBOX_CONTROL 0x013e 2 TRN_MSG_VALID:0:0 TRN_MSG_ACK:1:1 RCV_MSG_VALID:8:8 RCV_MSG_ACK:9:9
NBIF BIF_BX_PF0_MAILBOX_INT_CNTL 0x013f 2 VALID_INT_EN:0:0 ACK_INT_EN:1:1
OSSSYS IH_RB_CNTL 0x0080 0 RB_ENABLE:0:0 RB_SIZE:1:5 WPTR_WRITEBACK_ENABLE:8:8
OSSSYS IH_RB_BASE 0x0081 0
OSSSYS IH_RB_BASE_HI 0x0082 0
OSSSYS IH_RB_RPTR 0x0083 0
OSSSYS IH_RB_WPTR 0x0084 0
OSSSYS IH_RB_WPTR_ADDR_HI 0x0085 0
OSSSYS IH_RB_WPTR_ADDR_LO 0x0086 0
OSSSYS IH_DOORBELL_RPTR 0x0087 0 OFFSET:0:25 ENABLE:28:28
"""

HEADER = '"""Register database, GENERATED by gen_regdb.py from public register-header facts; do not edit."""\n\n'


def parse(facts: str = FACTS) -> dict[str, dict[str, tuple[int, int, dict[str, tuple[int, int]]]]]:
    """{ip: {register: (offset, segment, {field: (lo, hi)})}}; rejects duplicates and overlapping fields."""
    db: dict[str, dict[str, tuple[int, int, dict[str, tuple[int, int]]]]] = {}
    for line in facts.strip().replace("\n+", "").splitlines():
        ip, name, offset, segment, *fields = line.split()
        if name in db.setdefault(ip, {}):
            raise ValueError(f"register {ip}.{name} listed twice")
        parsed: dict[str, tuple[int, int]] = {}
        used = 0
        for f in fields:
            fname, lo, hi = f.split(":")
            mask = ((1 << (int(hi) - int(lo) + 1)) - 1) << int(lo)
            if used & mask or not 0 <= int(lo) <= int(hi) < 32:
                raise ValueError(f"field {ip}.{name}.{fname} [{lo}:{hi}] overlaps another or leaves the dword")
            used |= mask
            parsed[fname] = (int(lo), int(hi))
        db[ip][name] = (int(offset, 16), int(segment), parsed)
    return db


def render(db: dict) -> str:
    lines = [HEADER, "# {ip: {register: (dword offset in the segment, segment index, {field: (lo bit, hi bit)})}}\n"]
    lines.append("REGISTERS: dict[str, dict[str, tuple[int, int, dict[str, tuple[int, int]]]]] = {\n")
    for ip, regs in db.items():
        lines.append(f"    {ip!r}: {{\n")
        for name, (offset, segment, fields) in regs.items():
            lines.append(f"        {name!r}: ({offset:#06x}, {segment}, {fields!r}),\n")
        lines.append("    },\n")
    lines.append("}\n")
    return "".join(lines)


def main() -> None:
    out = Path(__file__).with_name("regdb.py")
    out.write_text(render(parse()))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
