"""UPat, PatternMatcher and graph_rewrite: declarative rules applied over a UOp graph until nothing matches."""

from __future__ import annotations
import inspect
import itertools
from typing import Any, Callable, Iterable
from fusegrad.dtype import DType
from fusegrad.helpers import DEBUG, Hooks
from fusegrad.uop.ops import GroupOp, Ops, UOp


class UPat:
    """A pattern over UOps. `src` as a tuple matches in order; as a list it matches in any order (commutative ops)."""

    __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len")

    def __init__(
        self,
        op: Ops | Iterable[Ops] | None = None,
        dtype: DType | Iterable[DType] | None = None,
        src: tuple[UPat, ...] | list[UPat] | UPat | None = None,
        arg: Any = None,
        name: str | None = None,
        allow_any_len: bool = False,
    ):
        self.op = None if op is None else (frozenset((op,)) if isinstance(op, Ops) else frozenset(op))
        self.dtype = None if dtype is None else (frozenset((dtype,)) if isinstance(dtype, DType) else frozenset(dtype))
        self.src = (src,) if isinstance(src, UPat) else src
        self.arg, self.name, self.allow_any_len = arg, name, allow_any_len

    @staticmethod
    def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype, name=name)

    @staticmethod
    def const(dtype: DType | Iterable[DType] | None, value: Any) -> UPat:
        return UPat(Ops.CONST, dtype, arg=value)

    def _bin(self, op: Ops, x: Any, reverse: bool = False) -> UPat:
        other = x if isinstance(x, UPat) else UPat(Ops.CONST, arg=x)
        srcs = [other, self] if reverse else [self, other]
        return UPat(op, src=srcs if op in GroupOp.Commutative else tuple(srcs))

    def __add__(self, x):
        return self._bin(Ops.ADD, x)

    def __radd__(self, x):
        return self._bin(Ops.ADD, x, True)

    def __mul__(self, x):
        return self._bin(Ops.MUL, x)

    def __rmul__(self, x):
        return self._bin(Ops.MUL, x, True)

    def __floordiv__(self, x):
        return self._bin(Ops.IDIV, x)

    def __mod__(self, x):
        return self._bin(Ops.MOD, x)

    def __lt__(self, x):
        return self._bin(Ops.CMPLT, x)

    def maximum(self, x):
        return self._bin(Ops.MAX, x)

    def ne(self, x):
        return self._bin(Ops.CMPNE, x)

    def eq(self, x):
        return self._bin(Ops.CMPEQ, x)

    def alu(self, op: Ops, *src: UPat) -> UPat:
        return UPat(op, src=[self, *src] if op in GroupOp.Commutative else (self, *src))

    def match(self, u: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
        if self.op is not None and u.op not in self.op:
            return []
        if self.dtype is not None and u.dtype not in self.dtype:
            return []
        if self.arg is not None and (type(u.arg) is not type(self.arg) or u.arg != self.arg):
            return []
        if self.name is not None:
            if self.name in store:
                return [store] if store[self.name] is u else []
            store = {**store, self.name: u}
        if self.src is None:
            return [store]
        if len(u.src) != len(self.src) and not (self.allow_any_len and len(u.src) >= len(self.src)):
            return []
        orders = itertools.permutations(self.src) if isinstance(self.src, list) else (self.src,)
        out: list[dict[str, UOp]] = []
        for order in orders:
            stores = [store]
            for pat, s in zip(order, u.src):
                stores = [m for st in stores for m in pat.match(s, st)]
                if not stores:
                    break
            out.extend(stores)
        return out

    def __repr__(self) -> str:
        return (
            f"UPat(op={self.op and sorted(o.name for o in self.op)}, name={self.name!r}, src={self.src!r},"
            f" arg={self.arg!r})"
        )


class PatternMatcher:
    """Rules `(UPat, fn)`; fn gets the named captures (and `ctx` if it asks for it) and returns a UOp or None."""

    def __init__(self, patterns: list[tuple[UPat, Callable[..., UOp | None]]]):
        self.patterns = patterns
        self.by_op: dict[Ops | None, list[tuple[UPat, Callable, bool]]] = {}
        for pat, fn in patterns:
            wants_ctx = "ctx" in inspect.signature(fn).parameters
            for op in pat.op if pat.op is not None else (None,):
                self.by_op.setdefault(op, []).append((pat, fn, wants_ctx))
        for op, rules in self.by_op.items():  # rules without an op apply to every op, after the op's own rules
            if op is not None:
                rules.extend(self.by_op.get(None, []))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.patterns + other.patterns)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        for pat, fn, wants_ctx in self.by_op.get(u.op, self.by_op.get(None, [])):
            for store in pat.match(u, {}):
                ret = fn(**store, ctx=ctx) if wants_ctx else fn(**store)
                if ret is not None and ret is not u:
                    return ret
        return None


