"""Index bound checks run by kernels (CHECK_OOB=1).

An op that picks or writes by index registers an `IndexCheck` on the uops it builds from that index: the check holds a
two-element reduction over the index values (`extremes`). A realize that computes any registered uop schedules the
extremes kernels first, reads the two numbers back before any other kernel runs, and raises `IndexError` naming the op,
the offending value and the bound, so a failed check writes nothing."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from fusegrad.lazy_numpy import np

from fusegrad.schedule import realized_value
from fusegrad.uop.ops import Ops, UOp


@dataclass(frozen=True)
class IndexCheck:
    """Every value of an index must lie in [low, size); extremes is int64 (2,) holding [~min(index), max(index)]."""

    op: str
    bound: str  # what the index addresses, e.g. "dim 1"
    low: int
    size: int
    extremes: UOp
    device: str

    def raise_if_violated(self, extremes: np.ndarray) -> None:
        smallest, largest = ~int(extremes[0]), int(extremes[1])
        bad = smallest if smallest < self.low else largest if largest >= self.size else None
        if bad is not None:
            raise IndexError(f"{self.op}: index {bad} is out of bounds for {self.bound} with size {self.size}")


# uop -> the checks its value depends on; weak, so a check lives exactly as long as the graph that needs it
index_checks: weakref.WeakKeyDictionary[UOp, list[IndexCheck]] = weakref.WeakKeyDictionary()


def register_check(check: IndexCheck, *guarded: UOp) -> None:
    for u in guarded:
        if check not in (known := index_checks.setdefault(u, [])):
            known.append(check)


def checks_below(roots: list[UOp]) -> list[IndexCheck]:
    """The checks of every not yet realized uop the roots compute, each bound once (the op nearest a root names it)."""
    if not index_checks:
        return []
    root_set = set(roots)
    nodes = UOp(Ops.SINK, src=tuple(roots)).toposort(gate=lambda u: u in root_set or realized_value(u) is None)
    found: dict[tuple, IndexCheck] = {}
    for u in reversed(nodes):
        for c in index_checks.get(u, ()):
            found.setdefault((c.extremes, c.low, c.size, c.bound), c)
    return list(found.values())
