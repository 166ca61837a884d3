"""Lowers one kernel AST to a simplified, linear list of UOps through the named STAGES below."""

from __future__ import annotations
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable
from fusegrad.helpers import DEBUG, EMULATED_DTYPES, NOOPT, SPEC, prod
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.sint import sym_str
from fusegrad.uop.spec import check_graph, check_linear
from fusegrad.codegen.lowerer import lower_kernel, output_value, reads_own_output
from fusegrad.codegen.opt import Opt, OptError, OptOps
from fusegrad.codegen.opt.heuristic import hand_coded_opts
from fusegrad.codegen.linearize import linearize
from fusegrad.codegen.decompose import decompose_for_device
from fusegrad.codegen.accumulators import block_long_sums
from fusegrad.codegen.emulate import emulate_dtypes, emulated_dtypes, emulated_param
from fusegrad.codegen.custom import custom_name, is_custom, lower_custom
from fusegrad.codegen.opt.packs import Pack, find_packs
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from fusegrad.dtype import dtypes

if TYPE_CHECKING:
    from fusegrad.renderer import Capabilities, Renderer


def _load_var(v: UOp, g: UOp) -> UOp:
    """The variable's load, clamped to the variable's bounds (which binding already checked, so the clamp changes
    no value): a load's range is its dtype's, and index arithmetic over it would then be written wrapping (unsigned),
    which keeps GCC from vectorizing the loops a symbolic size bounds."""
    value = UOp(Ops.LOAD, g.dtype, (g, UOp.const(dtypes.int32, 0))).cast(v.dtype).maximum(v.arg[1])
    return value.alu(Ops.CMPLT, value.const_like(v.arg[2])).where(value, value.const_like(v.arg[2]))


# a kernel variable (schedule/variables.py) is element 0 of its int32 parameter buffer
pm_load_vars = PatternMatcher([(UPat(Ops.DEFINE_VAR, src=(UPat(Ops.DEFINE_GLOBAL, name="g"),), name="v"), _load_var)])


@dataclass(frozen=True)
class KernelInfo:
    """What a renderer needs besides the instructions: a name and the size of the loop split across threads."""

    name: str
    lin: tuple[UOp, ...]
    outer_size: int  # trip count of the outermost global loop (1 when there is none)
    ops_estimate: int
    nparams: int
    opts: tuple[Opt, ...] = ()  # the opts the lowerer applied
    # upcast lanes the renderer prints as one vector (the pack_vectors stage), by instruction: (pack, lane)
    packs: dict[UOp, tuple[Pack, int]] = field(default_factory=dict, compare=False)


def kernel_name(ast: UOp) -> str:
    """E_<output shape> for elementwise kernels, r_<output>_<reduced sizes> for kernels that reduce; a custom kernel's
    own name."""
    if is_custom(ast):
        return custom_name(ast)
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
    return ("r_" if reduced else "E_") + "_".join(_dim_name(d) for d in out_shape + reduced)


def _dim_name(d: int | UOp) -> str:
    # a symbolic size by its formula, in the characters a C identifier may hold
    return str(d) if isinstance(d, int) else re.sub(r"\W+", "_", sym_str(d)).strip("_")


@dataclass
class CodegenState:
    """What the stages pass along: the kernel graph, the chosen opts and, at the end, the instruction list."""

    ast: UOp
    capabilities: Capabilities  # what the target can do: the heuristics plan for its vectors and loops
    opts: tuple[Opt, ...] | None
    kernel: UOp | None = None
    lin: list[UOp] | None = None
    max_trips: dict | None = None  # range arg -> the most trips of a symbolic loop (its variables at their largest)
    chosen: bool = False  # the opts are the heuristics' choice (not given by the caller)
    packs: dict[UOp, tuple[Pack, int]] = field(default_factory=dict)


def _lower(s: CodegenState) -> None:
    s.kernel = lower_kernel(s.ast)


def _lower_custom(s: CodegenState) -> None:
    if s.opts:
        raise OptError(f"custom kernel {custom_name(s.ast)!r} takes no opts, got {list(s.opts)}")
    s.kernel, s.opts = lower_custom(s.ast), ()


def _choose_opts(s: CodegenState) -> None:
    if s.opts is None:
        s.opts = (
            ()
            if NOOPT
            else tuple(hand_coded_opts(output_value(s.ast), s.kernel, reads_own_output(s.kernel), s.capabilities))
        )
        s.chosen = True
    if DEBUG >= 3:
        print(f"{kernel_name(s.ast)} opts: {list(s.opts)}")


def _lower_with_opts(s: CodegenState) -> None:
    if not s.opts:
        return
    try:
        s.kernel = _lower_for_target(s, s.opts)
    except OptError as e:
        if not s.chosen:
            raise  # opts the caller gave (BEAM, a test) are theirs to fix
        # the heuristics' choice must never fail a user's kernel: drop the refused opt, or fall back to none
        if DEBUG >= 2:
            print(f"{kernel_name(s.ast)}: the checker refused the chosen opts ({e}); trying without each")
        for opts in [s.opts[:i] + s.opts[i + 1 :] for i in reversed(range(len(s.opts)))] + [()]:
            try:
                s.kernel, s.opts = _lower_for_target(s, opts) if opts else s.kernel, opts
                break
            except OptError:
                continue


def _lower_for_target(s: CodegenState, opts: tuple[Opt, ...]) -> UOp:
    block = next((o for o in opts if o.op is OptOps.REDUCE_BLOCK), None)
    if s.capabilities.parallel_loops and block is not None:
        # its blocks add partial sums into the output one after another: as parallel work items they would race
        raise OptError(f"{block}: this target runs global loops in parallel, and the reduce's blocks must run in order")
    return lower_kernel(s.ast, opts)


