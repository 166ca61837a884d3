"""What a valid kernel graph is as the scheduler emits it and between codegen stages; `check_kernel_ast`,
`check_graph` and `check_linear` raise SpecError on the first node that breaks it. The per-node rules are
PatternMatchers whose callbacks return the reason a node is invalid."""

from __future__ import annotations
from fusegrad.dtype import NARROW_FLOATS, dtypes
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat


class SpecError(Exception):
    """A kernel graph that breaks the spec of the stage it came out of."""

    def __init__(self, stage: str, u: UOp, reason: str):
        super().__init__(f"after stage {stage!r}: {u.op.name} ({u.dtype!r}, arg={u.arg!r}): {reason}")
        self.stage, self.uop, self.reason = stage, u, reason


def _index_reason(u: UOp, what: str) -> str | None:
    if len(u.src) < 2 or u.src[0].op is not Ops.DEFINE_GLOBAL:
        return f"a {what} indexes a DEFINE_GLOBAL, got {[s.op.name for s in u.src[:1]]}"
    if not dtypes.is_int(u.src[1].dtype):
        return f"a {what} index is an integer, got {u.src[1].dtype!r}"
    return None


def _load_reason(u: UOp) -> str | None:
    if (reason := _index_reason(u, "LOAD")) is not None:
        return reason
    if len(u.src) not in (2, 3) or (len(u.src) == 3 and u.src[2].dtype is not dtypes.bool):
        return f"a LOAD is (buffer, index[, bool gate]), got sources {[s.dtype for s in u.src]}"
    if u.dtype is not u.src[0].dtype:
        return f"a LOAD reads the buffer's dtype {u.src[0].dtype!r}"
    return None


def _store_reason(u: UOp) -> str | None:
    if (reason := _index_reason(u, "STORE")) is not None:
        return reason
    if len(u.src) != 3 or u.src[2].dtype is not u.src[0].dtype:
        return f"a STORE writes (buffer, index, value) with the buffer's dtype {u.src[0].dtype!r}"
    return None


def _alu_reason(u: UOp) -> str | None:
    if u.op in GroupOp.Unary and (len(u.src) != 1 or u.src[0].dtype is not u.dtype):
        return f"a unary op keeps its source's dtype, got {[s.dtype for s in u.src]}"
    if u.op in GroupOp.Binary:
        if len(u.src) != 2 or u.src[0].dtype is not u.src[1].dtype:
            return f"a binary op's sources share one dtype, got {[s.dtype for s in u.src]}"
        out = dtypes.bool if u.op in GroupOp.Comparison else u.src[0].dtype
        if u.dtype is not out:
            return f"the result is {out!r}"
    if u.op is Ops.WHERE and (
        len(u.src) != 3 or u.src[0].dtype is not dtypes.bool or not u.src[1].dtype is u.src[2].dtype is u.dtype
    ):
        return f"a WHERE is (bool, x, x) -> x, got {[s.dtype for s in u.src]} -> {u.dtype!r}"
    return None


def _range_reason(u: UOp) -> str | None:
    if len(u.src) != 1 or not dtypes.is_int(u.dtype) or u.src[0].dtype is not u.dtype:
        return f"a RANGE counts an integer to a bound of its dtype, got {[s.op.name for s in u.src]}"
    if u.src[0].op is Ops.CONST and u.src[0].arg < 0:
        # an empty loop (a reduce over a 0-sized axis) runs zero times and leaves the identity; a symbolic bound (a
        # bound variable's size) is checked non-negative when the variable is bound
        return f"a RANGE counts to a non-negative constant or a symbolic size, got {u.src[0].arg}"
    if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[1] in ("global", "reduce")):
        return "a RANGE's arg is (id, 'global' | 'reduce')"
    return None


def _reduce_reason(u: UOp) -> str | None:
    if u.arg not in (Ops.ADD, Ops.MUL, Ops.MAX) or u.src[0].dtype is not u.dtype:
        return f"a REDUCE folds its value's dtype with ADD, MUL or MAX, got {u.src[0].dtype!r}"
    if len(u.src) < 2 or any(r.op is not Ops.RANGE or r.arg[1] != "reduce" for r in u.src[1:]):
        return f"a REDUCE runs over reduce RANGEs, got {[s.op.name for s in u.src[1:]]}"
    return None


# the nodes a lowered kernel is made of: tensor-level ops (movement, REDUCE_AXIS, BUFFER, ...) are gone
LOWERED_OPS = GroupOp.ALU | {
    Ops.SINK,
    Ops.STORE,
    Ops.LOAD,
    Ops.DEFINE_GLOBAL,
    Ops.DEFINE_VAR,
    Ops.RANGE,
    Ops.REDUCE,
    Ops.CONST,
    Ops.CAST,
    Ops.BITCAST,
}

