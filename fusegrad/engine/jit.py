"""TinyJit (API.md §6.1): the first call runs a function, the second records the kernels it launches, later calls
replay them on the new inputs' buffers with no Python graph work.

A replay is a `CapturedJit`: the recorded launches with their buffers, intermediate buffers re-planned to share memory
(`memory_planner.py`), consecutive CPU kernels batched into one C call each (`runtime/cpu_graph.py`). Inputs are checked
on every call against the capture: a mismatch raises JitError rather than replaying on the wrong layout."""

from __future__ import annotations
import functools
import gc
import pickle
import time
import weakref
import numpy as np
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable
from fusegrad.helpers import DEBUG, JIT, JIT_BATCH_SIZE, JITBEAM, NO_MEMORY_PLANNER, Context, GlobalCounters
from fusegrad.engine.memory_planner import plan_buffers
from fusegrad.engine.realize import capturing, realize_lock
from fusegrad.runtime.device import Buffer, Device, HostAllocator
from fusegrad.schedule import buffer_of, buffer_uop
from fusegrad.schedule.variables import var_buffer, var_params
import fusegrad.tensor as tensor_module
from fusegrad.tensor import Tensor, _pending_assigns
from fusegrad.uop.ops import GroupOp, Ops, UOp


class JitError(Exception):
    """A TinyJit call that cannot be captured or replayed as the rules of API.md §6.1 require."""


# ---------------------------------------------------------------------------------------------- inputs


def _split_args(
    args: tuple, kwargs: dict, var_vals: dict[UOp, int]
) -> tuple[list[tuple[str, Tensor]], list[tuple[str, Any]]]:
    """(name, tensor) of every input (positional, keyword, and one level inside list/tuple/dict) and (name, value) of
    every other argument; a bound Variable (or an expression of some) is compared unbound, its value put in var_vals."""
    tensors: list[tuple[str, Tensor]] = []
    others: list[tuple[str, Any]] = []

    def visit(name: str, v: Any, top: bool) -> None:
        if isinstance(v, Tensor):
            tensors.append((name, v))
        elif top and isinstance(v, (list, tuple)):
            others.append((name, (type(v), len(v))))
            for i, x in enumerate(v):
                visit(f"{name}[{i}]", x, False)
        elif top and isinstance(v, dict):
            others.append((name, (dict, tuple(v))))
            for k, x in v.items():
                visit(f"{name}[{k!r}]", x, False)
        else:
            others.append((name, _unbind(v, var_vals) if isinstance(v, UOp) else v))

    for i, a in enumerate(args):
        visit(f"argument {i}", a, True)
    for k, a in kwargs.items():
        visit(f"argument {k!r}", a, True)
    return tensors, others


def _layout(u: UOp, bases: list[UOp], var_vals: dict[UOp, int]) -> Hashable | None:
    """What a replay must find again in an input: its views down to each buffer (device, size, dtype), or None when
    the tensor is not a view of realized buffers yet. Appends the BUFFER nodes to `bases`; symbolic sizes are kept
    unbound, their values go to `var_vals`."""
    if u.op is Ops.BUFFER:
        buf = buffer_of[u]
        bases.append(u)
        return (buf.device, buf.size, u.dtype)
    if u.op in GroupOp.Movement:
        inner = _layout(u.src[0], bases, var_vals)
        return None if inner is None else (u.op, _unbind(u.arg, var_vals), inner)
    if u.op is Ops.MULTI and all(_whole(s) for s in u.src):
        shards = tuple(_layout(s, bases, var_vals) for s in u.src)
        return (Ops.MULTI, u.arg, shards)
    return None


