"""Turns lazy tensor graphs into an ordered list of kernels: decides what is realized into a buffer, fuses the rest.

The scheduler is the named PASSES below, run in order on one ScheduleState (DEBUG>=5 prints the state after each; under
SPEC every kernel AST is checked against uop/spec.py's kernel spec as it is emitted). The planner (planner.py) finds
the realize points and orders their kernels; kernel_ast.py builds each kernel's AST."""

from __future__ import annotations
import weakref
from dataclasses import dataclass, field
from typing import Callable, Protocol
from fusegrad.helpers import DEBUG

# the buffer table lives with the buffers (runtime/buffers.py), where the front end reads it
from fusegrad.runtime.buffers import base_buffer, buffer_of, buffer_uop
from fusegrad.schedule.items import ScheduleItem, buffer_view
from fusegrad.schedule.planner import KERNEL_DEPTH_LIMIT, Planner, reads_shifted
from fusegrad.schedule.panels import PanelTarget, pack_weight_panels
from fusegrad.schedule.split_reduce import split_long_reduces
from fusegrad.uop.multi import lower_multi
from fusegrad.uop.ops import Ops, UOp

__all__ = [
    "KERNEL_DEPTH_LIMIT",
    "Plan",
    "ScheduleItem",
    "VersionReaders",
    "base_buffer",
    "buffer_of",
    "buffer_uop",
    "create_schedule",
    "plan_schedule",
    "reads_shifted",
    "realized_value",
    "record_realized",
]


# a computed tensor-level uop -> the buffer view holding its value (UOp.realized_ref), so realized work is not redone.
# A tensor's own result is held weakly (it lives as long as the tensor holds it); an intermediate that read data is
# held as long as the graph node that computed it is alive (loss.item() after opt.step() reuses the forward pass)
def realized_value(u: UOp) -> UOp | None:
    if (ref := u.realized_ref) is None:
        return None
    return ref if isinstance(ref, UOp) else ref()


def record_realized(u: UOp, value: UOp, strong: bool = False) -> None:
    u.realized_ref = value if strong else weakref.ref(value)


def substitute_realized(roots: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp]]:
    """Replace every already-realized subgraph below the roots by its buffer view. A root itself is computed again:
    its tensor gets a buffer of its own, so an assign into it can never change another tensor. Also returns the
    map from each visited node to its replacement."""
    memo: dict[UOp, UOp] = {}
    root_set = set(roots)
    for u in UOp(Ops.SINK, src=tuple(roots)).toposort(gate=lambda x: x in root_set or realized_value(x) is None):
        if u not in root_set and (r := realized_value(u)) is not None:
            memo[u] = r
        else:
            new_src = tuple(memo[s] for s in u.src)
            memo[u] = u if new_src == u.src else u.replace(src=new_src)
    return [memo[r] for r in roots], memo


class VersionReaders(Protocol):
    """Which assign targets (BUFFER versions) a live graph outside this realize still reads, when the schedule keeps
    the values of `kept`: those assigns copy on write. The engine answers it (engine/copy_on_write.py)."""

    # every node of the realize's graph, sources first, when the reader walked it (None otherwise): the schedule
    # cache numbers the graph in this order instead of walking it again
    order: list[UOp] | None

    def shared(self, kept: set[UOp]) -> set[UOp]: ...


@dataclass
class Plan:
    """A schedule with what its planner decided: `kept` maps the caller's nodes whose value an intermediate buffer
    keeps to that point, `planner` holds the buffers and constants it made."""

    items: list[ScheduleItem]
    results: list[UOp]
    inner: dict[UOp, UOp]
    kept: dict[UOp, UOp]
    planner: Planner


def create_schedule(
    roots: list[UOp], devices: list, readers: VersionReaders | None = None
) -> tuple[list[ScheduleItem], list[UOp], dict[UOp, UOp]]:
    """Schedule the kernels that compute `roots`; returns the items, each root's resulting buffer view, and the
    buffer views of intermediate values worth keeping (they read data, so recomputing them would cost a kernel).
    An assign into a BUFFER version that `readers` says is still read elsewhere writes a fresh buffer instead."""
    plan = plan_schedule(roots, devices, readers)
    return plan.items, plan.results, plan.inner


@dataclass
class ScheduleState:
    """What the passes read and write: the roots as each pass leaves them, and the planner's decisions."""

    roots: list[UOp]
    devices: list
    readers: VersionReaders | None
    graph: list[UOp] = field(default_factory=list)  # the roots as the last graph pass left them
    substituted: dict[UOp, UOp] = field(default_factory=dict)  # each caller's node -> its node after substitution
    unchanged_by_multi: bool = True  # lower_multi kept every root (its nodes are the caller's, substituted)
    replaced: dict[UOp, UOp] = field(default_factory=dict)  # split_long_reduces' node -> its replacement
    planner: Planner | None = None
    kept: set[UOp] = field(default_factory=set)  # points worth keeping after the schedule runs
    kept_originals: dict[UOp, UOp] = field(default_factory=dict)  # the caller's nodes a kept point computes
    items: list[ScheduleItem] = field(default_factory=list)


def _substitute_realized(s: ScheduleState) -> None:
    s.graph, s.substituted = substitute_realized(s.roots)


def _lower_multi(s: ScheduleState) -> None:
    lowered = lower_multi(s.graph, s.devices)
    s.unchanged_by_multi = all(a is b for a, b in zip(lowered, s.graph))
    s.graph = lowered


