"""Schedules reused by graph structure.

A realize whose graph has the structure of an earlier one (the same ops, dtypes, shapes, devices, the same pattern of
buffers and realized values, only other buffers and other lifted constants) gets the kernels planned for that one,
re-bound to this call's buffers and constants, without planning again: a training step with new data schedules once.

The structure is one walk of the graph (`GraphShape`), which numbers buffers, buffer versions and lifted constants
in order of first appearance. A `ScheduleTemplate` says where each kernel argument, result and kept intermediate of
a planned schedule comes from in those terms: an input buffer, a constant, or a buffer the schedule creates."""

from __future__ import annotations
import operator
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import NUM_CPU_THREADS, SCHEDULE_CACHE
from fusegrad.runtime.device import Buffer
from fusegrad.runtime.buffers import buffer_of, buffer_uop
from fusegrad.schedule import ScheduleItem, VersionReaders, plan_schedule, realized_value
from fusegrad.schedule.kernel_ast import const_buffer, is_liftable_const
from fusegrad.uop.ops import GroupOp, Ops, UOp, _hashable

MAX_CACHED_SCHEDULES = 512
# where a kernel argument comes from: ("in", buffer slot) | ("new", k) | ("const", const slot, device) | ("fixed", buf)
BufferRef = tuple


class GraphShape:
    """One walk of a graph: its structural key and, in slot order, the buffers, versions and constants it reads."""

    __slots__ = ("key", "nodes", "buffers", "versions", "_version_slot", "consts", "const_slot", "visits", "leaf")

    def __init__(self, roots: list[UOp], devices: list, order: list[UOp] | None = None):
        """`order`: every node of the graph, sources first (a walk the caller made already, such as the copy-on-write
        check's), numbered as it is when no node of it stands for a realized value; else the graph is walked."""
        root_set = set(roots)
        index: dict[UOp, int] = {}
        rows = None if order is None else self._number(order, index, root_set, True)
        if rows is not None and not all(r in index for r in roots):
            rows = None  # the order is another realize's graph (one with the index checks' roots added, say)
        if rows is None:
            index.clear()
            if (rows := self._number(self._walk(roots, root_set, index), index, root_set, False)) is None:
                return
        if any(not isinstance(d, str) or d.startswith("DISK") for d in devices):
            return
        self.key = (rows, tuple([index[r] for r in roots]), tuple(devices), int(NUM_CPU_THREADS.value))

    def _walk(self, roots: list[UOp], root_set: set[UOp], index: dict[UOp, int]) -> list[UOp]:
        """The nodes in the order they are numbered, each after its sources; a node computed already (not a root)
        stands for its stored value, as substitute_realized makes it, and takes that value's number in `index`."""
        buffer_op = Ops.BUFFER
        order: list[UOp] = []
        visits = 0
        # entries: (node, state) with state 0 = to visit, 1 = sources done, 2 = stands for its realized value
        stack: list[tuple[UOp, int, UOp | None]] = [(r, 0, None) for r in reversed(roots)]
        while stack:
            u, state, value = stack.pop()
            if u in index:
                continue
            if state == 2:
                index[u] = index[value]  # type: ignore[index]
                continue
            if state == 0:
                visits += 1
                if (ref := u.realized_ref) is not None and u.op is not buffer_op and u not in root_set:
                    if (value := ref if isinstance(ref, UOp) else ref()) is not None:
                        # computed already: this graph reads the stored value, as substitute_realized makes it
                        stack.append((u, 2, value))
                        stack.append((value, 0, None))
                        continue
                if src := u.src:  # a leaf (a buffer, a constant) is numbered at once, without a second trip
                    stack.append((u, 1, None))
                    # the last source is walked first: in a chain `x * 2 + 1 ...` that is the shared constant, numbered
                    # once and then skipped, rather than pushed by every op and found numbered on the way back
                    if len(src) == 2:  # most nodes: no loop
                        if (s := src[0]) not in index:
                            stack.append((s, 0, None))
                        if (s := src[1]) not in index:
                            stack.append((s, 0, None))
                        continue
                    for s in src:
                        if s not in index:
                            stack.append((s, 0, None))
                    continue
            index[u] = len(order)
            order.append(u)
        self.visits = visits
        return order

    def _number(self, order: list[UOp], index: dict[UOp, int], root_set: set[UOp], check: bool) -> tuple | None:
        """The key's rows, with the buffers, versions and constants of the nodes in `order` (numbered here when
        `check`, else by the walk); None for a graph no template re-binds (multi-device, DISK), or with `check` when
        a node stands for a realized value (the walk handles it)."""
        # the structure, flat: per node its op, dtype, arg, source count and sources' numbers. One tuple for the whole
        # graph (not one per node): a realize's rows were hundreds of short-lived tuples the GC counted and promoted
        rows: list = []
        buffer_slot: dict[Buffer, int] = {}
        self.buffers: list[Buffer] = []
        self._version_slot: dict[UOp, int] | None = {}
        self.versions: list[UOp] = []
        self.const_slot: dict[tuple[DType, float], int] = {}
        self.consts: list[tuple[DType, float]] = []
        self.key: Any = None
        self.leaf: list | None = None  # the leaf-op memo's entry for this graph (graph_shape sets it)
        self.nodes = order
        if check:
            self.visits = len(order)
        # the loop runs once per realize: names it reads per node are locals (an Ops member lookup is a Python call)
        buffer_op, const_op, contiguous_op, special = Ops.BUFFER, Ops.CONST, Ops.CONTIGUOUS, (Ops.MULTI, Ops.COPY)
        for i, u in enumerate(order):
            op, arg, src = u.op, u.arg, u.src
            if check and u.realized_ref is not None and op is not buffer_op and u not in root_set:
                if realized_value(u) is not None:
                    return None
            if op is buffer_op:
                buf = u.buffer
                if buf.device.startswith("DISK"):
                    return None  # a DISK slice is a view of a file, made by the planner: not re-bindable
                if (b := buffer_slot.get(buf)) is None:
                    b = buffer_slot[buf] = len(self.buffers)
                    self.buffers.append(buf)
                self._version_slot[u] = v = len(self.versions)  # type: ignore[index]
                self.versions.append(u)
                arg = (b, v, arg[1], arg[2])
            elif op is const_op:
                if is_liftable_const(u):
                    if (c := self.const_slot.get(ck := (u.dtype, arg))) is None:
                        c = self.const_slot[ck] = len(self.consts)
                        self.consts.append(ck)
                    arg = ("lifted", c)
                else:
                    arg = _hashable(arg)  # 0.0 and -0.0 are different literals
            elif op is contiguous_op and type(arg) is int:
                arg = "distinct"  # a per-call id that only keeps equal graphs apart
            elif op in special and (op is special[0] or arg.startswith("DISK")):
                return None  # multi-device and disk graphs are planned every time
            if check:
                index[u] = i
            # sources by count: a comprehension is a call of its own, and most nodes have one or two
            n = len(src)
            if n == 2:
                rows += (op, u.dtype, arg, 2, index[src[0]], index[src[1]])
            elif n == 1:
                rows += (op, u.dtype, arg, 1, index[src[0]])
            else:
                rows += (op, u.dtype, arg, n, *[index[s] for s in src])
        return tuple(rows)

    @property
    def version_slot(self) -> dict[UOp, int]:
        """BUFFER node -> its slot among the versions (made when first asked: a re-bound leaf op rarely asks)."""
        if (slots := self._version_slot) is None:
            slots = self._version_slot = {v: i for i, v in enumerate(self.versions)}
        return slots

    @staticmethod
    def of_leaf_op(root: UOp, key: tuple, versions: list[UOp], buffer_nodes: list[UOp], consts: list) -> GraphShape:
        """The walk of a graph of a leaf form (root on BUFFER nodes and constants), from what an earlier walk of that
        form found."""
        shape = GraphShape.__new__(GraphShape)
        shape.key, shape.versions, shape.consts, shape._version_slot = key, versions, consts, None
        shape.const_slot = {c: i for i, c in enumerate(consts)} if consts else {}
        shape.buffers = [u.buffer for u in buffer_nodes]
        shape.nodes = [*versions, root]
        shape.visits, shape.leaf = 1, None
        return shape


