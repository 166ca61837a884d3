"""Memory planning of a captured step: buffers whose lifetimes (first to last launch using them) do not overlap share
memory. Each device gets one arena; a buffer is placed, largest first, at the lowest offset free of every placed buffer
whose lifetime overlaps its own."""

from __future__ import annotations
from fusegrad.dtype import dtypes
from fusegrad.runtime.device import Buffer

ALIGN = 64  # the host allocator's alignment: vector loads in kernels rely on it


def plan_offsets(sizes: list[int], lifetimes: list[tuple[int, int]], align: int = ALIGN) -> tuple[list[int], int]:
    """Byte offset of each buffer in one arena, and the arena's size. Lifetimes are inclusive launch indices; two
    buffers may overlap in memory only when one's last use comes before the other's first."""
    offsets = [0] * len(sizes)
    placed: list[tuple[int, int, int, int]] = []  # (start, end, first, last)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], lifetimes[i][0])):
        first, last = lifetimes[i]
        size = -(-max(sizes[i], 1) // align) * align
        busy = sorted((s, e) for s, e, f, la in placed if f <= last and first <= la)
        offset = 0
        for s, e in busy:
            if offset + size <= s:
                break
            offset = max(offset, e)
        placed.append((offset, offset + size, first, last))
        offsets[i] = offset
    return offsets, max((e for _, e, _, _ in placed), default=0)


def plan_buffers(
    bufs: list[Buffer], lifetimes: list[tuple[int, int]]
) -> tuple[dict[Buffer, Buffer], list[Buffer], dict[Buffer, tuple[int, int]]]:
    """A new buffer for each of `bufs`, viewing a per-device arena at its planned offset; returns {old: new}, the
    arenas (which own the memory: keep them alive as long as the new buffers) and {new: (arena index, offset)}."""
    replacement: dict[Buffer, Buffer] = {}
    arenas: list[Buffer] = []
    placement: dict[Buffer, tuple[int, int]] = {}
    for device in dict.fromkeys(b.device for b in bufs):
        mine = [i for i, b in enumerate(bufs) if b.device == device]
        offsets, total = plan_offsets([bufs[i].nbytes for i in mine], [lifetimes[i] for i in mine])
        arenas.append(Buffer(device, total, dtypes.uint8).ensure_allocated())
        for i, offset in zip(mine, offsets):
            replacement[bufs[i]] = placed_buffer(arenas[-1], offset, bufs[i])
            placement[replacement[bufs[i]]] = (len(arenas) - 1, offset)
    return replacement, arenas, placement


def placed_buffer(arena: Buffer, offset: int, like: Buffer) -> Buffer:
    """A buffer of like's device, size and dtype whose memory is arena's bytes from offset."""
    new = Buffer(like.device, like.size, like.dtype)
    new.use_external(arena.host_view()[offset : offset + like.nbytes])
    return new


def overlapping_live_pairs(
    offsets: list[int], sizes: list[int], lifetimes: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Pairs of buffers that are live at the same launch and share a byte: a correct plan has none."""
    bad = []
    for i in range(len(sizes)):
        for j in range(i + 1, len(sizes)):
            live_together = lifetimes[i][0] <= lifetimes[j][1] and lifetimes[j][0] <= lifetimes[i][1]
            share = offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]
            if live_together and share and sizes[i] and sizes[j]:
                bad.append((i, j))
    return bad
