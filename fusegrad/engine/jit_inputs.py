"""TinyJit's inputs: which arguments are tensors, what a replay must find again in each (its layout), and the values
of bound Variables in them (compared unbound, passed to the kernels)."""

from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable, Hashable
from fusegrad.runtime.device import Buffer
from fusegrad.runtime.buffers import buffer_of
from fusegrad.tensor import Tensor
from fusegrad.uop.multi import is_realized_multi
from fusegrad.uop.ops import GroupOp, Ops, UOp


class JitError(Exception):
    """A TinyJit call that cannot be captured or replayed as TinyJit's rules require."""


POSITIONAL_NAMES = [f"argument {i}" for i in range(16)]


def split_args(
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
            others.append((name, unbind(v, var_vals) if isinstance(v, UOp) else v))

    for i, a in enumerate(args):
        visit(POSITIONAL_NAMES[i] if i < len(POSITIONAL_NAMES) else f"argument {i}", a, True)
    for k, a in kwargs.items():
        visit(f"argument {k!r}", a, True)
    return tensors, others


def input_layout(u: UOp, bases: list[UOp], var_vals: dict[UOp, int]) -> Hashable | None:
    """What a replay must find again in an input: its views down to each buffer (device, size, dtype), or None when
    the tensor is not a view of realized buffers yet. Appends the BUFFER nodes to `bases`; symbolic sizes are kept
    unbound, their values go to `var_vals`."""
    if u.op is Ops.BUFFER:
        buf = buffer_of[u]
        bases.append(u)
        return (buf.device, buf.size, u.dtype)
    if u.op in GroupOp.Movement:
        inner = input_layout(u.src[0], bases, var_vals)
        return None if inner is None else (u.op, unbind(u.arg, var_vals), inner)
    if is_realized_multi(u):
        shards = tuple(input_layout(s, bases, var_vals) for s in u.src)
        return (Ops.MULTI, u.arg, shards)
    return None


def map_binds(x: Any, on_bind: Callable[[UOp], UOp]) -> Any:
    """x (a size, a tuple of sizes or pairs) with each BIND node inside it replaced by on_bind(node)."""
    if isinstance(x, tuple):
        return tuple(map_binds(y, on_bind) for y in x) if any(isinstance(y, (tuple, UOp)) for y in x) else x
    if not isinstance(x, UOp):
        return x
    if x.op is Ops.BIND:
        return on_bind(x)
    src = tuple(map_binds(s, on_bind) for s in x.src)
    return x if src == x.src else x.replace(src=src)


def unbind(x: Any, var_vals: dict[UOp, int]) -> Any:
    """x with each bound Variable replaced by the Variable; the values go to var_vals."""
    if type(x) is tuple and all(type(y) is int for y in x):
        return x  # concrete sizes (a reshape's, a permute's): every replay's check meets them

    def to_var(bind: UOp) -> UOp:
        var, value = bind.unbind()
        if var_vals.setdefault(var, value) != value:
            raise JitError(f"Variable {var.arg[0]!r} is bound to both {var_vals[var]} and {value} in one call")
        return var

    return map_binds(x, to_var)


def rebind(x: Any, var_vals: dict[UOp, int]) -> Any:
    """x with each bound Variable bound to its value in var_vals instead."""

    def to_value(bind: UOp) -> UOp:
        var = bind.src[0]
        return var.bind(var_vals[var]) if var in var_vals and var_vals[var] != bind.src[1].arg else bind

    return map_binds(x, to_value)


def is_constant(u: UOp) -> bool:
    """u reads no buffer and nothing in it forces one: a constant the JIT could only bake in."""
    return not any(x.op in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN) for x in u.toposort())


def same_value(a: Any, b: Any) -> bool:
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


def prepare_inputs(
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
        if (lay := input_layout(t.uop, b, var_vals)) is None:
            if is_constant(t.uop):
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
                layouts[i] = input_layout(t.uop, bases[i], var_vals)
                if layouts[i] is None:
                    raise JitError(f"{name} did not realize to a buffer (its graph ends in {t.uop.op})")
    seen: dict[Buffer, str] = {}
    for (name, _), b in zip(tensors, bases):
        for u in b:
            if (other := seen.setdefault(buffer_of[u], name)) != name:
                raise JitError(f"{name} and {other} are the same buffer; a jitted function needs distinct inputs")
    return layouts, bases


def tensor_buffers(u: UOp) -> list[Buffer] | None:
    """The buffers a realized tensor's value is a view of, or None for an unrealized one."""
    b: list[UOp] = []
    return [buffer_of[x] for x in b] if input_layout(u, b, {}) is not None else None


def rebase_view(u: UOp, new_base: dict[UOp, UOp], var_vals: dict[UOp, int] | None = None) -> UOp:
    """u with its BUFFER nodes replaced by those `new_base` maps them to (the view ops above them kept), and its
    symbolic sizes bound to the values in var_vals."""
    if u.op is Ops.BUFFER:
        return new_base.get(u, u)
    src = tuple(rebase_view(s, new_base, var_vals) for s in u.src)
    arg = rebind(u.arg, var_vals) if var_vals and u.op in GroupOp.Movement else u.arg
    return u if src == u.src and arg is u.arg else u.replace(src=src, arg=arg)


def describe_mismatch(name: str, t: Tensor, lay: InputLayout, i: int, got: Hashable) -> str:
    for what, was, now in (("shape", lay.shapes[i], t.shape), ("dtype", lay.dtypes[i], t.dtype)):
        if was != now:
            return f"{name} has {what} {now}, at capture {was}"
    if lay.devices[i] != t.device:
        return f"{name} is on device {t.device}, at capture on {lay.devices[i]}"
    return f"{name} is a different view or buffer layout {got}, at capture {lay.layouts[i]} (pass .contiguous())"


__all__ = ["JitError", "InputLayout", "split_args", "prepare_inputs", "input_layout", "tensor_buffers", "rebase_view"]
