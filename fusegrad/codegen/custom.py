"""lower_custom: a user-written kernel (uop/kernel.py's surface) -> a lowered kernel, SINK(STORE(DEFINE_GLOBAL, index,
value), ...) over RANGE loops, which the rest of codegen's stages take as they take the lowerer's.

The user's kernel is imperative (stores in order, registers set inside loops); the lowered kernel is a value graph.
Registers are evaluated away: each read of a register element is the value last stored into it, and a store ended by
REDUCE ranges whose value folds the element's own value with ADD, MUL or MAX (`acc + x`) is that fold, a REDUCE over
those loops. UPCAST and UNROLL ranges are unrolled: what they end is repeated once per value of the range."""

from __future__ import annotations
from fusegrad.dtype import dtypes
from fusegrad.uop.kernel import OUTPUT_AXES, REDUCE_AXES, UNROLLED_AXES, KernelInfo
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.uop.pattern import graph_rewrite
from fusegrad.uop.symbolic import pm_symbolic
from fusegrad.codegen.lowerer import identity, substitute

FOLDS = {Ops.ADD: Ops.ADD, Ops.MUL: Ops.MUL, Ops.MAX: Ops.MAX}


class CustomKernelError(ValueError):
    """A custom kernel that cannot be compiled as written."""


def is_custom(ast: UOp) -> bool:
    return ast.op is Ops.SINK and isinstance(ast.arg, KernelInfo)


def custom_name(ast: UOp) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in ast.arg.name) or "custom"


def lower_custom(sink: UOp) -> UOp:
    """The user's kernel (a SINK whose arg is a KernelInfo) as a lowered kernel; CustomKernelError names what is
    wrong in one that cannot be."""
    name = sink.arg.name
    if sink.arg.opts_to_apply:
        opts = sink.arg.opts_to_apply
        raise CustomKernelError(f"custom kernel {name!r}: opts_to_apply {opts} (custom kernels take no opts)")
    lowering = _Lowering(name)
    for s in unroll(sink).src:
        lowering.emit(s, ())
    if not lowering.stores:
        raise CustomKernelError(f"custom kernel {name!r} stores nothing: its sink holds no store into a placeholder")
    return graph_rewrite(UOp(Ops.SINK, src=tuple(lowering.stores)), pm_symbolic)


def unroll(root: UOp) -> UOp:
    """Each END over UPCAST / UNROLL ranges becomes one copy of what it ends per value of those ranges, in order."""
    memo: dict[UOp, UOp] = {}
    for u in root.toposort():
        new = u.replace(src=tuple(memo[s] for s in u.src)) if u.src else u
        if new.op is Ops.END and any(_axis(r) in UNROLLED_AXES for r in new.src[1:]):
            body = new.src[0]
            for r in new.src[1:]:
                if _axis(r) in UNROLLED_AXES:
                    body = UOp(Ops.GROUP, src=tuple(substitute(body, r, r.const_like(v)) for v in range(r.src[0].arg)))
            rest = tuple(r for r in new.src[1:] if _axis(r) not in UNROLLED_AXES)
            new = UOp(Ops.END, src=(body, *rest)) if rest else body
        memo[u] = new
    return memo[root]


def _axis(r: UOp):
    return r.arg[1]


