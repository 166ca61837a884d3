"""Tensor: the user API. Every method builds a lazy UOp graph; nothing computes until realize() or a data accessor."""

from __future__ import annotations

import itertools
import pathlib
import weakref
from typing import Any, Sequence

from fusegrad.lazy_numpy import np

from fusegrad.dtype import (
    DType,
    DTypeLike,
    dtypes,
    float_to_fp8,
    fp8_to_float,
    from_numpy,
    least_upper_dtype,
    np_bf16_to_f32,
    to_dtype,
    to_numpy_dtype,
)
from fusegrad.engine.realize import bound_variables, capturing, realize_leaf, realize_lock
from fusegrad.engine.realize import realize_uops, schedule_uops
from fusegrad.gradient import compute_gradient
from fusegrad.uop.broadcast import broadcast_const, broadcast_uop
from fusegrad.helpers import prod
from fusegrad.runtime.buffers import (
    base_buffer,
    buffer_holding,
    buffer_uop,
    copy_to_device,
    file_buffer,
    is_contiguous_view,
    canonical_device,
    read_values,
)
from fusegrad.uop.multi import is_realized_multi, multi_axis, shard_uop
from fusegrad.tensor_ops.base import TensorBase
from fusegrad.tensor_ops.creation import CreationMixin
from fusegrad.tensor_ops.conv import ConvMixin
from fusegrad.tensor_ops.elementwise import ElementwiseMixin
from fusegrad.tensor_ops.indexing import IndexingMixin, view_base
from fusegrad.tensor_ops.linalg import LinalgMixin
from fusegrad.tensor_ops.losses import LossMixin
from fusegrad.tensor_ops.movement import MovementMixin
from fusegrad.tensor_ops.nn import NNMixin
from fusegrad.tensor_ops.pool import PoolMixin
from fusegrad.tensor_ops.pydata import py_data_to_numpy, py_scalar_const
from fusegrad.tensor_ops.reduce import ReduceMixin
from fusegrad.tensor_ops.shapes import broadcast_shape, check_sym
from fusegrad.tensor_ops.sorting import SortingMixin
from fusegrad.uop.ops import Ops, UOp, elementwise_uop
from fusegrad.uop.sint import shape_str, smax, sprod

Scalar = int | float | bool


