"""The planner: which nodes of a lazy graph are realized into buffers (realize points), in what order their kernels
run, and each kernel's AST (schedule/kernel_ast.py builds its value graph)."""

from __future__ import annotations
import heapq
from typing import Callable
from fusegrad.dtype import DType
from fusegrad.helpers import SPEC
from fusegrad.runtime.buffers import base_buffer, buffer_of, buffer_uop, is_contiguous_view
from fusegrad.runtime.device import Buffer
from fusegrad.schedule.cat_split import cat_axis, cat_pieces, piece_kernel
from fusegrad.schedule.custom import custom_needs, emit_custom, is_custom_output
from fusegrad.schedule.items import ScheduleItem, buffer_view
from fusegrad.schedule.kernel_ast import kernel_ast_value, kernel_view
from fusegrad.schedule.variables import KernelVars
from fusegrad.uop.ops import GroupOp, Ops, UOp, view_over
from fusegrad.uop.spec import check_kernel_ast
from fusegrad.uop.trampoline import Step, run_steps

# a broadcast expression whose recomputation would cost this many extra ALU ops is realized once instead. Not lower:
# 2^20 stored an MLP's softmax gradient (its two backward matmuls 76 -> 9 us and 68 -> 8 us) but made the BERT ONNX
# encoder 2.7x slower (8.2 -> 22 ms, one run each, same minute)
RECOMPUTE_LIMIT = 1 << 22
# ... unless the expression's value is small: storing at most this many elements costs one tiny kernel, so a lower
# limit holds for it. An MLP's softmax gradient (batch 128 x 10 classes, 9 ops an element, one an exp) broadcast over
# its two backward matmuls cost 1.5M ops, 85 and 55 us a step on Zen 3, against about 3 us to store it and read it back
# (batch 64: 0.7M ops). The BERT ONNX encoder has no small value past this limit
SMALL_VALUE_ELEMENTS = 4096
SMALL_VALUE_RECOMPUTE_LIMIT = 1 << 19
# a kernel fuses chains of at most this many ops: a node this far above the last buffer is realized into a buffer of
# its own. The C compiler's optimizer is superlinear in a function's statements (a 100k-statement kernel takes gcc
# minutes) while a kernel boundary costs one memory pass, and the chunks of a uniform chain share one compiled kernel.
# Cutting by depth (not by a kernel's node count) cuts every kernel that shares a subgraph at the same nodes
KERNEL_DEPTH_LIMIT = 1000
# a gather inside a broadcast expression counts as this many ALU ops: its load at a loaded index keeps the consumer's
# loop scalar (the BERT ONNX encoder's attention mask, gathered from the input mask and broadcast over 4 heads, was
# recomputed per score by the softmax's three kernels: 0.5 ms each at 3.6 GFLOPS, one thread)
GATHER_RECOMPUTE_COST = 256


def _recompute_limit(value: UOp) -> int:
    """The recompute cost (ALU ops) past which a broadcast value is stored once instead."""
    return SMALL_VALUE_RECOMPUTE_LIMIT if value.size <= SMALL_VALUE_ELEMENTS else RECOMPUTE_LIMIT


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    return buffer_uop(Buffer(device, size, dtype))


def reads_shifted(root: UOp, is_target: Callable[[UOp], bool], is_leaf: Callable[[UOp], bool]) -> bool:
    """Does `root` read a target through a movement op other than a reshape, or a reduce: another element than the one
    it writes (an in-place hazard)? The walk does not go past targets and leaves."""
    stack: list[tuple[UOp, bool]] = [(root, False)]
    seen: set[tuple[UOp, bool]] = set()
    while stack:
        u, moved = stack.pop()
        if (u, moved) in seen:
            continue
        seen.add((u, moved))
        if is_target(u):
            if moved:
                return True
            continue
        if is_leaf(u):
            continue
        shifts = u.op in GroupOp.Movement and u.op is not Ops.RESHAPE or u.op in (Ops.REDUCE_AXIS, Ops.GATHER)
        stack.extend((s, moved or shifts) for s in u.src)
    return False


def kernel_value(point: UOp) -> UOp:
    """What a realize point's kernel computes: an assign's value, a contiguous or copy's source, else the point."""
    if point.op is Ops.ASSIGN:
        return point.src[1]
    return point.src[0] if point.op in (Ops.CONTIGUOUS, Ops.COPY) else point


