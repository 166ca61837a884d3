"""Ops, GroupOp and UOp: the one immutable, hash-consed graph node every stage speaks."""

from __future__ import annotations
import math
import weakref
from _weakref import _remove_dead_weakref
from numbers import Number
from enum import Enum, auto
from typing import Any, Callable, Iterator
from fusegrad.dtype import DType, dtypes, truncate
from fusegrad.helpers import prod
from fusegrad.uop import kernel as _kernel
from fusegrad.uop.kernel import AddrSpace, AxisType, KernelBuilder, KernelInfo  # noqa: F401 (tinygrad's import path)


class Ops(Enum):
    # tensor-level graph
    BUFFER = auto()
    CONST = auto()
    ARANGE = auto()
    CONTIGUOUS = auto()
    COPY = auto()
    ASSIGN = auto()
    DETACH = auto()  # noqa: E702
    RESHAPE = auto()
    PERMUTE = auto()
    EXPAND = auto()
    PAD = auto()
    SHRINK = auto()
    FLIP = auto()  # noqa: E702
    REDUCE_AXIS = auto()
    CAST = auto()
    BITCAST = auto()  # noqa: E702
    MULTI = auto()  # a value split along arg[0] (or replicated if None) over the devices arg[1], one src per device
    GATHER = auto()  # src (table, index): out[i..., j...] = table[index[i...], j...]; 0 where the index is out of range
    # kernel level
    SINK = auto()
    DEFINE_GLOBAL = auto()
    DEFINE_VAR = auto()  # a named symbolic int, arg (name, min, max, multiple_of); in a kernel its src is the param
    BIND = auto()  # a DEFINE_VAR bound to a value: src (DEFINE_VAR, CONST value); ranges and kernels use the var's
    RANGE = auto()
    REDUCE = auto()  # noqa: E702
    LOAD = auto()
    STORE = auto()
    DEFINE_ACC = auto()
    ACC_UPDATE = auto()
    ENDRANGE = auto()  # noqa: E702
    WORD = auto()  # word arg (0 low, 1 high) of a 64-bit int, only inside codegen's long/ulong emulation
    # a user-written kernel (uop/kernel.py), before codegen's lower_custom stage makes it a lowered kernel
    DEFINE_REG = auto()  # a register array, arg (slot, size)
    INDEX = auto()  # src (view of a DEFINE_GLOBAL or DEFINE_REG, *one index per dim): the element there
    AFTER = auto()  # src (view, *deps): the view's storage once deps (stores, loops) happened; tensor level: src
    # (input, CUSTOM_KERNEL), the input's buffer as the kernel left it
    END = auto()  # src (stores, *ranges): the stores close the loops
    GROUP = auto()  # stores that happen in order
    CUSTOM_KERNEL = auto()  # tensor level: src = the inputs, arg = CustomKernel (uop/kernel.py)
    # unary ALU
    NEG = auto()
    RECIPROCAL = auto()
    SQRT = auto()
    EXP = auto()
    LOG = auto()
    EXP2 = auto()
    LOG2 = auto()  # noqa: E702
    SIN = auto()
    COS = auto()
    TRUNC = auto()  # noqa: E702
    # binary ALU
    ADD = auto()
    MUL = auto()
    FDIV = auto()
    IDIV = auto()
    MOD = auto()
    MAX = auto()
    POW = auto()  # noqa: E702
    CMPLT = auto()
    CMPNE = auto()
    CMPEQ = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()  # noqa: E702
    # ternary ALU
    WHERE = auto()

    def __repr__(self) -> str:
        return f"Ops.{self.name}"

    # by identity, in C: Enum's own hash is a Python call on the name, and every hash-consed node hashes its op
    __hash__ = object.__hash__


class GroupOp:
    Unary = {Ops.NEG, Ops.RECIPROCAL, Ops.SQRT, Ops.EXP, Ops.LOG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TRUNC}
    Binary = {
        Ops.ADD,
        Ops.MUL,
        Ops.FDIV,
        Ops.IDIV,
        Ops.MOD,
        Ops.MAX,
        Ops.POW,
        Ops.CMPLT,
        Ops.CMPNE,
        Ops.CMPEQ,
        Ops.AND,
        Ops.OR,
        Ops.XOR,
        Ops.SHL,
        Ops.SHR,
    }
    Ternary = {Ops.WHERE}
    ALU = Unary | Binary | Ternary
    Comparison = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
    Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR}
    Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
    Elementwise = ALU | {Ops.CAST, Ops.BITCAST}


