"""The kernel-building surface of UOp: what a user writes in a custom kernel (placeholders, ranges, indexing, stores,
accumulators), as tinygrad spells it. Codegen's lower_custom stage (codegen/custom.py) makes it a lowered kernel."""

from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, Callable
from fusegrad.dtype import AddrSpace, DType, dtypes
from fusegrad.helpers import prod

if TYPE_CHECKING:
    from fusegrad.uop.ops import UOp


class AxisType(Enum):
    """What a range is: a loop over outputs (GLOBAL, LOCAL, LOOP, THREAD run as output loops), a loop an accumulator
    sums over (REDUCE, GROUP_REDUCE), or one unrolled into copies of what it ends (UPCAST, UNROLL)."""

    GLOBAL = auto()
    LOCAL = auto()
    LOOP = auto()
    THREAD = auto()
    WARP = auto()
    GROUP_REDUCE = auto()
    REDUCE = auto()
    UPCAST = auto()
    UNROLL = auto()


OUTPUT_AXES = (AxisType.GLOBAL, AxisType.LOCAL, AxisType.LOOP, AxisType.THREAD, AxisType.WARP)
REDUCE_AXES = (AxisType.REDUCE, AxisType.GROUP_REDUCE)
UNROLLED_AXES = (AxisType.UPCAST, AxisType.UNROLL)


@dataclass(frozen=True)
class KernelInfo:
    """A custom kernel's sink arg: its name, and the opts to apply (None or (): none; custom kernels take no opts)."""

    name: str = "custom"
    opts_to_apply: tuple | None = None


@dataclass(frozen=True)
class CustomKernel:
    """A CUSTOM_KERNEL node's arg: the kernel codegen compiles (a SINK over placeholders whose arg is a KernelInfo, or
    a SINK of the parameters whose arg is a RawKernel), the input slots it writes, and the gradient function (None:
    backward through it raises)."""

    kernel_ast: Any
    written: tuple[int, ...]
    grad_fxn: Callable | None = None
    empty: tuple[int, ...] = ()  # written slots whose input was Tensor.empty: nothing to copy into the fresh buffer

    @property
    def name(self) -> str:
        return self.kernel_ast.arg.name


@dataclass(frozen=True)
class RawKernel:
    """Device source a user wrote: `src` in the device's language (C for CPU, OpenCL C for CL, LLVM IR for LLVM),
    `entry` its function, `global_size` / `local_size` the launch (GPU devices), `written` the input slots it stores
    into. The function takes one pointer per input, in order. `items` > 0 (C on CPU): it also takes `long long
    start, long long end` after them and computes items [start, end) of `items`, which the CPU device splits over
    its threads as it does its own kernels' outer loop (`ops`: the launch's work, which decides how many pieces)."""

    src: str
    entry: str
    global_size: tuple[int, ...] = (1, 1, 1)
    local_size: tuple[int, ...] = (1, 1, 1)
    written: tuple[int, ...] = (0,)
    items: int = 0
    ops: int = 0

    @property
    def name(self) -> str:
        return self.entry


class Core:
    """Ops, GroupOp and UOp, which ops.py fills in when it defines them (it builds UOp on KernelBuilder, so this
    module cannot import it)."""

    Ops: Any = None
    GroupOp: Any = None
    UOp: Any = None
    simplify: Any = None  # symbolic.py's, installed by it


core = Core()


def _ops() -> Core:
    return core