def _pack_weight_panels(s: ScheduleState) -> None:
    s.graph, s.replaced = pack_weight_panels(s.graph, panel_target(s.devices))


def _split_long_reduces(s: ScheduleState) -> None:
    s.graph, split = split_long_reduces(s.graph)
    # the caller's nodes -> their node after both passes (the split's keys are the panel pass's results)
    s.replaced = {u: split.get(v, v) for u, v in s.replaced.items()} | split


def panel_target(devices: list) -> PanelTarget | None:
    """The panel pass's view of the target: one device whose renderer's register tiles gain from weight panels."""
    if not devices or any(d != devices[0] for d in devices) or isinstance(devices[0], tuple):
        return None
    from fusegrad.runtime.device import Device  # the device registry, loaded by whoever realizes

    device = Device[devices[0]] if isinstance(devices[0], str) else devices[0]
    caps = getattr(getattr(device, "renderer", None), "capabilities", None)
    return PanelTarget(caps.vector_bytes) if caps is not None and caps.weight_panels else None


def _find_realize_points(s: ScheduleState) -> None:
    # a multi-device root is realized shard by shard, each on its own device
    flat = [
        pair for u, d in zip(s.graph, s.devices) for pair in (zip(u.src, u.arg[1]) if u.op is Ops.MULTI else [(u, d)])
    ]
    s.planner = Planner([u for u, _ in flat])
    s.planner.find_points([d for _, d in flat])
    root_set = {u for u, _ in flat}
    s.kept = {
        p for p in s.planner.points if p not in root_set and p.op not in (Ops.ASSIGN, Ops.CONTIGUOUS, Ops.CUSTOM_KERNEL)
    }


def _kept_point(s: ScheduleState, n: UOp) -> UOp | None:
    """The kept point whose buffer holds n's value: n after the graph passes, or the point under reshapes a pass put
    over it (the panels' (..., n/panel, panel) sum viewed as a matmul's (..., n)); a reshape keeps memory order."""
    p = s.replaced.get(n, n)
    while p not in s.kept and p.op is Ops.RESHAPE:
        p = p.src[0]
    return p if p in s.kept else None


def _copy_on_write(s: ScheduleState) -> None:
    # the caller's nodes whose value a kept point computes (substitution rebuilt the nodes above realized values)
    if s.unchanged_by_multi:
        s.kept_originals = {u: p for u, n in s.substituted.items() if (p := _kept_point(s, n)) is not None}
    if s.readers is not None:
        s.planner.copy_on_write = s.readers.shared(set(s.kept_originals))  # type: ignore[union-attr]


def _emit_kernels(s: ScheduleState) -> None:
    s.items = s.planner.plan()  # type: ignore[union-attr]


def _seen_as(view: UOp, shape: tuple) -> UOp | None:
    """A kept point's buffer view seen as one of the caller's nodes above it (a reshape of it), or None where the
    view is not a plain buffer's (a symbolic one)."""
    if view.shape == shape:
        return view
    base = view.src[0] if view.op is Ops.RESHAPE else view
    return buffer_view(base, shape) if base.op is Ops.BUFFER else None


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[ScheduleState], None]


PASSES: tuple[Pass, ...] = (
    Pass("substitute_realized", _substitute_realized),  # realized subgraphs become their buffers
    Pass("lower_multi", _lower_multi),  # multi-device tensors become one graph per shard (uop/multi.py)
    Pass("pack_weight_panels", _pack_weight_panels),  # a big matmul reads its weight in panels (panels.py)
    Pass("split_long_reduces", _split_long_reduces),  # a long reduce becomes two kernels (split_reduce.py)
    Pass("find_realize_points", _find_realize_points),  # what is realized into a buffer; the rest fuses
    Pass("copy_on_write", _copy_on_write),  # an assign into a version still read elsewhere writes a fresh buffer
    Pass("emit_kernels", _emit_kernels),  # one ScheduleItem per point, in dependency order
)


def _show(p: Pass, s: ScheduleState) -> None:
    print(f"--- schedule after {p.name}")
    if p.name == "emit_kernels":
        for i, item in enumerate(s.items):
            print(f"kernel {i} on {item.device}, {len(item.buffers)} buffer(s):\n{item.ast}")
    elif s.planner is not None:
        print(f"{len(s.planner.points)} realize point(s): {[p.op.name for p in s.planner.points]}")
    else:
        print(UOp(Ops.SINK, src=tuple(s.graph)))


def plan_schedule(roots: list[UOp], devices: list, readers: VersionReaders | None = None) -> Plan:
    """create_schedule, keeping the planner's decisions: runs PASSES in order."""
    s = ScheduleState(roots, devices, readers)
    for p in PASSES:
        p.run(s)
        if DEBUG >= 5:
            _show(p, s)
    planner = s.planner
    assert planner is not None

    def result(u: UOp) -> UOp:
        return planner.result.get(u, u)

    results = [u.replace(src=tuple(result(x) for x in u.src)) if u.op is Ops.MULTI else result(u) for u in s.graph]
    inner = {p: planner.result[p] for p in s.kept if any(planner.inputs[p])}
    # recorded for the caller's own nodes too: its graphs (a grad, a lazy loss) then read the kept values
    for u, p in s.kept_originals.items():
        if any(planner.inputs[p]) and (view := _seen_as(planner.result[p], u.shape)) is not None:
            inner[u] = view
    if DEBUG >= 3:
        print(f"scheduled {len(s.items)} kernel(s) for {len(roots)} tensor(s)")
    return Plan(s.items, results, inner, s.kept_originals, planner)