class Tensor(
    TensorBase,
    CreationMixin,
    ElementwiseMixin,
    ReduceMixin,
    MovementMixin,
    IndexingMixin,
    LinalgMixin,
    ConvMixin,
    PoolMixin,
    NNMixin,
    LossMixin,
    SortingMixin,
):
    """An n-dimensional array on a device, computed lazily."""

    training: bool = False  # [compat] legacy switch, read alongside TRAINING
    no_grad: bool = False  # [compat] <= v0.10; nothing is recorded anyway, gradients are computed on request
    _seed: int = 0
    _rng_calls: int = 0
    _lazy_sum: bool = False  # a .grad that backward built as old .grad + new gradient

    def __init__(
        self,
        data: Any = None,
        device: str | tuple | None = None,
        dtype: DTypeLike | None = None,
        requires_grad: bool | None = None,
    ):
        dt = to_dtype(dtype) if dtype is not None else None
        placement = canonical_device(device)
        # host data for several devices is loaded on the first one and replicated from there
        self.device = placement[0] if isinstance(placement, tuple) and not isinstance(data, UOp) else placement
        self.grad: Tensor | None = None
        self.requires_grad, self.is_param = requires_grad, requires_grad is not False
        self._ref = weakref.ref(self)  # registered on each node it holds, so backward finds it from the graph
        if isinstance(data, UOp):
            self.uop = data
        elif data is None:
            self.uop = UOp.const(dt or dtypes.default_float, 0)
        elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
            value, const_dt = py_scalar_const(data, dt)
            self.uop = UOp.const(const_dt, value)
        elif isinstance(data, bytes):
            self.uop = self._from_numpy(np.frombuffer(data, np.uint8), dt)
        elif isinstance(data, (list, tuple, range)):
            self.uop = self._from_numpy(*py_data_to_numpy(data, dt))
        elif isinstance(data, (np.ndarray, np.generic)):
            self.uop = self._from_numpy(np.asarray(data), dt)
        elif isinstance(data, pathlib.Path):
            self.uop = self._from_file(data, dt or dtypes.uint8)
        else:
            raise TypeError(f"cannot build a Tensor from {type(data).__name__}")
        if isinstance(placement, tuple) and not isinstance(data, UOp):
            self.uop, self.device = shard_uop(self.uop, placement, None), placement

    def _from_file(self, path: pathlib.Path, dt: DType) -> UOp:
        """A 1-D tensor over the file's bytes on device DISK:<abs path>; nothing is read until it is used."""
        buf = file_buffer(str(path.resolve()), dt)
        self.device = buf.device
        return buffer_uop(buf)

    def _from_numpy(self, arr: np.ndarray, dt: DType | None) -> UOp:
        src_dt = from_numpy(arr.dtype)
        dt = dt or src_dt
        if dt is dtypes.bfloat16:
            from fusegrad.dtype import np_f32_to_bf16

            store = np_f32_to_bf16(arr.astype(np.float32))
        elif dt in dtypes.fp8s:
            store = float_to_fp8(arr, dt)
        elif dt.fmt is None:
            raise TypeError(f"cannot build {dt} tensors from numpy data yet")
        elif src_dt is not dt:
            store = arr.astype(to_numpy_dtype(dt), copy=True)
        else:
            store = arr  # the caller's array: buffer_holding copies it
        buf = buffer_uop(buffer_holding(self.device, arr.size, dt, store, owned=store is not arr))
        return buf if arr.ndim == 1 else UOp(Ops.RESHAPE, dt, (buf,), arr.shape)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_ref"]  # a weak reference does not pickle; the copy makes its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._ref = weakref.ref(self)
        self._uop.add_holder(self._ref)

    # ------------------------------------------------------------------ properties
    @property
    def uop(self) -> UOp:
        return self._uop

    @uop.setter
    def uop(self, u: UOp) -> None:
        self._uop = u
        u.add_holder(self._ref)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._uop.shape

    @property
    def dtype(self) -> DType:
        return self._uop.dtype

    @property
    def ndim(self) -> int:
        return len(self._uop.shape)

    def numel(self) -> int:
        return sprod(self.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[self._axis(dim)]

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def is_floating_point(self) -> bool:
        return dtypes.is_float(self.dtype)

    @property
    def T(self) -> Tensor:
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self):
        raise TypeError("the truth value of a Tensor is ambiguous; use .item(), .any() or .all()")

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        grad = " with grad" if self.grad is not None else ""
        return f"<Tensor {self.device} shape={self.shape} dtype={self.dtype}{grad}>"

    def requires_grad_(self, flag: bool = True) -> Tensor:
        self.requires_grad, self.is_param = flag, flag
        return self

    def is_param_(self, is_param: bool = True) -> Tensor:
        self.is_param = is_param
        return self

    @property
    def max_shape(self) -> tuple[int, ...]:
        return tuple(smax(d) for d in self.shape)

    def max_numel(self) -> int:
        return prod(self.max_shape)

    # ------------------------------------------------------------------ realization and data
    def realize(self, *lst: Tensor, do_update_stats: bool = True) -> Tensor:
        if lst:
            Tensor._realize((self, *lst), keep_old_versions=True)
            return self
        with realize_lock:
            # an eager op on realized tensors, as a loop of them asks again and again: the leaf-op memo's schedule
            if not _pending_assigns and (r := realize_leaf(self._uop, self.device)) is not None:
                self._uop = r  # the uop setter's work, inline
                r.add_holder(self._ref)
            else:
                Tensor._realize_locked((self,), keep_old_versions=True)
        return self

    @staticmethod
    def realize_all(tensors: Sequence[Tensor]) -> None:
        Tensor._realize(tensors, keep_old_versions=True)

    @staticmethod
    def _realize(tensors: Sequence[Tensor], keep_old_versions: bool) -> None:
        """Realize tensors; with keep_old_versions, an assign whose old value a live graph still reads copies on write,
        without it every assign writes its storage in place (setitem: all views of the storage see the write)."""
        with realize_lock:  # the pending-assign bookkeeping is shared by all threads
            Tensor._realize_locked(tensors, keep_old_versions)

    @staticmethod
    def _realize_locked(tensors: Sequence[Tensor], keep_old_versions: bool) -> None:
        if len(tensors) == 1:  # the common call (t.realize()): no de-duplication
            u = (t := tensors[0])._uop
            if base_buffer(u) is not None or u.op is Ops.MULTI and is_realized_multi(u):
                return
            todo = [t]
        else:
            todo = list(
                {
                    id(t): t
                    for t in tensors
                    if base_buffer(t.uop) is None and not (t.uop.op is Ops.MULTI and is_realized_multi(t.uop))
                }.values()
            )
            if not todo:
                return
        if pending := bool(_pending_assigns):
            # an assign reached through another tensor's graph runs now: its own tensor takes the result (or it runs
            # again)
            for key, ref in list(_pending_assigns.items()):
                if (t := ref()) is None or t.uop.op is not Ops.ASSIGN:
                    del _pending_assigns[key]
            todo += _pending_assigns_reached(todo)
            pending = bool(_pending_assigns)
        if len(todo) > 1:
            _separate_equal_roots(todo)
        roots = [t._uop for t in todo]
        # each root is held by this list and by its tensor; any other holder of a node that reads an assign's old
        # version is a live graph outside this realize, so that assign copies on write
        # with no pending assign the graph holds no assign node worth the walk (one whose tensor is gone aside)
        holders = 2 if keep_old_versions and pending else None
        try:
            results = realize_uops(roots, [todo[0].device] if len(todo) == 1 else [t.device for t in todo], holders)
        except Exception:
            # failed index checks, compiles and memory checks raise before any kernel ran: targets keep their values
            for t in todo:
                if t.uop.op is Ops.ASSIGN:
                    t.uop = t.uop.src[0]
                    _pending_assigns.pop(id(t), None)
            raise
        for t, r in zip(todo, results):
            t.uop = r

    def _host_data(self) -> np.ndarray:
        """The values as a new numpy array (bfloat16 / fp8 as float32); a multi-device tensor is gathered first."""
        if capturing:
            capturing[-1].refuse_read(self)  # a TinyJit capture cannot replay a read of data into Python
        self._check_concrete()
        if isinstance(self.device, tuple):
            return self.to(self.device[0])._host_data()
        t = self if is_contiguous_view(self.uop) else self.contiguous()
        t.realize()
        data = read_values(t.uop).reshape(self.shape)
        if self.dtype in dtypes.fp8s:
            return fp8_to_float(data, self.dtype)
        return np_bf16_to_f32(data) if self.dtype is dtypes.bfloat16 else data

    def numpy(self) -> np.ndarray:
        return self._host_data()

    def tolist(self) -> Any:
        return self._host_data().tolist()

    def _check_concrete(self) -> None:
        assert all(isinstance(d, int) for d in self.shape), (
            f"cannot read back a tensor of symbolic shape {shape_str(self.shape)}; shrink it to a concrete shape first"
        )

    def item(self) -> Scalar:
        self._check_concrete()
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self._host_data().reshape(()).item()

    def data(self) -> memoryview:
        arr = self._host_data()
        raw = memoryview(arr.reshape(-1)).cast("B")
        return raw.cast(arr.dtype.char, self.shape) if self.shape and 0 not in self.shape else raw.cast(arr.dtype.char)

    # ------------------------------------------------------------------ placement and mutation
    def to(self, device: str | tuple[str, ...] | None) -> Tensor:
        device = canonical_device(device)
        if device == self.device:
            return self
        if isinstance(device, tuple):
            if isinstance(self.device, tuple):
                raise RuntimeError(f"tensor is already sharded on {self.device}; gather first")
            return self.shard(device)
        if isinstance(self.device, str):
            out = Tensor(copy_to_device(self.uop, self.device, device), device=device)
        else:
            out = Tensor(UOp(Ops.COPY, self.dtype, (self.uop,), device), device=device)
        if self.grad is not None:
            out.grad = self.grad.to(device)
        return out

    def to_(self, device: str | tuple[str, ...] | None) -> Tensor:
        moved = self.to(device)
        self.uop, self.device, self.grad = moved.uop, moved.device, moved.grad
        return self

    def shard(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        """Split `axis` evenly over devices (or replicate the tensor on each when axis is None)."""
        if isinstance(self.device, tuple):
            raise RuntimeError(f"tensor is already sharded on {self.device}; cannot reshard")
        placement = canonical_device(devices)
        if not isinstance(placement, tuple):
            return self.to(placement)
        if axis is not None:
            axis = self._axis(axis)
            if self.shape[axis] % len(placement):
                raise RuntimeError(
                    f"cannot shard axis {axis} of size {self.shape[axis]} evenly over {len(placement)} devices"
                )
        return Tensor(shard_uop(self.uop, placement, axis), device=placement)

    def shard_(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        sharded = self.shard(devices, axis)
        self.uop, self.device = sharded.uop, sharded.device
        return self

    def shard_like(self, y: Tensor) -> Tensor:
        return self.shard(y.device, multi_axis(y.uop)) if isinstance(y.device, tuple) else self.to(y.device)

    def contiguous(self) -> Tensor:
        # each call is a distinct node: contiguous() promises a buffer of its own, even for equal graphs
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), next(_contiguous_ids)))

    def contiguous_backward(self) -> Tensor:
        """Identity forward; the gradient flowing back through it is materialized in its own buffer."""
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), "backward"))

    def schedule_linear(self, *lst: Tensor) -> list:
        """The kernels that would realize these tensors (nothing runs)."""
        tensors = [self, *lst]
        return schedule_uops([t.uop for t in tensors], [t.device for t in tensors])

    def linear_with_vars(self, *lst: Tensor) -> tuple[list, dict]:
        """The kernels and the value of each bound Variable they read (the kernels read them as parameters)."""
        return self.schedule_linear(*lst), bound_variables([t.uop for t in (self, *lst)])

    schedule = schedule_linear
    schedule_with_vars = linear_with_vars

    def clone(self, device: str | None = None) -> Tensor:
        out = (self.to(device) if device is not None else self).contiguous()
        if self.grad is not None:
            out.grad = self.grad.clone(device)
        return out

    def detach(self) -> Tensor:
        return self._new(elementwise_uop(Ops.DETACH, self.dtype, (self._uop,), self.shape))  # its shape recorded

    def assign(self, x: Any) -> Tensor:
        if not isinstance(x, Tensor):
            x = Tensor(x, device=self.device, dtype=self.dtype)
        if x.device != self.device:
            raise RuntimeError(f"assign from device {x.device} into a tensor on {self.device}")
        if x.dtype != self.dtype:
            raise RuntimeError(f"assign of {x.dtype} into a {self.dtype} tensor; cast it first")
        x = x._broadcast_to(self.shape)
        if self.uop.op is Ops.ASSIGN:
            self.realize()  # the pending assign lands in the storage, so this one writes the same storage
        if not is_contiguous_view(self.uop) and not is_realized_multi(self.uop):
            if view_base(self.uop).op is Ops.BUFFER:
                self[...] = x  # a view of storage: write through it, like setitem
                return self
            self.replace(self.contiguous().realize())
        self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, x.uop))
        _pending_assigns[id(self)] = self._ref
        return self

    def replace(self, x: Tensor) -> Tensor:
        if x.shape != self.shape:
            raise ValueError(f"replace needs equal shapes, got {self.shape} and {x.shape}")
        self.uop, self.device = x.uop, x.device
        return self

    def _new(self, uop: UOp) -> Tensor:
        """A tensor of a graph built from self, on self's (already canonical) device: __init__ without its parsing,
        since every op builds one."""
        return tensor_of_uop(uop, self.device)

    # ------------------------------------------------------------------ creation
    # ------------------------------------------------------------------ random numbers
    # ------------------------------------------------------------------ broadcasting and dtype promotion
    def _operand(self, x: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
        """Both operands broadcast to one shape and promoted to one dtype; Python scalars are weak."""
        if isinstance(x, Tensor):
            if x.device != self.device:
                raise RuntimeError(f"operands on different devices: {self.device} and {x.device}")
            dt, x_dt = self._uop.dtype, x._uop.dtype
            out_dt = dt if x_dt is dt else least_upper_dtype(dt, x_dt)
            a, b = self, x
        else:
            if isinstance(x, UOp):  # a symbolic int (a bound Variable): a weak int whose value is a kernel parameter
                x = check_sym("operand", x)
            elif not isinstance(x, (bool, int, float)) or isinstance(x, np.generic):
                x = _scalar(x)
            if isinstance(x, bool):
                out_dt = self.dtype
            elif isinstance(x, (int, UOp)):
                out_dt = dtypes.default_int if self.dtype is dtypes.bool else self.dtype
            else:
                out_dt = self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float
            const = x.cast(out_dt) if isinstance(x, UOp) else UOp.const(out_dt, x)
            a = self if self.uop.dtype is out_dt else self.cast(out_dt)
            # a scalar becomes a broadcast constant directly: this is the hot path of elementwise code
            const = broadcast_uop(const, a.shape)
            b = a._new(const)
            return (b, a) if reverse else (a, b)
        # most operands have the result dtype already: no cast's dtype parsing
        a = a if a.uop.dtype is out_dt else a.cast(out_dt)
        b = b if b.uop.dtype is out_dt else b.cast(out_dt)
        if a.shape != b.shape:
            shape = broadcast_shape(a.shape, b.shape)
            a, b = a._broadcast_to(shape), b._broadcast_to(shape)
        return (b, a) if reverse else (a, b)

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        if len(self.shape) > len(shape):
            raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
        padded = (1,) * (len(shape) - len(self.shape)) + self.shape
        if any(s != d and s != 1 for s, d in zip(padded, shape)):
            raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
        # leading 1s keep the element count: the RESHAPE node without reshape's checks
        u = self._uop if padded == self.shape else UOp(Ops.RESHAPE, self.dtype, (self._uop,), padded)
        return tensor_of_uop(UOp(Ops.EXPAND, u.dtype, (u,), shape), self.device) if padded != shape else self._new(u)

    def _alu(self, op: Ops, *srcs: Tensor, dtype: DType | None = None) -> Tensor:
        src = (self._uop, srcs[0]._uop) if len(srcs) == 1 else (self._uop, *(s._uop for s in srcs))
        # the sources' one shape (_operand broadcast them), recorded: asked later, a chain of new nodes without one is
        # inferred node by node, an exception each; sources without a known equal shape leave it to that inference
        shape = getattr(src[0], "_shape", None)
        if shape is not None and all(getattr(s, "_shape", None) == shape for s in src[1:]):
            return self._new(elementwise_uop(op, dtype or self._uop.dtype, src, shape))
        return self._new(UOp(op, dtype or self._uop.dtype, src))

    def _binary(self, op: Ops, x: Tensor | Scalar, reverse: bool = False, dtype: DType | None = None) -> Tensor:
        # the hot paths of elementwise code, one tensor for the result only: a float tensor and a Python float, and two
        # tensors of one dtype, shape and device (what _operand makes of them, without its promotion and broadcasting)
        uop = self._uop
        if type(x) is float or type(x) is int:  # an int against a float tensor is a constant of its dtype too
            if dtypes.is_float(dt := uop.dtype):
                const = broadcast_const(dt, x, shape := uop.shape)
                out = elementwise_uop(op, dtype or dt, (const, uop) if reverse else (uop, const), shape)
                return tensor_of_uop(out, self.device)
        elif type(x) is Tensor:
            xu = x._uop
            if xu.dtype is uop.dtype and x.device == self.device:
                if (shape := uop.shape) == (x_shape := xu.shape):
                    out = elementwise_uop(op, dtype or uop.dtype, (xu, uop) if reverse else (uop, xu), shape)
                    return tensor_of_uop(out, self.device)
                # a 0-d operand (a learning rate, a step's scalar) broadcast as _operand would, without its checks
                if not x_shape:
                    xu = broadcast_uop(xu, shape)
                elif not shape:
                    uop, shape = broadcast_uop(uop, x_shape), x_shape
                else:
                    xu = None
                if xu is not None:
                    out = elementwise_uop(op, dtype or xu.dtype, (xu, uop) if reverse else (uop, xu), shape)
                    return tensor_of_uop(out, self.device)
        a, b = self._operand(x, reverse)
        return a._alu(op, b, dtype=dtype)

    def _where_scalar(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor | None:
        """self.where(x, y) when self is a bool condition and one of x, y a Python number, the other a float tensor of
        the condition's shape and device (relu, clamp): the number as a broadcast constant of the tensor's dtype, as
        _operand would make it, without its checks. None otherwise."""
        if type(y) is Tensor and (type(x) is float or type(x) is int):
            t, number, tensor_first = y, x, False
        elif type(x) is Tensor and (type(y) is float or type(y) is int):
            t, number, tensor_first = x, y, True
        else:
            return None
        tu, cond = t._uop, self._uop
        if cond.dtype is not dtypes.bool or not dtypes.is_float(dt := tu.dtype) or t.device != self.device:
            return None
        if (shape := tu.shape) != cond.shape:
            return None
        const = broadcast_const(dt, number, shape)
        src = (cond, tu, const) if tensor_first else (cond, const, tu)
        return tensor_of_uop(elementwise_uop(Ops.WHERE, dt, src, shape), self.device)

    # ------------------------------------------------------------------ elementwise math
    # ------------------------------------------------------------------ reductions
    def _axes(self, axis: int | Sequence[int] | None) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        out = tuple(self._axis(a) for a in axes)
        if len(set(out)) != len(out):
            raise RuntimeError(f"axis {axis} repeats a dimension")
        return out if self.ndim else ()  # a 0-d tensor accepts axis 0 / -1 and has nothing to reduce

    def _axis(self, a: int, extra: int = 0) -> int:
        n = self.ndim + extra
        if not isinstance(a, int):
            raise TypeError(f"axis must be an int, got {type(a).__name__}")
        if not -max(n, 1) <= a < max(n, 1):
            raise IndexError(f"dimension {a} is out of range for a tensor with {self.ndim} dims")
        return a + n if a < 0 else a

    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
        axes = self._axes(axis)
        if not axes:
            return self
        shape = self.shape
        reduced = UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes))
        # the shapes are known here: recorded at once, the reshape's checks skipped (it only drops dims of size 1)
        reduced._shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
        if keepdim:
            return self._new(reduced)
        dropped = tuple(d for i, d in enumerate(shape) if i not in axes)
        return self._new(UOp(Ops.RESHAPE, self.dtype, (reduced,), dropped))

    # ------------------------------------------------------------------ movement
    # ------------------------------------------------------------------ indexing
    # ------------------------------------------------------------------ linear algebra
    # ------------------------------------------------------------------ autograd
    def _seed_gradient(self, gradient: Tensor | None) -> UOp:
        if not dtypes.is_float(self.dtype):
            raise RuntimeError(f"only float Tensors have gradient (this one is {self.dtype})")
        if gradient is None:
            if self.shape:
                raise AssertionError(f"backward/gradient without a gradient needs a 0-d tensor, got shape {self.shape}")
            return UOp.const(self.dtype, 1.0)
        if gradient.shape != self.shape:
            raise ValueError(f"gradient shape {gradient.shape} does not match tensor shape {self.shape}")
        return gradient.cast(self.dtype).uop

    def gradient(
        self, *targets: Tensor, gradient: Tensor | None = None, materialize_grads: bool = True
    ) -> list[Tensor]:
        """d self / d target for each target, without touching .grad; unrelated targets get zeros."""
        for t in targets:
            if not dtypes.is_float(t.dtype):
                raise RuntimeError(f"only float Tensors have gradient (target is {t.dtype})")
        grads = compute_gradient(self.uop, self._seed_gradient(gradient), {t.uop for t in targets})
        return [Tensor(grads[t.uop], device=t.device) if t.uop in grads else t.zeros_like() for t in targets]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """d self / d t into t.grad for every live float tensor t in self's graph that did not set requires_grad=False;
        added to an existing t.grad (tinygrad's gradient accumulation)."""
        nodes = self.uop.toposort()
        targets = list(
            {
                id(t): t
                for u in nodes
                if u.holders is not None and u.op is not Ops.CONST and dtypes.is_float(u.dtype)
                for ref in u.holder_refs()
                if (t := ref()) is not None and t._uop is u and t.requires_grad is not False
            }.values()
        )
        grads = compute_gradient(self.uop, self._seed_gradient(gradient), {t.uop for t in targets}, nodes)
        del nodes  # the graph's nodes: a list kept alive here would count as a holder of them in a realize below
        targets = [t for t in targets if t.uop in grads]
        # a lazy sum of sums would keep every earlier step's graph and buffers alive (the batch `x` of a loop nobody
        # clears): an accumulated .grad still pending is realized before the next gradient is added to it
        if pending := [
            t.grad for t in targets if t.grad is not None and t.grad._lazy_sum and not t.grad.uop.is_realized
        ]:
            Tensor.realize(*pending)
        for t in targets:
            g = Tensor(grads[t.uop], device=t.device)
            if t.grad is None:
                t.grad = g
            else:
                t.grad = t.grad + g
                t.grad._lazy_sum = True
        return self

    # ------------------------------------------------------------------ training mode [compat]
    @staticmethod
    def train(mode: bool = True):
        """[compat] context manager / decorator setting training mode (TRAINING)."""
        from fusegrad.helpers import Context

        return Context(TRAINING=int(mode))

    @staticmethod
    def test(mode: bool = True):
        """[compat] <= v0.10: test mode is training mode off."""
        return Tensor.train(not mode)


