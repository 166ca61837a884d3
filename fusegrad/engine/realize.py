"""Runs a schedule: compiles each kernel once (cached by its AST), launches it, and keeps the counters."""

from __future__ import annotations
import atexit
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator
from fusegrad.helpers import BEAM, DEBUG, EMULATED_DTYPES, NOOPT, SPEC, GlobalCounters, Hooks
from fusegrad.uop.kernel import RawKernel
from fusegrad.engine.checks import checks_below, index_checks
from fusegrad.runtime.device import Device, copy_buffer, physical_memory
from fusegrad.engine.copy_on_write import OldVersionReaders
from fusegrad.runtime.buffers import base_buffer, buffer_of
from fusegrad.schedule import ScheduleItem, create_schedule, record_realized
from fusegrad.schedule.variables import bound_vars
from fusegrad.schedule.cache import bind_leaf, cached_schedule, clear_schedule_cache, leaf_template
from fusegrad.engine.eager import eager_launch
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from fusegrad.codegen import KernelInfo
    from fusegrad.renderer import Capabilities


class Runner:
    """A compiled kernel for one device, callable on a list of buffers."""

    def __init__(self, info: KernelInfo, program: Any, device: str):
        self.info, self.program, self.device = info, program, device

    def __call__(self, buffers) -> None:
        self.program(buffers)


# loaded programs, least recently used first; equal kernels with other constants share one (the scheduler lifts
# constants into a parameter buffer), so the bound is only reached by that many genuinely different kernels
_runners: OrderedDict[tuple[str, UOp, int, int, str], Runner] = OrderedDict()
MAX_LOADED_PROGRAMS = 1024
# templates keep loaded programs (their launch memos): dropped at exit while the device modules can still unload them
atexit.register(clear_schedule_cache)
# scheduling and running mutate shared state (buffer maps, realized values, counters): one realize at a time
realize_lock = threading.RLock()
# TinyJit's recorder while it captures a step (engine/jit.py): it sees every launch and refuses reads of data
capturing: list[Any] = []
# the @function bodies being traced (engine/function_trace.py): each refuses a realize of its placeholders' values
tracing: list[Any] = []


def _runner_key(device: str, ast: UOp) -> tuple[str, UOp, int, int, str]:
    # NOOPT, BEAM and EMULATED_DTYPES change the program built from the same AST; NOOPT wins over BEAM
    noopt = int(NOOPT.value)
    return (device, ast, noopt, 0 if noopt else int(BEAM.value), EMULATED_DTYPES.value)


def get_runner(device: str, ast: UOp, lowered: Any = None) -> Runner:
    """The kernel's runner, built now unless it is loaded; `lowered` is its lower_to_linear result when known."""
    key = _runner_key(device, ast)
    if (r := _runners.get(key)) is not None:
        _runners.move_to_end(key)
        return r
    dev = Device[device]
    if dev.renderer is None:  # a device without a code generator (DISK) says why it runs no kernels
        dev.refuse_kernels()
    if isinstance(ast.arg, RawKernel):
        r = _runners[key] = _raw_runner(dev, device, ast)
        GlobalCounters.compile_count += 1
        return r
    if DEBUG >= 3:
        print(ast)
    if (hook := Hooks.trace) is not None:
        t0 = hook.codegen_begin(device, ast)
    from fusegrad.codegen import lower_to_linear  # loaded with the first kernel, not at import
    from fusegrad.codegen.custom import is_custom

    if key[3] and not is_custom(ast):  # a custom kernel's loops are the user's: no search
        from fusegrad.codegen.opt.beam import beam_search  # numpy timing and the disk cache only when searching
        from fusegrad.engine.search_target import DeviceSearchTarget

        info = lower_to_linear(
            ast, dev.renderer, opts=beam_search(ast, DeviceSearchTarget(device), int(BEAM.value)).opts
        )
    else:
        info = lowered if lowered is not None else lower_to_linear(ast, dev.renderer)
    if hook is not None:
        t1 = time.perf_counter()
    r = _runners[key] = Runner(info, dev.build(info), device)
    if hook is not None:
        hook.compiled(r, dev, t0, t1)
    if SPEC >= 2 and info.opts:
        from fusegrad.engine.opt_equivalence import check_opts_keep_meaning

        try:
            check_opts_keep_meaning(ast, device, info, r.program)
        except BaseException:
            del _runners[key]  # a kernel whose opts change its meaning is never launched
            raise
    GlobalCounters.compile_count += 1
    while len(_runners) > MAX_LOADED_PROGRAMS:
        _runners.popitem(last=False)
    return r