class RewriteLoopError(RuntimeError):
    pass


def graph_rewrite(
    root: UOp, pm: PatternMatcher, ctx: Any = None, bottom_up: bool = True, max_depth: int = 2_000
) -> UOp:
    """Apply pm until nothing matches. bottom_up: rewrite a node's sources before the node; else the node first.
    A rule set that cycles (a -> b -> a) or keeps growing the graph raises RewriteLoopError instead of hanging.
    The walk keeps its own stack, so graphs of any depth rewrite within Python's default recursion limit."""
    done: dict[UOp, UOp] = {}
    active: set[UOp] = set()
    # frames [node, stage, next source index, rewrite result being visited, is a rewrite result]
    stack: list[list[Any]] = [[root, _ENTER, 0, None, False]]
    nested = 0  # rewrite results being visited inside one another
    depth_limit = max_depth  # raised to cover the input's own depth once it is exceeded (top-down walks nest)
    # VIZ's recorder (fusegrad/viz) wraps the matcher to see each rule that fires; otherwise the matcher itself
    rewrite = pm.rewrite if (recorder := Hooks.rewrites) is None else recorder.begin(root, pm)

    def visit_result(frame: list[Any], r: UOp) -> None:
        nonlocal nested, depth_limit
        if DEBUG >= 6:
            print(f"rewrite {frame[0].op} -> {r.op}")
        frame[1], frame[3] = _TAKE_RESULT, r
        if r in done:
            return
        nested += 1
        if nested > depth_limit:
            if depth_limit == max_depth:
                depth_limit = max_depth + len(root.toposort())
            if nested > depth_limit:
                raise RewriteLoopError(f"graph_rewrite did not settle: {max_depth} nested rewrites from {frame[0].op}")
        stack.append([r, _ENTER, 0, None, True])

    while stack:
        frame = stack[-1]
        u, stage = frame[0], frame[1]
        if stage is _ENTER:
            if u in done:
                stack.pop()
                nested -= frame[4]
                continue
            if u in active:
                raise RewriteLoopError(f"graph_rewrite loops: rules rewrite {u.op} (arg={u.arg!r}) back into itself")
            active.add(u)
            frame[1] = _SOURCES
            if not bottom_up and (r := rewrite(u, ctx)) is not None:
                visit_result(frame, r)
            continue
        if stage is _SOURCES:
            i, src = frame[2], u.src
            while i < len(src) and src[i] in done:
                i += 1
            if i < len(src):
                frame[2] = i
                stack.append([src[i], _ENTER, 0, None, False])
                continue
            new_src = tuple(done[s] for s in src)
            n = u if new_src == src else u.replace(src=new_src)
            if (bottom_up or n is not u) and (r := rewrite(n, ctx)) is not None:
                visit_result(frame, r)
                continue
        else:
            n = done[frame[3]]
        active.discard(u)
        done[u] = n
        stack.pop()
        nested -= frame[4]
    if recorder is not None:
        recorder.end(rewrite, done[root])
    return done[root]


# graph_rewrite frame stages: check the node, rebuild it from rewritten sources, take the rewrite's result
_ENTER, _SOURCES, _TAKE_RESULT = "enter", "sources", "take result"


def rewrite_once(
    roots: list[UOp], pm: PatternMatcher, ctx: object = None, origin: dict[UOp, UOp] | None = None
) -> tuple[list[UOp], dict[UOp, UOp]]:
    """The roots with pm applied once to each node (sources first; what a rule returns is not rewritten again), and
    each changed node's replacement, so the scheduler can tell which of the caller's nodes a kernel computes.
    `origin`, when given, gets each node rebuilt over rewritten sources -> the node it was rebuilt from."""
    replaced: dict[UOp, UOp] = {}
    for u in UOp(Ops.SINK, src=tuple(roots)).toposort():
        new_src = tuple(replaced.get(s, s) for s in u.src)
        rebuilt = u if new_src == u.src else u.replace(src=new_src)
        if origin is not None and rebuilt is not u:
            origin[rebuilt] = u
        if (new := pm.rewrite(rebuilt, ctx) or rebuilt) is not u:
            replaced[u] = new
    return [replaced.get(r, r) for r in roots], replaced
