"""TinyJit (docs/api.md): the first call runs a function, the second records the kernels it launches, later calls
replay them on the new inputs' buffers with no Python graph work.

A replay is a `CapturedJit` (`jit_program.py`): the recorded launches with their buffers, intermediate buffers
re-planned to share memory (`memory_planner.py`, `jit_capture.py`), consecutive CPU kernels batched into one C call each
(`runtime/cpu_graph.py`). Inputs are checked on every call against the capture (`jit_inputs.py`): a mismatch raises
JitError rather than replaying on the wrong layout."""

from __future__ import annotations
import functools
import pickle
import time
import weakref
from dataclasses import dataclass
from contextlib import nullcontext
from typing import Any, Callable
from sys import getrefcount
from fusegrad.helpers import DEBUG, JIT, JITBEAM, NO_MEMORY_PLANNER, Context, Hooks
from fusegrad.engine.jit_capture import (
    Recorder,
    drop_input_grads,
    keep_moved_state,
    lazy_leftovers,
    live_tensor_nodes,
    live_tensor_buffers,
    plan_memory,
    prune_launches,
    realize_earlier_readers,
    realize_effects,
    returned_tensors,
)
from fusegrad.engine.jit_inputs import (
    InputLayout,
    JitError,
    describe_mismatch,
    input_layout,
    prepare_inputs,
    rebase_view,
    same_value,
    split_args,
)
from fusegrad.engine import jit_pickle  # noqa: F401  (registers how a captured step pickles)
from fusegrad.engine.jit_program import CapturedJit, Launch, freeze, is_frozen_tensor, thaw
from fusegrad.engine.native_lane import NATIVE_AFTER, lane_state, native_class
from fusegrad.engine.realize import capturing, realize_lock
from fusegrad.runtime.buffers import buffer_of
from fusegrad.schedule.variables import var_params
from fusegrad.tensor import Tensor, tensor_of_uop
from fusegrad.uop.ops import UOp


@dataclass
class KnownCall:
    """The last call whose inputs passed the checks, when its arguments were all tensors passed by position: a call
    with the very same nodes (UOps never change) has the same layouts, buffers and Variable values."""

    uops: tuple[UOp, ...]
    inputs: list[Any]  # the input buffers, in the capture's order
    bases: list[UOp]
    var_vals: dict[UOp, int]
    # once a replay for these inputs ran steady (CapturedJit._steady) and returned one tensor: what the next call with
    # them runs and returns, without CapturedJit's call
    lane: SteadyLane | None = None
    c_lane: tuple | None = None  # the lane as the C call reads it (native_lane.lane_state), once switched


def _alone() -> int:
    # what getrefcount reports for a tensor only SteadyLane.held and one local name hold (the interpreter's counting
    # of a local's references varies between versions): measured with the lane's own steps
    held = [object()]
    t = held[0]
    return getrefcount(t)


_ALONE = _alone()
_acquire, _release = realize_lock.acquire, realize_lock.release


@dataclass
class SteadyLane:
    """A TinyJit call repeated with the same inputs: a jitted collective or tiny step is a few microseconds of work, so
    the replay's checks and the returned Tensor's construction are most of it. The lane runs CapturedJit's steady
    thunks under the realize lock and hands back a tensor it returned before when nobody holds that one any more (its
    reference count says so) and its user changed nothing in it; two are kept, since `loss = step(x)` still holds
    the last one while the next call runs."""

    steady: tuple  # CapturedJit._steady as it was: (thunks, inputs, var_vals); another tuple once that changed
    uop: UOp  # the returned tensor's node and device
    device: Any
    held: list[Tensor]  # the tensors returned last, newest first
    attrs: int  # how many attributes tensor_of_uop gives a tensor
    countdown: int = NATIVE_AFTER  # runs left before the TinyJit asks for the C lane (native_lane.py); 0: never

    @staticmethod
    def of(cap: CapturedJit, ret: Tensor) -> SteadyLane:
        return SteadyLane(cap._steady, ret.uop, ret.device, [ret], len(ret.__dict__))  # type: ignore[arg-type]

    def unchanged(self, t: Tensor) -> bool:
        """Whether t's attributes are as tensor_of_uop made them: compared by identity, since a value its user set may
        be a tensor, whose == is elementwise (a new attribute changes the count)."""
        d = t.__dict__
        return (
            len(d) == self.attrs
            and d["_uop"] is self.uop
            and d["grad"] is None
            and d["requires_grad"] is None
            and d["is_param"] is True
            and d["device"] is self.device
        )

    def hand_out(self) -> Tensor:
        """The older held tensor if it is free and unchanged, else a new one; either becomes the newest."""
        held = self.held
        if len(held) == 2:
            t = held[1]
            if getrefcount(t) == _ALONE and self.unchanged(t):
                held.reverse()
                return t
        t = tensor_of_uop(self.uop, self.device)
        held[:] = [t, held[0]]
        return t