def _raw_runner(dev: Any, device: str, ast: UOp) -> Runner:
    """A user's raw source (RawKernel), built by the device for its parameters."""
    from fusegrad.codegen import KernelInfo

    if (build := getattr(dev, "build_raw", None)) is None:
        raise NotImplementedError(f"raw kernel {ast.arg.entry!r}: {device} takes no raw source (CPU, LLVM and CL do)")
    return Runner(KernelInfo(ast.arg.entry, (), 1, 0, len(ast.src)), build(ast.arg, len(ast.src)), device)


def check_custom_kernel(ast: UOp, device: str) -> None:
    """Compile a custom kernel now, so a bad one raises where it is written (the program is kept for its launch)."""
    get_runner(device, ast)


def run_item(item: ScheduleItem, runner: Runner | None = None, debug: int | None = None) -> None:
    """Launch one item; `runner` (from compile_schedule) and `debug` (DEBUG's value) spare a loop the lookups."""
    for b in item.buffers:
        if b._mem is None:
            b.ensure_allocated()
    if debug is None:
        debug = DEBUG.value
    st = time.perf_counter()
    if item.ast.op is Ops.COPY:
        dst, src = item.buffers
        copy_buffer(dst, src)
        name, ops = f"copy {src.device} -> {dst.device}", 0
    else:
        if item.buffers[0].size == 0:
            return
        if runner is None:
            runner = get_runner(item.device, item.ast)
        runner.program(item.buffers)
        name, ops = runner.info.name, runner.info.ops_estimate
    hook = Hooks.trace
    if debug >= 2 or hook is not None:
        Device[item.device].synchronize()  # a GPU launch returns at once: the time shown is the kernel's
    et = time.perf_counter() - st
    if hook is not None:
        hook.item_launched(item, runner, st, st + et)
    if capturing:
        capturing[-1].record(item, runner if item.ast.op is not Ops.COPY else None)
    mem = 0
    for b in item.buffers:
        mem += b.size * b.dtype.itemsize
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += ops
    GlobalCounters.global_mem += mem
    GlobalCounters.time_sum_s += et
    if debug >= 2:
        print(
            f"*** {item.device:6s} {GlobalCounters.kernel_count:4d} {name:32s} arg {len(item.buffers):2d}"
            f" mem {GlobalCounters.mem_used / 1e9:6.2f} GB"
            f" tm {et * 1e6:9.2f}us {ops / max(et, 1e-9) / 1e9:8.2f} GFLOPS {mem / max(et, 1e-9) / 1e9:7.2f} GB/s"
        )


def check_memory(items: list[ScheduleItem]) -> None:
    """MemoryError before anything compiles or runs when the schedule's new buffers cannot fit the machine."""
    upper = 0  # counting a buffer that several items share once per item: a bound, exact only when it is too much
    for item in items:
        for b in item.buffers:
            if b._mem is None:
                upper += b.size * b.dtype.itemsize
    if upper <= (limit := physical_memory()):
        return
    new = {id(b): b for item in items for b in item.buffers if b._mem is None}.values()
    total = 0
    for b in new:
        total += b.size * b.dtype.itemsize
    if total > limit:
        largest = max(new, key=lambda b: b.nbytes)
        raise MemoryError(
            f"realizing needs {total} bytes of new buffers (largest: {largest.size} x {largest.dtype} = "
            f"{largest.nbytes} bytes on {largest.device}), more than the machine's {limit} bytes"
        )


def compile_schedule(items: list[ScheduleItem]) -> list[Runner | None]:
    """Each item's runner (None for a transfer or an empty output), compiled before anything runs."""
    check_memory(items)
    kernels = [it for it in items if it.ast.op is Ops.SINK and it.buffers[0].size]
    lowered = _lower_ahead(kernels)
    return [
        get_runner(it.device, it.ast, lowered.get((it.device, it.ast)))
        if it.ast.op is Ops.SINK and it.buffers[0].size
        else None
        for it in items
    ]


