"""A traced graph as a replayable program: the nodes that depend on a call's inputs, each as (op, dtype, source
slots, arg), rebuilt over new input nodes by one loop. This is what a @function call costs instead of running its
Python body: no Tensor methods, no shape checks, no broadcasting or promotion, one UOp construction per node."""

from __future__ import annotations
import itertools
from typing import Iterable
from fusegrad.uop.ops import Ops, UOp

# fresh ids for the CONTIGUOUS nodes a replay builds: contiguous() promises a buffer of its own on every call
_FRESH = object()


class GraphProgram:
    """Nodes reachable from `roots` above the `known` nodes (each a slot of the environment a run starts from),
    as instructions. Subgraphs that reach no known node are kept as they are (fixed constants of the program)."""

    def __init__(self, roots: Iterable[UOp], known: dict[UOp, int], contiguous_ids: itertools.count):
        self.contiguous_ids = contiguous_ids
        self.first_slot = len(known)
        slots = dict(known)
        varying = set(known)
        self.fixed: list[UOp] = []
        self.instrs: list[tuple] = []
        computed: list[UOp] = []
        root_list = list(roots)
        for node in _toposort_above(root_list, set(known)):
            if node in slots:
                continue
            if not any(s in varying for s in node.src):
                continue  # a fixed subgraph: only its topmost nodes a varying node reads get a slot (below)
            for s in node.src:
                if s not in slots and s not in varying:
                    slots[s] = self.first_slot + len(self.fixed)
                    self.fixed.append(s)
            varying.add(node)
            computed.append(node)
        for r in root_list:
            if r not in slots and r not in varying:  # a root that reads no input: a fixed value
                slots[r] = self.first_slot + len(self.fixed)
                self.fixed.append(r)
        base = self.first_slot + len(self.fixed)
        for i, node in enumerate(computed):
            slots[node] = base + i
        for node in computed:
            arg = _FRESH if node.op is Ops.CONTIGUOUS and type(node.arg) is int else node.arg
            shape = getattr(node, "_shape", None)
            self.instrs.append((node.op, node.dtype, tuple(slots[s] for s in node.src), arg, shape))
        self.root_slots = [slots[r] for r in root_list]
        self.slots = slots  # where each traced node lives in a run's environment (a backward program reads them)

    def run(self, env: list) -> list:
        """Extends env (the known nodes' new values, in slot order) with the fixed and computed nodes; returns it."""
        env.extend(self.fixed)
        append, fresh = env.append, self.contiguous_ids
        for op, dtype, src, arg, shape in self.instrs:
            if arg is _FRESH:
                arg = next(fresh)
            u = UOp(op, dtype, tuple([env[i] for i in src]), arg)
            if shape is not None:
                u._shape = shape  # same input shapes, same shapes: the next op need not infer it
            append(u)
        return env

    def __len__(self) -> int:
        return len(self.instrs)


def _toposort_above(roots: list[UOp], stop: set[UOp]) -> list[UOp]:
    """The nodes under roots in dependency order, not walking below the stop nodes."""
    out: dict[UOp, None] = {}
    for r in roots:
        for u in r.toposort(gate=lambda x: x not in stop):
            out[u] = None
    return list(out)