# ops that only view their source's storage (what a write through a tensor's view reaches)
_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP, Ops.DETACH})


def reduce_identity(op: Ops, dtype: DType) -> bool | int | float:
    """The value a reduce with op may read any number of times without changing its result."""
    if op is Ops.MAX:
        return dtype.min
    value = 0 if op is Ops.ADD else 1
    return bool(value) if dtype is dtypes.bool else value


class SymbolicHooks:
    """What uop/sint.py and uop/symbolic.py lend the node class: they build on UOp, so ops.py cannot import them;
    each installs its functions here when imported, which importing the fusegrad.uop package does first."""

    sym_repr: Callable[[UOp], str]
    sym_str: Callable[[Any], str]
    variable: Callable[..., UOp]
    sadd: Callable[[Any, Any], Any]
    ssub: Callable[[Any, Any], Any]
    range_sources: Callable[[UOp], tuple[UOp, ...]]
    value_range: Callable[[UOp], tuple[Any, Any]]


symbolic_hooks = SymbolicHooks()


class _CacheRef(weakref.ref):
    """The hash-consing table's weak reference to a node, knowing its key: the node's death drops the entry."""

    __slots__ = ("key",)


class UOpMeta(type):
    """Hash-consing: UOp(op, dtype, src, arg) with equal parts returns the same live object."""

    # key -> weak reference to the node; a plain dict (a WeakValueDictionary's get and set are Python calls, and every
    # op of every graph goes through here). A node's death drops its entry at once: dead entries left for a sweep
    # outlived the young generations and each made the cyclic GC's full collections come sooner (measured: one per 125
    # eager Adam steps, 130 ms each with torch imported, about 1 ms a step)
    cache: dict[tuple, weakref.ref[UOp]] = {}
    sweep_at = MIN_SWEEP = 1 << 14  # entries, live or dead, at which the next creation drops the dead ones

    def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        # a BUFFER's arg (id, device, size) is ints and a string, as _hashable leaves them: every realize makes one.
        # Ops members and dtypes are singletons compared by identity: their ids make a key of plain values, which the
        # GC stops tracking at its first pass, so a graph's live keys never reach its old generation
        ids = (id(src[0]), id(src[1])) if (n := len(src)) == 2 else (id(src[0]),) if n == 1 else tuple(map(id, src))
        key = (id(op), id(dtype), ids, arg if arg is None or op is _BUFFER else _hashable(arg))
        cache = UOpMeta.cache
        if (ref := cache.get(key)) is not None and (ret := ref()) is not None:
            return ret
        # UOp.__init__'s work without its frame (and type.__call__'s): every op of every graph is made here
        ret = object.__new__(cls)
        ret.op, ret.dtype, ret.src, ret.arg = op, dtype, src, arg
        ret._readers = [] if op is _BUFFER or op in _VIEW_OPS and src and src[0]._readers is not None else None
        ret.holders = ret.realized_ref = ret._buf = None
        if op is _RESHAPE or op is _EXPAND or op is _CONST:  # known now, where asking later costs an exception
            ret._shape = () if op is _CONST else tuple(arg)  # a constant is 0-d (a mean's division asked it)
        # a dead entry under this key (its sources' ids reused, its callback not yet run) is replaced
        ref = cache[key] = _CacheRef(ret, _drop_dead_entry)
        ref.key = key
        if len(cache) > UOpMeta.sweep_at:
            UOpMeta.sweep()
        for s in src:
            if (readers := s._readers) is not None:
                n = len(readers)
                if n and readers[-1]() is None:  # the last reader died (an eager op's, realized): its place
                    readers[-1] = weakref.ref(ret)
                elif n < 16 or n & (n - 1):  # add_reader without its pruning, which it does at powers of two only
                    readers.append(weakref.ref(ret))
                else:
                    s.add_reader(ret)
        return ret

    @staticmethod
    def new_buffer(dtype: DType, arg: tuple, buf: Any) -> UOp:
        """UOp(Ops.BUFFER, dtype, (), arg) holding buf, without __call__'s general steps: every realize makes one."""
        key, cache = (id(_BUFFER), id(dtype), (), arg), UOpMeta.cache
        if (ref := cache.get(key)) is None or (ret := ref()) is None:
            ret = object.__new__(UOp)
            ret.op, ret.dtype, ret.src, ret.arg, ret._readers = _BUFFER, dtype, (), arg, []
            ret.holders, ret.realized_ref, ret._shape = None, None, (arg[2],)  # _infer_shape's, known now
            ref = cache[key] = _CacheRef(ret, _drop_dead_entry)
            ref.key = key
        ret._buf = buf  # a live node with that arg (an unpickled graph's id) gets it, as after UOp()
        return ret

    @staticmethod
    def sweep() -> None:
        """Drop the entries of dead nodes their callbacks missed; the next sweep comes when the table has doubled."""
        cache = UOpMeta.cache
        for key in [k for k, r in cache.items() if r() is None]:
            _remove_dead_weakref(cache, key)  # only if still dead: another thread may have made a live node since
        UOpMeta.sweep_at = max(2 * len(cache), UOpMeta.MIN_SWEEP)