# tensors that were assigned to, by id (Tensor.__eq__ is elementwise), as their weak references; realize_all picks up
# those still pending. A plain dict: a WeakValueDictionary's iteration and set are Python calls on every realize after
# an assign; an entry whose tensor died is dropped by the next realize's scan (its reference never resolves to a
# later tensor under the same id)
_pending_assigns: dict[int, weakref.ref[Tensor]] = {}


def pending_assign_tensors() -> list[Tensor]:
    """The live tensors with an assign not yet realized."""
    return [t for ref in list(_pending_assigns.values()) if (t := ref()) is not None and t.uop.op is Ops.ASSIGN]


_contiguous_ids = itertools.count()


def _pending_assigns_reached(todo: list[Tensor]) -> list[Tensor]:
    """Pending assigns (not in todo) whose node todo's graphs contain."""
    todo_ids = {id(t) for t in todo}
    pending = [t for key, ref in list(_pending_assigns.items()) if key not in todo_ids and (t := ref()) is not None]
    if not pending:
        return []
    nodes = set(UOp(Ops.SINK, src=tuple(t.uop for t in todo)).toposort())
    return [t for t in pending if t.uop in nodes]


def _separate_equal_roots(todo: list[Tensor]) -> None:
    """Two tensors holding one graph still get two buffers: an assign into one must not change the other."""
    seen: set[UOp] = set()
    for t in todo:
        if t.uop in seen:
            t.uop = t.contiguous().uop
        seen.add(t.uop)


def _scalar(x: Any) -> Scalar:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"unsupported operand type {type(x).__name__}")


def tensor_of_uop(u: UOp, device: str | tuple[str, ...]) -> Tensor:
    """A Tensor holding node u on an already canonical device, as Tensor(u, device=device) builds it without parsing
    the device: every op builds one (`Tensor._new`), and TinyJit one per output of each replay."""
    t = Tensor.__new__(Tensor)
    t.device, t.grad, t.requires_grad, t.is_param = device, None, None, True
    t._ref = ref = weakref.ref(t)
    t._uop = u  # the uop setter's work, inline: every op builds one
    if u.holders is None:  # a new node (add_holder's first case)
        u.holders = ref
    else:
        u.add_holder(ref)
    return t
