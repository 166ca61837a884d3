"""A kernel's AST from a realize point's value: buffers become numbered DEFINE_GLOBAL parameters, inner realize points
their buffers, bound variables kernel parameters, and data constants one-element parameter buffers (lifted), so
kernels that differ only in a constant are one AST and one compiled program."""

from __future__ import annotations
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING
from fusegrad.lazy_numpy import np
from fusegrad.dtype import DType, dtypes, to_numpy_dtype
from fusegrad.runtime.buffers import buffer_of
from fusegrad.runtime.device import Buffer
from fusegrad.schedule.variables import arg_uops
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

if TYPE_CHECKING:
    from fusegrad.schedule.planner import Planner


@dataclass
class KernelBuild:
    """What the kernel-AST rules read and fill: the planner's decisions, the kernel's parameters so far, the realize
    point it computes and its device."""

    planner: Planner
    value: UOp
    params: dict[object, tuple[Buffer, UOp]]
    point: UOp
    device: str
    shaping: set[UOp] | None = None  # found on the first int constant: most kernels have none
    # an assign's storage when the kernel stores into it in place, and the output parameter its reads become
    output: tuple[Buffer, UOp] | None = None
    original: set[UOp] | None = None  # the value's own nodes, found with `shaping`

    def lifted(self, user: UOp | None, s: UOp) -> bool:
        """Whether s, a source of user (None: standing alone), is read from a parameter. Float constants are lifted
        wherever they are used; int ones only as operands of plain arithmetic and comparisons
        (INT_CONST_OPERAND_OPS): a shift count, a power, a divisor shape the compiled code."""
        if not is_lifted_const_view(s, self.planner.const_views):
            return False
        if dtypes.is_float(s.dtype):
            return True
        if self.shaping is None:
            # the kernel's own nodes: the walk stops at values earlier kernels store (a long chain is many kernels)
            own = self.value.toposort(lambda n: n is self.point or n not in self.planner.result)
            self.shaping, self.original = feeds_code_shape(own), set(own)
        # decided at the value's own node (the rewrite asks again for the node rebuilt over rewritten sources, which
        # the shaping set does not know); an int constant combined only with constants (the squarings of `2 ** t`)
        # stays foldable by the compiler
        return (
            user is not None
            and user in self.original  # type: ignore[operator]
            and user not in self.shaping
            and (
                user.op is Ops.NEG  # `x - k` adds -k
                or user.op in INT_CONST_OPERAND_OPS
                and any(o is not s and not is_lifted_const_view(o, self.planner.const_views) for o in user.src)
            )
        )

    def param(self, buf: Buffer, key: object) -> UOp:
        return kernel_param(self.params, buf, key)

    def buffer_param(self, buf: Buffer) -> UOp:
        return self.param(buf, buf)

    def const_use(self, u: UOp) -> UOp:
        """A lifted constant (under its views) read from a parameter of this use's own."""
        c = u.peel(GroupOp.Movement)
        self.planner.const_params[buf := const_buffer(self.device, c.dtype, c.arg)] = (c.dtype, c.arg)
        # past the cap, uses of one value share a parameter: a kernel's argument list stays short
        key = object() if len(self.params) < MAX_KERNEL_PARAMS else buf
        base = UOp(Ops.RESHAPE, c.dtype, (self.param(buf, key),), ())
        # a view to a symbolic size reads the variable's kernel parameter too
        return kernel_view(self.planner, u, base, self.params, self.device)


def _inner_point(ctx: KernelBuild, u: UOp) -> UOp | None:
    """A value an earlier kernel of the schedule stores: read from its buffer."""
    return ctx.planner.result.get(u) if u is not ctx.point else None


def _buffer(ctx: KernelBuild, u: UOp) -> UOp:
    buf = buffer_of[u]
    if ctx.output is not None and buf is ctx.output[0] and buf.dtype == ctx.output[1].dtype:
        # the storage the kernel stores into, read through its output parameter: the code generator then knows the
        # kernel reads its own output (no tile may overlap another) and no two restrict pointers alias
        return ctx.output[1]
    return ctx.param(buf, buf)


def _lifted_alone(ctx: KernelBuild, u: UOp) -> UOp | None:
    """A float constant standing alone (the kernel's whole value, or below a DETACH) is read from a parameter."""
    return ctx.const_use(u) if ctx.lifted(None, u) else None


def _bind(ctx: KernelBuild, u: UOp) -> UOp:
    return ctx.planner.vars.kernel_var(u, ctx.device, ctx.buffer_param)  # its value is a parameter, not in the AST


def _has_bind(u: UOp) -> bool:
    return any(n.op is Ops.BIND for a in arg_uops(u) for n in a.toposort())


def _operands(ctx: KernelBuild, u: UOp) -> UOp | None:
    """Lifted constant operands read from parameters, one per use; bound variables in a view's arg become the
    kernel's variables."""
    lifted = [ctx.lifted(u, s) for s in u.src]
    binds = _has_bind(u)
    if not any(lifted) and not binds:
        return None
    src = tuple(ctx.const_use(s) if lift else s for s, lift in zip(u.src, lifted))
    return u.replace(src=src, arg=ctx.planner.vars.kernel_arg(u, ctx.device, ctx.buffer_param) if binds else u.arg)