def _drop_dead_entry(ref: _CacheRef, cache: dict = UOpMeta.cache, remove: Callable = _remove_dead_weakref) -> None:
    # only while the entry is still this dead reference (atomic): another thread may have put a live node there. The
    # table and the remover are bound here: a node dying at interpreter exit may outlive this module's globals
    remove(cache, ref.key)


def _hashable(arg: Any) -> Any:
    # floats keep their sign and NaN-ness apart (0.0 vs -0.0, nan == nan for caching)
    if isinstance(arg, float):
        return ("f", math.copysign(1, arg), arg if arg == arg else "nan")
    if isinstance(arg, tuple):
        for a in arg:
            if type(a) is not int and type(a) is not str:
                return tuple(_hashable(a) for a in arg)
        return arg  # ints and strings (a shape, a BUFFER's arg): cannot equal the (type, value) pairs below
    return (type(arg), arg) if isinstance(arg, (bool, int)) else arg


_BUFFER, _RESHAPE, _EXPAND, _CONST = Ops.BUFFER, Ops.RESHAPE, Ops.EXPAND, Ops.CONST


def elementwise_uop(op: Ops, dtype: DType, src: tuple[UOp, ...], shape: tuple, arg: Any = None) -> UOp:
    """UOp(op, dtype, src, arg) for a tensor-level elementwise op over sources of `shape`, with its shape recorded at
    once: the next op asks for it, and finding it missing costs an exception."""
    u = UOp(op, dtype, src, arg)
    u._shape = shape
    return u


def view_over(view: UOp, base: UOp) -> UOp:
    """view's chain of movement ops rebuilt over another node."""
    view, chain = view.peel_chain(GroupOp.Movement)
    for v in reversed(chain):
        base = v.replace(src=(base,))
    return base