# eager ops on realized tensors (an `x + y`, an `x * 2`, an `x - y`, an `x.relu()`): (the graph's form, devices,
# threads) -> [weak refs to its BUFFER leaves, the walk's key, which leaves are its versions and buffers, the template
# that schedules it when no copy on write is asked (None until one is known), its lifted constants]; its root is new
# each time, its leaves not
_leaf_op_shapes: dict[tuple, list] = {}
MAX_LEAF_OP_SHAPES = 256
# a small graph the memo takes: at most this many nodes (its BUFFER leaves too), each other one of these ops
MAX_FORM_NODES = 12
_FORM_OPS = frozenset({*GroupOp.Elementwise, *GroupOp.Movement, Ops.REDUCE_AXIS, Ops.CONST})

LeafForm = tuple  # (the memo's key, the BUFFER leaves in order of first sight)


def _single_root_form(roots: list[UOp], devices: list) -> LeafForm | None:
    """The leaf-op memo's form of the graph when there is one root, else None."""
    return leaf_form(roots[0], tuple(devices)) if len(roots) == 1 else None


def leaf_form(root: UOp, devices: tuple) -> LeafForm | None:
    """(key, leaves) when root is one op straight on BUFFER nodes (its sources are the leaves) or a small graph of
    elementwise, movement and reduce ops over BUFFER nodes and constants, none of its inner nodes computed already;
    else None. Devices given as a tuple (the eager fast path builds no lists)."""
    if not (src := root.src):
        return None
    buffer_op = Ops.BUFFER
    for s in src:
        if s.op is not buffer_op:
            return _small_form(root, devices)
    arg = root.arg
    key = (
        root.op,
        root.dtype,
        None if arg is None else _hashable(arg),
        (id(src[0]), id(src[1])) if len(src) == 2 else tuple(map(id, src)),  # `x + y`: without map's iterator
        devices,
        NUM_CPU_THREADS.value,
    )
    return key, src


