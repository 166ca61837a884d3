"""`@function`: a function of tensors traced once per input signature into a graph that later calls replay.

The signature is every tensor argument's shape, dtype, device, sharded axis and requires_grad, the non-tensor
arguments' values, training mode and the default dtypes. The first call with a signature runs the body on
placeholder tensors (function_trace.Trace); later calls rebuild that graph over their own arguments' nodes
(function_program.GraphProgram) without running the body. The kernels are the same either way, so the kernel and
schedule caches serve them as before; what a call saves is the Python of the body: Tensor methods, shape and dtype
checks, broadcasting, gradient rules."""

from __future__ import annotations
import functools
import weakref
from typing import Any, Callable
from fusegrad.dtype import dtypes
from fusegrad.engine.function_trace import Trace
from fusegrad.helpers import DEBUG, TRAINING
from fusegrad.uop.multi import multi_axis
from fusegrad.tensor import Tensor


class Function:
    """A traced function (see the module doc); `function(...)` makes one."""

    def __init__(
        self,
        fxn: Callable,
        precompile: bool = False,
        precompile_backward: bool = False,
        allow_implicit: bool = False,
        grad_fxn: Callable | None = None,
    ):
        if not callable(fxn):
            raise TypeError(f"@function wraps a callable, got {type(fxn).__name__}")
        if grad_fxn is not None and not callable(grad_fxn):
            raise TypeError(f"@function's grad_fxn must be callable, got {type(grad_fxn).__name__}")
        self.fxn, self.precompile, self.precompile_backward = fxn, precompile, precompile_backward
        self.allow_implicit, self.grad_fxn = allow_implicit, grad_fxn
        self.name = getattr(fxn, "__qualname__", getattr(fxn, "__name__", repr(fxn)))
        self.traces: dict[tuple, Trace] = {}
        self._instance_traces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        functools.update_wrapper(self, fxn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """A method: each instance keeps its own traces, which die with it."""
        if obj is None:
            return self
        try:
            traces = self._instance_traces.setdefault(obj, {})
        except TypeError:  # neither weakly referable nor hashable: the instance is a non-tensor argument by identity
            return functools.partial(self._call, self.traces, (id(obj),), obj)
        return functools.partial(self._call, traces, (), obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(self.traces, (), None, *args, **kwargs)

    def _call(self, traces: dict, extra_key: tuple, instance: Any, *args: Any, **kwargs: Any) -> Any:
        tensors: list[Tensor] = []
        items = tuple(sorted(kwargs.items()))
        key = (extra_key, _mode(), _key(self.name, args, tensors), _key(self.name, items, tensors))
        trace = traces.get(key)
        implicit = trace.implicit_values() if trace is not None else None
        if trace is None or implicit is None:
            bound = (instance,) if instance is not None else ()

            def on_placeholders(placeholders: list[Tensor], call: Callable | None = None) -> Any:
                swap = iter(placeholders)
                new_args, new_kwargs = _swap(args, swap), dict(_swap(items, swap))
                if call is not None:
                    return call((*bound, *new_args), new_kwargs)
                return self.fxn(*bound, *new_args, **new_kwargs)

            trace = traces[key] = Trace(self, on_placeholders, tensors)
            implicit = trace.implicit_values() or []
            if DEBUG >= 2:
                print(
                    f"@function {self.name}: trace {len(traces)}, {len(trace.forward)} nodes, "
                    f"{len(trace.implicit)} implicit inputs, {len(trace.backward)} backward"
                )
        return trace.call([t.uop for t in tensors] + implicit)

    def __repr__(self) -> str:
        return f"<function {self.name}: {len(self.traces)} traced signatures>"


def function(
    fxn: Callable | None = None,
    *,
    precompile: bool = False,
    precompile_backward: bool = False,
    allow_implicit: bool = False,
    grad_fxn: Callable | None = None,
) -> Any:
    """`@function` or `@function(precompile=..., precompile_backward=..., allow_implicit=..., grad_fxn=...)`.

    precompile / precompile_backward: compile the body's kernels (its backward's) when it is traced.
    allow_implicit: the body may read tensors that are not arguments (weights); each call reads their current value.
    grad_fxn(grad_outputs, *args, **kwargs) -> one gradient (or None) per tensor argument, replacing the body's own
    backward; grad_outputs is a Tensor for a single output, else a tuple with one per output."""
    options = dict(
        precompile=precompile, precompile_backward=precompile_backward, allow_implicit=allow_implicit, grad_fxn=grad_fxn
    )
    if fxn is None:
        return lambda f: Function(f, **options)
    return Function(fxn, **options)


def _mode() -> tuple:
    """What a body's graph may depend on besides its arguments: training mode and the default dtypes."""
    return (TRAINING.value, Tensor.training, dtypes.default_float, dtypes.default_int)


def _key(name: str, values: tuple, tensors: list[Tensor]) -> tuple:
    """The signature of values (tensors appended to `tensors` in order): tensors by layout, the rest by value."""
    out = []
    for v in values:
        if isinstance(v, Tensor):
            tensors.append(v)
            axis = multi_axis(v.uop) if isinstance(v.device, tuple) else None
            out.append((Tensor, v.shape, v.dtype, v.device, axis, v.requires_grad))
        elif isinstance(v, (tuple, list)):
            out.append((type(v), _key(name, tuple(v), tensors)))
        elif isinstance(v, dict):
            out.append((dict, _key(name, tuple(v.items()), tensors)))
        else:
            try:
                hash(v)
            except TypeError:
                raise TypeError(
                    f"@function {name}: argument {v!r} of type {type(v).__name__} is neither a Tensor nor hashable; "
                    "non-tensor arguments are part of the signature"
                ) from None
            out.append((type(v), v))
    return tuple(out)


def _swap(values: tuple, placeholders: Any) -> tuple:
    """values with each tensor replaced by the next placeholder (the order `_key` found them in)."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(next(placeholders))
        elif isinstance(v, (tuple, list)):
            out.append(type(v)(_swap(tuple(v), placeholders)))
        elif isinstance(v, dict):
            out.append(dict(_swap(tuple(v.items()), placeholders)))
        else:
            out.append(v)
    return tuple(out)