class UOp(KernelBuilder, metaclass=UOpMeta):
    __slots__ = (
        "op",
        "dtype",
        "src",
        "arg",
        "__weakref__",
        "_shape",
        "_size",
        "_vrange",
        "_readers",
        "holders",
        "realized_ref",
        "_buf",
    )

    def __init__(self, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None):
        # what a node holds; UOpMeta.__call__ makes every node and sets these itself, the same way
        self.op, self.dtype, self.src, self.arg = op, dtype, src, arg
        # weak references to the live nodes built on a BUFFER or a view of one: a write into storage finds its readers
        tracked = op is Ops.BUFFER or op in _VIEW_OPS and bool(src) and src[0]._readers is not None
        self._readers: list[weakref.ref[UOp]] | None = [] if tracked else None
        # weak references to the tensors that held this node (some moved on): one, or a list once a second registers
        self.holders: weakref.ref | list[weakref.ref] | None = None
        # the buffer view holding this node's computed value (a UOp or a weak reference to one): the scheduler's record
        # (schedule.record_realized), kept on the node so that it dies with it and every walk reads it without a lookup
        self.realized_ref: UOp | weakref.ref[UOp] | None = None
        # a BUFFER node's storage (runtime.buffers.buffer_of reads and sets it): on the node, so it dies with it
        self._buf: Any = None

    def add_reader(self, u: UOp) -> None:
        readers = self._readers
        assert readers is not None
        if len(readers) >= 16 and not len(readers) & (len(readers) - 1):  # at powers of two: drop the dead
            readers[:] = [r for r in readers if r() is not None]
        readers.append(weakref.ref(u))

    def holder_refs(self) -> tuple | list:
        """The weak references of the tensors that registered as holding this node (some may have moved on)."""
        holders = self.holders
        return () if holders is None else holders if type(holders) is list else (holders,)

    def live_readers(self) -> list[UOp]:
        """The live nodes built directly on this one (tracked for BUFFER nodes and views of them only)."""
        return [u for r in self._readers or () if (u := r()) is not None]

    def add_holder(self, ref: weakref.ref) -> None:
        if (holders := self.holders) is None or type(holders) is not list and holders() is None:
            self.holders = ref  # the usual case, one tensor per node (or its dead one's place): the reference alone
        elif type(holders) is not list:
            self.holders = [holders, ref]
        elif holders and holders[-1]() is None:  # the last holder died (a replay's previous result): its place
            holders[-1] = ref
        elif len(holders) >= 16 and not len(holders) & (len(holders) - 1):  # at powers of two: drop the moved on
            holders[:] = [h for h in holders if (t := h()) is not None and getattr(t, "uop", None) is self] + [ref]
        else:
            holders.append(ref)

    def __reduce__(self):
        # the whole graph as one flat table: pickling node by node would recurse once per level of depth
        nodes = self.toposort()
        index = {n: i for i, n in enumerate(nodes)}
        return (_rebuild_graph, (tuple((n.op, n.dtype, tuple(index[s] for s in n.src), n.arg) for n in nodes),))

    def __repr__(self) -> str:
        if self.op is Ops.DEFINE_VAR or self.op is Ops.BIND or self.op in GroupOp.ALU and _is_symbolic_size(self):
            return symbolic_hooks.sym_repr(self)
        return pretty(self)

    def replace(self, **kwargs: Any) -> UOp:
        parts = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg} | kwargs
        return UOp(parts["op"], parts["dtype"], tuple(parts["src"]), parts["arg"])

    # ---- graph walking
    def toposort(self, gate: Callable[[UOp], bool] | None = None) -> list[UOp]:
        """Nodes in dependency order (sources first); `gate(u)` False stops the walk below u."""
        out: dict[UOp, None] = {}
        stack: list[tuple[UOp, bool]] = [(self, False)]
        pop, push = stack.pop, stack.append  # bound once: this walk runs over every realize's whole graph
        while stack:
            u, visited = pop()
            if u in out:
                continue
            if visited:
                out[u] = None
                continue
            push((u, True))
            if gate is None or gate(u):
                for s in u.src[::-1]:  # sources pushed last to first, so the first is finished first
                    if s not in out:
                        push((s, False))
        return list(out)

    # ---- constructors
    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        return UOp(Ops.CONST, dtype, (), truncate(value, dtype))

    def const_like(self, value: Any) -> UOp:
        return UOp.const(self.dtype, value)

    def alu(self, op: Ops, *src: UOp) -> UOp:
        out_dtype = dtypes.bool if op in GroupOp.Comparison else (src[-1].dtype if op is Ops.WHERE else self.dtype)
        return UOp(op, out_dtype, (self, *src))

    def _operand(self, x: UOp | int | float | bool) -> UOp:
        return x if isinstance(x, UOp) else self.const_like(x)

    def __add__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self.alu(Ops.ADD, self._operand(x))

    def __radd__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self._operand(x).alu(Ops.ADD, self)

    def __sub__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self.alu(Ops.ADD, self._operand(x).alu(Ops.NEG))

    def __rsub__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self._operand(x).alu(Ops.ADD, self.alu(Ops.NEG))

    def __mul__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self.alu(Ops.MUL, self._operand(x))

    def __rmul__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self._operand(x).alu(Ops.MUL, self)

    def __floordiv__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self.alu(Ops.IDIV, self._operand(x))

    def __mod__(self, x):
        if not isinstance(x, (UOp, Number)):
            return NotImplemented  # a Tensor operand: Tensor's reflected op takes over
        return self.alu(Ops.MOD, self._operand(x))

    def __neg__(self):
        return self.alu(Ops.NEG)

    def __lt__(self, x):
        return self.alu(Ops.CMPLT, self._operand(x))

    def __ge__(self, x):
        return (self < x).alu(Ops.CMPEQ, UOp.const(dtypes.bool, False))

    def __and__(self, x):
        return self.alu(Ops.AND, self._operand(x))

    def __or__(self, x):
        return self.alu(Ops.OR, self._operand(x))

    def ne(self, x):
        return self.alu(Ops.CMPNE, self._operand(x))

    def eq(self, x):
        return self.alu(Ops.CMPEQ, self._operand(x))

    def maximum(self, x):
        return self.alu(Ops.MAX, self._operand(x))

    def where(self, a, b):
        a = a if isinstance(a, UOp) else UOp.const(b.dtype if isinstance(b, UOp) else dtypes.default_int, a)
        return self.alu(Ops.WHERE, a, b if isinstance(b, UOp) else a.const_like(b))

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    # ---- symbolic variables: see uop/sint.py
    def bind(self, val: int) -> UOp:
        """This DEFINE_VAR bound to `val` (in range and a multiple of multiple_of, else AssertionError)."""
        assert self.op is Ops.DEFINE_VAR, f"only a Variable can be bound, not {self.op}"
        name, lo, hi, multiple_of = self.arg
        assert isinstance(val, int) and not isinstance(val, bool), f"Variable {name!r} binds an int, got {val!r}"
        assert lo <= val <= hi, f"Variable {name!r} bound to {val}, outside its range [{lo}, {hi}]"
        assert val % multiple_of == 0, f"Variable {name!r} bound to {val}, not a multiple of {multiple_of}"
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, val)))

    def unbind(self) -> tuple[UOp, int]:
        """(variable, value) of a bound variable."""
        assert self.op is Ops.BIND, f"unbind needs a bound variable, got {self.op}"
        return self.src[0], self.src[1].arg

    # ---- tinygrad's introspection names
    @property
    def base(self) -> UOp:
        """The node under a chain of views (self when self is no view)."""
        return self.peel(_VIEW_OPS)

    def peel(self, ops: Ops | set | frozenset | tuple) -> UOp:
        """The first node down the chain of first sources whose op is not in ops (one op or a collection)."""
        return self.peel_chain(ops)[0]

    def peel_chain(self, ops: Ops | set | frozenset | tuple) -> tuple[UOp, list[UOp]]:
        """peel's node, and the nodes peeled on the way, from self downwards."""
        ops = (ops,) if isinstance(ops, Ops) else ops
        u, chain = self, []
        while u.op in ops and u.src:
            chain.append(u)
            u = u.src[0]
        return u, chain

    @property
    def buffer(self) -> Any:
        """The storage under this node: a BUFFER's, or its base BUFFER's for a view (None while there is none)."""
        if self.op is Ops.BUFFER:
            return self._buf
        b = self.base
        return b._buf if b.op is Ops.BUFFER else None

    @buffer.setter
    def buffer(self, buf: Any) -> None:
        self._buf = buf

    @staticmethod
    def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.weakint) -> UOp:
        """A symbolic integer in [min_val, max_val] (what Variable builds); .bind(value) gives it a value."""
        return symbolic_hooks.variable(name, min_val, max_val, dtype)

    @property
    def is_realized(self) -> bool:
        """The value sits in device memory: a view of a BUFFER with storage, or a MULTI whose shards all are."""
        b = self.base
        if b.op is Ops.MULTI:
            return all(s.is_realized for s in b.src)
        return b.op is Ops.BUFFER and b._buf is not None

    @property
    def expr(self) -> str:
        """A variable's name (bound or not); any other symbolic expression as text."""
        return symbolic_hooks.sym_str(self)

    # ---- shapes of tensor-level nodes
    @property
    def shape(self) -> tuple[int, ...]:
        try:
            return self._shape
        except AttributeError:
            pass
        if self.op in _ALU_OPS:  # the common new node: sources of one known shape, asked once per tensor op
            src = self.src
            try:
                first = src[0]._shape
                for s in src[1:]:
                    if s._shape != first:
                        break  # mismatched: _infer_shape below says which
                else:
                    self._shape = first
                    return first
            except AttributeError:
                pass  # a source without a shape yet: the walk below
        sources = _shape_sources(self)
        if all(hasattr(s, "_shape") for s in sources):  # a node built on known shapes: no walk
            self._shape = _infer_shape(self)
            return self._shape
        # sources first, from an explicit stack: the first question about a deep new graph must not recurse
        for n in _uncached_postorder(self, "_shape", _shape_sources):
            n._shape = _infer_shape(n)
        return self._shape

    @property
    def size(self) -> int:
        """Element count; for a symbolic shape the largest it can be (what a buffer for it must hold)."""
        try:
            return self._size
        except AttributeError:
            self._size = prod(d if isinstance(d, int) else d.vmax for d in self.shape)
            return self._size

    # ---- value ranges of kernel-level integer nodes
    @property
    def vmin(self) -> Any:
        return self._value_range()[0]

    @property
    def vmax(self) -> Any:
        return self._value_range()[1]

    def _value_range(self) -> tuple[Any, Any]:
        try:
            return self._vrange
        except AttributeError:
            pass
        for n in _uncached_postorder(self, "_vrange", symbolic_hooks.range_sources):
            n._vrange = symbolic_hooks.value_range(n)
        return self._vrange