def _small_form(root: UOp, devices: tuple) -> LeafForm | None:
    """leaf_form of a graph that is not one op on BUFFER nodes: its key spells the whole graph (BUFFER nodes by id,
    constants by value), so equal keys are graphs of one structure over the same leaves."""
    leaves: list[UOp] = []
    if (word := _spell(root, root, {}, leaves, [MAX_FORM_NODES])) is None or not leaves:
        return None
    return (word, devices, NUM_CPU_THREADS.value), tuple(leaves)


def _spell(u: UOp, root: UOp, spelled: dict[UOp, tuple], leaves: list[UOp], budget: list[int]) -> tuple | None:
    """u's part of a small form's key, its BUFFER nodes added to leaves; None where u is not of a small form. Each
    node met spends one of `budget` before its sources are looked at, so a large graph (a chain of thousands of ops)
    is given up after MAX_FORM_NODES nodes, not walked to its bottom. (A function of its own, not a closure: a
    recursive closure is a reference cycle, and the nodes it names would stay alive until the collector ran, each one
    a reader that makes the next assign copy on write.)"""
    if (done := spelled.get(u)) is not None:
        return done
    budget[0] -= 1
    if budget[0] < 0:
        return None
    if u.op is Ops.BUFFER:
        leaves.append(u)
        word: tuple = ("b", id(u))
    elif u.op not in _FORM_OPS or (u is not root and u.realized_ref is not None):
        return None  # another op, or a value computed already (the walk reads it from its buffer)
    else:
        parts = [_spell(s, root, spelled, leaves, budget) for s in u.src]
        if None in parts:
            return None
        arg = u.arg
        word = (u.op, u.dtype, None if arg is None else _hashable(arg), *parts)
    spelled[u] = word
    return word


