"""A captured TinyJit step (`CapturedJit`): the recorded launches over fixed buffers, run in batched CPU graphs or one
by one, with the input buffers and bound Variable values of each call swapped in."""

from __future__ import annotations
import time
from functools import partial
from dataclasses import dataclass, field
from typing import Any, Callable
from fusegrad.lazy_numpy import np
from fusegrad.helpers import JIT_BATCH_SIZE, GlobalCounters, Hooks
from fusegrad.engine.jit_inputs import InputLayout
from fusegrad.runtime.device import Buffer, Device, HostAllocator, copy_buffer
from fusegrad.schedule.variables import var_buffer, var_params
from fusegrad.tensor import Tensor
from fusegrad.uop.ops import UOp


@dataclass
class Launch:
    """One recorded launch: a compiled runner (None: a copy of buffers[1] into buffers[0]) and its buffers."""

    runner: Any
    buffers: list[Buffer]
    ast: UOp | None = None  # what the runner was compiled from (a pickled capture compiles it again)

    @property
    def prg(self) -> Any:
        """tinygrad's ExecItem name for the runner (None for a copy)."""
        return self.runner

    @property
    def bufs(self) -> list[Buffer]:
        """tinygrad's ExecItem name for the buffers."""
        return self.buffers


@dataclass
class PythonStep:
    launch: Launch
    input_slots: list[tuple[int, int]]  # (position in buffers, input buffer index)


@dataclass
class GraphStep:
    graph: Any  # runtime.cpu_graph.CPUGraph
    input_slots: list[tuple[list[int], int]]  # (table cells, input buffer index)
    launches: list[Launch]