def _is_symbolic_size(u: UOp) -> bool:
    """An integer expression over variables (a symbolic size), printed as its formula."""
    nodes = u.toposort(gate=lambda x: x.op is not Ops.BIND)
    return (
        len(nodes) < 64
        and any(n.op in (Ops.DEFINE_VAR, Ops.BIND) for n in nodes)
        and all(n.op in GroupOp.ALU or n.op in (Ops.CONST, Ops.BIND, Ops.DEFINE_VAR) for n in nodes)
    )


def _rebuild_graph(table: tuple[tuple[Ops, DType, tuple[int, ...], Any], ...]) -> UOp:
    """Inverse of UOp.__reduce__: rows in dependency order, sources given as row numbers; the last row is the root."""
    nodes: list[UOp] = []
    for op, dtype, src, arg in table:
        nodes.append(UOp(op, dtype, tuple(nodes[i] for i in src), arg))
    return nodes[-1]


def _uncached_postorder(root: UOp, slot: str, sources: Callable[[UOp], tuple[UOp, ...]]) -> list[UOp]:
    """The nodes below root (root last, sources first) whose `slot` is not cached yet, following only the sources
    that `sources(node)` says the cached value depends on."""
    out: list[UOp] = []
    seen: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        u, expanded = stack.pop()
        if expanded:
            out.append(u)
            continue
        if u in seen or hasattr(u, slot):
            continue
        seen.add(u)
        stack.append((u, True))
        stack.extend((s, False) for s in reversed(sources(u)))
    return out