class KernelBuilder:
    """Methods UOp gets for writing kernels by hand."""

    __slots__ = ()

    @staticmethod
    def placeholder(shape: tuple[int, ...] | int, dtype: DType, slot: int, addrspace: AddrSpace = AddrSpace.GLOBAL):
        """A buffer of `shape`: GLOBAL is kernel parameter `slot`, REG a register array (slot numbers it)."""
        ops = _ops()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"a placeholder's shape is non-negative ints, got {shape}")
        if addrspace is AddrSpace.LOCAL:
            raise NotImplementedError("AddrSpace.LOCAL placeholders (work-group memory) are not supported; use REG")
        op = ops.Ops.DEFINE_GLOBAL if addrspace is AddrSpace.GLOBAL else ops.Ops.DEFINE_REG
        base = ops.UOp(op, dtype, (), (slot, prod(shape)))
        return base if shape == (prod(shape),) else ops.UOp(ops.Ops.RESHAPE, dtype, (base,), shape)

    @staticmethod
    def range(end: int, axis_id: int, axis_type: AxisType = AxisType.LOOP, dtype: DType = dtypes.int32):
        """The loop index 0..end-1; `axis_id` names the loop (ids are unique within a kernel)."""
        ops = _ops()
        if not isinstance(end, int) or isinstance(end, bool) or end < 0:
            raise ValueError(f"a range counts to a non-negative int, got {end!r}")
        if not isinstance(axis_type, AxisType):
            raise TypeError(f"axis_type is an AxisType, got {axis_type!r}")
        return ops.UOp(ops.Ops.RANGE, dtype, (ops.UOp.const(dtype, end),), (axis_id, axis_type))

    @staticmethod
    def group(*srcs: UOp):
        """Stores (or ended stores) that happen in this order."""
        ops = _ops()
        return ops.UOp(ops.Ops.GROUP, dtypes.void, tuple(srcs))

    def __getitem__(self: Any, key: Any):
        """A placeholder view indexed: ints and index UOps give the element (one per dim); slices give a view."""
        ops = _ops()
        key = key if isinstance(key, tuple) else (key,)
        shape = self.shape
        if len(key) > len(shape):
            raise IndexError(f"{len(key)} indices into a placeholder of shape {shape}")
        if any(isinstance(k, slice) for k in key):
            bounds = []
            for k, d in zip(key + (slice(None),) * (len(shape) - len(key)), shape):
                if not isinstance(k, slice):
                    raise IndexError(f"mix of indices and slices {key} is not supported: slice first, then index")
                start, stop, step = k.indices(d)
                if step != 1:
                    raise IndexError(f"a placeholder slice steps by 1, got {k}")
                bounds.append((start, max(start, stop)))
            return ops.UOp(ops.Ops.SHRINK, self.dtype, (self,), tuple(bounds))
        if len(key) != len(shape):
            raise IndexError(f"{len(key)} indices into a placeholder of shape {shape}: index every dim")
        idxs = tuple(k if isinstance(k, ops.UOp) else ops.UOp.const(dtypes.int32, _int_index(k)) for k in key)
        if bad := [i.dtype for i in idxs if not dtypes.is_int(i.dtype)]:
            raise TypeError(f"an index is an integer, got {bad}")
        return ops.UOp(ops.Ops.INDEX, self.dtype, (self, *(i.cast(dtypes.int32) for i in idxs)))

    def __iter__(self):
        # __getitem__ alone would make every UOp iterable (a symbolic size too): it is not a sequence
        raise TypeError(f"a {type(self).__name__} is not iterable")

    def flatten(self: Any):
        ops = _ops()
        return ops.UOp(ops.Ops.RESHAPE, self.dtype, (self,), (prod(self.shape),))

    def reshape(self: Any, *shape: int):
        ops = _ops()
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if prod(shape) != prod(self.shape):
            raise ValueError(f"cannot reshape a placeholder of shape {self.shape} to {shape}")
        return ops.UOp(ops.Ops.RESHAPE, self.dtype, (self,), shape)

    def store(self: Any, value: Any):
        """Write value into this element (an indexed placeholder)."""
        ops = _ops()
        if self.op is not ops.Ops.INDEX:
            raise TypeError(f"store writes an indexed placeholder (C[i].store(v)), not a {self.op.name}")
        value = value if isinstance(value, ops.UOp) else ops.UOp.const(self.dtype, value)
        if value.dtype is not self.dtype:
            raise TypeError(f"storing a {value.dtype!r} value into a {self.dtype!r} buffer: cast it first")
        return ops.UOp(ops.Ops.STORE, dtypes.void, (self, value))

    def set(self: Any, value: Any, end: Any = ()):
        """Store value here (closing the `end` ranges) and return the buffer as it is afterwards."""
        ops = _ops()
        end = end if isinstance(end, (tuple, list)) else (end,)
        store = self.store(value)
        return ops.UOp(ops.Ops.AFTER, self.dtype, (self.src[0], store.end(*end) if end else store))

    def after(self: Any, *deps: UOp):
        """This buffer once deps (stores, loops) happened: reads through it see their writes."""
        ops = _ops()
        return ops.UOp(ops.Ops.AFTER, self.dtype, (self, *deps))

    def end(self: Any, *ranges: UOp):
        """These stores close the loops of `ranges`."""
        ops = _ops()
        if bad := [r for r in ranges if r.op is not ops.Ops.RANGE]:
            raise TypeError(f"end closes ranges, got {[r.op.name for r in bad]}")
        return ops.UOp(ops.Ops.END, dtypes.void, (self, *ranges)) if ranges else self

    def sink(self: Any, *srcs: UOp, arg: KernelInfo | None = None):
        """The kernel: these stores, named by arg."""
        ops = _ops()
        return ops.UOp(ops.Ops.SINK, dtypes.void, (self, *srcs), arg if arg is not None else KernelInfo())

    def simplify(self: Any):
        return core.simplify(self)

    def __gt__(self: Any, x: Any):
        return self._operand(x) < self

    def __le__(self: Any, x: Any):
        return (self._operand(x) < self).eq(False)

    def __truediv__(self: Any, x: Any):
        ops = _ops()
        if not isinstance(x, (ops.UOp, int, float)):
            return NotImplemented
        return self.alu(ops.Ops.FDIV, self._operand(x))


def _int_index(k: Any) -> int:
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"an index is an int or an integer UOp, got {k!r}")
    return k