def _decompose(s: CodegenState) -> None:
    s.kernel = decompose_for_device(s.kernel, s.capabilities)


def _block_long_sums(s: CodegenState) -> None:
    # after decompose: half sums already accumulate in float32, so the partials between levels stay float32
    s.kernel = block_long_sums(s.kernel)


def _emulate_dtypes(s: CodegenState) -> None:
    # after decompose and the float32 partials: what is left of a narrow float is its loads, stores and casts
    s.kernel = emulate_dtypes(s.kernel, emulated_dtypes(EMULATED_DTYPES.value))


def _linearize(s: CodegenState) -> None:
    # every buffer stays a parameter even when simplification removed its loads (x % 1 reads nothing); a variable,
    # simplified with its range until now, becomes the load of its parameter
    s.max_trips = {
        u.arg: u.src[0].vmax for u in s.kernel.toposort() if u.op is Ops.RANGE and u.src[0].op is not Ops.CONST
    }
    kernel = graph_rewrite(s.kernel, pm_load_vars)
    params = [emulated_param(u, emulated_dtypes(EMULATED_DTYPES.value)) for u in s.ast.toposort()]
    s.lin = linearize(kernel, params=[u for u in params if u.op is Ops.DEFINE_GLOBAL])


def _pack_vectors(s: CodegenState) -> None:
    s.packs = pack_vectors(tuple(s.lin), s.capabilities)


def pack_vectors(lin: tuple[UOp, ...], caps: Capabilities) -> dict[UOp, tuple[Pack, int]]:
    """The upcast lanes of lin that run as one vector of the target's (find_packs, up to caps.packed_bytes wide and
    with its vector_math); none where the target prints no vector types."""
    if not caps.vector_types:
        return {}
    return find_packs(lin, caps.packed_bytes, caps.vector_math, caps.loop_vectorizer)


@dataclass(frozen=True)
class Stage:
    """One named step of codegen and the spec (uop/spec.py) its output satisfies."""

    name: str
    run: Callable[[CodegenState], None]
    spec: str  # "lowered" / "decomposed": a graph spec; "linear": the instruction list's


STAGES: tuple[Stage, ...] = (
    Stage("lower", _lower, "lowered"),
    Stage("choose_opts", _choose_opts, "lowered"),
    Stage("lower_with_opts", _lower_with_opts, "lowered"),
    Stage("decompose", _decompose, "decomposed"),
    Stage("block_long_sums", _block_long_sums, "decomposed"),
    Stage("emulate_dtypes", _emulate_dtypes, "decomposed"),
    Stage("linearize", _linearize, "linear"),
    Stage("pack_vectors", _pack_vectors, "linear"),
)

# a user-written kernel (uop/kernel.py) enters after lowering: its loops and stores are the user's, opts apply none
CUSTOM_STAGES: tuple[Stage, ...] = (Stage("lower_custom", _lower_custom, "lowered"),) + STAGES[3:]


def _show(stage: Stage, s: CodegenState) -> None:
    print(f"--- {kernel_name(s.ast)} after {stage.name}")
    if s.lin is None:
        print(s.kernel)
    elif DEBUG >= 6:
        for i, u in enumerate(s.lin):
            print(
                f"{i:4d} {u.op.name:12s} {u.dtype!r:18s}"
                f" {[s.lin.index(x) if x in s.lin else x.op.name for x in u.src]} {u.arg!r}"
            )


def lower_to_linear(ast: UOp, renderer: Renderer, opts: tuple[Opt, ...] | None = None) -> KernelInfo:
    """Runs STAGES in order: lower without opts -> choose opts (the heuristics, or none under NOOPT=1; or the given
    ones) -> lower with them -> decompose -> block long sums -> emulate dtypes (EMULATED_DTYPES) -> linearize -> pack
    vectors (the lanes the target runs as one vector of its vector types).
    renderer: the device's; its capabilities are what the heuristics plan for (vector width and registers), and on a
    target that runs every global loop in parallel work items (parallel_loops) a REDUCE_BLOCK is refused.
    DEBUG>=5 prints the graph after each stage, DEBUG>=6 the instruction list; SPEC=1 checks each stage's output
    against its spec."""
    state = CodegenState(ast, renderer.capabilities, None if opts is None else tuple(opts))
    for stage in CUSTOM_STAGES if is_custom(ast) else STAGES:
        stage.run(state)
        if SPEC and state.lin is not None:
            check_linear(state.lin, stage.name)
        elif SPEC:
            check_graph(state.kernel, stage.spec, stage.name)
        if DEBUG >= 5:
            _show(stage, state)
    lin = state.lin
    outer = next((u for u in lin if u.op is Ops.RANGE and u.arg[1] == "global"), None)
    return KernelInfo(
        kernel_name(ast),
        tuple(lin),
        outer.src[0].arg if outer is not None else 1,
        estimate_ops(lin, state.max_trips),
        sum(1 for u in lin if u.op is Ops.DEFINE_GLOBAL),
        state.opts,
        state.packs,
    )


def estimate_ops(lin: list[UOp], max_trips: dict | None = None) -> int:
    """ALU operations executed, counting each instruction once per iteration of the loops around it; a symbolic loop
    counts its most trips (`max_trips` by range arg), so threads split it when it can be long."""
    total, trips = 0, []
    from fusegrad.uop.ops import GroupOp

    for u in lin:
        if u.op is Ops.RANGE:
            trips.append(u.src[0].arg if u.src[0].op is Ops.CONST else (max_trips or {}).get(u.arg, 1))
        elif u.op is Ops.ENDRANGE:
            trips.pop()
        elif u.op in GroupOp.ALU or u.op is Ops.ACC_UPDATE:
            total += prod(trips)
    return total
