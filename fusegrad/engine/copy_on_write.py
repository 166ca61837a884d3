"""Copy on write: which old versions of assigned buffers a live graph outside this realize still reads.

An assign writes its target's storage in place unless some graph the caller still holds (a lazy tensor, a grad, a view)
would compute from the old value afterwards; then the assign writes a fresh buffer. The engine asks this before a
realize (the front end only says whether old versions are kept), the scheduler when it plans."""

from __future__ import annotations
import sys
from fusegrad.runtime.buffers import base_buffer
from fusegrad.schedule import realized_value
from fusegrad.uop.ops import Ops, UOp

# references OldVersionReaders itself holds on the node it measures: the node list, the count dict's key, the loop
# variable and getrefcount's argument
_OWN_REFS = 4


class OldVersionReaders:
    """Which BUFFER versions that an assign in roots' graph overwrites a live graph outside this realize (a lazy
    tensor, a grad, a view, the realized map) may still compute from: those assigns copy on write. Built before the
    schedule (a node is held outside when it has more references than this graph, the roots list and the roots'
    tensors, `refs_per_root` per root, account for); asked after planning, when it is known what the schedule computes
    and keeps, since a reader of a value the schedule keeps no longer needs the old buffer."""

    def __init__(self, roots: list[UOp], refs_per_root: int):
        nodes = UOp(Ops.SINK, src=tuple(roots)).toposort()
        target_bits = {b: 1 << i for i, b in enumerate(dict.fromkeys(_assign_targets(nodes)))}
        root_set = set(roots)
        self.held: set[UOp] = set()
        if target_bits:
            self.held = _held_readers(nodes, roots, refs_per_root, target_bits, root_set)
        self.target_bits, self.root_set = target_bits, root_set
        self.order = nodes[:-1]  # without the SINK of the roots: the graph's own nodes, sources first
        self._below_held: list[UOp] | None = None

    def shared(self, kept: set[UOp]) -> set[UOp]:
        """The targets some outside holder still reads, when the schedule keeps the values of `kept`."""
        if not self.held:
            return set()
        # only the held nodes' bits are asked: the walk covers the nodes below them (a lazy `.grad` of the batch
        # reading a weight is a few nodes of a step's hundreds)
        if self._below_held is None:
            self._below_held = _below(self.held, self.order)
        reads = _version_reads(self._below_held, self.target_bits, self.root_set, kept)
        bits = 0
        for u in self.held:
            bits |= reads[u]
        return {b for b, bit in self.target_bits.items() if bits & bit}


def _below(held: set[UOp], order: list[UOp]) -> list[UOp]:
    """The held nodes and every node under them, sources first: marked walking the graph's order backwards (users
    come after their sources), without a toposort of their own. Every node of the realize but its SINK is in order."""
    if any(u.op is Ops.SINK for u in held):
        return UOp(Ops.SINK, src=tuple(held)).toposort()
    marked = set(held)
    for u in reversed(order):
        if u in marked:
            marked.update(u.src)
    return [u for u in order if u in marked]


def _version_reads(nodes: list[UOp], target_bits: dict[UOp, int], roots: set[UOp], kept: set[UOp]) -> dict[UOp, int]:
    """Bit i of the result for u: u's value depends on target i's old value through nodes nobody has computed."""
    reads: dict[UOp, int] = {}
    # names the loop reads per node are locals: it runs over a realize's whole graph, twice for an optimizer step
    buffer_op, assign_op, bits_of = Ops.BUFFER, Ops.ASSIGN, target_bits.get
    for u in nodes:
        if (op := u.op) is buffer_op:
            bits = bits_of(u, 0)
        elif u in kept:
            bits = 0  # computed by this realize into a buffer of its own: its readers use that
        elif u.realized_ref is not None and u not in roots and (value := realized_value(u)) is not None:
            bits = bits_of(base_buffer(value), 0)  # computed already: its readers read the stored value
        elif op is assign_op:
            bits = 0  # computed by this realize: whoever holds it reads the new value
        else:
            bits = 0
            for s in u.src:
                bits |= reads[s]
        reads[u] = bits
    return reads


def _held_readers(nodes: list[UOp], roots: list[UOp], refs_per_root: int, target_bits: dict, root_set: set) -> set[UOp]:
    """The nodes that read a target's old version (_version_reads, nothing kept) and have a holder outside this
    realize: more references than this realize's graph, roots and bookkeeping hold."""
    reads = _version_reads(nodes, target_bits, root_set, frozenset())
    refs = dict.fromkeys(nodes, 1)  # each node is a key of `reads`
    for u in nodes:
        for s in u.src:
            refs[s] += 1
        if isinstance(ref := u.realized_ref, UOp) and ref in refs:
            refs[ref] += 1  # a value the realized map holds for a node of this graph belongs to this graph
    for r in roots:
        refs[r] += refs_per_root
    for u in (*target_bits, *root_set):
        refs[u] += 1
    # the loop's names would count as holders of the last nodes they named
    u = s = r = ref = None  # type: ignore[assignment]
    return {u for u in nodes if reads[u] and sys.getrefcount(u) > refs[u] + _OWN_REFS}


def _assign_targets(nodes: list[UOp]) -> list[UOp]:
    assign = Ops.ASSIGN  # an Ops member lookup per node otherwise
    return [b for u in nodes if u.op is assign and (b := base_buffer(u.src[0])) is not None]