def _unbind(x: Any, var_vals: dict[UOp, int]) -> Any:
    """x (a size, a tuple of sizes or pairs) with each bound Variable replaced by the Variable; values to var_vals."""
    if isinstance(x, tuple):
        return tuple(_unbind(y, var_vals) for y in x) if any(isinstance(y, (tuple, UOp)) for y in x) else x
    if not isinstance(x, UOp):
        return x
    if x.op is Ops.BIND:
        var, value = x.unbind()
        if var_vals.setdefault(var, value) != value:
            raise JitError(f"Variable {var.arg[0]!r} is bound to both {var_vals[var]} and {value} in one call")
        return var
    src = tuple(_unbind(s, var_vals) for s in x.src)
    return x if src == x.src else x.replace(src=src)


def _rebind(x: Any, var_vals: dict[UOp, int]) -> Any:
    """x with each bound Variable bound to its value in var_vals instead."""
    if isinstance(x, tuple):
        return tuple(_rebind(y, var_vals) for y in x) if any(isinstance(y, (tuple, UOp)) for y in x) else x
    if not isinstance(x, UOp):
        return x
    if x.op is Ops.BIND:
        var = x.src[0]
        return var.bind(var_vals[var]) if var in var_vals and var_vals[var] != x.src[1].arg else x
    src = tuple(_rebind(s, var_vals) for s in x.src)
    return x if src == x.src else x.replace(src=src)


def _whole(u: UOp) -> bool:
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u.op is Ops.BUFFER


def _is_constant(u: UOp) -> bool:
    """u reads no buffer and nothing in it forces one: a constant the JIT could only bake in."""
    return not any(x.op in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN) for x in u.toposort())


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False  # no plain equality (numpy arrays): only the same object is the same argument


@dataclass
class InputLayout:
    names: list[str]
    layouts: list[Hashable]
    shapes: list[tuple]
    dtypes: list[Any]
    devices: list[Any]
    others: list[tuple[str, Any]]


def _prepare_inputs(
    tensors: list[tuple[str, Tensor]], var_vals: dict[UOp, int] | None = None
) -> tuple[list[Hashable], list[list[UOp]]]:
    """Realize the inputs (refusing constants) and return each one's layout and BUFFER nodes; one buffer twice is an
    error, since a replay could not tell the two apart."""
    layouts: list[Hashable] = []
    bases: list[list[UOp]] = []
    pending = []
    var_vals = {} if var_vals is None else var_vals
    for name, t in tensors:
        b: list[UOp] = []
        if (lay := _layout(t.uop, b, var_vals)) is None:
            if _is_constant(t.uop):
                raise JitError(
                    f"{name} is a constant tensor (shape {t.shape}), not a buffer a replay can swap: "
                    "pass t.contiguous() or t.clone() instead"
                )
            pending.append(t)
        layouts.append(lay)
        bases.append(b)
    if pending:
        Tensor.realize_all(pending)
        for i, (name, t) in enumerate(tensors):
            if layouts[i] is None:
                bases[i] = []
                layouts[i] = _layout(t.uop, bases[i], var_vals)
                if layouts[i] is None:
                    raise JitError(f"{name} did not realize to a buffer (its graph ends in {t.uop.op})")
    seen: dict[Buffer, str] = {}
    for (name, _), b in zip(tensors, bases):
        for u in b:
            if (other := seen.setdefault(buffer_of[u], name)) != name:
                raise JitError(f"{name} and {other} are the same buffer; a jitted function needs distinct inputs")
    return layouts, bases


# ---------------------------------------------------------------------------------------------- capture


class _Recorder:
    """Collects every launch of a capture (realize.py calls `record`), and refuses reads of data."""

    def __init__(self):
        self.launches: list[tuple[Any, tuple[Buffer, ...], UOp]] = []
        self.rng_start = Tensor._rng_calls
        self.rng_base: dict[str, Tensor] = {}  # device -> uint32 (1,) buffer holding rng_start, advanced per replay

    def rng_stream(self, device: str, call: int) -> Tensor:
        """The random stream number of rand call `call` as a kernel input: base buffer + offset in this step."""
        if device not in self.rng_base:
            self.rng_base[device] = Tensor(np.array([self.rng_start], np.uint32), device=device)
        return self.rng_base[device] + (call - self.rng_start)

    def record(self, item: Any, runner: Any) -> None:
        self.launches.append((runner, tuple(item.buffers), item.ast))

    def refuse_read(self, t: Tensor) -> None:
        raise JitError(
            f"reading data (.numpy(), .item(), .tolist(), .data()) of a tensor of shape {t.shape} inside a TinyJit "
            "capture: a replay cannot repeat it; return the tensor and read it after the call"
        )