def _lower_ahead(kernels: list[ScheduleItem]) -> dict[tuple[str, UOp], Any]:
    """Lower the kernels not loaded yet, and let a device that can (the CPU device) compile them side by side."""
    if BEAM or Hooks.trace is not None or len(kernels) < 2:  # the profiler times each kernel's codegen alone
        return {}
    from fusegrad.codegen import lower_to_linear
    from fusegrad.codegen.custom import is_custom

    by_device: dict[str, dict[tuple[str, UOp], Any]] = {}
    for it in kernels:
        ahead = getattr(Device[it.device], "compile_ahead", None)
        if ahead is None or isinstance(it.ast.arg, RawKernel) or is_custom(it.ast):
            continue
        if _runner_key(it.device, it.ast) in _runners or (it.device, it.ast) in by_device.get(it.device, {}):
            continue
        by_device.setdefault(it.device, {})[(it.device, it.ast)] = lower_to_linear(it.ast, Device[it.device].renderer)
    for device, infos in by_device.items():
        if len(infos) > 1:
            Device[device].compile_ahead(list(infos.values()))
    return {k: v for infos in by_device.values() for k, v in infos.items()}


class Prepared:
    """A schedule's runners (compile_schedule) with what every run of it adds to GlobalCounters: the same for every
    schedule a template binds (same kernels, same buffer sizes), so a template's memo keeps one per NOOPT, BEAM and
    EMULATED_DTYPES."""

    __slots__ = ("runners", "kernels", "ops", "mem", "graph", "eager")

    def __init__(self, items: list[ScheduleItem]):
        self.runners = compile_schedule(items)
        launched = [(it, r) for it, r in zip(items, self.runners) if r is not None]
        self.kernels = len(launched)
        self.ops = sum(r.info.ops_estimate for _, r in launched)
        self.mem = sum(b.nbytes for it, _ in launched for b in it.buffers)
        self.graph: Any = None  # the kernels as one batch (built at the first run; False: they cannot be batched)
        self.eager: Any = None  # a leaf-op template's EagerLaunch (set at its first run; False: not of that form)

    def batch(self, items: list[ScheduleItem]) -> Any:
        """The schedule's kernels as one CPU graph launched by one C call, when there are several and the CPU device's
        runner takes every one (TinyJit's batches, for an eager step): else False."""
        if self.graph is None:
            from fusegrad.runtime.cpu_graph import CPUGraph, GraphEntry, batchable, runner_built

            if not runner_built():  # its first compile runs in the background: this run launches kernel by kernel
                return False
            runners = self.runners
            if len(items) < 2 or not all(
                r is not None and batchable(r.program, len(it.buffers)) for it, r in zip(items, runners)
            ):
                self.graph = False
            else:
                _allocate(items)
                graph = CPUGraph([GraphEntry(r.program, tuple(it.buffers)) for it, r in zip(items, runners)])  # type: ignore[union-attr]
                graph.forget_buffers()  # every run binds its own: the first run's buffers are not kept alive
                self.graph = graph
        return self.graph


def prepared(items: list[ScheduleItem], memo: dict | None) -> Prepared:
    """Prepared(items), kept in the schedule template's memo (`memo`, from cached_schedule): a re-bound schedule has
    the same kernels and sizes, so the same memory bound, as the one it was planned for."""
    if memo is None:
        return Prepared(items)
    if (prep := memo.get(key := _prepared_key())) is None:
        prep = memo[key] = Prepared(items)
    return prep


def _prepared_key() -> tuple[int, int, str]:
    # what changes the program built from an AST: NOOPT, BEAM (unless NOOPT), EMULATED_DTYPES
    noopt = int(NOOPT.value)
    return (noopt, 0 if noopt else int(BEAM.value), EMULATED_DTYPES.value)


def run_items(items: list[ScheduleItem], runners: list[Runner | None], debug: int, prep: Prepared | None) -> None:
    """run_item for each item; kernels launch inline (the per-launch work of an eager op) unless DEBUG shows them or a
    TinyJit records them. `prep` (for all of items and runners) has their counters summed already."""
    if debug >= 2 or capturing or prep is None or Hooks.trace is not None:  # the profiler times each launch
        for item, runner in zip(items, runners):
            run_item(item, runner, debug)
        return
    clock = time.perf_counter
    st = clock()
    if graph := prep.batch(items):
        _allocate(items)
        graph.bind_all([b.address() for item in items for b in item.buffers])
        graph()
    else:
        _launch_each(items, runners, debug)
    GlobalCounters.kernel_count += prep.kernels
    GlobalCounters.global_ops += prep.ops
    GlobalCounters.global_mem += prep.mem
    # the kernels' time with the loop's own: the Python between launches is a fraction of a launch
    GlobalCounters.time_sum_s += clock() - st


def _allocate(items: list[ScheduleItem]) -> None:
    for item in items:
        for b in item.buffers:
            if b._mem is None:
                b.ensure_allocated()