def _leaf_hit(key: tuple, leaves: tuple[UOp, ...]) -> list | None:
    """The memo's entry for key when its leaves are still these nodes (an id may have been reused since)."""
    if (hit := _leaf_op_shapes.get(key)) is None:
        return None
    for r, s in zip(hit[0], leaves):
        if r() is not s:
            return None
    return hit


def graph_shape(
    roots: list[UOp], devices: list, form: LeafForm | None = None, order: list[UOp] | None = None
) -> GraphShape:
    """GraphShape(roots, devices, order), without the walk when the graph has a leaf form an earlier graph had too:
    a BUFFER node's storage never changes, so such a graph has the earlier one's structure. `form` is
    _single_root_form(roots, devices) when the caller has it already."""
    if (form := form or _single_root_form(roots, devices)) is None:
        return GraphShape(roots, devices, order)
    key, leaves = form
    root = roots[0]
    if (hit := _leaf_hit(key, leaves)) is not None:
        versions, buffer_nodes = [leaves[i] for i in hit[2]], [leaves[i] for i in hit[3]]
        shape = GraphShape.of_leaf_op(root, hit[1], versions, buffer_nodes, hit[5])
        shape.leaf = hit
        return shape
    shape = GraphShape(roots, devices)
    if shape.key is not None:
        if len(_leaf_op_shapes) >= MAX_LEAF_OP_SHAPES:
            _leaf_op_shapes.clear()
        # weak references and positions: the memo keeps no node and no buffer alive
        where = {s: i for i, s in reversed(list(enumerate(leaves)))}
        buffer_first = [where[next(v for v in shape.versions if buffer_of[v] is b)] for b in shape.buffers]
        refs = tuple(weakref.ref(s) for s in leaves)
        versions = tuple(where[v] for v in shape.versions)
        entry = [refs, shape.key, versions, tuple(buffer_first), None, list(shape.consts)]
        shape.leaf = _leaf_op_shapes[key] = entry
    return shape