def _tensor_buffers(u: UOp) -> list[Buffer] | None:
    """The buffers a realized tensor's value is a view of, or None for an unrealized one."""
    b: list[UOp] = []
    return [buffer_of[x] for x in b] if _layout(u, b, {}) is not None else None


def _rebase(u: UOp, new_base: dict[UOp, UOp], var_vals: dict[UOp, int] | None = None) -> UOp:
    """u with its BUFFER nodes replaced by those `new_base` maps them to (the view ops above them kept), and its
    symbolic sizes bound to the values in var_vals."""
    if u.op is Ops.BUFFER:
        return new_base.get(u, u)
    src = tuple(_rebase(s, new_base, var_vals) for s in u.src)
    arg = _rebind(u.arg, var_vals) if var_vals and u.op in GroupOp.Movement else u.arg
    return u if src == u.src and arg is u.arg else u.replace(src=src, arg=arg)


@dataclass
class Launch:
    """One recorded launch: a compiled runner (None: a copy of buffers[1] into buffers[0]) and its buffers."""

    runner: Any
    buffers: list[Buffer]
    ast: UOp | None = None  # what the runner was compiled from (a pickled capture compiles it again)


@dataclass
class _PythonStep:
    launch: Launch
    input_slots: list[tuple[int, int]]  # (position in buffers, input buffer index)


@dataclass
class _GraphStep:
    graph: Any  # runtime.cpu_graph.CPUGraph
    input_slots: list[tuple[list[int], int]]  # (table cells, input buffer index)
    launches: list[Launch]