def _launch_each(items: list[ScheduleItem], runners: list[Runner | None], debug: int) -> None:
    for item, runner in zip(items, runners):
        if runner is None:  # a transfer or an empty output
            run_item(item, runner, debug)
            continue
        buffers = item.buffers
        for b in buffers:
            if b._mem is None:
                b.ensure_allocated()
        runner.program(buffers)


def device_capabilities(device: str) -> Capabilities:
    """What device's kernels can do (its renderer's capabilities): the front end's one way to ask about the target."""
    return Device[device].renderer.capabilities


def int8_dot(device: str) -> bool:
    """Whether device's kernels multiply 8-bit integers in dot-product instructions (its renderer's `int8_dot`): a
    quantized matvec then quantizes its activations to 8 bits, as llama.cpp does."""
    return device_capabilities(device).int8_dot


def int16_dot(device: str) -> bool:
    """Whether device's kernels multiply pairs of 16-bit integers into 32-bit sums in one instruction (its
    renderer's `int16_dot`): without int8_dot, a quantized matvec then quantizes its activations to 8-bit values held
    in 16 bits."""
    return device_capabilities(device).int16_dot


def u8s8_pair_dot(device: str) -> bool:
    """Whether device's kernels are C for x86 AVX2 (its renderer's `u8s8_pair_dot`): a quantized matvec may then run
    as a raw C kernel of AVX2 intrinsics (vpmaddubsw)."""
    return device_capabilities(device).u8s8_pair_dot


def c_vector_exp(floats: str, ints: str) -> str:
    """C source of `fg_exp_<floats>`: the C renderer's exp of float lanes, for raw C kernels computing what generated
    kernels do (the same values); floats and ints name GCC vector types of one lane count the kernel defines."""
    from fusegrad.renderer.c import GCC_VECTOR_EXP  # the renderer is loaded with the first kernel anyway

    return GCC_VECTOR_EXP.format(t=floats, it=ints)


