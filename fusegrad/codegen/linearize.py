"""Orders a lowered kernel into a linear instruction list with explicit loop begin/end and accumulators."""

from __future__ import annotations
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from fusegrad.codegen.lowerer import identity
from fusegrad.uop.trampoline import Step, run_steps


def _reduce_to_acc(r: UOp, ctx: list[int]) -> UOp:
    """REDUCE(value, *ranges) -> ACC_UPDATE(DEFINE_ACC, value, *ranges); uses read the accumulator after the loop."""
    ctx[0] += 1
    acc = UOp(Ops.DEFINE_ACC, r.dtype, (UOp.const(r.dtype, identity(r.arg, r.dtype)),), ctx[0] - 1)
    return UOp(Ops.ACC_UPDATE, r.dtype, (acc, *r.src), r.arg)


pm_accumulators = PatternMatcher([(UPat(Ops.REDUCE, name="r"), _reduce_to_acc)])


def _loop_deps(nodes: list[UOp], deps: dict[UOp, frozenset[UOp]]) -> dict[UOp, frozenset[UOp]]:
    """The loops each node depends on (an accumulator result no longer depends on its own reduce loops)."""
    for u in nodes:
        if u in deps:
            continue
        if u.op is Ops.RANGE:
            deps[u] = frozenset((u,))
        elif u.op is Ops.ACC_UPDATE:
            deps[u] = deps[u.src[1]].difference(u.src[2:])
        else:
            deps[u] = frozenset().union(*(deps[s] for s in u.src))
    return deps


class LoopNests:
    """Which accumulators share a loop nest: those over the same loops that vary with the same enclosing loops.
    Unrolled copies of one reduce share its loops, but a copy whose body simplified away an enclosing loop's index
    (a blocked sum's lane that never reads the block index) sums outside that loop: it gets fresh copies of the loops,
    else the group's one loop nest would be opened outside the enclosing loop the others need."""

    def __init__(self, kernel: UOp):
        self.next_id = 1 + max((u.arg[0] for u in kernel.toposort() if u.op is Ops.RANGE), default=-1)
        self.deps: dict[UOp, frozenset[UOp]] = {}
        self.enclosing: dict[tuple[UOp, ...], frozenset[UOp]] = {}  # loops -> the enclosing loops of their first use
        self.fresh: dict[tuple[tuple[UOp, ...], frozenset[UOp]], tuple[UOp, ...]] = {}

    def separate(self, acc: UOp) -> UOp | None:
        loops, outside = acc.src[2:], _loop_deps(acc.toposort(gate=lambda x: x not in self.deps), self.deps)[acc]
        if self.enclosing.setdefault(loops, outside) == outside:
            return None
        if (loops, outside) not in self.fresh:
            self.fresh[(loops, outside)] = tuple(self._copy(r) for r in loops)
        new = dict(zip(loops, self.fresh[(loops, outside)]))
        body = graph_rewrite(acc.src[1], PatternMatcher([(UPat(Ops.RANGE, name="x"), lambda x: new.get(x))]))
        return acc.replace(src=(acc.src[0], body, *new.values()))

    def _copy(self, r: UOp) -> UOp:
        self.next_id += 1
        return r.replace(arg=(self.next_id - 1, r.arg[1]))


pm_loop_nests = PatternMatcher([(UPat(Ops.ACC_UPDATE, name="acc"), lambda ctx, acc: ctx.separate(acc))])


def linearize(kernel: UOp, params: list[UOp] | None = None) -> list[UOp]:
    kernel = graph_rewrite(kernel, pm_accumulators, ctx=[0])
    kernel = graph_rewrite(kernel, pm_loop_nests, ctx=LoopNests(kernel))
    nodes = kernel.toposort()
    deps = _loop_deps(nodes, {})
    params = sorted({u for u in nodes if u.op is Ops.DEFINE_GLOBAL} | set(params or ()), key=lambda u: u.arg[0])
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0])
    lin: list[UOp] = list(params)
    done: set[UOp] = set(lin)
    open_ranges: set[UOp] = set()

    # accumulators over the same loops (unrolled copies of one reduce) share one loop nest (see LoopNests)
    groups: dict[tuple[UOp, ...], list[UOp]] = {}
    for u in nodes:
        if u.op is Ops.ACC_UPDATE:
            groups.setdefault(u.src[2:], []).append(u)

    def emit(u: UOp) -> Step:
        # a step on run_steps' stack, not Python's: a kernel can be a chain of thousands of statements
        if u in done:
            return
        if u.op is Ops.ACC_UPDATE:
            loops = u.src[2:]
            group = [w for w in groups[loops] if w not in done]
            # hoist what the loop body needs but does not vary inside the loop; an inner accumulator is not hoisted,
            # it starts afresh right before its own loops
            for w in group:
                for n in w.src[1].toposort(gate=lambda x: x not in done):
                    if n not in done and n.op not in (Ops.RANGE, Ops.DEFINE_ACC) and deps[n] <= open_ranges:
                        yield emit(n)
            for w in group:
                lin.append(w.src[0])
                done.add(w.src[0])
            for r in loops:
                lin.append(r)
                done.add(r)
                open_ranges.add(r)
            # each update right after its value: values computed first and added last keep all of them live at
            # once (an 8x8 register tile's products spilled on a 16-register target)
            for w in group:
                yield emit(w.src[1])
                lin.append(w)
                done.add(w)
            for r in reversed(loops):
                lin.append(UOp(Ops.ENDRANGE, src=(r,)))
                open_ranges.discard(r)
            return
        for s in u.src:
            if s not in done:
                yield emit(s)
        if u.op is not Ops.SINK:
            lin.append(u)
        done.add(u)

    # a load no loop changes (a scalar parameter or constant) is read once, before the loops: the C compiler cannot
    # hoist it itself, as the output pointer might alias it
    for u in nodes:
        if u.op is Ops.LOAD and not deps[u]:
            run_steps(emit(u))
    # a symbolic loop bound (a reduce's too: the variable's clamped load is an expression) is computed before the loops
    for r in (u for u in nodes if u.op is Ops.RANGE and (u.arg[1] == "global" or not deps[u.src[0]])):
        run_steps(emit(r.src[0]))
    lin.extend(global_ranges)
    done.update(global_ranges)
    open_ranges.update(global_ranges)
    run_steps(emit(kernel))
    lin.extend(UOp(Ops.ENDRANGE, src=(r,)) for r in reversed(global_ranges))
    return lin