@dataclass
class ScheduleTemplate:
    """A planned schedule in slot terms; `bind` makes the items, results and kept values for another GraphShape."""

    kernels: list[tuple[UOp, str, tuple[BufferRef, ...]]]  # (ast, device, where each argument comes from)
    new_buffers: list[tuple[str, int, DType]]  # buffers the schedule creates: (device, size, dtype)
    new_versions: list[BufferRef]  # BUFFER nodes the schedule creates, over these buffers
    results: list[tuple]  # each root's value as a view recipe (see _recipe)
    inner: list[tuple[int, tuple]]  # (node position, view recipe) of kept intermediate values
    new_bytes: int
    # whatever the runner of the schedule keeps for it (the engine: its loaded programs); opaque to the scheduler
    launch_memo: dict[Any, Any] = field(default_factory=dict)

    def bind(self, shape: GraphShape) -> tuple[list[ScheduleItem], list[UOp], dict[UOp, UOp]]:
        return self.bind_parts(shape.buffers, shape.versions, shape.consts, shape.nodes)

    def bind_parts(
        self, buffers: list[Buffer], old: list[UOp], consts: list, nodes: list[UOp] | None
    ) -> tuple[list[ScheduleItem], list[UOp], dict[UOp, UOp]]:
        """bind, from a GraphShape's parts: its buffers, versions, constants and nodes (None when `inner` is empty)."""
        n_inputs = len(buffers)  # the same for every graph of this structure
        if (gathers := self._gathers) is None or self._gathers_for != n_inputs:
            gathers = self._plan_gathers(n_inputs)
        new = self.new_buffers
        pool = buffers + [Buffer(*new[0])] if len(new) == 1 else buffers + [Buffer(*b) for b in new]
        if extra_refs := self._extra_refs:  # constants (one buffer per constant and device), then fixed buffers
            for ref in extra_refs:
                if ref[0] == "const":
                    dtype, value = consts[ref[1]]
                    pool.append(const_buffer(ref[2], dtype, value))
                else:
                    pool.append(ref[1])
        if len(gathers) == 1:
            ast, device, gather = gathers[0]
            items = [ScheduleItem(ast, gather(pool), device)]
        else:
            items = [ScheduleItem(ast, gather(pool), device) for ast, device, gather in gathers]
        # one new version and one result (an eager op): no comprehension frames
        slots = self._version_slots
        versions = [buffer_uop(pool[slots[0]])] if len(slots) == 1 else [buffer_uop(pool[i]) for i in slots]
        recipes = self.results
        if len(recipes) == 1:
            results = [_view(recipes[0], old, versions)]
        else:
            results = [_view(recipe, old, versions) for recipe in recipes]
        if not self.inner:
            return items, results, {}
        assert nodes is not None
        return items, results, {nodes[i]: _view(recipe, old, versions) for i, recipe in self.inner}

    def one_kernel(self) -> tuple | None:
        """(gather, (device, size, dtype), chain) when the template is one kernel writing one new buffer, reading only
        the caller's buffers, whose result is a view of that buffer (an eager op), once bound: gather(the input buffers
        in slot order + [the new buffer]) gives the kernel's arguments, chain the result's movement ops (op, dtype, arg)
        over the new buffer's node. Else None."""
        if self._gathers is None or self._extra_refs or len(self.kernels) != 1 or len(self.new_buffers) != 1:
            return None
        if self.inner or len(self.results) != 1 or self.new_versions != [("new", 0)]:
            return None
        (kind, slot), chain = self.results[0]
        return (self._gathers[0][2], self.new_buffers[0], chain) if kind == "new" and slot == 0 else None

    # bind's plan of arguments, made at the first bind (class attributes: not dataclass fields)
    _gathers = None
    _gathers_for = -1

    def _plan_gathers(self, n_inputs: int) -> list:
        """Each kernel's arguments as positions in bind's pool (inputs, created buffers, then `_extra_refs`), read
        by one itemgetter call per kernel instead of a Python call per argument."""
        n_new, extra, extra_index = len(self.new_buffers), [], {}

        def position(ref: BufferRef) -> int:
            if ref[0] == "in":
                return ref[1]
            if ref[0] == "new":
                return n_inputs + ref[1]
            if (j := extra_index.get(ref)) is None:
                j = extra_index[ref] = len(extra)
                extra.append(ref)
            return n_inputs + n_new + j

        gathers = []
        for ast, device, refs in self.kernels:
            positions = [position(r) for r in refs]
            get = operator.itemgetter(*positions)
            gathers.append((ast, device, get if len(positions) > 1 else (lambda pool, get=get: (get(pool),))))
        self._version_slots = [position(r) for r in self.new_versions]
        self._extra_refs = extra
        self._gathers, self._gathers_for = gathers, n_inputs
        return gathers


def _view(recipe: tuple, old_versions: list[UOp], new_versions: list[UOp]) -> UOp:
    """A template's view recipe over one bind's BUFFER nodes."""
    (kind, slot), chain = recipe
    u = old_versions[slot] if kind == "version" else new_versions[slot]
    for op, dtype, arg in chain:
        u = UOp(op, dtype, (u,), arg)
    return u


class _Entry:
    """Templates of one structure, by the copy-on-write decision (which depends on who else holds the graph)."""

    __slots__ = ("kept", "templates")

    def __init__(self, kept: tuple[int, ...]):
        self.kept = kept  # positions of the caller's nodes whose values the schedule keeps
        self.templates: dict[frozenset[int], ScheduleTemplate] = {}


_cache: OrderedDict[tuple, _Entry] = OrderedDict()


class _ScheduleCacheStats:
    """Hits and misses of the schedule cache: the one instance ScheduleCacheStats (an instance attribute's update
    costs a third of a class attribute's, and every eager op counts one)."""

    __slots__ = ("hits", "misses")

    def __init__(self):
        self.hits = self.misses = 0


ScheduleCacheStats = _ScheduleCacheStats()


_NO_SLOTS: frozenset[int] = frozenset()


def _copy_on_write_slots(shape: GraphShape, kept: tuple[int, ...], readers: VersionReaders | None) -> frozenset:
    if readers is None:
        return _NO_SLOTS
    return _slots(shape, readers.shared({shape.nodes[i] for i in kept}))