def panel_columns(device: str, itemsize: int = 4) -> int:
    """Columns of a packed weight panel on device: two of its vectors of itemsize-byte elements (the register tile's
    width); 0 where the device's kernels do not gain from panels (its renderer's `weight_panels`). A plain matmul's
    panels are the scheduler's choice (schedule/panels.py); the layouts models store or build themselves (quantized
    weights dequantized into panels, attention's packed keys) ask this, not the target itself."""
    caps = device_capabilities(device)
    return max(2 * caps.vector_bytes // itemsize, 1) if caps.weight_panels else 0


def schedule_uops(roots: list[UOp], devices: list[str]) -> list[ScheduleItem]:
    """The kernels that would realize roots (nothing runs): Tensor.schedule's entry point."""
    return create_schedule(roots, devices)[0]


def bound_variables(roots: list[UOp]) -> dict:
    """The value of each bound Variable the graphs under roots read."""
    return bound_vars(roots)


def realize_leaf(root: UOp, device: str | tuple[str, ...]) -> UOp | None:
    """realize_uops([root], [device]) for an eager op on realized tensors whose schedule the leaf-op memo holds (an
    eager `x + y` in a loop), without the general path's steps that have nothing to do there (no tracer, profiler,
    index check or copy on write); None, having done nothing, for any other root. The caller holds realize_lock."""
    if root.op is Ops.MULTI or tracing or Hooks.trace is not None:
        return None  # a MULTI of buffers is realized already; the others need the general path's steps
    # index_checks' own dict first (a WeakKeyDictionary's len() is a Python call); a check pending elsewhere (another
    # lazy graph, a dead one the collector has not reached) is not this op's: only the op and its buffers can hold one
    if index_checks.data and (root in index_checks or any(s in index_checks for s in root.src)):
        return None
    if (leaf := leaf_template(root, device)) is None:
        return None
    template, hit, src = leaf
    if src is not root.src and index_checks.data:
        return None  # a small graph's inner nodes: only the general path asks all of them
    memo = template.launch_memo
    debug = DEBUG.value
    if (prep := memo.get(_prepared_key())) is not None and (fast := prep.eager) and debug < 2 and not capturing:
        result = fast.run([src[i]._buf for i in hit[3]])  # one kernel: launched without schedule items
    else:
        items, results, _ = bind_leaf(template, hit, src)
        prep = prepared(items, memo)
        if prep.eager is None:
            prep.eager = eager_launch(template, prep.runners, prep.ops, prep.mem) or False
        run_items(items, prep.runners, debug, prep)
        result = results[0]
    if root is not result:
        record_realized(root, result)
    return result


# root -> what to call once its buffer is written, for realizes inside `when_written` (the innermost one counts)
written_hooks: list[dict[UOp, Callable[[Any], None]]] = []


@contextmanager
def when_written(hooks: dict[UOp, Callable[[Any], None]]) -> Iterator[None]:
    """Inside: a realize of several roots calls hooks[root](its Buffer) as soon as the kernel writing that root's
    buffer ran, while the rest of its schedule still has to run (a gradient bucket's allreduce starts during
    backward). Hooks are called in the order of the roots, each no earlier than the ones before it."""
    written_hooks.append(hooks)
    try:
        yield
    finally:
        written_hooks.pop()


def hook_points(roots: list[UOp], results: list[UOp], items: list[ScheduleItem], hooks: dict) -> list[tuple]:
    """(number of items to run first, hook, the root's Buffer) for each hooked root, in root order: after the item
    writing its buffer and after every earlier hooked root's point."""
    writer = {id(item.buffers[0]): i for i, item in enumerate(items)}  # the last item writing each buffer
    points, at = [], 0
    for root, res in zip(roots, results):
        if (hook := hooks.get(root)) is not None:
            buf = buffer_of.get(base_buffer(res))  # type: ignore[arg-type]
            at = max(at, writer.get(id(buf), -1) + 1)
            points.append((at, hook, buf))
    return points


def run_with_hooks(items: list[ScheduleItem], runners: list[Runner | None], debug: int, points: list) -> None:
    done = 0
    for at, hook, buf in points:
        run_items(items[done:at], runners[done:at], debug, None)
        done = at
        hook(buf)
    run_items(items[done:], runners[done:], debug, None)


def realize_uops(roots: list[UOp], devices: list[str], holders_per_root: int | None = None) -> list[UOp]:
    """Compute roots; returns each root's buffer view. Nothing is recorded as realized unless every kernel ran.
    With `holders_per_root` (the references the caller holds on each root: its `roots` list, its tensor), an assign
    whose old value a live graph outside this realize still reads copies on write; without it assigns write in place."""
    with realize_lock:
        for tracer in tracing:
            tracer.refuse_realize(roots)
        if (hook := Hooks.trace) is not None:
            token, t_sched = hook.open("realize", "realize", {"roots": len(roots)}), time.perf_counter()
        readers = OldVersionReaders(roots, holders_per_root) if holders_per_root is not None else None
        checks = checks_below(roots)
        if checks:
            roots_and_checks = [c.extremes for c in checks] + roots
            items, results, inner, memo = cached_schedule(
                roots_and_checks, [c.device for c in checks] + devices, readers
            )
        else:
            items, results, inner, memo = cached_schedule(roots, devices, readers)
        if hook is not None:
            hook.scheduled(t_sched, time.perf_counter(), len(items))
        # compile everything first: a compiler error then leaves every buffer untouched
        prep = prepared(items, memo)
        runners = prep.runners
        debug = DEBUG.value
        if checks:
            # the bound kernels come first in the schedule: run them (and what they need), then check before any other
            check_bufs = [buffer_of[base_buffer(r)] for r in results[: len(checks)]]  # type: ignore[index]
            split = 1 + max(i for i, item in enumerate(items) if item.buffers[0] in check_bufs)
            run_items(items[:split], runners[:split], debug, None)
            prep = None  # its counters are for the whole schedule
            for check, buf in zip(checks, check_bufs):
                check.raise_if_violated(buf.numpy())
                if capturing:
                    capturing[-1].record_check(check, buf)
            items, runners, results = items[split:], runners[split:], results[len(checks) :]
        if written_hooks and (points := hook_points(roots, results, items, written_hooks[-1])):
            run_with_hooks(items, runners, debug, points)
        else:
            run_items(items, runners, debug, prep)
        for r, res in zip(roots, results):
            if r is not res:
                # a graph holding an assign node means the value it wrote, for as long as that graph lives
                record_realized(r, res, strong=r.op is Ops.ASSIGN)
        for point, res in inner.items():
            record_realized(point, res, strong=True)
        if hook is not None:
            hook.close(token, {"items": len(items)})
    return results


__all__ = [
    "realize_uops",
    "realize_leaf",
    "compile_schedule",
    "get_runner",
    "buffer_of",
    "realize_lock",
    "capturing",
    "tracing",
    "when_written",
]