_NODE_RULES = [
    (UPat(Ops.SINK, name="u"), lambda u: None if all(s.op is Ops.STORE for s in u.src) else "a SINK holds STOREs"),
    (UPat(Ops.STORE, name="u"), _store_reason),
    (UPat(Ops.LOAD, name="u"), _load_reason),
    (UPat(Ops.RANGE, name="u"), _range_reason),
    (UPat(Ops.REDUCE, name="u"), _reduce_reason),
    (UPat(GroupOp.ALU, name="u"), _alu_reason),
    (UPat((Ops.CAST, Ops.BITCAST), name="u"), lambda u: None if len(u.src) == 1 else "a cast has one source"),
    (UPat(Ops.CONST, name="u"), lambda u: "a CONST has no sources" if u.src else None),
    (
        UPat(Ops.DEFINE_GLOBAL, name="u"),
        lambda u: None if not u.src and isinstance(u.arg, tuple) else "a DEFINE_GLOBAL is a leaf (index, size)",
    ),
]
spec_lowered = PatternMatcher(
    _NODE_RULES + [(UPat(name="u"), lambda u: None if u.op in LOWERED_OPS else "not an op of a lowered kernel")]
)

_VIA_FLOAT32 = (dtypes.bfloat16,) + dtypes.fp8s


def _narrow_cast_reason(u: UOp) -> str | None:
    a, b = u.src[0].dtype, u.dtype
    if a in dtypes.fp8s and b is dtypes.float64 or b in dtypes.fp8s and a is dtypes.float64:
        return None if b in dtypes.fp8s else "fp8 converts to float32 only"
    if (a in _VIA_FLOAT32 or b in _VIA_FLOAT32) and dtypes.float32 not in (a, b):
        return f"{a!r} -> {b!r}: bfloat16 and fp8 convert through float32"
    return None


# after decompose: the device computes half, bfloat16 and fp8 arithmetic in float32; narrow floats are only stored
spec_decomposed = (
    PatternMatcher(
        [
            (
                UPat(GroupOp.ALU, name="u"),
                lambda u: (
                    "narrow float arithmetic is computed in float32"
                    if u.dtype in NARROW_FLOATS or any(s.dtype in NARROW_FLOATS for s in u.src)
                    else None
                ),
            ),
            (
                UPat(Ops.REDUCE, name="u"),
                lambda u: "a narrow float sum accumulates in float32" if u.dtype in NARROW_FLOATS else None,
            ),
            (UPat(Ops.CAST, name="u"), _narrow_cast_reason),
        ]
    )
    + spec_lowered
)

GRAPH_SPECS = {"lowered": spec_lowered, "decomposed": spec_decomposed}


def check_graph(kernel: UOp, spec: str, stage: str) -> None:
    """Every node of kernel satisfies the named spec, else SpecError names the stage, the node and why."""
    if kernel.op is not Ops.SINK:
        raise SpecError(stage, kernel, "a kernel's root is a SINK")
    pm = GRAPH_SPECS[spec]
    for u in kernel.toposort():
        if (reason := pm.rewrite(u)) is not None:
            raise SpecError(stage, u, reason)


# the nodes of a kernel's AST as the scheduler emits it: tensor-level ops over parameters (what codegen's lowerer has a
# rule for); the graph's storage (BUFFER, BIND), realize points (ASSIGN, COPY) and devices (MULTI) are gone
KERNEL_AST_OPS = (
    GroupOp.Elementwise
    | GroupOp.Movement
    | {
        Ops.SINK,
        Ops.STORE,
        Ops.DEFINE_GLOBAL,
        Ops.DEFINE_VAR,
        Ops.CONST,
        Ops.ARANGE,
        Ops.GATHER,
        Ops.REDUCE_AXIS,
        Ops.CONTIGUOUS,
        Ops.DETACH,
    }
)


def _kernel_sink_reason(u: UOp) -> str | None:
    stores = [x for x in u.src if x.op is Ops.STORE]
    if not stores or any(x.op not in (Ops.STORE, Ops.DEFINE_VAR) for x in u.src):
        return "a kernel's SINK holds its STOREs and its DEFINE_VARs"
    return None


