"""Turning a TinyJit capture into a replayable step: the recorder realize.py reports launches to, state tensors whose
assign copied on write, pruning, and the memory plan of the step's intermediate buffers."""

from __future__ import annotations
import weakref
from typing import Any
from fusegrad.lazy_numpy import np
from fusegrad.engine.jit_inputs import JitError, is_constant, rebase_view, tensor_buffers
from fusegrad.engine.jit_program import CapturedJit, IndexCheckRunner, Launch, run_launch
from fusegrad.engine.memory_planner import plan_buffers
from fusegrad.runtime.device import Buffer, Device, HostAllocator
from fusegrad.runtime.buffers import buffer_of, buffer_uop
from fusegrad.schedule import reads_shifted
from fusegrad.tensor import Tensor, pending_assign_tensors
from fusegrad.uop.ops import Ops, UOp, UOpMeta


class Recorder:
    """Collects every launch of a capture (realize.py calls `record`), and refuses reads of data."""

    def __init__(self):
        self.launches: list[tuple[Any, tuple[Buffer, ...], UOp]] = []
        self.rng_start = Tensor._rng_calls
        self.rng_base: dict[str, Tensor] = {}  # device -> uint32 (1,) buffer holding rng_start, advanced per replay
        # the capture's input buffers: each replay swaps in its call's, so a host call must not bind to their memory
        self.inputs: set[Buffer] = set()

    def rng_stream(self, device: str, call: int) -> Tensor:
        """The random stream number of rand call `call` as a kernel input: base buffer + offset in this step."""
        if device not in self.rng_base:
            self.rng_base[device] = Tensor(np.array([self.rng_start], np.uint32), device=device)
        return self.rng_base[device] + (call - self.rng_start)

    def record(self, item: Any, runner: Any) -> None:
        self.launches.append((runner, tuple(item.buffers), item.ast))

    def record_check(self, check: Any, buf: Buffer) -> None:
        """An index check (CHECK_OOB=1) the realize made after its bound kernels: replays make it at the same place."""
        self.launches.append((IndexCheckRunner(check), (buf,), None))

    def record_call(self, runner: Any, buffers: tuple[Buffer, ...]) -> None:
        """A host call on buffers (a collective: buffers[0] its output) that replays run at the same place."""
        self.launches.append((runner, tuple(buffers), None))

    def refuse_read(self, t: Tensor) -> None:
        raise JitError(
            f"reading data (.numpy(), .item(), .tolist(), .data()) of a tensor of shape {t.shape} inside a TinyJit "
            "capture: a replay cannot repeat it; return the tensor and read it after the call"
        )


def live_tensors() -> list[Tensor]:
    """Every live Tensor, found through the nodes they hold: each registers on its node (UOp.holders), and every live
    node is in the hash-consing table. That table is far smaller than the garbage collector's list of all objects (a
    test worker that collected the whole suite holds ~860k objects: 1 s per capture), and no tensor pays to register."""
    out: dict[int, Tensor] = {}
    for ref in list(UOpMeta.cache.values()):
        if (u := ref()) is None or u.holders is None:
            continue
        for h in u.holder_refs():
            if (t := h()) is not None and t._uop is u:
                out[id(t)] = t
    return list(out.values())


def live_tensor_buffers() -> dict[int, tuple[weakref.ref[Tensor], list[Buffer]]]:
    """id(tensor) -> (weak reference to the tensor, its buffers) for every live realized tensor."""
    out = {}
    for t in live_tensors():
        if (bufs := tensor_buffers(t.uop)) is not None:
            out[id(t)] = (weakref.ref(t), bufs)
    return out


def live_tensor_nodes() -> dict[int, tuple[weakref.ref[Tensor], UOp]]:
    """id(tensor) -> (weak reference to the tensor, its node) for every live tensor."""
    return {id(t): (weakref.ref(t), t.uop) for t in live_tensors()}


