"""Lowers one kernel AST to a simplified, linear list of UOps: lower -> simplify -> decompose -> linearize."""

from __future__ import annotations
from dataclasses import dataclass
from fusegrad.helpers import DEBUG, NOOPT, prod
from fusegrad.uop.ops import Ops, UOp
from fusegrad.codegen.lowerer import lower_kernel, reads_own_output
from fusegrad.codegen.opt import Opt
from fusegrad.codegen.opt.heuristic import hand_coded_opts
from fusegrad.codegen.linearize import linearize
from fusegrad.codegen.decompose import decompose_for_device
from fusegrad.codegen.accumulators import block_long_sums


@dataclass(frozen=True)
class KernelInfo:
    """What a renderer needs besides the instructions: a name and the size of the loop split across threads."""

    name: str
    lin: tuple[UOp, ...]
    outer_size: int  # trip count of the outermost global loop (1 when there is none)
    ops_estimate: int
    nparams: int
    opts: tuple[Opt, ...] = ()  # the opts the lowerer applied


def kernel_name(ast: UOp) -> str:
    """E_<output shape> for elementwise kernels, r_<output>_<reduced sizes> for kernels that reduce."""
    store = ast.src[0]
    value = store.src[1]
    out_shape = [d for d in value.shape if d != 1] or [1]
    reduced = [
        d
        for u in value.toposort(gate=lambda x: x.op is not Ops.DEFINE_GLOBAL)
        if u.op is Ops.REDUCE_AXIS
        for i, d in enumerate(u.src[0].shape)
        if i in u.arg[1] and d != 1
    ]
    return ("r_" if reduced else "E_") + "_".join(str(d) for d in out_shape + reduced)


def lower_to_linear(ast: UOp, half_native: bool = True, opts: tuple[Opt, ...] | None = None) -> KernelInfo:
    """Stages: lower without opts -> choose opts (the heuristics, or none under NOOPT=1; or the given ones) -> lower
    with them -> decompose -> block long sums -> linearize."""
    kernel = lower_kernel(ast)
    if opts is None:
        opts = () if NOOPT else tuple(hand_coded_opts(ast.src[0].src[1], kernel, reads_own_output(kernel)))
    if opts:
        kernel = lower_kernel(ast, tuple(opts))
    if DEBUG >= 3:
        print(f"{kernel_name(ast)} opts: {list(opts)}")
    if DEBUG >= 5:
        print(kernel)
    kernel = decompose_for_device(kernel, half_native=half_native)
    # after decompose: half sums already accumulate in float32, so the partials between levels stay float32
    kernel = block_long_sums(kernel)
    # every buffer stays a parameter even when simplification removed its loads (x % 1 reads nothing)
    lin = linearize(kernel, params=[u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL])
    if DEBUG >= 6:
        for i, u in enumerate(lin):
            print(
                f"{i:4d} {u.op.name:12s} {u.dtype!r:18s}"
                f" {[lin.index(s) if s in lin else s.op.name for s in u.src]} {u.arg!r}"
            )
    outer = next((u for u in lin if u.op is Ops.RANGE and u.arg[1] == "global"), None)
    return KernelInfo(
        kernel_name(ast),
        tuple(lin),
        outer.src[0].arg if outer is not None else 1,
        estimate_ops(lin),
        sum(1 for u in lin if u.op is Ops.DEFINE_GLOBAL),
        tuple(opts),
    )


def estimate_ops(lin: list[UOp]) -> int:
    """ALU operations executed, counting each instruction once per iteration of the loops around it."""
    total, trips = 0, []
    from fusegrad.uop.ops import GroupOp

    for u in lin:
        if u.op is Ops.RANGE:
            trips.append(u.src[0].arg)
        elif u.op is Ops.ENDRANGE:
            trips.pop()
        elif u.op in GroupOp.ALU or u.op is Ops.ACC_UPDATE:
            total += prod(trips)
    return total