@dataclass
class CapturedJit:
    """A replayable step: launches in order over fixed buffers, except the input buffers, swapped on each call."""

    launches: list[Launch]
    input_buffers: list[Buffer]  # at capture, in input order (each input's buffers in layout order)
    layout: InputLayout
    returns: Any  # the return value's structure, tensors as (uop, device) leaves
    input_base_uops: list[UOp]  # BUFFER nodes of the capture's inputs (a returned view of an input is rebased)
    var_vals: dict[UOp, int] = field(default_factory=dict)  # bound Variable values of the capture
    planned_from: int = 0
    planned_to: int = 0
    arenas: list[Buffer] = field(default_factory=list)  # memory of the planned buffers
    placement: dict[Buffer, tuple[int, int]] = field(default_factory=dict)  # planned buffer -> (arena, offset)
    steps: list[Any] = field(default_factory=list)
    var_slots: list[tuple[Launch, int, UOp, Any, int | None]] = field(default_factory=list)
    _last_vals: dict[UOp, int] = field(default_factory=dict)
    returns_vary: bool = True  # some returned tensor views an input or has a symbolic shape
    rng_buffers: list[Buffer] = field(default_factory=list)  # random stream bases read by the captured kernels
    rng_calls: int = 0  # random draws per step: each replay advances the bases (and Tensor's counter) by this
    internal: set[Buffer] = field(default_factory=set)
    _last: list[Buffer | None] = field(default_factory=list)

    def build_steps(self, use_graphs: bool) -> None:
        from fusegrad.runtime.cpu_graph import CPUGraph, GraphEntry

        index = {b: i for i, b in enumerate(self.input_buffers)}
        self.internal = {b for la in self.launches for b in la.buffers if b not in index}
        self.steps, batch = [], []

        def flush() -> None:
            if batch:
                entries = [GraphEntry(la.runner.program if la.runner else None, tuple(la.buffers)) for la in batch]
                graph = CPUGraph(entries)
                slots = [(graph.slots[b], i) for b, i in index.items() if b in graph.slots]
                self.steps.append(_GraphStep(graph, slots, list(batch)))
                batch.clear()

        for la in self.launches:
            if use_graphs and _graphable(la):
                batch.append(la)
                if len(batch) >= max(int(JIT_BATCH_SIZE.value), 1):
                    flush()
                continue
            flush()
            self.steps.append(_PythonStep(la, [(p, index[b]) for p, b in enumerate(la.buffers) if b in index]))
        flush()
        self._last = list(self.input_buffers)
        leaves: list[UOp] = []
        _thaw(self.returns, _is_frozen_tensor, lambda f: leaves.append(f[0]))
        inputs = set(self.input_base_uops)
        self.returns_vary = any(
            any(isinstance(d, UOp) for d in u.shape) or any(x in inputs for x in u.toposort()) for u in leaves
        )
        # where each kernel reads a Variable's value: a replay with another value swaps in that value's buffer
        place = {
            id(la): (s.graph, i) for s in self.steps if isinstance(s, _GraphStep) for i, la in enumerate(s.launches)
        }
        self.var_slots = []
        for la in self.launches:
            for pos, var in (var_params(la.ast) if la.ast is not None and la.runner is not None else {}).items():
                graph, entry = place.get(id(la), (None, 0))
                self.var_slots.append((la, pos, var, graph, None if graph is None else graph.arg_off[entry] + pos))
        self._last_vals = dict(self.var_vals)

    def __reduce__(self) -> tuple:
        from fusegrad.engine.jit_pickle import captured_state

        return _restore_captured, (captured_state(self), any(isinstance(s, _GraphStep) for s in self.steps))

    @property
    def batches(self) -> int:
        return sum(isinstance(s, _GraphStep) for s in self.steps)

    def __call__(self, inputs: list[Buffer], var_vals: dict[UOp, int] | None = None) -> None:
        """Run every launch with `inputs` in place of the capture's input buffers and the bound Variables' values
        `var_vals` (API.md §6.2) in place of the capture's (each is a one-element buffer a kernel reads)."""
        if var_vals and var_vals != self._last_vals:
            for la, pos, var, graph, cell in self.var_slots:
                if var in var_vals:
                    la.buffers[pos] = var_buffer(la.runner.device, var, var_vals[var])
                    if graph is not None:
                        graph.set_address([cell], la.buffers[pos].address())
            self._last_vals = {**self._last_vals, **var_vals}
        if self.rng_calls:
            Tensor._rng_calls += self.rng_calls
            for b in self.rng_buffers:
                b.host_view()[0] += np.uint32(self.rng_calls)
        if inputs != self._last:  # Buffers compare by identity
            for i, (b, last) in enumerate(zip(inputs, self._last)):
                if b is not last and b in self.internal:
                    inputs[i] = _fresh_copy(b)  # a buffer this step writes, e.g. an earlier return: read a copy
            for step in self.steps:
                if isinstance(step, _GraphStep):
                    for cells, i in step.input_slots:
                        if inputs[i] is not self._last[i]:
                            step.graph.set_address(cells, inputs[i].address())
            self._last = inputs
        for step in self.steps:
            if isinstance(step, _GraphStep):
                step.graph()
            else:
                bufs = list(step.launch.buffers)
                for p, i in step.input_slots:
                    bufs[p] = inputs[i]
                _run_one(step.launch.runner, bufs)
        GlobalCounters.kernel_count += len(self.launches)


def _restore_captured(state: dict, use_graphs: bool) -> CapturedJit:
    from fusegrad.engine.jit_pickle import captured_from_state

    return captured_from_state(state, CapturedJit, Launch, use_graphs)