def _slots(shape: GraphShape, targets: set[UOp]) -> frozenset[int]:
    # a target only below a realized value is no assign of this schedule: it changes nothing in the plan
    return frozenset(slot for t in targets if (slot := shape.version_slot.get(t)) is not None)


def cached_schedule(
    roots: list[UOp], devices: list, readers: VersionReaders | None = None
) -> tuple[list[ScheduleItem], list[UOp], dict[UOp, UOp], dict | None]:
    """create_schedule, reusing the plan of an earlier graph of the same structure. The last value is the reused or
    new template's `launch_memo` (None when the schedule is not one a template re-binds): whoever runs the items
    keeps there what holds for every schedule of this structure (the loaded programs)."""
    if not SCHEDULE_CACHE.value:
        plan = plan_schedule(roots, devices, readers)
        return plan.items, plan.results, plan.inner, None
    if (form := _single_root_form(roots, devices)) is not None and readers is None:
        # an eager op on realized tensors seen before: its leaves and template straight from the memo, no GraphShape
        if (hit := _leaf_hit(*form)) is not None and (template := hit[4]) is not None:
            ScheduleCacheStats.hits += 1
            return (*bind_leaf(template, hit, form[1]), template.launch_memo)
    shape = graph_shape(roots, devices, form, None if readers is None else readers.order)
    key = shape.key
    if key is None:
        plan = plan_schedule(roots, devices, readers)
        return plan.items, plan.results, plan.inner, None
    assert shape is not None
    if (entry := _cache.get(key)) is not None:
        _cache.move_to_end(key)
        cow = _NO_SLOTS if readers is None else _copy_on_write_slots(shape, entry.kept, readers)
        if (template := entry.templates.get(cow)) is not None:
            ScheduleCacheStats.hits += 1
            _remember_leaf_template(shape, template, readers)
            return (*template.bind(shape), template.launch_memo)
    ScheduleCacheStats.misses += 1
    plan = plan_schedule(roots, devices, readers)
    position = {u: i for i, u in enumerate(shape.nodes)}
    kept = tuple(sorted(position[u] for u in plan.kept if u in position))
    template = _make_template(shape, plan, position)
    if template is not None and len(kept) == len(plan.kept):
        cow = _slots(shape, plan.planner.copy_on_write)
        if entry is None:
            entry = _cache[key] = _Entry(kept)
            while len(_cache) > MAX_CACHED_SCHEDULES:
                _cache.popitem(last=False)
        entry.templates[cow] = template
        if not cow:
            _remember_leaf_template(shape, template, readers)
        return plan.items, plan.results, plan.inner, template.launch_memo
    return plan.items, plan.results, plan.inner, None


def leaf_template(root: UOp, device: str | tuple[str, ...]) -> tuple[ScheduleTemplate, list, tuple] | None:
    """When root is an eager op on realized tensors whose template (without copy on write) the leaf-op memo holds: that
    template, the memo's entry, whose [3] says which leaves are the template's input buffers in slot order, and the
    leaves (root's sources when it is one op on BUFFER nodes). Counted as a schedule cache hit: the caller binds it.
    Else None."""
    if not SCHEDULE_CACHE.value or (form := leaf_form(root, (device,))) is None:
        return None
    if (hit := _leaf_hit(*form)) is None or (template := hit[4]) is None:
        return None
    ScheduleCacheStats.hits += 1
    return template, hit, form[1]


def bind_leaf(
    template: ScheduleTemplate, hit: list, leaves: tuple[UOp, ...]
) -> tuple[list[ScheduleItem], list[UOp], dict]:
    """The leaf-op memo's template bound to this graph's leaves (its versions and buffers by position)."""
    versions, buffer_nodes = hit[2], hit[3]
    if len(leaves) == 2 and len(versions) == 2 and len(buffer_nodes) == 2:  # `x + y`: no comprehensions
        a, b = leaves[versions[0]], leaves[versions[1]]
        old = [a, b]
        buffers = [a.buffer, b.buffer] if buffer_nodes == versions else [leaves[i].buffer for i in buffer_nodes]
    else:
        old, buffers = [leaves[i] for i in versions], [leaves[i].buffer for i in buffer_nodes]
    return template.bind_parts(buffers, old, hit[5], None)