class IndexCheckRunner:
    """A replayed CHECK_OOB index check: raises IndexError from the extremes buffer before later launches run."""

    def __init__(self, check: Any):
        self.check, self.device = check, check.device

    def __call__(self, buffers: list[Buffer]) -> None:
        self.check.raise_if_violated(buffers[0].numpy())


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
    _last: list[Buffer | None] = field(default_factory=list)  # the buffers the launches read as inputs now
    _given: list[Buffer | None] = field(default_factory=list)  # the input buffers of the last call
    _copied: bool = False  # some input of the last call was a buffer the step writes, read from a fresh copy
    name: str = "step"  # the captured function's name (profiles show it)
    intermediates: list[Buffer] = field(default_factory=list)  # what the step writes first and no tensor keeps
    use_graphs: bool = True
    ops: int = 0  # per replay, for GlobalCounters as an eager run counts them
    mem: int = 0
    _freed: bool = False  # free_intermediates ran: the next call allocates the intermediates again
    # each step as a call of no arguments over its current buffers, made after a replay allocated them all: a replay
    # is then one call each; None when the steps, inputs or Variable buffers changed since
    _thunks: list[Callable[[], Any]] | None = None
    single_return: tuple[UOp, Any] | None = None  # the (uop, device) of the one tensor returned, when it never varies
    # (thunks, inputs, var_vals): the last call's thunks while a call with the very same `inputs` and `var_vals`
    # objects (TinyJit's KnownCall passes its own, never changed) needs nothing but them: no random stream to advance,
    # no input to copy. A new tuple each time it is set, held, so its identity names one binding (TinyJit's lane)
    _steady: tuple[list[Callable[[], Any]], Any, Any] | None = None

    def build_steps(self, use_graphs: bool) -> None:
        from fusegrad.runtime.cpu_graph import CPUGraph, GraphEntry

        self.use_graphs = use_graphs
        self.ops = sum(la.runner.info.ops_estimate for la in self.launches if hasattr(la.runner, "info"))
        self.mem = sum(b.nbytes for la in self.launches for b in la.buffers)
        index = {b: i for i, b in enumerate(self.input_buffers)}
        self.internal = {b for la in self.launches for b in la.buffers if b not in index}
        self.steps, batch = [], []

        def flush() -> None:
            if batch:
                entries = [GraphEntry(la.runner.program if la.runner else None, tuple(la.buffers)) for la in batch]
                graph = CPUGraph(entries)
                slots = [(graph.slots[b], i) for b, i in index.items() if b in graph.slots]
                self.steps.append(GraphStep(graph, slots, list(batch)))
                batch.clear()

        for la in self.launches:
            if use_graphs and graphable(la):
                batch.append(la)
                if len(batch) >= max(int(JIT_BATCH_SIZE.value), 1):
                    flush()
                continue
            flush()
            self.steps.append(PythonStep(la, [(p, index[b]) for p, b in enumerate(la.buffers) if b in index]))
        flush()
        self._last = list(self.input_buffers)
        self._given = list(self.input_buffers)
        leaves: list[UOp] = []
        thaw(self.returns, is_frozen_tensor, lambda f: leaves.append(f[0]))
        inputs = set(self.input_base_uops)
        self.returns_vary = any(
            any(isinstance(d, UOp) for d in u.shape) or any(x in inputs for x in u.toposort()) for u in leaves
        )
        self.single_return = self.returns if not self.returns_vary and is_frozen_tensor(self.returns) else None
        self._thunks = None
        # where each kernel reads a Variable's value: a replay with another value swaps in that value's buffer
        place = {
            id(la): (s.graph, i) for s in self.steps if isinstance(s, GraphStep) for i, la in enumerate(s.launches)
        }
        self.var_slots = []
        for la in self.launches:
            for pos, var in (var_params(la.ast) if la.ast is not None and la.runner is not None else {}).items():
                graph, entry = place.get(id(la), (None, 0))
                self.var_slots.append((la, pos, var, graph, None if graph is None else graph.arg_off[entry] + pos))
        self._last_vals = dict(self.var_vals)

    @property
    def jit_cache(self) -> list[Launch]:
        """The captured kernel calls in launch order, each with its runner (`prg`) and buffers (`bufs`)."""
        return self.launches

    def free_intermediates(self) -> None:
        """Give back the memory of the step's intermediate buffers (planned arenas included); the next call allocates
        it again. Inputs, outputs and the buffers of live tensors are untouched."""
        fresh = {b: Buffer(b.device, b.size, b.dtype) for b in dict.fromkeys([*self.intermediates, *self.placement])}
        for la in self.launches:
            la.buffers = [fresh.get(b, b) for b in la.buffers]
        self.placement = {fresh[b]: where for b, where in self.placement.items()}
        self.intermediates = [fresh[b] for b in self.intermediates]
        self.arenas = [Buffer(a.device, a.size, a.dtype) for a in self.arenas]
        self.steps, self.internal, self._freed = [], set(), True  # batched tables hold the old addresses
        self._thunks = self._steady = None  # they hold the old buffers

    def _allocate_intermediates(self) -> None:
        for arena in self.arenas:
            arena.ensure_allocated()
        for b, (i, offset) in self.placement.items():
            b.use_external(self.arenas[i].host_view()[offset : offset + b.nbytes])
        for b in self.intermediates:
            if b not in self.placement:
                b.ensure_allocated()
        last_vals = self._last_vals  # the Variable buffers the launches read now stay as they are
        self.build_steps(self.use_graphs)
        self._last_vals, self._freed = last_vals, False

    @property
    def batches(self) -> int:
        return sum(isinstance(s, GraphStep) for s in self.steps)

    def __call__(self, inputs: list[Buffer], var_vals: dict[UOp, int] | None = None, timed: bool = False) -> None:
        """Run every launch with `inputs` in place of the capture's input buffers and the bound Variables' values
        `var_vals` (bound Variables) in place of the capture's (each is a one-element buffer a kernel reads); `timed`
        prints each launch's time (DEBUG=2)."""
        steady = self._steady
        if steady is not None and steady[1] is inputs and steady[2] is var_vals and not timed and Hooks.trace is None:
            for fn in steady[0]:  # the per-call path of a step called again as it was: its thunks, counted
                fn()
            self.count_launches()
            return
        self._steady = None
        if self._freed:
            self._allocate_intermediates()
        if var_vals and var_vals != self._last_vals:
            # one value buffer (and its address) per variable and device: a decode step's position is read by ~7
            # kernels a layer, each of whose slots asked the buffer cache again
            fresh: dict[tuple[str, UOp], tuple[Buffer, int]] = {}
            for la, pos, var, graph, cell in self.var_slots:
                if var in var_vals:
                    if (got := fresh.get(key := (la.runner.device, var))) is None:
                        buf = var_buffer(key[0], var, var_vals[var])
                        got = fresh[key] = (buf, buf.address())
                    la.buffers[pos] = got[0]
                    if graph is not None:
                        graph.set_address([cell], got[1])
            self._last_vals = {**self._last_vals, **var_vals}
            self._thunks = None
        if self.rng_calls:
            Tensor._rng_calls += self.rng_calls
            for b in self.rng_buffers:
                b.copyin(b.numpy() + np.uint32(self.rng_calls))
        if inputs != self._given:  # Buffers compare by identity
            self._bind_inputs(inputs)
        elif self._copied:
            self._bind_inputs(inputs)  # the step writes an input's buffer: read a fresh copy of it again
        if timed:
            self._run_timed()
        elif (hook := Hooks.trace) is not None:
            hook.jit_replay(self.steps, self._run_python_step, self.name)
        elif (thunks := self._thunks) is not None:
            for fn in thunks:
                fn()
        else:
            for step in self.steps:
                if type(step) is GraphStep:
                    step.graph.run()
                else:
                    self._run_python_step(step)
            self._thunks = [self._thunk(step) for step in self.steps]  # every buffer is allocated now
        if not self.rng_calls and not self._copied:
            self._steady = (self._thunks, inputs, var_vals)  # held: no id reused
        self.count_launches()

    def count_launches(self) -> None:
        """Add one replay's launches, ops and bytes to GlobalCounters, as an eager run counts them."""
        counters = GlobalCounters
        counters.kernel_count += len(self.launches)
        counters.global_ops += self.ops
        counters.global_mem += self.mem

    def _bind_inputs(self, given: list[Buffer]) -> None:
        """Point the launches at this call's input buffers, rewriting only the graph table cells that change."""
        inputs = list(given)
        self._copied = False
        for i, b in enumerate(given):
            if b in self.internal:
                inputs[i] = fresh_copy(b)  # a buffer this step writes, e.g. an earlier return: read a copy
                self._copied = True
        for step in self.steps:
            if type(step) is GraphStep:
                for cells, i in step.input_slots:
                    if inputs[i] is not self._last[i]:
                        step.graph.set_address(cells, inputs[i].address())
        self._given, self._last = list(given), inputs
        self._thunks = None

    def _thunk(self, step: Any) -> Callable[[], Any]:
        """The step as a call of no arguments on the buffers it reads now (allocated, this call's inputs in place)."""
        if type(step) is GraphStep:
            return step.graph.run  # one C call of one argument
        bufs = list(step.launch.buffers)
        for p, i in step.input_slots:
            bufs[p] = self._last[i]
        runner = step.launch.runner
        if runner is None:
            return partial(copy_buffer, bufs[0], bufs[1])
        # a runner may bind itself to its buffers (a host collective: its MPI call on their memory)
        return thunk(bufs) if (thunk := getattr(runner, "thunk", None)) is not None else partial(runner, bufs)

    def _run_python_step(self, step: PythonStep) -> None:
        bufs = list(step.launch.buffers)
        for p, i in step.input_slots:
            bufs[p] = self._last[i]
        run_launch(step.launch.runner, bufs)

    def _run_timed(self) -> None:
        """Each launch on its own, timed (a batch's launches one by one, as its table holds them)."""
        for step in self.steps:
            launches = step.launches if type(step) is GraphStep else [step.launch]
            slots = step.input_slots if type(step) is PythonStep else []
            for la in launches:
                bufs = list(la.buffers)
                if type(step) is GraphStep:
                    for cells, i in step.input_slots:
                        bufs = [self._last[i] if b is self.input_buffers[i] else b for b in bufs]
                for p, i in slots:
                    bufs[p] = self._last[i]
                st = time.perf_counter()
                run_launch(la.runner, bufs)
                et = time.perf_counter() - st
                name = la.runner.info.name if la.runner is not None and hasattr(la.runner, "info") else "copy"
                ops = la.runner.info.ops_estimate if la.runner is not None and hasattr(la.runner, "info") else 0
                print(
                    f"  JIT {name:32s} arg {len(bufs):2d} tm {et * 1e6:9.2f}us {ops / max(et, 1e-9) / 1e9:8.2f} GFLOPS"
                )