def lazy_leftovers(before: dict[int, tuple[weakref.ref[Tensor], UOp]]) -> list[Tensor]:
    """Live tensors the call left unrealized (new ones, or ones it gave a new graph, e.g. a `.grad`) whose graph reads
    a buffer: replays would leave them computing from the capture's buffers, so the capture realizes them."""
    out = []
    for t in live_tensors():
        if (prev := before.get(id(t))) is not None and prev[0]() is t and prev[1] is t.uop:
            continue
        if tensor_buffers(t.uop) is None and not is_constant(t.uop):
            out.append(t)
    return out


def realize_earlier_readers(before: dict[int, tuple[weakref.ref[Tensor], UOp]], launches: list[Any]) -> None:
    """Realize (outside the capture) the lazy tensors made before the call that read a buffer the step uses: a state
    buffer they read kept its old value by a copy on write, which keep_moved_state is about to give the new one."""
    touched = {b for _, bufs, _ in launches for b in bufs}
    todo = []
    for ref, u in before.values():
        if (t := ref()) is None or t.uop is not u or tensor_buffers(u) is not None or is_constant(u):
            continue
        if any(x.op is Ops.BUFFER and buffer_of.get(x) in touched for x in u.toposort()):
            todo.append(t)
    Tensor.realize_all(todo)


def drop_input_grads(inputs: list[Tensor], leftovers: list[Tensor]) -> list[Tensor]:
    """The leftovers less the lazy `.grad`s of inputs that did not ask for one (requires_grad not True), which become
    None: a replay brings new inputs and fills no `.grad` on them, and computing an input's gradient in every replay
    would cost as much as a matmul of the backward pass."""
    dropped = set()
    for t in inputs:
        if t.grad is not None and t.requires_grad is not True and any(t.grad is x for x in leftovers):
            dropped.add(id(t.grad))
            t.grad = None
    return [t for t in leftovers if id(t) not in dropped]


def returned_tensors(ret: Any, where: str = "return value") -> list[Tensor]:
    if ret is None and where == "return value":
        return []
    if isinstance(ret, Tensor):
        return [ret]
    if isinstance(ret, (list, tuple)):
        return [t for i, x in enumerate(ret) for t in returned_tensors(x, f"{where}[{i}]")]
    if isinstance(ret, dict):
        return [t for k, x in ret.items() for t in returned_tensors(x, f"{where}[{k!r}]")]
    raise JitError(f"a jitted function returns None, Tensors or lists/tuples/dicts of them; {where} is {type(ret)}")


def realize_effects(returned: list[Tensor]) -> None:
    """Realize the returned tensors with every assign still pending: a step's effects happen within the step."""
    Tensor.realize_all(returned + pending_assign_tensors())


Snapshot = dict[int, tuple[weakref.ref[Tensor], list[Buffer]]]


def keep_moved_state(before: Snapshot, launches: list[Launch]) -> tuple[list[Launch], set[int]]:
    """A tensor whose assign copied on write during the capture (a live graph still read its old value) now lives in
    a new buffer, but the captured kernels read the old one: point the tensor back at its old buffer and either let
    the assign write there (when that is safe) or copy the new value there at the end of every replay (and now), so
    the next replay reads the updated state. Returns the copies to append, and the ids of the buffers live tensors
    view from then on."""
    read = {b for la in launches for b in la.buffers[1:]}
    written = {la.buffers[0] for la in launches}
    copies: dict[Buffer, Buffer] = {}  # new buffer -> old buffer
    for ref, old_bufs in before.values():
        if (t := ref()) is None or (now := tensor_buffers(t.uop)) is None or len(now) != len(old_bufs):
            continue
        moved = {new: old for new, old in zip(now, old_bufs) if new is not old and old in read and new in written}
        if not moved:
            continue
        base: dict[UOp, UOp] = {}
        for u in t.uop.toposort():
            if u.op is Ops.BUFFER and (old := moved.get(buffer_of[u])) is not None:
                base[u] = buffer_uop(old)
        t.uop = rebase_view(t.uop, base)
        copies.update(moved)
    held = {id(b) for _, bufs in live_tensor_buffers().values() for b in bufs}
    for new, old in list(copies.items()):
        if id(new) not in held and write_in_place(launches, new, old):
            del copies[new]
    extra = [Launch(None, [old, new]) for new, old in copies.items()]
    for la in extra:
        run_launch(None, la.buffers)
    return extra, held