class TinyJit:
    """`@TinyJit`, `@TinyJit(prune=True)` or `TinyJit(f)`: warm up, capture, then replay."""

    def __init__(self, fxn: Callable | None = None, *, prune: bool = False):
        self.fxn, self.prune = fxn, prune
        self._instance: weakref.ref | None = None  # a method's TinyJit for one instance: that instance
        self._instances: dict[int, tuple[weakref.ref, TinyJit]] = {}  # id(instance) -> (weak ref, its TinyJit)
        if fxn is not None:
            functools.update_wrapper(self, fxn)
        self.reset()

    def reset(self) -> None:
        """Forget the capture (a method's: every instance's): the next call warms up again."""
        self.cnt = 0
        self.captured: CapturedJit | None = None
        self._known: KnownCall | None = None
        for _, jit in list(self._instances.values()):
            jit.reset()

    def __getstate__(self) -> dict:
        # the function goes along when pickle can name it (a module-level def); a loaded capture replays without it
        try:
            fxn = self.fxn if pickle.dumps(self.fxn) else None
        except Exception:
            fxn = None
        if self._instance is not None:
            fxn = None  # one instance's capture: loaded, it replays; its body needs the instance, which stays here
        return {"fxn": fxn, "prune": self.prune, "cnt": self.cnt, "captured": self.captured}

    def __setstate__(self, state: dict) -> None:
        self.fxn, self.prune, self.cnt, self.captured = state["fxn"], state["prune"], state["cnt"], state["captured"]
        self._instance, self._instances, self._known = None, {}, None
        if self.fxn is not None:
            functools.update_wrapper(self, self.fxn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """A method: each instance gets its own TinyJit (held while the instance lives), capturing its own kernels."""
        if obj is None or self._instance is not None:
            return self
        key = id(obj)
        if (entry := self._instances.get(key)) is not None and entry[0]() is obj:
            return entry[1]
        instances = self._instances

        def forget(ref: weakref.ref) -> None:
            if instances.get(key, (None,))[0] is ref:
                del instances[key]

        try:
            ref = weakref.ref(obj, forget)
        except TypeError:  # no weak references (__slots__): the instance is a non-tensor argument of one capture
            return functools.partial(self.__call__, obj)
        jit = TinyJit(self.fxn, prune=self.prune)
        jit._instance = ref
        instances[key] = (ref, jit)
        return jit

    def _run_body(self, args: tuple, kwargs: dict) -> Any:
        if self._instance is None:
            return self.fxn(*args, **kwargs)
        if (obj := self._instance()) is None:
            raise ReferenceError(f"TinyJit {self._name()}: the instance it was bound to no longer exists")
        return self.fxn(obj, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        known = self._known
        if known is not None and not kwargs and not capturing and JIT.value:
            # the per-call path: one identity check per argument, then the replay
            uops = known.uops
            if len(args) == 1 == len(uops):  # one or two tensor arguments, the usual cases, without a loop
                same = type(a := args[0]) is Tensor and a._uop is uops[0]
            elif len(args) == 2 == len(uops):
                a, b = args
                same = type(a) is Tensor and type(b) is Tensor and a._uop is uops[0] and b._uop is uops[1]
            else:
                same = len(args) == len(uops) and all(type(a) is Tensor and a._uop is u for a, u in zip(args, uops))
            if same:
                cap = self.captured
                lane = known.lane
                if lane is not None and DEBUG.value < 2 and Hooks.trace is None:
                    _acquire()
                    try:
                        # the same inputs again and the replay bound as it was (checked under the lock: another
                        # thread's call may rebind it): the step's thunks, then the returned tensor
                        if cap._steady is lane.steady:
                            for fn in lane.steady[0]:
                                fn()
                            cap.count_launches()
                            self.cnt += 1
                            if lane.countdown:
                                lane.countdown -= 1
                                if not lane.countdown:
                                    self._go_native(known, cap, lane)  # type: ignore[arg-type]
                            t = lane.held[0]
                            if getrefcount(t) == _ALONE and lane.unchanged(t):
                                return t
                            return lane.hand_out()
                    finally:
                        _release()
                with realize_lock:
                    if (one := cap.single_return) is not None and DEBUG.value < 2:  # type: ignore[union-attr]
                        cap(known.inputs, known.var_vals)  # type: ignore[misc]
                        ret = tensor_of_uop(one[0], one[1])
                        steady = cap._steady  # type: ignore[union-attr]
                        if steady is not None and steady[1] is known.inputs and steady[2] is known.var_vals:
                            known.lane = lane = SteadyLane.of(cap, ret)  # type: ignore[arg-type]
                            if type(self).native_lane:
                                lane.countdown = 1  # on the C lane already: its next run hands this lane over
                    else:
                        ret = self._run_captured(known.inputs, known.bases, known.var_vals)
                self.cnt += 1
                return ret
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
            return self._run_body(args, kwargs)
        var_vals: dict[UOp, int] = {}
        tensors, others = split_args(args, kwargs, var_vals)
        with realize_lock:
            if self.captured is not None:
                ret = self._replay(tensors, others, var_vals)
            elif self.cnt >= 1:
                ret = self._capture(tensors, others, var_vals, args, kwargs)
            else:
                prepare_inputs(tensors)
                realize_effects([])  # assigns made before the call are not the function's
                ret = self._run_body(args, kwargs)
                realize_effects(returned_tensors(ret))
            if not others and not kwargs and len(tensors) == len(args) and self.captured is not None:
                self._known = KnownCall(*self._last_checked)
        self.cnt += 1
        return ret

    native_lane = False  # True on native_lane's subclass, whose call is the C lane

    def _go_native(self, known: KnownCall, cap: CapturedJit, lane: SteadyLane) -> None:
        """The lane's later runs in C (the instance switches to native_lane's subclass), once it is built; while it
        builds, ask again after NATIVE_AFTER more runs. A subclass of TinyJit keeps its class and the Python lane."""
        if type(self) is not TinyJit and not type(self).native_lane:
            return
        if (cls := native_class(TinyJit)) is None:
            lane.countdown = NATIVE_AFTER
            return
        known.c_lane = lane_state(known, cap, lane)
        self.__class__ = cls

    def _name(self) -> str:
        return getattr(self.fxn, "__qualname__", repr(self.fxn))

    # ------------------------------------------------------------------------------------------ capture
    def _capture(
        self, tensors: list[tuple[str, Tensor]], others: list, var_vals: dict[UOp, int], args: tuple, kwargs: dict
    ) -> Any:
        layouts, bases = prepare_inputs(tensors, var_vals)
        uops = tuple(t.uop for _, t in tensors)  # before the body, which may assign to an input
        realize_effects([])  # assigns made before the call are not the function's
        before = live_tensor_buffers()
        nodes_before = live_tensor_nodes()
        recorder = Recorder()
        recorder.inputs = {buffer_of[u] for b in bases for u in b}
        if (hook := Hooks.trace) is not None:
            token = hook.open(f"jit capture {self._name()}", "jit")
        capturing.append(recorder)
        try:
            with Context(BEAM=int(JITBEAM.value)) if JITBEAM.value else nullcontext():
                ret = self._run_body(args, kwargs)
                realize_effects(returned_tensors(ret))
                leftovers = drop_input_grads([t for _, t in tensors], lazy_leftovers(nodes_before))
                kernels_before_leftovers = len(recorder.launches)
                Tensor.realize_all(leftovers)  # a replay then leaves them holding its own values
        finally:
            capturing.pop()
            if hook is not None:
                hook.close(token, {"launches": len(recorder.launches)})
        realize_earlier_readers(nodes_before, recorder.launches)  # they keep the values from before the call
        if not recorder.launches:
            raise JitError(f"didn't JIT anything! {self._name()} launched no kernel while it was captured")
        launches = [Launch(r, list(b), ast) for r, b, ast in recorder.launches]
        input_bufs = [buffer_of[u] for b in bases for u in b]
        copies, held = keep_moved_state(before, launches)
        launches += copies
        if self.prune:
            # a kernel reading a Variable's value changes with it, like one reading an input
            var_bufs = {
                la.buffers[p] for la in launches if la.ast is not None and la.runner for p in var_params(la.ast)
            }
            launches, kept_outputs = prune_launches(launches, set(input_bufs) | var_bufs)
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
            freeze(ret),
            [u for b in bases for u in b],
            var_vals=var_vals,
            rng_buffers=[buffer_of[t.uop] for t in recorder.rng_base.values()],
            rng_calls=Tensor._rng_calls - recorder.rng_start if recorder.rng_base else 0,
        )
        plan_memory(
            captured, kept_outputs | {b for la in launches for b in la.buffers if id(b) in held}, not NO_MEMORY_PLANNER
        )
        captured.build_steps(use_graphs=int(JIT.value) != 2)
        captured.name = self._name()
        self.captured = captured
        self._last_checked = (uops, input_bufs, [u for b in bases for u in b], var_vals)
        if DEBUG >= 1:
            print(
                f"JIT {self._name()}: captured {len(launches)} kernels into {captured.batches} batches "
                f"({len(captured.steps) - captured.batches} launched alone); memory planned from "
                f"{captured.planned_from} to {captured.planned_to} bytes; {len(leftovers)} tensors left lazy by the "
                f"function realized ({len(recorder.launches) - kernels_before_leftovers} kernels)"
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
            a[0] != b[0] or not same_value(a[1], b[1]) for a, b in zip(others, lay.others)
        ):
            for (n0, v0), (n1, v1) in zip(lay.others, others):
                if n0 != n1 or not same_value(v0, v1):
                    raise JitError(f"args mismatch: {n1} is {v1!r}, at capture {n0} was {v0!r}")
            raise JitError(f"args mismatch: other arguments {[n for n, _ in others]}, at capture {lay.others}")
        bases: list[UOp] = []
        for i, (name, t) in enumerate(tensors):
            start = len(bases)
            got = input_layout(t.uop, bases, var_vals)
            if got is None:
                del bases[start:]
                layouts, b = prepare_inputs([(name, t)], var_vals)
                got = layouts[0]
                bases.extend(b[0])
            if got != lay.layouts[i]:
                raise JitError(f"args mismatch: {describe_mismatch(name, t, lay, i, got)}")
        inputs = [buffer_of[u] for u in bases]
        if len(set(inputs)) != len(inputs):
            prepare_inputs(tensors)  # names the two arguments
        self._last_checked = (tuple(t.uop for _, t in tensors), inputs, bases, var_vals)
        return self._run_captured(inputs, bases, var_vals)

    def _run_captured(self, inputs: list, bases: list[UOp], var_vals: dict[UOp, int]) -> Any:
        """Replay the capture on checked inputs and return this call's tensors."""
        cap = self.captured
        assert cap is not None
        if DEBUG.value >= 2:
            st = time.perf_counter()
            cap(inputs, var_vals, timed=True)
            print(
                f"JIT {self._name()}: replay {self.cnt - 1}: {len(cap.launches)} kernels in {len(cap.steps)} "
                f"calls, {(time.perf_counter() - st) * 1e6:.1f} us"
            )
        else:
            cap(inputs, var_vals)
        rets = cap.returns
        if not cap.returns_vary:
            if is_frozen_tensor(rets):
                return tensor_of_uop(rets[0], rets[1])
            return thaw(rets, is_frozen_tensor, lambda f: tensor_of_uop(f[0], f[1]))
        # a returned view of an input, or a return of symbolic shape: rebuilt on this call's inputs and values
        rebase = {old: new for old, new in zip(cap.input_base_uops, bases) if old is not new}
        new_vals = {v: x for v, x in var_vals.items() if cap.var_vals.get(v, x) != x}
        return thaw(rets, is_frozen_tensor, lambda f: Tensor(rebase_view(f[0], rebase, new_vals), device=f[1]))


__all__ = ["TinyJit", "JitError", "CapturedJit"]