def _kernel_store_reason(u: UOp) -> str | None:
    if len(u.src) != 2:
        return "a kernel's STORE is (target, value)"
    target = u.src[0].peel(GroupOp.Movement)
    return None if target.op is Ops.DEFINE_GLOBAL else "a STORE writes a DEFINE_GLOBAL or a view of one"


spec_kernel_ast = PatternMatcher(
    [
        (UPat(Ops.SINK, name="u"), _kernel_sink_reason),
        (UPat(Ops.STORE, name="u"), _kernel_store_reason),
        (UPat(name="u"), lambda u: None if u.op in KERNEL_AST_OPS else "not an op of a scheduled kernel"),
    ]
)


def check_kernel_ast(ast: UOp) -> None:
    """A kernel the scheduler emits (SINK(STORE(target, value), *DEFINE_VARs)) holds only what codegen lowers."""
    if ast.op is not Ops.SINK:
        raise SpecError("schedule", ast, "a kernel's root is a SINK")
    for u in ast.toposort():
        if (reason := spec_kernel_ast.rewrite(u)) is not None:
            raise SpecError("schedule", u, reason)


LINEAR_OPS = (LOWERED_OPS - {Ops.SINK, Ops.REDUCE}) | {Ops.DEFINE_ACC, Ops.ACC_UPDATE, Ops.ENDRANGE}

spec_linear = PatternMatcher(
    [
        (
            UPat(Ops.ACC_UPDATE, name="u"),
            lambda u: (
                None
                if u.src[0].op is Ops.DEFINE_ACC
                and u.src[1].dtype is u.dtype is u.src[0].dtype
                and all(r.op is Ops.RANGE for r in u.src[2:])
                else "an ACC_UPDATE is (DEFINE_ACC, value, *RANGEs) of one dtype"
            ),
        ),
        (
            UPat(Ops.DEFINE_ACC, name="u"),
            lambda u: None if len(u.src) == 1 and u.src[0].op is Ops.CONST else "a DEFINE_ACC starts from a CONST",
        ),
        (
            UPat(Ops.ENDRANGE, name="u"),
            lambda u: None if len(u.src) == 1 and u.src[0].op is Ops.RANGE else "an ENDRANGE closes one RANGE",
        ),
    ]
    + _NODE_RULES
    + [(UPat(name="u"), lambda u: None if u.op in LINEAR_OPS else "not an op of a linear kernel")]
)


def check_linear(lin: list[UOp], stage: str = "linearize") -> None:
    """The instruction list runs in order: each RANGE is closed by its ENDRANGE innermost-first, every source (but an
    inlined CONST) comes before its use and, if it varies with loops, inside them; an accumulator is defined before
    the loops it sums over."""
    position: dict[UOp, int] = {}
    scope: dict[UOp, tuple[UOp, ...]] = {}  # the loops open where a value is defined: it is visible inside them only
    open_ranges: list[UOp] = []
    opened: set[UOp] = set()
    for i, u in enumerate(lin):
        if (reason := spec_linear.rewrite(u)) is not None:
            raise SpecError(stage, u, reason)
        for s in u.src:
            if s.op is Ops.CONST or (u.op is Ops.ENDRANGE and s in opened):
                continue
            if s not in position:
                raise SpecError(stage, u, f"source {s.op.name} is used at {i} before it is defined")
            if s.op is Ops.RANGE and s not in open_ranges:
                raise SpecError(stage, u, f"uses RANGE {s.arg} outside its loop")
            if s.op is not Ops.RANGE and tuple(open_ranges[: len(scope[s])]) != scope[s]:
                raise SpecError(stage, u, f"uses {s.op.name} (at {position[s]}) after the loop it is defined in closed")
        if u.op is Ops.ENDRANGE:
            if not open_ranges or open_ranges[-1] is not u.src[0]:
                innermost = open_ranges[-1].arg if open_ranges else None
                raise SpecError(stage, u, f"closes RANGE {u.src[0].arg}, innermost open is {innermost}")
            open_ranges.pop()
        elif u.op is Ops.RANGE:
            if u in opened:
                raise SpecError(stage, u, "a RANGE opens once")
            opened.add(u)
            open_ranges.append(u)
        elif u.op is Ops.ACC_UPDATE and any(position[r] < position[u.src[0]] for r in u.src[2:]):
            raise SpecError(stage, u, "its DEFINE_ACC comes after the loops it accumulates over")
        position[u] = i
        # an accumulator's value lives on after its loops, where it was defined
        scope[u] = scope[u.src[0]] if u.op is Ops.ACC_UPDATE else tuple(open_ranges)
    if open_ranges:
        raise SpecError(stage, open_ranges[-1], "a RANGE is never closed")