class _Lowering:
    def __init__(self, name: str):
        self.name = name
        self.stores: list[UOp] = []
        self.ranges: dict[UOp, UOp] = {}
        # one memo per accumulation being evaluated: inside one, a read of its register gives the running value
        self.memos: list[dict[UOp, UOp]] = [{}]
        self.running: dict[tuple[UOp, int], UOp] = {}  # (register, element) -> its value so far in the loop body
        self.params: dict[int, UOp] = {}

    def fail(self, msg: str) -> CustomKernelError:
        return CustomKernelError(f"custom kernel {self.name!r}: {msg}")

    # ---- the sink's stores into global buffers
    def emit(self, x: UOp, ended: tuple[UOp, ...]) -> None:
        if x.op is Ops.DEFINE_GLOBAL:
            self._param(x)
        elif x.op is Ops.END:
            if bad := [r for r in x.src[1:] if _axis(r) not in OUTPUT_AXES]:
                raise self.fail(
                    f"a store into a global buffer ends {[(r.arg[0], _axis(r).name) for r in bad]}: only output loops "
                    "end there; sum over a REDUCE range into a REG placeholder and store that"
                )
            self.emit(x.src[0], ended + x.src[1:])
        elif x.op is Ops.GROUP:
            for s in x.src:
                self.emit(s, ended)
        elif x.op is Ops.STORE:
            self._global_store(x, ended)
        else:
            raise self.fail(f"a sink holds stores (STORE, END, GROUP), got {x.op.name}")

    def _global_store(self, st: UOp, ended: tuple[UOp, ...]) -> None:
        target, value = st.src
        base, flat = self.element(target)
        if base.op is not Ops.DEFINE_GLOBAL:
            raise self.fail("a register store at the top of the kernel is never read: store into a global placeholder")
        lowered = UOp(Ops.STORE, src=(self._param(base), flat, self.value(value)))
        open_loops = {self.range(r) for r in ended}
        for r in _free_ranges(lowered):
            if r.arg[1] == "reduce":
                raise self.fail(
                    f"the store into slot {base.arg[0]} uses REDUCE range {r.arg[0]} outside a register sum"
                )
            if r not in open_loops:
                raise self.fail(f"the store into slot {base.arg[0]} uses range {r.arg[0]} but does not .end() it")
        self.stores.append(lowered)

    def _param(self, g: UOp) -> UOp:
        if (seen := self.params.setdefault(g.arg[0], g)) is not g:
            two = f"{seen.dtype!r} x {seen.arg[1]} and {g.dtype!r} x {g.arg[1]}"
            raise self.fail(f"slot {g.arg[0]} is two placeholders: {two}")
        if g.arg[1] >= 2**31 - 1:
            raise self.fail(f"slot {g.arg[0]} holds {g.arg[1]} elements, more than 32-bit indices reach")
        return g

    # ---- values
    def range(self, r: UOp) -> UOp:
        if (lowered := self.ranges.get(r)) is None:
            axis = _axis(r)
            if axis in UNROLLED_AXES:
                raise self.fail(f"{axis.name} range {r.arg[0]} is used outside an END over it (what it unrolls)")
            kind = "reduce" if axis in REDUCE_AXES else "global"
            lowered = self.ranges[r] = UOp(Ops.RANGE, r.dtype, r.src, (r.arg[0], kind))
        return lowered

    def value(self, u: UOp) -> UOp:
        memo = self.memos[-1]
        if (r := memo.get(u)) is not None:
            return r
        nodes = u.toposort(gate=lambda x: x not in memo and x.op is not Ops.INDEX)
        for n in nodes:
            if n in memo:
                continue
            if n.op is Ops.RANGE:
                memo[n] = self.range(n)
            elif n.op is Ops.CONST:
                memo[n] = n
            elif n.op is Ops.INDEX:
                memo[n] = self.read(n)
            elif n.op in GroupOp.ALU or n.op in (Ops.CAST, Ops.BITCAST):
                memo[n] = n.replace(src=tuple(memo[s] for s in n.src))
            else:
                raise self.fail(f"{n.op.name} is not a value (values are indexed placeholders, ranges, ALU)")
        return memo[u]

    def read(self, ix: UOp) -> UOp:
        base, flat = self.element(ix)
        if base.op is Ops.DEFINE_GLOBAL:
            if any(s.op is not Ops.RANGE for a in _afters(ix.src[0]) for s in a.src[1:]):
                raise self.fail(f"slot {base.arg[0]} is read after a store into it in this kernel: split the kernel")
            return UOp(Ops.LOAD, base.dtype, (self._param(base), flat))
        e = self.const_element(base, flat)
        if (base, e) in self.running:
            return self.running[(base, e)]
        state = self.state(ix.src[0])
        if (base, e) not in state:
            raise self.fail(f"register {base.arg[0]} element {e} is read before anything is stored into it")
        return state[(base, e)]

    def element(self, ix: UOp) -> tuple[UOp, UOp]:
        """(the placeholder, the flat index) an INDEX names; an index provably outside its dim is an error."""
        if ix.op is not Ops.INDEX:
            raise self.fail(f"a store writes an indexed placeholder, got {ix.op.name}")
        view, idxs = ix.src[0], [self.value(i) for i in ix.src[1:]]
        for d, (i, n) in enumerate(zip(idxs, view.shape)):
            if i.vmin < 0 or i.vmax >= n:
                reach = f"reaches [{i.vmin}, {i.vmax}], outside [0, {n - 1}]"
                raise self.fail(f"index {d} of a placeholder of shape {view.shape} {reach}")
        return _view_index(view, idxs)

    def const_element(self, base: UOp, flat: UOp) -> int:
        flat = graph_rewrite(flat, pm_symbolic)
        if flat.op is not Ops.CONST:
            raise self.fail(
                f"register {base.arg[0]} is indexed by a loop index: index it with constants or UPCAST ranges"
            )
        return flat.arg

    # ---- registers
    def state(self, view: UOp) -> dict[tuple[UOp, int], UOp]:
        """(register, element) -> value, as the view's chain of AFTERs leaves the register."""
        if view.op is Ops.DEFINE_REG:
            return {}
        if view.op is Ops.AFTER:
            memo = self.memos[-1]
            if (state := memo.get(("state", view))) is None:  # type: ignore[call-overload]
                state = self.state(view.src[0])
                for dep in view.src[1:]:
                    state = self.apply(dep, state)
                memo[("state", view)] = state  # type: ignore[index]
            return state
        if view.op in GroupOp.Movement:
            return self.state(view.src[0])
        raise self.fail(f"a register view is a DEFINE_REG under movement ops and AFTERs, got {view.op.name}")

    def apply(self, dep: UOp, state: dict) -> dict:
        """state once dep (stores into registers, ended or grouped) ran."""
        if dep.op in (Ops.RANGE, Ops.CONST):
            return state  # a loop a read is inside (acc.after(k)): the running value is read there anyway
        if dep.op is Ops.GROUP:
            for s in dep.src:
                state = self.apply(s, state)
            return state
        if dep.op is Ops.AFTER:
            for s in dep.src[1:]:
                state = self.apply(s, state)
            return state
        if dep.op is Ops.STORE:
            base, flat = self.element(dep.src[0])
            if base.op is not Ops.DEFINE_REG:
                raise self.fail(f"a store into slot {base.arg[0]} orders a register's reads: store globals at the sink")
            key = (base, self.const_element(base, flat))
            value = self.value(dep.src[1])
            if key in self.running:
                self.running[key] = value
                self.memos[-1] = {}  # values read the running element: the next store's reads see this one
            return state | {key: value}
        if dep.op is Ops.END:
            if bad := [r for r in dep.src[1:] if _axis(r) not in REDUCE_AXES]:
                names = [(r.arg[0], _axis(r).name) for r in bad]
                raise self.fail(f"a register store ends {names}: it ends REDUCE ranges only")
            return self.accumulate(dep.src[0], dep.src[1:], state)
        raise self.fail(f"{dep.op.name} is not a store, an END or a GROUP")

    def accumulate(self, body: UOp, loops: tuple[UOp, ...], state: dict) -> dict:
        targets = self.targets(body)
        depth = len(self.memos)
        markers = {t: UOp(Ops.DEFINE_ACC, t[0].dtype, (), ("running", t[0].arg[0], t[1], depth)) for t in targets}
        saved = self.running
        self.running = saved | markers
        self.memos.append({})
        try:
            self.apply(body, state)
            finals = {t: self.running[t] for t in targets}
        finally:
            self.memos.pop()
            self.running = saved
        out = dict(state)
        ranges = tuple(self.range(r) for r in loops)
        for t, f in finals.items():
            op, terms = self.fold(f, markers[t], t)
            if t not in state:
                raise self.fail(f"register {t[0].arg[0]} element {t[1]} is accumulated before it is set (.set(init))")
            total = terms[0]
            for x in terms[1:]:
                total = total.alu(op, x)
            reduced = UOp(Ops.REDUCE, total.dtype, (total, *ranges), op)
            init = state[t]
            # a REDUCE starts from its identity: an initial value equal to it adds nothing (acc = 0.0 for a sum)
            starts_at_identity = init.op is Ops.CONST and init.arg == identity(op, init.dtype)
            out[t] = reduced if starts_at_identity else init.alu(op, reduced)
        return out

    def targets(self, x: UOp) -> list[tuple[UOp, int]]:
        if x.op is Ops.STORE:
            base, flat = self.element(x.src[0])
            return [(base, self.const_element(base, flat))] if base.op is Ops.DEFINE_REG else []
        if x.op in (Ops.GROUP, Ops.END):
            return list(dict.fromkeys(t for s in (x.src if x.op is Ops.GROUP else x.src[:1]) for t in self.targets(s)))
        return []

    def fold(self, f: UOp, marker: UOp, t: tuple[UOp, int]) -> tuple[Ops, list[UOp]]:
        """f = op(op(marker, x0), x1)...: (op, [x0, x1, ...]), none of the xs reading the marker."""
        terms: list[UOp] = []
        op = f.op
        while f is not marker:
            if f.op not in FOLDS or f.op is not op or len(f.src) != 2:
                break
            a, b = f.src
            a_in, b_in = _reads(a, marker), _reads(b, marker)
            if a_in == b_in:
                break
            f, x = (a, b) if a_in else (b, a)
            terms.append(x)
        if f is not marker or not terms:
            raise self.fail(
                f"register {t[0].arg[0]} element {t[1]} is set inside a REDUCE loop to a value that is not its own "
                "value folded with ADD, MUL or MAX (acc + x, acc * x, acc.maximum(x))"
            )
        return op, terms[::-1]