def write_in_place(launches: list[Launch], new: Buffer, old: Buffer) -> bool:
    """Make the kernel that writes `new` write `old` instead, when no launch after it reads the old value and it reads
    `old` only at the element it writes; then `old` holds the new value from there on and `new` is unused."""
    writers = [i for i, la in enumerate(launches) if new in la.buffers]
    w = writers[0]
    la = launches[w]
    if la.runner is None or la.ast is None or la.buffers[0] is not new or new in la.buffers[1:]:
        return False
    if any(old in later.buffers for later in launches[w + 1 :] if new not in later.buffers):
        return False  # a later launch reads the old value (one reading the new value reads `old` after the rename)
    if any(old in later.buffers[1:] and new in later.buffers for later in launches[w + 1 :]):
        return False
    if any(p and b is old and not reads_aligned(la.ast, p) for p, b in enumerate(la.buffers)):
        return False
    for i in writers:
        launches[i].buffers = [old if b is new else b for b in launches[i].buffers]
    la.buffers[0] = old
    run_launch(None, [old, new])  # the capture's new value, where the next replay reads it
    return True


def reads_aligned(ast: UOp, param: int) -> bool:
    """Every read of kernel parameter `param` is of the element the kernel stores (only reshapes and elementwise ops
    between the load and the store): the kernel may write that buffer in place."""
    return not reads_shifted(
        ast.src[0].src[1],
        lambda u: u.op is Ops.DEFINE_GLOBAL and u.arg[0] == param,
        lambda u: u.op is Ops.DEFINE_GLOBAL,
    )


def prune_launches(launches: list[Launch], inputs: set[Buffer]) -> tuple[list[Launch], set[Buffer]]:
    """Keep the launches that depend on an input; the outputs of dropped ones that kept ones read stay as computed."""
    tainted = set(inputs)
    kept, dropped_outputs = [], set()
    for la in launches:
        if any(b in tainted for b in la.buffers):
            kept.append(la)
            tainted.add(la.buffers[0])
        else:
            dropped_outputs.add(la.buffers[0])
    read = {b for la in kept for b in la.buffers}
    return kept, dropped_outputs & read


def plan_memory(cap: CapturedJit, keep: set[Buffer], enabled: bool) -> None:
    """Give the step's intermediates (buffers first written by it, no input, nothing in `keep`: live tensors' and
    pruned kernels' outputs) shared memory."""
    inputs = set(cap.input_buffers)
    first_use: dict[Buffer, int] = {}
    last_use: dict[Buffer, int] = {}
    candidates: dict[Buffer, bool] = {}
    for i, la in enumerate(cap.launches):
        for p, b in enumerate(la.buffers):
            if b not in first_use:
                first_use[b] = i
                # written first (not read by the same launch): whatever it held before the step is never read
                candidates[b] = p == 0 and b not in la.buffers[1:]
            last_use[b] = i
    plan = [
        b
        for b, ok in candidates.items()
        if ok
        and b not in inputs
        and b not in keep
        and type(b) is Buffer
        and isinstance(Device[b.device].allocator, HostAllocator)
    ]
    cap.planned_from, cap.intermediates = sum(b.nbytes for b in plan), plan
    if not enabled or not plan:
        cap.planned_to = cap.planned_from
        return
    replacement, arenas, placement = plan_buffers(plan, [(first_use[b], last_use[b]) for b in plan])
    if sum(a.nbytes for a in arenas) >= cap.planned_from:  # nothing shared: the buffers keep their own memory
        cap.planned_to = cap.planned_from
        return
    cap.arenas, cap.placement, cap.planned_to = arenas, placement, sum(a.nbytes for a in arenas)
    cap.intermediates = [replacement[b] for b in plan]
    for la in cap.launches:
        la.buffers = [replacement.get(b, b) for b in la.buffers]


__all__ = [
    "Recorder",
    "drop_input_grads",
    "lazy_leftovers",
    "live_tensor_nodes",
    "keep_moved_state",
    "prune_launches",
    "plan_memory",
    "realize_effects",
    "returned_tensors",
]