def _graphable(la: Launch) -> bool:
    from fusegrad.runtime.cpu_graph import batchable

    if la.runner is None:
        return all(type(b) is Buffer and isinstance(Device[b.device].allocator, HostAllocator) for b in la.buffers)
    return batchable(la.runner.program, len(la.buffers))


def _run_one(runner: Any, buffers: list[Buffer]) -> None:
    if runner is None:
        buffers[0].host_view()[:] = buffers[1].host_view()
    else:
        for b in buffers:
            b.ensure_allocated()
        runner(buffers)


def _fresh_copy(buf: Buffer) -> Buffer:
    out = Buffer(buf.device, buf.size, buf.dtype).ensure_allocated()
    out.host_view()[:] = buf.host_view()
    return out


def _live_tensors() -> list[Tensor]:
    """Every live Tensor: from the tensor module's registry where it keeps one, else from the garbage collector's list
    of objects (once per capture, so its cost does not matter)."""
    registry = getattr(tensor_module, "_all_tensors", None)
    return list(registry) if registry is not None else [o for o in gc.get_objects() if issubclass(type(o), Tensor)]


def _live_tensor_buffers() -> dict[int, tuple[weakref.ref[Tensor], list[Buffer]]]:
    """id(tensor) -> (weak reference to the tensor, its buffers) for every live realized tensor."""
    out = {}
    for t in _live_tensors():
        if (bufs := _tensor_buffers(t.uop)) is not None:
            out[id(t)] = (weakref.ref(t), bufs)
    return out


def _returned_tensors(ret: Any, where: str = "return value") -> list[Tensor]:
    if ret is None and where == "return value":
        return []
    if isinstance(ret, Tensor):
        return [ret]
    if isinstance(ret, (list, tuple)):
        return [t for i, x in enumerate(ret) for t in _returned_tensors(x, f"{where}[{i}]")]
    if isinstance(ret, dict):
        return [t for k, x in ret.items() for t in _returned_tensors(x, f"{where}[{k!r}]")]
    raise JitError(f"a jitted function returns None, Tensors or lists/tuples/dicts of them; {where} is {type(ret)}")


def _realize_effects(returned: list[Tensor]) -> None:
    """Realize the returned tensors with every assign still pending: a step's effects happen within the step."""
    Tensor.realize_all(returned + [t for t in list(_pending_assigns.values()) if t.uop.op is Ops.ASSIGN])


def _freeze(ret: Any) -> Any:
    """The return structure with each tensor as its (uop, device), to rebuild fresh Tensors on each replay."""
    if isinstance(ret, Tensor):
        return (ret.uop, ret.device)
    if isinstance(ret, list):
        return [_freeze(x) for x in ret]
    if isinstance(ret, tuple):
        return tuple(_freeze(x) for x in ret) if type(ret) is tuple else type(ret)(*(_freeze(x) for x in ret))
    if isinstance(ret, dict):
        return {k: _freeze(x) for k, x in ret.items()}
    return ret


def _thaw(frozen: Any, is_leaf: Callable[[Any], bool], make: Callable[[Any], Tensor]) -> Any:
    if is_leaf(frozen):
        return make(frozen)
    if isinstance(frozen, list):
        return [_thaw(x, is_leaf, make) for x in frozen]
    if isinstance(frozen, tuple):
        items = (_thaw(x, is_leaf, make) for x in frozen)
        return tuple(items) if type(frozen) is tuple else type(frozen)(*items)
    if isinstance(frozen, dict):
        return {k: _thaw(x, is_leaf, make) for k, x in frozen.items()}
    return frozen


def _is_frozen_tensor(x: Any) -> bool:
    return type(x) is tuple and len(x) == 2 and isinstance(x[0], UOp)


