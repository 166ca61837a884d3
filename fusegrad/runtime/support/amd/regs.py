"""Register offsets (BAR5 dwords unless noted) and PCI config-space bits that the driver layer and simulator share."""

from __future__ import annotations

# Indirect VRAM access for a small BAR0: MM_INDEX gets bit 31 set, MM_INDEX_HI the address bits above 31.
MM_INDEX, MM_DATA, MM_INDEX_HI = 0x0, 0x1, 0x6
MM_INDEX_ENABLE = 1 << 31

# NBIO 7.9 segment-2 registers (segment base 0xD20).
RCC_CONFIG_MEMSIZE = 0xDE3  # VRAM size in MiB
RCC_IOV_FUNC_IDENTIFIER = 0xDE5
FUNC_IDENTIFIER_IS_VF = 1 << 0
FUNC_IDENTIFIER_IOV_ENABLE = 1 << 31

# VF mailbox: TRN = VF->PF, RCV = PF->VF, four dwords each.
MAILBOX_TRN_DW0 = 0xE56
MAILBOX_RCV_DW0 = 0xE5A
MAILBOX_CONTROL = 0xE5E
MAILBOX_INT_CNTL = 0xE5F
MAILBOX_FIRST, MAILBOX_LAST = MAILBOX_TRN_DW0, MAILBOX_INT_CNTL
# MAILBOX_CONTROL is accessed a byte at a time: byte 0 is the TRN side, byte 1 the RCV side.
MAILBOX_TRN_BYTE = MAILBOX_CONTROL * 4  # 0x3978
MAILBOX_RCV_BYTE = MAILBOX_CONTROL * 4 + 1  # 0x3979
TRN_MSG_VALID, TRN_MSG_ACK = 0x01, 0x02
RCV_MSG_VALID, RCV_MSG_ACK = 0x01, 0x02

PCI_COMMAND = 0x04  # 16-bit
PCI_COMMAND_MASTER = 0x4
