"""One trace of a @function body for one input signature: the body run once on placeholder tensors, its graph (and
each output's backward) kept as GraphPrograms that later calls replay over their own input nodes."""

from __future__ import annotations
import weakref
from typing import Any, Callable
from fusegrad.engine.function_program import GraphProgram
from fusegrad.engine.realize import compile_schedule, tracing
from fusegrad.gradient import compute_gradient, register_gradient
from fusegrad.dtype import dtypes
from fusegrad.runtime.buffers import next_buffer_id
from fusegrad.schedule import create_schedule
from fusegrad.tensor import Tensor, _contiguous_ids, tensor_of_uop
from fusegrad.uop.ops import Ops, UOp


class BodyTracer:
    """On engine.realize.tracing while a body runs: a realize of anything computed from the placeholders is refused
    (placeholders have no values; the call's outputs are realized by the caller)."""

    def __init__(self, name: str, placeholders: list[UOp]):
        self.name = name
        self.placeholder_buffers = {u for p in placeholders for u in p.toposort() if u.op is Ops.BUFFER}

    def refuse_realize(self, roots: list[UOp]) -> None:
        for r in roots:
            if any(u in self.placeholder_buffers for u in r.toposort()):
                raise RuntimeError(
                    f"@function {self.name}: the body realizes or reads a value computed from its arguments (shape "
                    f"{r.shape}, dtype {r.dtype}); a body stays lazy, realize the call's outputs instead"
                )


def run_traced(tracer: BodyTracer, body: Callable[[], Any]) -> Any:
    tracing.append(tracer)
    try:
        return body()
    finally:
        tracing.remove(tracer)


def describe(t: Tensor | UOp) -> str:
    if isinstance(t, Tensor):
        return f"shape {t.shape}, dtype {t.dtype}, device {t.device}"
    return f"shape {t.shape}, dtype {t.dtype}, device {t.arg[1]}"


class ImplicitInput:
    """A tensor the body read that is not an argument: each call reads the tensor's node anew (an optimizer's
    assign gives it a new one), and a tensor that changed shape, dtype or device, or died, makes the call retrace."""

    def __init__(self, tensor: Tensor):
        self.ref = weakref.ref(tensor)
        self.layout = (tensor.shape, tensor.dtype, tensor.device, tensor.requires_grad)

    def current(self) -> UOp | None:
        t = self.ref()
        if t is None or (t.shape, t.dtype, t.device, t.requires_grad) != self.layout:
            return None
        return t.uop


def find_implicit(name: str, outputs: list[UOp], inputs: set[UOp], start_id: int, allow: bool) -> list[Tensor]:
    """The tensors holding what the body read from buffers made before the trace (not arguments): RuntimeError
    naming the first unless `allow`. Buffers the body made itself (Tensor([...]) inside it) are constants."""
    nodes: dict[UOp, None] = {}
    for r in outputs:
        for u in r.toposort(gate=lambda x: x not in inputs):
            nodes[u] = None
    order = [u for u in nodes if u not in inputs]
    if any(u.op is Ops.ASSIGN for u in order):
        raise RuntimeError(f"@function {name}: the body assigns into a tensor; a body cannot have side effects")
    reaches: set[UOp] = set()  # nodes computed from such buffers only (a node that also reads an argument is not)
    depends = set(inputs)
    for u in order:
        if any(s in depends for s in u.src):
            depends.add(u)
        elif (u.op is Ops.BUFFER and u.arg[0] < start_id) or any(s in reaches for s in u.src):
            reaches.add(u)
    if not reaches:
        return []
    found: dict[int, Tensor] = {}
    covered: set[UOp] = set()
    for u in reversed(order):  # readers first: each held tensor's node is taken, not the views below it
        if u in covered:
            covered.update(u.src)
            continue
        if u in reaches and (holder := _holder(u)) is not None:
            found.setdefault(id(holder), holder)
            covered.update(u.src)
    if not allow:
        held = list(found.values())
        first: Tensor | UOp = held[0] if held else next(u for u in order if u.op is Ops.BUFFER and u in reaches)
        raise RuntimeError(
            f"@function {name}: the body reads a buffer that is not an argument ({describe(first)}); pass it as an "
            "argument or use @function(allow_implicit=True)"
        )
    return list(found.values())