def _reads(u: UOp, marker: UOp) -> bool:
    return any(n is marker for n in u.toposort())


def _afters(view: UOp) -> list[UOp]:
    out = []
    while view.op in GroupOp.Movement or view.op is Ops.AFTER:
        if view.op is Ops.AFTER:
            out.append(view)
        view = view.src[0]
    return out


def _view_index(view: UOp, idxs: list[UOp]) -> tuple[UOp, UOp]:
    """(DEFINE_GLOBAL or DEFINE_REG, flat index) of the element at idxs of a chain of views and AFTERs over it."""
    while True:
        op = view.op
        if op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_REG):
            return view, idxs[0]
        src = view.src[0]
        if op is Ops.RESHAPE:
            flat = _flat(idxs, view.shape)
            idxs = _unflat(flat, src.shape)
        elif op is Ops.SHRINK:
            idxs = [i + b if b else i for i, (b, _) in zip(idxs, view.arg)]
        elif op is Ops.PERMUTE:
            old = [None] * len(idxs)
            for new_axis, old_axis in enumerate(view.arg):
                old[old_axis] = idxs[new_axis]
            idxs = old  # type: ignore[assignment]
        elif op is Ops.FLIP:
            idxs = [(d - 1) - i if f else i for i, f, d in zip(idxs, view.arg, view.shape)]
        elif op is not Ops.AFTER:
            raise CustomKernelError(f"a placeholder view is RESHAPE / SHRINK / PERMUTE / FLIP / AFTER, got {op.name}")
        view = src


def _flat(idxs: list[UOp], shape: tuple[int, ...]) -> UOp:
    out, stride = UOp.const(dtypes.int32, 0), 1
    for i, d in reversed(list(zip(idxs, shape))):
        if d != 1:
            out = out + i * stride
        stride *= d
    return out


def _unflat(flat: UOp, shape: tuple[int, ...]) -> list[UOp]:
    out, stride = [], 1
    for j, d in reversed(list(enumerate(shape))):
        out.append(UOp.const(dtypes.int32, 0) if d == 1 else (flat // stride) % d if j > 0 else flat // stride)
        stride *= d
    return out[::-1]


def _free_ranges(u: UOp) -> set[UOp]:
    """The RANGEs u depends on outside the REDUCEs that loop over them."""
    free: dict[UOp, frozenset] = {}
    for n in u.toposort():
        if n.op is Ops.RANGE:
            free[n] = frozenset((n,))
        elif n.op is Ops.REDUCE:
            free[n] = free[n.src[0]].difference(n.src[1:])
        else:
            free[n] = frozenset().union(*(free[s] for s in n.src))
    return set(free[u])


__all__ = ["lower_custom", "is_custom", "custom_name", "CustomKernelError"]