class Planner:
    """The tables of one schedule's graph; `find_points` marks its realize points, `plan` emits one ScheduleItem per
    point in dependency order."""

    def __init__(self, roots: list[UOp]):
        self.roots = roots
        self.copy_on_write: set[UOp] = set()  # assign targets (BUFFER versions) that get a fresh buffer
        self.points: dict[UOp, str] = {}  # realize point -> device
        self.result: dict[UOp, UOp] = {}  # realize point -> buffer view of its value
        self.items: list[ScheduleItem] = []
        self.vars = KernelVars()  # the value of each bound variable in this schedule
        # what the schedule made, so a cached copy of it can make the same again for other inputs (schedule/cache.py)
        self.created: list[Buffer] = []  # fresh buffers, in order of creation
        self.const_params: dict[Buffer, tuple[DType, float]] = {}  # lifted constant -> (dtype, value)
        self.const_views: dict[UOp, bool] = {}  # is_lifted_const_view's memo
        self.custom_outputs: dict[tuple[UOp, int], UOp] = {}  # (CUSTOM_KERNEL, written slot) -> its fresh buffer
        sink = UOp(Ops.SINK, src=tuple(roots))
        self.nodes = sink.toposort(gate=lambda u: u.op is not Ops.BUFFER)
        self.cost_memo: dict[UOp, int] = {}
        self.parents: dict[UOp, list[UOp]] = {}
        for u in self.nodes:
            for s in dict.fromkeys(u.src):
                self.parents.setdefault(s, []).append(u)
        # buffers overwritten by an assign in this schedule, and the values written into each
        self.assigned: dict[Buffer, list[UOp]] = {}
        for u in self.nodes:
            if u.op is Ops.ASSIGN and (b := base_buffer(u.src[0])) is not None:
                self.assigned.setdefault(buffer_of[b], []).append(kernel_value(u))
        self.assigned_reads_memo: dict[UOp, set[Buffer]] = {}
        # roots computed by a kernel of their own (not views of a buffer), which `plan` runs before any assign of a
        # buffer they read
        self.root_set = {r for r in roots if base_buffer(r) is None}
        self.device_of: dict[UOp, str | None] = {}
        for u in self.nodes:
            self.device_of[u] = self._device(u)
        self.depth_cuts = self._depth_cuts()

    def find_points(self, devices: list[str]) -> None:
        """Each root computed by a kernel, and what its kernel needs realized first, becomes a realize point."""
        for r, d in zip(self.roots, devices):
            if base_buffer(r) is None:
                self._mark(r, self.device_of[r] or d)
        # a reduce fused into several kernels would be computed once per kernel: realize it once instead
        while shared := self._reduces_in_several_kernels():
            # the outermost first: a reduce inside another (a per-block sum under a matvec's sum) goes with it
            inner = {
                v for u in shared for v in u.toposort(gate=lambda x, u=u: x is u or x not in self.points) if v is not u
            }
            for u in [u for u in shared if u not in inner] or shared:
                self._mark(u, self.device_of[u] or self.points[next(iter(self.points))])

    def _depth_cuts(self) -> set[UOp]:
        """Nodes to realize so no fused chain is longer than KERNEL_DEPTH_LIMIT ops. A node is cut when a user would
        exceed the limit, so a node read by several users is cut once (not each user: they would recompute it)."""
        height: dict[UOp, int] = {}  # fused ops from the nearest buffer, constant or cut up to the node
        cuts: set[UOp] = set()
        for u in self.nodes:
            for s in u.src:
                if height[s] + 1 >= KERNEL_DEPTH_LIMIT:
                    cuts.add(s)
                    height[s] = 0
            always_realized = u.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN) and u.arg != "backward"
            always_realized = always_realized or u.op is Ops.AFTER
            height[u] = 0 if always_realized else 1 + max((height[s] for s in u.src), default=-1)
        return cuts

    def _reduces_in_several_kernels(self) -> list[UOp]:
        seen_in: dict[UOp, int] = {}
        for point in self.points:
            value = kernel_value(point)
            if value is not point and value in self.points:
                continue
            for u in value.toposort(gate=lambda x: x is value or x not in self.points):
                if u.op is Ops.REDUCE_AXIS and u not in self.points:
                    seen_in[u] = seen_in.get(u, 0) + 1
        return [u for u, n in seen_in.items() if n > 1]

    def _device(self, u: UOp) -> str | None:
        if u.op is Ops.BUFFER:
            return u.arg[1]
        if u.op is Ops.COPY:
            return u.arg
        if u.op is Ops.SINK:
            return None  # the roots of one schedule may live on different devices
        devs = {d for s in u.src if (d := self.device_of[s]) is not None}
        if len(devs) > 1:
            raise RuntimeError(f"{u.op} mixes tensors on different devices {sorted(devs)}; move them with .to() first")
        return devs.pop() if devs else None

    def _mark(self, point: UOp, device: str) -> None:
        """Make `point` a realize point and walk its kernel to find the points it needs."""
        run_steps(self._mark_step(point, device))

    def _mark_step(self, point: UOp, device: str) -> Step:
        # a step on run_steps' stack, not Python's: a chain of realize points can be thousands long
        if point in self.points:
            return
        self.points[point] = device
        if point.op is Ops.CUSTOM_KERNEL or is_custom_output(point):
            for u in custom_needs(point):
                yield self._mark_step(u, self.device_of[u] or device)
            return
        value = kernel_value(point)
        if point.op is Ops.COPY:
            if not is_contiguous_view(value):
                yield self._mark_step(value, self.device_of[value] or device)
            return
        if point.op is Ops.ASSIGN:
            target = base_buffer(point.src[0])
            if target is None or not is_store_view(point.src[0]):
                raise RuntimeError(
                    f"assign target must be a realized buffer or a reshape/permute/shrink/flip view of one, got "
                    f"{point.src[0].op}"
                )
            buf = buffer_of[target]
            if self._reads_shifted(value, buf, point.src[0]) or self._reads_other_assigned(value, buf):
                yield self._mark_step(value, device)
        stack: list[tuple[UOp, bool]] = [(value, False)]
        seen: set[tuple[UOp, bool]] = set()
        while stack:
            u, expanded = stack.pop()
            if (u, expanded) in seen or u.op is Ops.BUFFER:
                continue
            seen.add((u, expanded))
            if u is not point and (
                u.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN)
                and u.arg != "backward"
                or u.op is Ops.REDUCE_AXIS
                and expanded
                or is_custom_output(u)
            ):
                yield self._mark_step(u, self.device_of[u] or device)
                continue
            if u is not point and u in self.depth_cuts:
                yield self._mark_step(u, self.device_of[u] or device)
                continue
            grows = u.op is Ops.EXPAND and u.size > u.src[0].size
            if grows and self._recompute_cost(u.src[0]) * (u.size - u.src[0].size) >= _recompute_limit(u.src[0]):
                # a broadcast would recompute this expression for every copy: compute it once into a buffer instead
                yield self._mark_step(u.src[0], self.device_of[u.src[0]] or device)
                continue
            # a padded element reads nothing, but a reduce below the pad would run its loop there too (only its loads
            # are gated): a reduce read through a growing pad (a row written into a KV cache, a cat) is realized
            pads = u.op is Ops.PAD and u.size > u.src[0].size
            # a gather reads its table at loaded rows: a reduce there would run once per gathered element
            gathers = u.op is Ops.GATHER
            stack.extend((s, expanded or grows or pads or gathers) for s in u.src)

    def _recompute_cost(self, u: UOp) -> int:
        """Data-dependent ALU ops evaluated per element of u inside a fused kernel; index math over ARANGE/CONST is
        free (the compiler folds or hoists it), and the walk stops at buffers, reduces and realize points."""
        if (cost := self.cost_memo.get(u)) is None:
            cost = self.cost_memo[u] = self._count_data_ops(u)
        return cost

    def _count_data_ops(self, u: UOp) -> int:
        nodes = u.toposort(gate=lambda x: x is u or not self._stored(x) and x.op is not Ops.REDUCE_AXIS)
        reads_data: dict[UOp, bool] = {}
        for n in nodes:
            reads_data[n] = (
                n.op is Ops.BUFFER
                or n.op is Ops.REDUCE_AXIS
                or (n is not u and self._stored(n))
                or any(reads_data.get(s, False) for s in n.src)
            )
        gathers = sum(GATHER_RECOMPUTE_COST for n in nodes if n.op is Ops.GATHER and reads_data[n])
        return gathers + sum(1 for n in nodes if n.op in GroupOp.ALU and reads_data[n])

    def _stored(self, u: UOp) -> bool:
        """A node whose kernel reads it from a buffer: a realize point, or one that will be (a contiguous, copy or
        assign not yet reached by the marking walk, or a depth cut), so no recompute cost lies past it."""
        always_realized = u.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN) and u.arg != "backward" or u.op is Ops.AFTER
        return u in self.points or u in self.depth_cuts or always_realized

    def _reads_other_assigned(self, value: UOp, target: Buffer) -> bool:
        """Does `value` read a buffer whose assign in this schedule reads `target`, directly or through further
        assigns? Then each assign needs the other's old value and no order of kernels gives both: this one is
        computed into a temporary. Reads without such a cycle are ordered by `plan` (readers before the assign)."""
        pending = [b for b in self._assigned_reads(value) if b is not target]
        seen = set(pending)
        while pending:
            for v in self.assigned[pending.pop()]:
                reads = self._assigned_reads(v)
                if target in reads:
                    return True
                pending.extend(b for b in reads if b not in seen)
                seen.update(reads)
        return False

    def _assigned_reads(self, value: UOp) -> set[Buffer]:
        """The buffers assigned in this schedule that `value`'s kernels read, not looking inside other assigns or
        other roots (a gradient realized with the update): a root is a kernel of its own, which `plan` runs before
        the assigns of the buffers it reads."""
        if (reads := self.assigned_reads_memo.get(value)) is None:
            roots = self.root_set
            reads = self.assigned_reads_memo[value] = {
                buf
                for u in value.toposort(gate=lambda x: x.op is not Ops.ASSIGN and (x is value or x not in roots))
                if u.op is Ops.BUFFER and (buf := buffer_of[u]) in self.assigned
            }
        return reads

    def _reads_shifted(self, value: UOp, buf: Buffer, target: UOp) -> bool:
        """Does `value` read `buf` anywhere other than at the element it writes into `target` (an in-place hazard)?"""

        def is_leaf(u: UOp) -> bool:
            # a point or another root (a gradient realized with the step) is a kernel that runs before this assign
            return u.op is Ops.BUFFER or (u in self.points or u in self.root_set) and u is not value

        if is_contiguous_view(target):
            return reads_shifted(value, lambda u: u.op is Ops.BUFFER and buffer_of[u] is buf, is_leaf)
        # a region of buf: only a read through the very view it writes, moved by nothing, is of the element written
        if reads_shifted(value, lambda u: u is target, is_leaf):
            return True
        nodes = value.toposort(gate=lambda u: u is not target and not is_leaf(u))
        return any(u.op is Ops.BUFFER and buffer_of[u] is buf for u in nodes)

    def _kernel_inputs(self, point: UOp) -> tuple[set[UOp], set[Buffer]]:
        """The points and the buffers a point's kernel reads (the walk stops at other points)."""
        value = kernel_value(point)
        deps: set[UOp] = set()
        bufs: set[Buffer] = set()
        if value is not point and value in self.points:
            return {value}, bufs
        for u in value.toposort(gate=lambda x: x is value or x not in self.points):
            if u in self.points and u is not point:
                deps.add(u)
            elif u.op is Ops.BUFFER:
                bufs.add(buffer_of[u])
        return deps, bufs

    def plan(self) -> list[ScheduleItem]:
        order = [u for u in self.nodes if u in self.points]
        inputs = self.inputs = {p: self._kernel_inputs(p) for p in order}
        # write-after-read: a kernel reading a buffer that an assign overwrites must run before that assign
        after: dict[UOp, set[UOp]] = {p: set(inputs[p][0]) for p in order}
        readers_of: dict[Buffer, list[UOp]] = {}  # buffer -> the points whose kernels read it, one pass over all
        for p in order:
            for buf in inputs[p][1]:
                readers_of.setdefault(buf, []).append(p)
        for a in order:
            if a.op is not Ops.ASSIGN or base_buffer(a.src[0]) in self.copy_on_write:
                continue
            target = buffer_of[base_buffer(a.src[0])]  # type: ignore[index]
            after[a].update(p for p in readers_of.get(target, ()) if p is not a)
        # emit the earliest point (in graph order) whose prerequisites are all emitted; a heap keeps this linear-log
        position = {p: i for i, p in enumerate(order)}
        waiting_on = {p: len(after[p]) for p in order}
        unblocks: dict[UOp, list[UOp]] = {}
        for p in order:
            for q in after[p]:
                unblocks.setdefault(q, []).append(p)
        ready = [position[p] for p in order if not waiting_on[p]]
        heapq.heapify(ready)
        emitted = 0
        while ready:
            p = order[heapq.heappop(ready)]
            self._emit(p, self.points[p])
            emitted += 1
            for q in unblocks.get(p, ()):
                waiting_on[q] -= 1
                if not waiting_on[q]:
                    heapq.heappush(ready, position[q])
        if emitted < len(order):
            raise RuntimeError("cannot order these assigns: a kernel needs both the old and the new value of a buffer")
        return self.items

    def _emit(self, point: UOp, device: str) -> None:
        if point.op is Ops.CUSTOM_KERNEL or is_custom_output(point):
            emit_custom(self, point, device)
            return
        if point.op is Ops.COPY:
            src = self.result.get(point.src[0], point.src[0])
            src_buf = buffer_of[base_buffer(src)]  # type: ignore[index]
            out = self._new_buffer(device, point.size, point.dtype)
            self.items.append(ScheduleItem(point, (buffer_of[out], src_buf), device))
            self.result[point] = buffer_view(out, point.shape)
            return
        if device.startswith("DISK:") and point.op is not Ops.ASSIGN:
            from fusegrad.runtime.ops_disk import disk_view  # DISK cannot compute: a slice of a file is a view into it

            if (view := disk_view(kernel_value(point), buffer_of)) is not None:
                self.result[point] = buffer_view(buffer_uop(view), point.shape)
                return
        region = None  # an assign into part of a buffer: the view of it that the kernel's stores follow
        in_place: Buffer | None = None  # an assign's storage when the kernel stores into it (not a copy of it)
        if point.op is Ops.ASSIGN:
            target = base_buffer(point.src[0])
            target_buf = buffer_of[target]  # type: ignore[index]
            # copy on write: the old version keeps its storage for the live graphs that still read it
            out = self._new_buffer(device, target_buf.size, target_buf.dtype) if target in self.copy_on_write else None
            if not is_contiguous_view(point.src[0]):
                region = point.src[0]
                if out is not None:  # the new version holds the old values outside the region written
                    self._emit_buffer_copy(out, target_buf, device)
            in_place = target_buf if out is None else None
            out, value = out or buffer_uop(target_buf), point.src[1]
        else:
            out, value = (
                self._new_buffer(device, point.size, point.dtype),
                point.src[0] if point.op is Ops.CONTIGUOUS else point,
            )
        if value in self.result and value is not point:
            value = self.result[value]
        params: dict[object, tuple[Buffer, UOp]] = {}
        out_param = UOp(Ops.DEFINE_GLOBAL, out.dtype, (), (0, point.size if region is None else out.arg[2]))
        output = None if in_place is None else (in_place, out_param)
        ast_value = kernel_ast_value(self, value, params, point, device, output)
        store_at = out_param if region is None else kernel_view(self, region, out_param, params, device)
        kernel_vars = self.vars.take_kernel_vars()
        if not kernel_vars and (pieces := cat_pieces(ast_value)) is not None:
            # a concatenation: one kernel per piece, each storing into its slab of the output without tests
            bufs, axis = [buf for buf, _ in params.values()], cat_axis(ast_value)
            for span, piece in pieces:
                ast, numbers = piece_kernel(store_at, ast_value, axis, span, piece)
                if SPEC:
                    check_kernel_ast(ast)
                self.items.append(ScheduleItem(ast, (buffer_of[out], *(bufs[n - 1] for n in numbers)), device))
        else:
            ast = UOp(Ops.SINK, src=(UOp(Ops.STORE, src=(store_at, ast_value)), *kernel_vars))
            if SPEC:
                check_kernel_ast(ast)
            self.items.append(ScheduleItem(ast, (buffer_of[out], *(buf for buf, _ in params.values())), device))
        self.result[point] = buffer_view(out, point.shape) if region is None else view_over(region, out)

    def _emit_buffer_copy(self, out: UOp, src: Buffer, device: str) -> None:
        """A kernel copying every element of src into out's buffer (of src's size and dtype)."""
        ast = UOp(
            Ops.SINK,
            src=(
                UOp(
                    Ops.STORE,
                    src=(
                        UOp(Ops.DEFINE_GLOBAL, out.dtype, (), (0, src.size)),
                        UOp(Ops.DEFINE_GLOBAL, src.dtype, (), (1, src.size)),
                    ),
                ),
            ),
        )
        self.items.append(ScheduleItem(ast, (buffer_of[out], src), device))

    def _new_buffer(self, device: str, size: int, dtype: DType) -> UOp:
        out = new_buffer(device, size, dtype)
        self.created.append(buffer_of[out])
        return out


# the views an assign may write through: each element of the view is one element of the buffer, so a kernel whose
# loops cover the view stores every element it writes once, at the view's index into the buffer. A pad only completes
# a strided slice's last group (setitem's views): the lowerer proves no stored element is a padded one
STORE_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP, Ops.PAD})


def is_store_view(u: UOp) -> bool:
    u = u.peel(STORE_VIEW_OPS)
    return u.op is Ops.BUFFER