# the kernel's value graph, top down: buffers become numbered DEFINE_GLOBALs, inner points their buffers, bound
# variables kernel parameters and data constants one-element parameter buffers, so kernels that differ only in a
# constant (a learning rate, a scalar in a user's loop) are one AST and one compiled program. Each use of a constant
# gets a parameter of its own: equal constants (one hash-consed node) then build the same AST as different ones.
pm_kernel_ast = PatternMatcher(
    [
        (UPat(tuple(Ops), name="u"), _inner_point),  # first, for every op
        (UPat(Ops.BUFFER, name="u"), _buffer),
        (UPat(Ops.BIND, name="u"), _bind),
        (UPat(Ops.DETACH, src=(UPat(name="x"),)), lambda x: x),
        (UPat(Ops.CONTIGUOUS, arg="backward", src=(UPat(name="x"),)), lambda x: x),
        (UPat(GroupOp.Movement | {Ops.CONST}, name="u"), _lifted_alone),
        (UPat(name="u"), _operands),
    ]
)


def kernel_ast_value(
    planner: Planner,
    value: UOp,
    params: dict[object, tuple[Buffer, UOp]],
    point: UOp,
    device: str,
    output: tuple[Buffer, UOp] | None = None,
) -> UOp:
    """The kernel's value graph (pm_kernel_ast): one top-down graph_rewrite. `output`: the storage an assign stores
    into in place and the output parameter, which the value's reads of that storage then read through."""
    ctx = KernelBuild(planner, value, params, point, device, output=output)
    return graph_rewrite(value, pm_kernel_ast, ctx, bottom_up=False)


def kernel_view(planner: Planner, view: UOp, base: UOp, params: dict[object, tuple[Buffer, UOp]], device: str) -> UOp:
    """view's chain of movement ops rebuilt over base (a DEFINE_GLOBAL), bound variables as kernel parameters."""
    view, chain = view.peel_chain(GroupOp.Movement)
    for v in reversed(chain):
        arg = planner.vars.kernel_arg(v, device, lambda buf: kernel_param(params, buf, buf)) if arg_uops(v) else v.arg
        base = v.replace(src=(base,), arg=arg)
    return base


def kernel_param(params: dict[object, tuple[Buffer, UOp]], buf: Buffer, key: object) -> UOp:
    """The DEFINE_GLOBAL that reads buf for `key` in a kernel (numbered after the output, parameter 0)."""
    if key not in params:
        params[key] = (buf, UOp(Ops.DEFINE_GLOBAL, buf.dtype, (), (len(params) + 1, buf.size)))
    return params[key][1]


def is_lifted_const_view(u: UOp, memo: dict[UOp, bool]) -> bool:
    """A constant the kernel reads from a parameter, or a view of one (memo: answers for the views, so a long chain
    of views is walked once)."""
    chain = []
    while u.op in GroupOp.Movement and u not in memo:
        chain.append(u)
        u = u.src[0]
    found = memo[u] if u in memo else u.op is Ops.CONST and is_liftable_const(u)
    for v in chain:
        memo[v] = found
    return found


# constants the code generator folds by value (x*1, x+0, where(..., 0)) and non-finite masks stay literals
_FOLDED_CONSTS = (0.0, 1.0, -1.0)
# dtypes whose values numpy stores exactly as the kernel reads them (unsigned ints stay literals: random bits are
# made of shifts and masks by them)
_LIFTED_DTYPES = (dtypes.float16, dtypes.float32, dtypes.float64, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
# the ops an int constant is a parameter of (with data as another operand; and NEG); everything else (shifts, pow,
# division, bit masks, casts) compiles it in
INT_CONST_OPERAND_OPS = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE})
# ops whose int operands shape the compiled code: a shift count, a divisor, a bit mask
CODE_SHAPING_OPS = frozenset({Ops.SHL, Ops.SHR, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.POW})
MAX_CONST_BUFFERS = 4096
# a kernel gives each use of a constant its own parameter up to this many parameters
MAX_KERNEL_PARAMS = 64
# (device, dtype, value) -> a one-element buffer holding it; kernels only read these, so one buffer serves every kernel
_const_buffers: OrderedDict[tuple[str, DType, float], Buffer] = OrderedDict()


def feeds_code_shape(nodes: list[UOp]) -> set[UOp]:
    """Of a kernel's value's nodes (in toposort order), those whose result reaches an operand of a CODE_SHAPING_OP
    through elementwise and movement ops (`x >> where(m, 4, 0)`, a dequantizer's nibble shifts `arange(2) * 4`): int
    constants they use stay literals the compiler folds."""
    marked: set[UOp] = set()
    for u in reversed(nodes):  # every consumer before its sources
        if u.op in CODE_SHAPING_OPS or u in marked and (u.op in GroupOp.ALU or u.op in GroupOp.Movement):
            marked.update(u.src)
    return marked


def is_liftable_const(u: UOp) -> bool:
    return u.dtype in _LIFTED_DTYPES and math.isfinite(u.arg) and u.arg not in _FOLDED_CONSTS


def const_buffer(device: str, dtype: DType, value: float) -> Buffer:
    key = (device, dtype, value)
    if (buf := _const_buffers.get(key)) is None:
        buf = _const_buffers[key] = Buffer(device, 1, dtype)
        # host memory owned by this cache, outside GlobalCounters.mem_used, which counts what tensors hold
        buf.use_external(np.array([value], to_numpy_dtype(dtype)).view(np.uint8))
        if len(_const_buffers) > MAX_CONST_BUFFERS:
            _const_buffers.popitem(last=False)
    else:
        _const_buffers.move_to_end(key)
    return buf
