"""The profiling session: hooks the engine and runtime call (through helpers.Hooks.trace) append raw events here; the
Chrome trace is built from them only when written (chrome.py), so recording stays a tuple append per event."""

from __future__ import annotations
import itertools
import threading
import time
from typing import Any
from fusegrad.helpers import GlobalCounters

# raw event kinds: (kind, ...) tuples in `Session.events`
SLICE, LAUNCH, MEMORY = "slice", "launch", "memory"
THREAD_SLICE = "thread slice"  # one thread's chunks of a kernel split over the C runner's threads


class Session:
    """Everything recorded between install() and uninstall(): host slices (realize, schedule, codegen, compile, JIT
    capture and replay), device launches with their measured times, live memory, and (with a viz Recorder) the
    rewrites and kernels of the VIZ page. Times are perf_counter seconds (the C runner's CLOCK_MONOTONIC)."""

    def __init__(self, recorder: Any = None):
        self.events: list[tuple] = []
        self.recorder = recorder  # fusegrad.viz.recorder.Recorder under VIZ, else None
        self.start = time.perf_counter()
        self._local = threading.local()
        self._ids = itertools.count(1)
        self._cache_hits = 0
        self._cache_misses = 0
        self._step_meta: dict[int, tuple[Any, list[tuple[str, str, dict]]]] = {}  # id(replay step) -> its launches
        self.path: str | None = None  # where the trace was written, once it was

    # ------------------------------------------------------------------ host slices that launches link back to
    def _stack(self) -> list[list[Any]]:
        if (stack := getattr(self._local, "stack", None)) is None:
            stack = self._local.stack = []
        return stack

    def open(self, name: str, cat: str, args: dict | None = None) -> list[Any]:
        """A host slice that lasts until close(token); launches meanwhile get a flow arrow from it."""
        token = [name, cat, time.perf_counter(), next(self._ids), args or {}, threading.get_ident()]
        self._stack().append(token)
        if self.recorder is not None and cat == "realize":
            self.recorder.realize_begin(token[3])
        return token

    def close(self, token: list[Any], args: dict | None = None) -> None:
        stack = self._stack()
        while stack:  # a slice left open by an exception inside this one ends with it
            if stack.pop() is token:
                break
        name, cat, t0, sid, old_args, tid = token
        if self.recorder is not None and cat == "realize":
            self.recorder.realize_end()
        self.events.append((SLICE, name, cat, t0, time.perf_counter(), tid, {**old_args, **(args or {})}, sid))

    def slice(self, name: str, cat: str, t0: float, t1: float, args: dict | None = None) -> None:
        self.events.append((SLICE, name, cat, t0, t1, threading.get_ident(), args or {}, 0))

    # ------------------------------------------------------------------ the engine's and runtime's hooks
    def launch(self, name: str, device: str, t0: float, t1: float, args: dict) -> None:
        """One kernel or copy on `device`, timed by its runner; linked to the innermost open host slice."""
        stack = self._stack()
        parent = stack[-1][3] if stack else 0
        self.events.append((LAUNCH, name, device, t0, t1, threading.get_ident(), args, parent))

    def item_launched(self, item: Any, runner: Any, t0: float, t1: float) -> None:
        """A schedule item run eagerly: a kernel (`runner`) or, with runner None, a copy buffers[1] -> buffers[0]."""
        if runner is None:
            dst, src = item.buffers
            self.launch(f"copy {src.device} -> {dst.device}", dst.device, t0, t1, {"bytes": dst.nbytes})
        else:
            self.launch(runner.info.name, item.device, t0, t1, kernel_args(runner.info, item.buffers))

    def scheduled(self, t0: float, t1: float, kernels: int) -> None:
        self.slice("schedule", "schedule", t0, t1, {"kernels": kernels})

    def codegen_begin(self, device: str, ast: Any) -> float:
        self._cache_hits = self._cache_misses = 0
        if self.recorder is not None:
            self.recorder.kernel_begin(device, ast)
        return time.perf_counter()

    def compiled(self, runner: Any, dev: Any, t0: float, t1: float) -> None:
        """A kernel lowered (t0..t1) and built (t1..now) into `runner`; the disk cache's answers meanwhile say hit or
        miss."""
        t2 = time.perf_counter()
        info = runner.info
        self.slice(f"codegen {info.name}", "codegen", t0, t1, {"opts": [str(o) for o in info.opts]})
        cache = "hit" if self._cache_hits and not self._cache_misses else "miss" if self._cache_misses else "none"
        compiler = type(getattr(dev, "compiler", None)).__name__
        self.slice(
            f"compile {info.name}",
            "compile",
            t1,
            t2,
            {"kernel": info.name, "device": runner.device, "compiler": compiler, "cache": cache, "seconds": t2 - t1},
        )
        if self.recorder is not None:
            self.recorder.kernel_end(runner, dev)

    def cache_lookup(self, found: bool) -> None:
        if found:
            self._cache_hits += 1
        else:
            self._cache_misses += 1

    def memory(self, device: str) -> None:
        self.events.append((MEMORY, device, time.perf_counter(), GlobalCounters.mem_used_per_device.get(device, 0)))

    def jit_replay(self, steps: list[Any], run_python_step: Any, name: str) -> None:
        """A captured step's launches, each timed: a batch by the C runner's own clock (the batch's call itself is a
        host slice), a lone launch around its call."""
        token = self.open(f"jit replay {name}", "jit")
        clock, events, parent, ident = time.perf_counter, self.events, token[3], token[5]
        for step in steps:
            if (meta := self._step_meta.get(id(step))) is None or meta[0] is not step:
                meta = self._step_meta[id(step)] = (
                    step,
                    [_launch_meta(la, hasattr(step, "graph")) for la in _of(step)],
                )
            if hasattr(step, "graph"):
                st = clock()
                step.graph.timed()
                events.append((SLICE, "batch", "jit", st, clock(), ident, {"launches": len(meta[1])}, 0))
                times, spans = step.graph.timings()
                for i, (lname, device, args) in enumerate(meta[1]):
                    events.append(
                        (LAUNCH, lname, device, times[2 * i] * 1e-9, times[2 * i + 1] * 1e-9, ident, args, parent)
                    )
                    for participant, t0, t1 in spans[i]:  # a split kernel: each thread's share of it
                        events.append((THREAD_SLICE, lname, device, t0 * 1e-9, t1 * 1e-9, participant))
            else:
                st = clock()
                run_python_step(step)
                lname, device, args = meta[1][0]
                events.append((LAUNCH, lname, device, st, clock(), ident, args, parent))
        self.close(token)


def _of(step: Any) -> list[Any]:
    return step.launches if hasattr(step, "graph") else [step.launch]


def _launch_meta(la: Any, batched: bool) -> tuple[str, str, dict]:
    """A recorded launch's name, device and the args its slices share (rates are added from each slice's time)."""
    runner = la.runner
    info = getattr(runner, "info", None)
    if runner is None:
        dst, src = la.buffers[0], la.buffers[1]
        return f"copy {src.device} -> {dst.device}", dst.device, {"bytes": dst.nbytes, "batched": batched}
    if info is None:
        return type(runner).__name__, runner.device, {"batched": batched}
    return info.name, runner.device, kernel_args(info, la.buffers, batched)


def kernel_args(info: Any, buffers: Any, batched: bool = False) -> dict:
    """A kernel slice's args; chrome.py adds GFLOPS and GB/s from the slice's duration."""
    return {
        "ops": info.ops_estimate,
        "bytes": sum(b.nbytes for b in buffers),
        "outer_size": info.outer_size,
        "batched": batched,
    }