def _holder(u: UOp) -> Tensor | None:
    for ref in u.holder_refs():
        if (t := ref()) is not None and t.uop is u:
            return t
    return None


class Trace:
    """The body's graph for one signature, replayed by `call`; each float output gets the body's backward (or
    grad_fxn's), traced once too, as its registered gradient."""

    def __init__(self, fn: Any, placeholder_args: Callable[..., Any], arg_tensors: list[Tensor]):
        self.name = fn.name
        placeholders = [_placeholder(self.name, i, t) for i, t in enumerate(arg_tensors)]
        tracer = BodyTracer(self.name, [p.uop for p in placeholders])
        start_id = next_buffer_id()
        rng_calls = Tensor._rng_calls
        out = run_traced(tracer, lambda: placeholder_args(placeholders))
        if Tensor._rng_calls != rng_calls:  # a replay would repeat the trace's draws: dropout with one fixed mask
            raise RuntimeError(
                f"@function {self.name}: the body draws random numbers, which a replay would repeat; draw them outside "
                "and pass them as arguments"
            )
        self.kind, outs = _outputs(self.name, out)
        self.devices = [t.device for t in outs]
        ph_nodes = [p.uop for p in placeholders]
        out_nodes = [t.uop for t in outs]
        self.implicit = [
            ImplicitInput(t) for t in find_implicit(self.name, out_nodes, set(ph_nodes), start_id, fn.allow_implicit)
        ]
        inputs = ph_nodes + [imp.ref().uop for imp in self.implicit]  # type: ignore[union-attr]
        input_devices = [p.device for p in placeholders] + [imp.layout[2] for imp in self.implicit]
        self.n_explicit = len(ph_nodes)
        self.forward = GraphProgram(out_nodes, {u: i for i, u in enumerate(inputs)}, _contiguous_ids)
        computed_from = self.forward.first_slot + len(self.forward.fixed)
        self.backward: list[tuple[int, list[int], GraphProgram]] = []
        for k, (t, u) in enumerate(zip(outs, out_nodes)):
            if not dtypes.is_float(u.dtype) or self.forward.root_slots[k] < computed_from:
                continue
            grad = t.empty_like()
            if fn.grad_fxn is not None:
                pairs = self._custom_grads(fn, placeholder_args, placeholders, outs, k, grad, tracer)
            else:
                targets = {x for x in inputs if dtypes.is_float(x.dtype)}
                grads = compute_gradient(u, grad.uop, targets)
                pairs = [(i, grads[x]) for i, x in enumerate(inputs) if x in targets and x in grads]
            if not pairs:
                continue
            known = dict(self.forward.slots)
            known[grad.uop] = len(known)
            program = GraphProgram([g for _, g in pairs], known, _contiguous_ids)
            self.backward.append((k, [i for i, _ in pairs], program))
            if fn.precompile_backward:
                _compile([g for _, g in pairs], [input_devices[i] for i, _ in pairs])
        if fn.precompile:
            _compile(out_nodes, self.devices)
        # the traced nodes are not kept: an implicit input's old version, still held, would make every optimizer
        # assign into it copy on write
        self.forward.slots = {}
        for _, _, program in self.backward:
            program.slots = {}

    def _custom_grads(self, fn, placeholder_args, placeholders, outs, k, grad, tracer) -> list[tuple[int, UOp]]:
        others = (grad if j == k else o.zeros_like() for j, o in enumerate(outs))
        grad_outputs = grad if self.kind is None else tuple(others)
        got = run_traced(
            tracer, lambda: placeholder_args(placeholders, lambda a, kw: fn.grad_fxn(grad_outputs, *a, **kw))
        )
        got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        if len(got) != len(placeholders):
            raise ValueError(
                f"@function {self.name}: grad_fxn returned {len(got)} gradients for {len(placeholders)} tensor "
                "arguments"
            )
        pairs = []
        for i, (g, p) in enumerate(zip(got, placeholders)):
            if g is None:
                continue
            if not isinstance(g, Tensor) or g.shape != p.shape:
                what = g.shape if isinstance(g, Tensor) else type(g).__name__
                raise ValueError(
                    f"@function {self.name}: grad_fxn's gradient {i} is {what}, its argument has shape {p.shape}"
                )
            pairs.append((i, g.cast(p.dtype).uop))
        return pairs

    def implicit_values(self) -> list[UOp] | None:
        values = [imp.current() for imp in self.implicit]
        return None if any(v is None for v in values) else values  # type: ignore[return-value]

    def call(self, inputs: list[UOp]) -> Any:
        env = self.forward.run(list(inputs))
        outs = [env[s] for s in self.forward.root_slots]
        if self.backward:
            computed_from = self.forward.first_slot + len(self.forward.fixed)
            dead = {s: weakref.ref(env[s]) for s in self.forward.root_slots if s >= computed_from}
            for s in dead:
                env[s] = None  # the backward closures share env: none of them holds an output
            for k, grad_inputs, program in self.backward:
                backward = _backward(self.forward, env, dead, program)
                register_gradient(outs[k], tuple(inputs[i] for i in grad_inputs), backward)
        tensors = [tensor_of_uop(u, d) for u, d in zip(outs, self.devices)]
        return tensors[0] if self.kind is None else self.kind(tensors)