class TinyJit:
    """`@TinyJit`, `@TinyJit(prune=True)` or `TinyJit(f)`: warm up, capture, then replay (API.md §6.1)."""

    def __init__(self, fxn: Callable | None = None, *, prune: bool = False):
        self.fxn, self.prune = fxn, prune
        if fxn is not None:
            functools.update_wrapper(self, fxn)
        self.reset()

    def reset(self) -> None:
        """Forget the capture: the next call warms up again."""
        self.cnt = 0
        self.captured: CapturedJit | None = None

    def __getstate__(self) -> dict:
        # the function goes along when pickle can name it (a module-level def); a loaded capture replays without it
        try:
            fxn = self.fxn if pickle.dumps(self.fxn) else None
        except Exception:
            fxn = None
        return {"fxn": fxn, "prune": self.prune, "cnt": self.cnt, "captured": self.captured}

    def __setstate__(self, state: dict) -> None:
        self.fxn, self.prune, self.cnt, self.captured = state["fxn"], state["prune"], state["cnt"], state["captured"]
        if self.fxn is not None:
            functools.update_wrapper(self, self.fxn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # a method: the instance is a non-tensor argument, so another instance is a mismatch, not a silent replay
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fxn is None and self.captured is None:
            if len(args) == 1 and not kwargs and callable(args[0]):
                self.fxn = args[0]
                functools.update_wrapper(self, self.fxn)
                return self
            raise TypeError("TinyJit(prune=...) decorates one function: use @TinyJit(prune=True) above a def")
        if capturing:
            raise RuntimeError(f"TinyJit {self._name()} called while another TinyJit captures; nested JITs cannot be")
        if not JIT and self.fxn is not None:
            self.cnt += 1
            return self.fxn(*args, **kwargs)
        var_vals: dict[UOp, int] = {}
        tensors, others = _split_args(args, kwargs, var_vals)
        with realize_lock:
            if self.captured is not None:
                ret = self._replay(tensors, others, var_vals)
            elif self.cnt >= 1:
                ret = self._capture(tensors, others, var_vals, args, kwargs)
            else:
                _prepare_inputs(tensors)
                _realize_effects([])  # assigns made before the call are not the function's
                ret = self.fxn(*args, **kwargs)
                _realize_effects(_returned_tensors(ret))
        self.cnt += 1
        return ret

    def _name(self) -> str:
        return getattr(self.fxn, "__qualname__", repr(self.fxn))

    # ------------------------------------------------------------------------------------------ capture
    def _capture(
        self, tensors: list[tuple[str, Tensor]], others: list, var_vals: dict[UOp, int], args: tuple, kwargs: dict
    ) -> Any:
        layouts, bases = _prepare_inputs(tensors, var_vals)
        _realize_effects([])  # assigns made before the call are not the function's
        before = _live_tensor_buffers()
        recorder = _Recorder()
        capturing.append(recorder)
        try:
            with Context(BEAM=int(JITBEAM.value)) if JITBEAM.value else nullcontext():
                ret = self.fxn(*args, **kwargs)
                _realize_effects(_returned_tensors(ret))
        finally:
            capturing.pop()
        if not recorder.launches:
            raise JitError(f"didn't JIT anything! {self._name()} launched no kernel while it was captured")
        launches = [Launch(r, list(b), ast) for r, b, ast in recorder.launches]
        input_bufs = [buffer_of[u] for b in bases for u in b]
        launches += _keep_moved_state(before, launches)
        if self.prune:
            # a kernel reading a Variable's value changes with it, like one reading an input
            var_bufs = {
                la.buffers[p] for la in launches if la.ast is not None and la.runner for p in var_params(la.ast)
            }
            launches, kept_outputs = _prune(launches, set(input_bufs) | var_bufs)
        else:
            kept_outputs = set()
        captured = CapturedJit(
            launches,
            input_bufs,
            InputLayout(
                [n for n, _ in tensors],
                layouts,
                [t.shape for _, t in tensors],
                [t.dtype for _, t in tensors],
                [t.device for _, t in tensors],
                others,
            ),
            _freeze(ret),
            [u for b in bases for u in b],
            var_vals=var_vals,
            rng_buffers=[buffer_of[t.uop] for t in recorder.rng_base.values()],
            rng_calls=Tensor._rng_calls - recorder.rng_start if recorder.rng_base else 0,
        )
        _plan_memory(captured, kept_outputs, enabled=not NO_MEMORY_PLANNER)
        captured.build_steps(use_graphs=int(JIT.value) != 2)
        self.captured = captured
        if DEBUG >= 1:
            print(
                f"JIT {self._name()}: captured {len(launches)} kernels into {captured.batches} batches "
                f"({len(captured.steps) - captured.batches} launched alone); memory planned from "
                f"{captured.planned_from} to {captured.planned_to} bytes"
            )
        return ret

    # ------------------------------------------------------------------------------------------ replay
    def _replay(self, tensors: list[tuple[str, Tensor]], others: list, var_vals: dict[UOp, int]) -> Any:
        cap = self.captured
        assert cap is not None
        lay = cap.layout
        names = [n for n, _ in tensors]
        if names != lay.names:
            raise JitError(f"args mismatch: inputs were {lay.names} at capture, now {names}")
        if len(others) != len(lay.others) or any(
            a[0] != b[0] or not _same(a[1], b[1]) for a, b in zip(others, lay.others)
        ):
            for (n0, v0), (n1, v1) in zip(lay.others, others):
                if n0 != n1 or not _same(v0, v1):
                    raise JitError(f"args mismatch: {n1} is {v1!r}, at capture {n0} was {v0!r}")
            raise JitError(f"args mismatch: other arguments {[n for n, _ in others]}, at capture {lay.others}")
        bases: list[UOp] = []
        for i, (name, t) in enumerate(tensors):
            start = len(bases)
            got = _layout(t.uop, bases, var_vals)
            if got is None:
                del bases[start:]
                layouts, b = _prepare_inputs([(name, t)], var_vals)
                got = layouts[0]
                bases.extend(b[0])
            if got != lay.layouts[i]:
                raise JitError(f"args mismatch: {_describe_mismatch(name, t, lay, i, got)}")
        inputs = [buffer_of[u] for u in bases]
        if len(set(inputs)) != len(inputs):
            _prepare_inputs(tensors)  # names the two arguments
        st = time.perf_counter()
        cap(inputs, var_vals)
        if DEBUG >= 2:
            print(
                f"JIT {self._name()}: replay {self.cnt - 1}: {len(cap.launches)} kernels in {len(cap.steps)} "
                f"calls, {(time.perf_counter() - st) * 1e6:.1f} us"
            )
        if not cap.returns_vary:
            return _thaw(cap.returns, _is_frozen_tensor, lambda f: Tensor(f[0], device=f[1]))
        # a returned view of an input, or a return of symbolic shape: rebuilt on this call's inputs and values
        rebase = {old: new for old, new in zip(cap.input_base_uops, bases) if old is not new}
        new_vals = {v: x for v, x in var_vals.items() if cap.var_vals.get(v, x) != x}
        return _thaw(cap.returns, _is_frozen_tensor, lambda f: Tensor(_rebase(f[0], rebase, new_vals), device=f[1]))


def _describe_mismatch(name: str, t: Tensor, lay: InputLayout, i: int, got: Hashable) -> str:
    for what, was, now in (("shape", lay.shapes[i], t.shape), ("dtype", lay.dtypes[i], t.dtype)):
        if was != now:
            return f"{name} has {what} {now}, at capture {was}"
    if lay.devices[i] != t.device:
        return f"{name} is on device {t.device}, at capture on {lay.devices[i]}"
    return f"{name} is a different view or buffer layout {got}, at capture {lay.layouts[i]} (pass .contiguous())"


Snapshot = dict[int, tuple[weakref.ref[Tensor], list[Buffer]]]


def _keep_moved_state(before: Snapshot, launches: list[Launch]) -> list[Launch]:
    """A tensor whose assign copied on write during the capture (a live graph still read its old value) now lives in
    a new buffer, but the captured kernels read the old one: point the tensor back at its old buffer and either let
    the assign write there (when that is safe) or copy the new value there at the end of every replay (and now), so
    the next replay reads the updated state. Returns the copies to append."""
    read = {b for la in launches for b in la.buffers[1:]}
    written = {la.buffers[0] for la in launches}
    copies: dict[Buffer, Buffer] = {}  # new buffer -> old buffer
    for ref, old_bufs in before.values():
        if (t := ref()) is None or (now := _tensor_buffers(t.uop)) is None or len(now) != len(old_bufs):
            continue
        moved = {new: old for new, old in zip(now, old_bufs) if new is not old and old in read and new in written}
        if not moved:
            continue
        base: dict[UOp, UOp] = {}
        for u in t.uop.toposort():
            if u.op is Ops.BUFFER and (old := moved.get(buffer_of[u])) is not None:
                base[u] = buffer_uop(old)
        t.uop = _rebase(t.uop, base)
        copies.update(moved)
    held = {id(b) for _, bufs in _live_tensor_buffers().values() for b in bufs} if copies else set()
    for new, old in list(copies.items()):
        if id(new) not in held and _write_in_place(launches, new, old):
            del copies[new]
    extra = [Launch(None, [old, new]) for new, old in copies.items()]
    for la in extra:
        _run_one(None, la.buffers)
    return extra


def _write_in_place(launches: list[Launch], new: Buffer, old: Buffer) -> bool:
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
    if any(p and b is old and not _reads_aligned(la.ast, p) for p, b in enumerate(la.buffers)):
        return False
    for i in writers:
        launches[i].buffers = [old if b is new else b for b in launches[i].buffers]
    la.buffers[0] = old
    _run_one(None, [old, new])  # the capture's new value, where the next replay reads it
    return True


def _reads_aligned(ast: UOp, param: int) -> bool:
    """Every read of kernel parameter `param` is of the element the kernel stores (only reshapes and elementwise ops
    between the load and the store): the kernel may write that buffer in place."""
    stack, seen = [(ast.src[0].src[1], False)], set()
    while stack:
        u, moved = stack.pop()
        if (u, moved) in seen:
            continue
        seen.add((u, moved))
        if u.op is Ops.DEFINE_GLOBAL:
            if u.arg[0] == param and moved:
                return False
            continue
        shifts = u.op in GroupOp.Movement and u.op is not Ops.RESHAPE or u.op is Ops.REDUCE_AXIS
        stack.extend((x, moved or shifts) for x in u.src)
    return True


def _prune(launches: list[Launch], inputs: set[Buffer]) -> tuple[list[Launch], set[Buffer]]:
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


def _plan_memory(cap: CapturedJit, keep: set[Buffer], enabled: bool) -> None:
    """Give the step's intermediates (buffers first written by it, no input, no live tensor's) shared memory."""
    inputs = set(cap.input_buffers)
    held = {id(b) for _, bufs in _live_tensor_buffers().values() for b in bufs}
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
        and id(b) not in held
        and type(b) is Buffer
        and isinstance(Device[b.device].allocator, HostAllocator)
    ]
    cap.planned_from = sum(b.nbytes for b in plan)
    if not enabled or not plan:
        cap.planned_to = cap.planned_from
        return
    replacement, arenas, placement = plan_buffers(plan, [(first_use[b], last_use[b]) for b in plan])
    if sum(a.nbytes for a in arenas) >= cap.planned_from:  # nothing shared: the buffers keep their own memory
        cap.planned_to = cap.planned_from
        return
    cap.arenas, cap.placement, cap.planned_to = arenas, placement, sum(a.nbytes for a in arenas)
    for la in cap.launches:
        la.buffers = [replacement.get(b, b) for b in la.buffers]


__all__ = ["TinyJit", "JitError", "CapturedJit"]
