"""Bound variables in kernels: a kernel sees each variable as a DEFINE_VAR read from a one-element int32
parameter buffer holding its value, so one compiled program serves every value (the AST does not contain it)."""

from __future__ import annotations
from collections import OrderedDict
from typing import Any, Callable
from fusegrad.lazy_numpy import np
from fusegrad.dtype import dtypes
from fusegrad.runtime.device import Buffer
from fusegrad.uop.ops import Ops, UOp

MAX_VAR_BUFFERS = 4096
# (device, variable, value) -> a one-element int32 buffer holding the value; kernels only read it. Keyed by the
# variable too: two variables with equal values get separate parameters, so the AST never depends on the values
_var_buffers: OrderedDict[tuple[str, UOp, int], Buffer] = OrderedDict()


def var_buffer(device: str, var: UOp, value: int) -> Buffer:
    key = (device, var, value)
    if (buf := _var_buffers.get(key)) is None:
        buf = _var_buffers[key] = Buffer(device, 1, dtypes.int32)
        # host memory owned by this cache, outside GlobalCounters.mem_used, which counts what tensors hold
        buf.use_external(np.array([value], np.int32).view(np.uint8))
        if len(_var_buffers) > MAX_VAR_BUFFERS:
            _var_buffers.popitem(last=False)
    else:
        _var_buffers.move_to_end(key)
    return buf


def arg_uops(u: UOp) -> list[UOp]:
    """The symbolic sizes or bounds in a movement op's arg (RESHAPE/EXPAND sizes, PAD/SHRINK pairs)."""
    if u.op not in (Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK):
        return []
    return [y for x in u.arg for y in (x if isinstance(x, tuple) else (x,)) if isinstance(y, UOp)]


def _map_arg(arg: tuple, fn: Callable[[UOp], Any]) -> tuple:
    def one(x: Any) -> Any:
        return fn(x) if isinstance(x, UOp) else x

    return tuple(tuple(one(y) for y in x) if isinstance(x, tuple) else one(x) for x in arg)


class KernelVars:
    """Per schedule: the value each variable is bound to (a second, different binding is an error); per kernel (via
    `param`): the kernel DEFINE_VAR of each variable."""

    def __init__(self) -> None:
        self.values: dict[UOp, int] = {}
        self.in_kernel: dict[UOp, None] = {}  # the kernel DEFINE_VARs made since the last take_kernel_vars

    def take_kernel_vars(self) -> tuple[UOp, ...]:
        """The kernel DEFINE_VARs the kernel just built uses (for its SINK to hold, so each stays a parameter of the
        program even where lowering drops its use), in the order they were met."""
        out, self.in_kernel = tuple(self.in_kernel), {}
        return out

    def check(self, bind: UOp) -> tuple[UOp, int]:
        var, value = bind.unbind()
        if self.values.setdefault(var, value) != value:
            raise ValueError(
                f"Variable {var.arg[0]!r} is bound to both {self.values[var]} and {value} in one realize; "
                "bind it to one value"
            )
        return var, value

    def kernel_var(self, bind: UOp, device: str, param: Callable[[Buffer], UOp]) -> UOp:
        var, value = self.check(bind)
        kernel_var = UOp(Ops.DEFINE_VAR, var.dtype, (param(var_buffer(device, var, value)),), var.arg)
        self.in_kernel[kernel_var] = None
        return kernel_var

    def kernel_arg(self, u: UOp, device: str, param: Callable[[Buffer], UOp]) -> tuple:
        """u's arg with every bound variable replaced by its kernel DEFINE_VAR."""
        return _map_arg(u.arg, lambda x: self._swap_binds(x, device, param))

    def _swap_binds(self, x: UOp, device: str, param: Callable[[Buffer], UOp]) -> UOp:
        # a plain rebuild, not a graph_rewrite: a size is a few nodes, and this runs for every view in every kernel
        memo: dict[UOp, UOp] = {}
        for n in x.toposort(gate=lambda u: u.op is not Ops.BIND):
            if n.op is Ops.BIND:
                memo[n] = self.kernel_var(n, device, param)
            else:
                memo[n] = n.replace(src=tuple(memo[s] for s in n.src)) if n.src else n
        return memo[x]


def _symbolic_nodes(value: UOp) -> list[UOp]:
    """Every node of value's graph and of the symbolic sizes inside its movement ops."""
    nodes = value.toposort()
    return nodes + [n for u in nodes for x in arg_uops(u) for n in x.toposort()]


def symbolic_view(buf: UOp, shape: tuple) -> UOp:
    """A buffer holding a value of symbolic shape: laid out in its largest shape, shrunk to the symbolic one."""
    max_shape = tuple(d.vmax if isinstance(d, UOp) else d for d in shape)
    full = buf if buf.shape == max_shape else UOp(Ops.RESHAPE, buf.dtype, (buf,), max_shape)
    return UOp(Ops.SHRINK, buf.dtype, (full,), tuple((0, d) for d in shape))


def bound_vars(roots: list[UOp]) -> dict[UOp, int]:
    """The variables bound in these graphs (in their nodes or in movement sizes) and their values: what a replay of
    their kernels passes anew (TinyJit). ValueError when one variable is bound to two values."""
    found = KernelVars()
    for n in _symbolic_nodes(UOp(Ops.SINK, src=tuple(roots))):
        if n.op is Ops.BIND:
            found.check(n)
    return found.values


def var_params(ast: UOp) -> dict[int, UOp]:
    """Which buffers of a kernel hold variables: position in its buffer list -> the Variable (as users built it)."""
    return {
        v.src[0].arg[0]: UOp(Ops.DEFINE_VAR, v.dtype, (), v.arg)
        for v in ast.src[1:]
        if v.op is Ops.DEFINE_VAR and v.src and v.src[0].op is Ops.DEFINE_GLOBAL
    }


def rebind_buffers(ast: UOp, buffers: tuple[Buffer, ...], device: str, values: dict[UOp, int]) -> tuple[Buffer, ...]:
    """A captured kernel's buffers with each variable's buffer swapped for one holding its value in `values` (a
    TinyJit replay with new bound values runs the same program); AssertionError when a value is out of range."""
    out = list(buffers)
    for pos, var in var_params(ast).items():
        if var in values:
            var.bind(values[var])  # range and multiple_of checked, as at bind time
            out[pos] = var_buffer(device, var, values[var])
    return tuple(out)


__all__ = [
    "rebind_buffers",
    "var_params",
    "var_buffer",
    "KernelVars",
    "symbolic_view",
    "bound_vars",
    "arg_uops",
]