def _remember_leaf_template(shape: GraphShape, template: ScheduleTemplate, readers: VersionReaders | None) -> None:
    """A leaf op's template asked without copy on write serves the next such call straight from the leaf-op memo."""
    if (leaf := shape.leaf) is not None and readers is None and not template.inner:
        leaf[4] = template


def _compiles_in_a_slot_constant(shape: GraphShape, items) -> bool:
    """Whether a kernel has one of the caller's int constants as a literal (a shift count, a divisor: the scheduler
    lifts int constants only where the code does not depend on them): a template would replay it for other values."""
    slots = {(dtype, value) for dtype, value in shape.consts if dtypes.is_int(dtype)}
    return bool(slots) and any(
        u.op is Ops.CONST and (u.dtype, u.arg) in slots
        for item in items
        if item.ast.op is Ops.SINK
        for u in item.ast.toposort()
    )


def _make_template(shape: GraphShape, plan, position: dict[UOp, int]) -> ScheduleTemplate | None:
    """The plan in slot terms, or None when some part of it is not one of the kinds a template re-binds."""
    buffer_slot = {b: i for i, b in enumerate(shape.buffers)}
    created = {b: i for i, b in enumerate(plan.planner.created)}
    const_params = plan.planner.const_params

    def ref(buf: Buffer, device: str) -> BufferRef | None:
        if (i := buffer_slot.get(buf)) is not None:
            return ("in", i)
        if (i := created.get(buf)) is not None:
            return ("new", i)
        if (c := const_params.get(buf)) is not None:
            slot = shape.const_slot.get(c)
            # a constant the lowering made (not the caller's) is part of the structure: the same buffer serves
            return ("const", slot, device) if slot is not None else ("fixed", buf)
        return None

    if _compiles_in_a_slot_constant(shape, plan.items):
        return None
    kernels = []
    for item in plan.items:
        refs = tuple(ref(b, item.device) for b in item.buffers)
        if None in refs:
            return None
        kernels.append((_copy_stand_in(item.ast) if item.ast.op is Ops.COPY else item.ast, item.device, refs))
    new_versions: list[BufferRef] = []
    version_index: dict[UOp, int] = {}

    def recipe(u: UOp) -> tuple | None:
        chain = []
        while u.op is not Ops.BUFFER:
            if u.op not in GroupOp.Movement:
                return None
            chain.append((u.op, u.dtype, u.arg))
            u = u.src[0]
        chain.reverse()
        if (slot := shape.version_slot.get(u)) is not None:
            return ("version", slot), tuple(chain)
        if (j := version_index.get(u)) is None:
            if (r := ref(buffer_of[u], u.arg[1])) is None or r[0] not in ("in", "new"):
                return None
            j = version_index[u] = len(new_versions)
            new_versions.append(r)
        return ("new", j), tuple(chain)

    results = [recipe(r) for r in plan.results]
    inner = [(position[u], recipe(v)) for u, v in plan.inner.items() if u in position]
    if None in results or any(r is None for _, r in inner):
        return None
    new_buffers = [(b.device, b.size, b.dtype) for b in plan.planner.created]
    return ScheduleTemplate(
        kernels, new_buffers, new_versions, results, inner, sum(b.nbytes for b in plan.planner.created)
    )  # type: ignore[arg-type]


def _copy_stand_in(copy: UOp) -> UOp:
    """A transfer's item names its COPY node, which holds the caller's graph (and its buffers): a template keeps a
    COPY of a placeholder instead, so it holds no caller's storage alive."""
    return UOp(Ops.COPY, copy.dtype, (UOp(Ops.DEFINE_GLOBAL, copy.dtype, (), (1, copy.size)),), copy.arg)


def clear_schedule_cache() -> None:
    _cache.clear()
    _leaf_op_shapes.clear()