def _backward(forward: GraphProgram, saved: list, dead: dict[int, weakref.ref], program: GraphProgram) -> Callable:
    """backward(g) for one output: the forward's nodes come from saved, where its outputs are None and held weakly
    in dead (a registered gradient must not hold its own node), rebuilt if they died."""

    def backward(g: UOp) -> tuple[UOp, ...]:
        values = list(saved)
        for s, ref in dead.items():
            node = ref()
            values[s] = node if node is not None else _rebuild(forward, values, s)
        values.append(g)
        program.run(values)
        return tuple(values[s] for s in program.root_slots)

    return backward


def _rebuild(forward: GraphProgram, values: list, slot: int) -> UOp:
    op, dtype, src, arg, _ = forward.instrs[slot - forward.first_slot - len(forward.fixed)]
    srcs = tuple(values[i] if values[i] is not None else _rebuild(forward, values, i) for i in src)
    values[slot] = UOp(op, dtype, srcs, next(_contiguous_ids) if op is Ops.CONTIGUOUS and type(arg) is int else arg)
    return values[slot]


def _placeholder(name: str, i: int, t: Tensor) -> Tensor:
    """A tensor laid out like argument t (an unallocated buffer; sharded like t), marked for gradients like t: some
    ops build another graph for a tensor that may be differentiated."""
    if not all(isinstance(d, int) for d in t.shape):
        raise ValueError(
            f"@function {name}: tensor argument {i} has a symbolic shape {t.shape}; shapes must be concrete"
        )
    p = t.empty_like()
    p.requires_grad, p.is_param = t.requires_grad, t.is_param
    return p


def _outputs(name: str, out: Any) -> tuple[Any, list[Tensor]]:
    if isinstance(out, Tensor):
        return None, [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, Tensor) for t in out):
        return type(out), list(out)
    raise TypeError(f"@function {name} must return a Tensor or a tuple of Tensors, got {type(out).__name__}")


def _compile(roots: list[UOp], devices: list) -> None:
    """Compile the kernels that compute roots (on the placeholders: nothing is allocated or run)."""
    compile_schedule(create_schedule(list(roots), list(devices))[0])