_ALU_OPS = frozenset(GroupOp.ALU)


def _shape_sources(u: UOp) -> tuple[UOp, ...]:
    """The sources _infer_shape reads the shape of."""
    if u.op in (Ops.BUFFER, Ops.DEFINE_GLOBAL, Ops.CONST, Ops.ARANGE, Ops.RESHAPE, Ops.EXPAND, Ops.SINK):
        return ()
    if u.op in (Ops.DEFINE_VAR, Ops.BIND, Ops.DEFINE_REG, Ops.INDEX, Ops.END, Ops.GROUP, Ops.CUSTOM_KERNEL):
        return ()
    if u.op is Ops.STORE:
        return u.src[1:2]
    return u.src if u.op in GroupOp.ALU or u.op is Ops.GATHER else u.src[:1]


def _infer_shape(u: UOp) -> tuple[int, ...]:
    if u.op in GroupOp.ALU:  # first: the most common node, and each `Ops.X` below is a lookup of its own
        shapes = {x.shape for x in u.src}
        if len(shapes) != 1:
            raise ValueError(f"{u.op} on mismatched shapes {[x.shape for x in u.src]}")
        return u.src[0].shape
    if u.op is Ops.BUFFER:
        return (u.arg[2],)
    if u.op is Ops.DEFINE_GLOBAL or u.op is Ops.DEFINE_REG:
        return (u.arg[1],)
    if u.op in (Ops.INDEX, Ops.END, Ops.GROUP, Ops.CUSTOM_KERNEL):
        return ()
    if u.op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND):
        return ()  # a symbolic int is a 0-d value too (a mean over a symbolic axis divides by it)
    if u.op is Ops.ARANGE:
        return (u.arg,)
    if u.op in (Ops.RESHAPE, Ops.EXPAND):
        return tuple(u.arg)
    s = u.src[0].shape
    if u.op is Ops.PERMUTE:
        return tuple(s[i] for i in u.arg)
    if u.op is Ops.PAD:
        if any(isinstance(x, UOp) for x in (*s, *(v for p in u.arg for v in p))):
            sadd = symbolic_hooks.sadd
            return tuple(sadd(sadd(d, b), a) for d, (b, a) in zip(s, u.arg))
        return tuple(d + b + a for d, (b, a) in zip(s, u.arg))
    if u.op is Ops.SHRINK:
        if any(isinstance(v, UOp) for p in u.arg for v in p):
            return tuple(symbolic_hooks.ssub(e, b) for b, e in u.arg)
        return tuple(e - b for b, e in u.arg)
    if u.op is Ops.REDUCE_AXIS:
        return tuple(1 if i in u.arg[1] else d for i, d in enumerate(s))
    if u.op is Ops.STORE:
        return u.src[1].shape
    if u.op is Ops.MULTI:
        return tuple(d * len(u.src) if i == u.arg[0] else d for i, d in enumerate(s))
    if u.op is Ops.GATHER:
        return u.src[1].shape + s[1:]
    if u.op is Ops.SINK:
        return ()
    if u.op is Ops.BITCAST and u.src[0].dtype.itemsize != u.dtype.itemsize:
        return s[:-1] + (s[-1] * u.src[0].dtype.itemsize // u.dtype.itemsize,)
    return s  # FLIP, CAST, BITCAST, CONTIGUOUS, COPY, ASSIGN, DETACH keep the shape


_device_memo: weakref.WeakKeyDictionary[UOp, str | tuple[str, ...] | None] = weakref.WeakKeyDictionary()


def device_of(u: UOp) -> str | tuple[str, ...] | None:
    """The device a graph computes on (a tuple when it reads a multi-device value), None for a device-less constant."""
    for n in u.toposort(gate=lambda x: x not in _device_memo):
        if n in _device_memo:
            continue
        if n.op is Ops.BUFFER:
            _device_memo[n] = n.arg[1]
        elif n.op is Ops.COPY:
            _device_memo[n] = n.arg
        elif n.op is Ops.MULTI:
            _device_memo[n] = n.arg[1]
        else:
            _device_memo[n] = next((d for s in n.src if (d := _device_memo[s]) is not None), None)
    return _device_memo[u]


# deeper levels print their depth as a number instead of more indentation, so a deep chain prints in linear size
PRETTY_MAX_INDENT = 32


def pretty(u: UOp) -> str:
    """Indented tree view of a graph; shared nodes are printed once and then referenced as x<n>."""
    seen: dict[UOp, int] = {}
    lines: list[str] = []
    stack: list[tuple[UOp, int]] = [(u, 0)]
    while stack:
        n, depth = stack.pop()
        pad = "  " * min(depth, PRETTY_MAX_INDENT) + (f"[{depth}]" if depth > PRETTY_MAX_INDENT else "")
        if n in seen:
            lines.append(f"{pad}x{seen[n]}")
            continue
        seen[n] = len(seen)
        lines.append(f"{pad}x{seen[n]}:{n.op.name} {n.dtype} arg={n.arg!r}")
        stack.extend((s, depth + 1) for s in reversed(n.src))
    return "\n".join(lines)


def is_contiguous_view(u: UOp) -> bool:
    """u reads its buffer in order, element for element (only reshapes over a whole buffer)."""
    return u.peel(Ops.RESHAPE).op is Ops.BUFFER


def walk(roots: list[UOp]) -> Iterator[UOp]:
    return iter(UOp(Ops.SINK, dtypes.void, tuple(roots)).toposort())


_kernel.core.Ops, _kernel.core.GroupOp, _kernel.core.UOp = Ops, GroupOp, UOp  # what KernelBuilder builds with