def graphable(la: Launch) -> bool:
    from fusegrad.runtime.cpu_graph import batchable

    if la.runner is None:
        return all(type(b) is Buffer and isinstance(Device[b.device].allocator, HostAllocator) for b in la.buffers)
    return batchable(getattr(la.runner, "program", None), len(la.buffers))


def run_launch(runner: Any, buffers: list[Buffer]) -> None:
    if runner is None:
        copy_buffer(buffers[0], buffers[1])
    else:
        for b in buffers:
            b.ensure_allocated()
        runner(buffers)


def fresh_copy(buf: Buffer) -> Buffer:
    out = Buffer(buf.device, buf.size, buf.dtype).ensure_allocated()
    copy_buffer(out, buf)
    return out


def freeze(ret: Any) -> Any:
    """The return structure with each tensor as its (uop, device), to rebuild fresh Tensors on each replay."""
    if isinstance(ret, Tensor):
        return (ret.uop, ret.device)
    if isinstance(ret, list):
        return [freeze(x) for x in ret]
    if isinstance(ret, tuple):
        return tuple(freeze(x) for x in ret) if type(ret) is tuple else type(ret)(*(freeze(x) for x in ret))
    if isinstance(ret, dict):
        return {k: freeze(x) for k, x in ret.items()}
    return ret


def thaw(frozen: Any, is_leaf: Callable[[Any], bool], make: Callable[[Any], Tensor]) -> Any:
    if is_leaf(frozen):
        return make(frozen)
    if isinstance(frozen, list):
        return [thaw(x, is_leaf, make) for x in frozen]
    if isinstance(frozen, tuple):
        items = (thaw(x, is_leaf, make) for x in frozen)
        return tuple(items) if type(frozen) is tuple else type(frozen)(*items)
    if isinstance(frozen, dict):
        return {k: thaw(x, is_leaf, make) for k, x in frozen.items()}
    return frozen


def is_frozen_tensor(x: Any) -> bool:
    return type(x) is tuple and len(x) == 2 and isinstance(x[0], UOp)


__all__ = ["CapturedJit", "IndexCheckRunner", "Launch", "run_launch", "freeze", "thaw", "is_frozen_tensor"]
