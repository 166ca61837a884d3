"""Vector and scalar memory through the GPU VM: 64 lane addresses translated page by page, then one gather or
scatter over the simulated VRAM. Pages in system memory (or lanes that straddle two pages) take a per-page path
through the simulator's own read and write, which walks the same page tables; a missing mapping raises its VM fault.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

PAGE = 0x1000


class VMemory:
    def __init__(self, vram: np.ndarray, walk: Callable[[int], tuple[int, int, bool]], read, write):
        self.vram, self.walk, self.read, self.write = vram, walk, read, write

    def _phys(self, addrs: np.ndarray, nbytes: int) -> np.ndarray | None:
        """Physical VRAM byte addresses of each lane's first byte, or None when a slow path is needed."""
        if addrs.shape[0] == 1:  # one lane on (the common case of a single work-item kernel)
            a = int(addrs[0])
            if (a & (PAGE - 1)) + nbytes > PAGE:
                return None
            base, _, system = self.walk(a & ~(PAGE - 1))
            return None if system else np.array([base + (a & (PAGE - 1))], np.int64)
        pages = addrs >> np.uint64(12)
        offs = (addrs & np.uint64(PAGE - 1)).astype(np.int64)
        if int(offs.max()) + nbytes > PAGE:
            return None
        first = int(pages[0])
        if (pages == pages[0]).all():
            base, _, system = self.walk(first << 12)
            return None if system else offs + base
        uniq, inv = np.unique(pages, return_inverse=True)
        bases = np.empty(len(uniq), np.int64)
        for i, p in enumerate(uniq.tolist()):
            base, _, system = self.walk(p << 12)
            if system:
                return None
            bases[i] = base
        return bases[inv] + offs

    def gather(self, addrs: np.ndarray, nbytes: int) -> np.ndarray:
        """(lanes, nbytes) uint8 read at each address."""
        phys = self._phys(addrs, nbytes)
        if phys is None:
            return np.array([np.frombuffer(self.read(int(a), nbytes), np.uint8) for a in addrs.tolist()]).reshape(
                -1, nbytes
            )
        if nbytes == 1:
            return self.vram[phys][:, None]
        return self.vram[phys[:, None] + np.arange(nbytes)]

    def scatter(self, addrs: np.ndarray, data: np.ndarray) -> None:
        """Write data[i] (uint8 rows) at addrs[i], lane by lane in order (a later lane wins, as on the GPU)."""
        nbytes = data.shape[1]
        phys = self._phys(addrs, nbytes)
        if phys is None:
            for a, row in zip(addrs.tolist(), data):
                self.write(int(a), row.tobytes())
            return
        if nbytes == 1:
            self.vram[phys] = data[:, 0]
        else:
            self.vram[phys[:, None] + np.arange(nbytes)] = data
