"""Collectives on tensors. Each one realizes its input, then runs as a host call on the input's and output's buffers:
MPI reads and writes host memory in place through the buffer protocol (device memory goes through a host copy).
Inside a TinyJit capture the call is recorded among the step's kernels, so a replay runs it at the same place."""

from __future__ import annotations
from functools import partial
from typing import Any, Callable

import numpy as np

from fusegrad.dtype import NARROW_FLOATS, DType, dtypes
from fusegrad.engine.realize import capturing
from fusegrad.helpers import DIST_BLOCKING, DIST_TIMEOUT, prod
from fusegrad.distributed.comm import World, world
from fusegrad.distributed.metadata import check_collective
from fusegrad.runtime.buffers import Buffer, buffer_uop, view_buffer
from fusegrad.runtime.device import Device, HostAllocator
from fusegrad.tensor import Tensor, tensor_of_uop
from fusegrad.uop.ops import Ops

OPS = ("sum", "mean", "max", "min")
EAGER_CALLS = 64  # eager collectives (kind, op, dtype, shape, name) kept bound at once
# each collective's MPI call, blocking; "I" + lowercase is its nonblocking form and "_init" its persistent one
MPI_CALLS = {
    "all_reduce": "Allreduce",
    "all_gather": "Allgather",
    "reduce_scatter": "Reduce_scatter_block",
    "broadcast": "Bcast",
}


def host_array(buf: Buffer) -> np.ndarray:
    """The buffer's memory as numpy without a copy on host devices; a host copy of device memory otherwise."""
    return buf.host_view() if buf.is_host else buf.numpy()


def store(buf: Buffer, arr: np.ndarray) -> None:
    """Results MPI wrote into host_array(buf): already in place on host devices, copied back to device memory."""
    if not buf.is_host:
        buf.copyin(arr)


def mpi_op(w: World, op: str, dtype: DType) -> Any:
    if dtype is dtypes.bool:
        return {"max": w.mpi.LOR, "min": w.mpi.LAND}[op]
    return {"sum": w.mpi.SUM, "mean": w.mpi.SUM, "max": w.mpi.MAX, "min": w.mpi.MIN}[op]


class Collective:
    """One collective over buffers (output first, then input). It is the object a TinyJit capture records, so its
    replay calls it again on the same buffers: the MPI call is bound to their memory once, and a replay of a small
    collective is that one blocking MPI call (bounded by the World's watchdog); a large one starts a nonblocking call
    and waits politely (start, then finish), leaving the core to a descheduled peer."""

    def __init__(self, w: World, kind: str, op: str, root: int, what: str, dtype: DType):
        self.w, self.kind, self.root, self.what, self.dtype = w, kind, root, what, dtype
        self.op = mpi_op(w, op, dtype) if kind in ("all_reduce", "reduce_scatter") else None
        self.timeout = float(DIST_TIMEOUT.value)  # read once: the watchdog bounds a blocking call by it
        self.block_bytes = int(DIST_BLOCKING.value) if w.can_block else 0
        self.pending: Any = None  # the MPI request in flight
        self.pending_bytes = 0  # its bytes per rank
        # (output memory, input memory, the bound MPI call, whether it blocks): a replay's whole path
        self.cache: tuple[Any, Any, Callable[[], Any], bool] | None = None
        self.back: tuple[Buffer, np.ndarray] | None = None  # a device output: its host copy, copied in after the wait
        # replays may bind a persistent request: set at capture when both buffers are the step's own host memory (a
        # jit input's changes per call, and not alike on every rank, while every rank must create one at once)
        self.may_persist = False
        self.keep: Any = None
        # (output memory, input memory, what starts the request, the persistent request): a replay's whole path
        self.persistent: tuple[Any, Any, Callable[[], Any], Any] | None = None

    def mpi_call(self, form: str, dst: np.ndarray, inp: np.ndarray) -> Callable[[], Any]:
        """This collective's MPI call on these arrays, in one of MPI's three forms: "" blocking (MPI's tuned
        algorithms, up to 2.5x faster than the nonblocking ones at 4 KB to 64 KB here, and no request to poll), "I"
        nonblocking (returns its request) or "_init" persistent (returns the request each start runs again). A root's
        broadcast copies its input into the output first, in every form but "_init" (persist() does it per start)."""
        if form == "" and self.w.lib is not None:  # libmpi's call on the arrays' addresses, bound once
            direct = self.w.lib.bind(self.kind, self.w.data, self.op, self.root, dst, inp)
            if direct is not None:
                return self.root_copies(direct, dst, inp)
        name = MPI_CALLS[self.kind]
        fn = getattr(self.w.data, "I" + name.lower() if form == "I" else name + form)
        if self.kind != "broadcast":
            return partial(fn, inp, dst, self.op) if self.op is not None else partial(fn, inp, dst)
        call = partial(fn, dst, root=self.root)
        return call if form == "_init" else self.root_copies(call, dst, inp)

    def root_copies(self, call: Callable[[], Any], dst: np.ndarray, inp: np.ndarray) -> Callable[[], Any]:
        """call, preceded on a broadcast's root by copying its input into the output MPI sends from."""
        if self.kind != "broadcast" or self.w.rank != self.root:
            return call

        def root_call() -> Any:
            dst[:] = inp
            return call()

        return root_call

    def persist(self, out: Buffer, src: Buffer) -> tuple[Any, Any, Callable[[], Any], Any]:
        """A persistent request (MPI-4) bound to the buffers' memory: its algorithm and schedule are set up once, so a
        replay starts it (as fast as MPI's blocking call at small sizes) and waits for it politely, like any request.
        Every rank creates it at the same replay (the first, or after the step's memory moved): creation is a
        collective call."""
        if self.persistent is not None:
            self.persistent[3].Free()
        dst, inp = host_array(out), host_array(src)
        req = self.mpi_call("_init", dst, inp)()
        go = self.root_copies(req.Start, dst, inp)
        self.persistent, self.keep = (out._mem, src._mem, go, req), (dst, inp)  # the views MPI uses, alive
        return self.persistent

    def bind(self, out: Buffer, src: Buffer, may_block: bool) -> tuple[Any, Any, Callable[[], Any], bool]:
        """Bind the MPI call to the buffers' memory (numpy views of host memory; host copies of device memory)."""
        dst, inp = host_array(out.ensure_allocated()), host_array(src.ensure_allocated())
        blocking = may_block and max(dst.nbytes, inp.nbytes) <= self.block_bytes
        bound = (out._mem, src._mem, self.mpi_call("" if blocking else "I", dst, inp), blocking)
        # host memory is shared with MPI, so the same views serve every call on it; device memory is copied
        self.cache = bound if out.is_host and src.is_host else None
        self.back = None if out.is_host else (out, dst)
        return bound

    def thunk(self, buffers: list[Buffer]) -> Callable[[], None]:
        """This collective on these buffers as a call of no arguments (a TinyJit replay's step): a bound blocking call
        on host memory is the watched call itself, without __call__'s lookups. Its memory stays bound: a replay's
        buffers keep theirs (its batched kernels hold their addresses too) until it rebuilds its thunks."""
        out, src = buffers[0], buffers[1]
        bound = self.cache
        if bound is None or not bound[3] or bound[0] is not out._mem or bound[1] is not src._mem:
            return partial(self, buffers)
        thunk = partial(self.w.watched, self, bound[2], 1)
        if (c_call := getattr(bound[2], "c_call", None)) is not None:  # the shim: a C caller can watch it alike
            thunk.c_call = (*c_call, self.w, self, 1, self.w.raise_mpi_error)
        return thunk

    def call_blocking(self, call: Callable[[], Any]) -> None:
        """Run a bound blocking call, watched: the watchdog ends the job if it outlasts self.timeout."""
        self.w.watched(self, call, 1)

    def start(self, buffers: list[Buffer], bound: tuple | None = None) -> None:
        """Start the nonblocking call (`bound`: its binding, when the caller made it already)."""
        out, src = buffers[0], buffers[1]
        self.pending_bytes = max(out.nbytes, src.nbytes)  # how long finish() may expect to wait
        p = self.persistent
        if p is None or p[0] is not out._mem or p[1] is not src._mem:
            p = self.persist(out, src) if self.may_persist else None
        if p is not None:
            p[2]()
            self.pending = p[3]
            self.w.calls += 1
            return
        if bound is None:
            bound = self.cache
            if bound is None or bound[0] is not out._mem or bound[1] is not src._mem:
                bound = self.bind(out, src, may_block=False)
        self.pending = bound[2]()
        self.w.calls += 1

    def progress(self) -> None:
        """Let MPI move this collective's data now (it completes it when it can; finish() still waits)."""
        if self.pending is not None:
            self.pending.Test()

    def finish(self) -> None:
        req = self.pending
        assert req is not None, f"{self.what}: finish() without start()"
        if not req.Test():
            self.w.wait([req], f"{self.what} (collective #{self.w.calls})", self.pending_bytes)
        if self.back is not None:
            store(*self.back)
        self.pending = None

    def __call__(self, buffers: list[Buffer]) -> None:
        out, src = buffers[0], buffers[1]
        bound = self.cache
        if bound is None or bound[0] is not out._mem or bound[1] is not src._mem:
            bound = self.bind(out, src, may_block=True)
        if bound[3]:
            self.call_blocking(bound[2])
            if self.back is not None:
                store(*self.back)
            return
        self.start(buffers, bound)  # a large one: nonblocking (on a replay of the step's own buffers, persistent)
        self.finish()


class Start:
    """The first half of a nonblocking collective as a recorded launch: the wait comes later in the step. It also
    lets the collectives started before it progress (MPI moves their data only inside an MPI call)."""

    def __init__(self, coll: Collective, earlier: list[Collective] | None = None):
        self.coll, self.earlier = coll, earlier or []

    def __call__(self, buffers: list[Buffer]) -> None:
        self.coll.start(buffers)
        for c in self.earlier:
            c.progress()


class Finish:
    """The wait of a Start, as a recorded launch."""

    def __init__(self, coll: Collective):
        self.coll = coll

    def __call__(self, buffers: list[Buffer]) -> None:
        self.coll.finish()


def realized_buffer(t: Tensor) -> tuple[Tensor, Buffer]:
    """t as a tensor over one whole buffer read in order (a copy kernel only when it is a lazy graph or a view)."""
    if (buf := view_buffer(t.uop)) is None or buf.size != t.numel():
        t = t.contiguous().realize()
        buf = view_buffer(t.uop)
    assert buf is not None
    return t, buf


def output_like(shape: tuple[int, ...], t: Tensor) -> tuple[Tensor, Buffer]:
    """An uninitialized tensor of `shape` on t's (one, canonical) device and dtype: Tensor.empty's result without its
    argument checks, which cost an eager collective more than the MPI call."""
    buf = Buffer(t.device, prod(shape), t.dtype).ensure_allocated()  # type: ignore[arg-type]
    out = tensor_of_uop(buffer_uop(buf), t.device)
    return (out if len(shape) == 1 else out.reshape(shape)), buf


def launch(calls: list[tuple[Any, list[Buffer]]]) -> None:
    """Run host calls in order now, and record them when a TinyJit captures this step."""
    for runner, bufs in calls:
        runner(bufs)
        if capturing:
            capturing[-1].record_call(runner, tuple(bufs))
            coll = runner.coll if isinstance(runner, (Start, Finish)) else runner
            if isinstance(coll, Collective) and all(b.is_host and b not in capturing[-1].inputs for b in bufs[:2]):
                coll.may_persist = True


def check_tensor(t: Any, name: str, sharded_ok: bool = False) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} expects a Tensor, got {type(t).__name__}")
    if isinstance(t.device, tuple) and not sharded_ok:
        raise ValueError(f"{name} of a tensor sharded over {t.device}: move it to one device first (t.to(t.device[0]))")
    if not all(isinstance(d, int) for d in t.shape):
        raise ValueError(f"{name} needs a concrete shape, got {t.shape}")
    return t


class EagerCall:
    """An eager collective of one (kind, op, dtype, shape, name) on host memory, as a blocking libmpi call: each call's
    output takes the memory of the previous call's output once that died (a spare list, as eager kernels' outputs
    do), so the call bound to the input's and output's addresses serves again, and so does its Collective."""

    def __init__(self, coll: Collective, allocator: Any, out_shape: tuple[int, ...]):
        self.coll, self.allocator, self.spare = coll, allocator, []  # type: ignore[var-annotated]
        self.out_shape, self.out_size = out_shape, prod(out_shape)
        self.bound: tuple[int, int, Callable[[], Any]] | None = None  # (output address, input address, the call)

    def __call__(self, t: Tensor, src: Buffer) -> Tensor | None:
        """The collective's result, or None when the library leaves this call to mpi4py."""
        out = Buffer(t.device, self.out_size, t.dtype).allocate_spare(self.spare, self.allocator)  # type: ignore[arg-type]
        dst_at, src_at, b = out.address(), src.address(), self.bound
        if b is None or b[0] != dst_at or b[1] != src_at:
            c, w = self.coll, self.coll.w
            if (call := w.lib.bind(c.kind, w.data, c.op, c.root, out.host_view(), src.host_view())) is None:
                return None
            b = self.bound = (dst_at, src_at, call)  # addresses only: no view keeps the output's memory from reuse
        self.coll.call_blocking(b[2])
        ret = tensor_of_uop(buffer_uop(out), t.device)
        return ret if len(self.out_shape) == 1 else ret.reshape(self.out_shape)


def eager_call(w: World, kind: str, op: str, root: int, t: Tensor, out_shape: tuple, what: str) -> EagerCall | None:
    """The cached EagerCall for this collective, when it can be one: host memory, blocking size, not captured."""
    if capturing or w.lib is None or not w.can_block:
        return None
    # read per call: a Context may change them; the Collective reads them once
    key = (kind, op, root, t.dtype, t.device, t.shape, what, DIST_BLOCKING.value, DIST_TIMEOUT.value)
    if (call := w.eager.get(key, False)) is False:
        if len(w.eager) >= EAGER_CALLS:  # each may hold a spare output block: the oldest goes
            w.eager.pop(next(iter(w.eager)))
        call = w.eager[key] = new_eager_call(w, kind, op, root, t, out_shape, what)
    return call


def new_eager_call(w: World, kind: str, op: str, root: int, t: Tensor, out_shape: tuple, what: str) -> EagerCall | None:
    """None for a collective the fast path leaves alone (cached as such too)."""
    if kind == "broadcast" or not isinstance(t.device, str) or not t.numel():
        return None  # (a broadcast's root copies through numpy views, which would pin the output's memory)
    if max(prod(out_shape), t.numel()) * t.dtype.itemsize > int(DIST_BLOCKING.value):
        return None
    if type(allocator := Device[t.device].allocator) is not HostAllocator:
        return None
    return EagerCall(Collective(w, kind, op, root, what, t.dtype), allocator, out_shape)


def input_buffer(t: Tensor) -> Buffer:
    """realized_buffer(t)'s buffer, at once for a tensor that is a whole buffer already."""
    u = t.uop
    if u.op is Ops.BUFFER and (buf := u.buffer) is not None and buf.is_allocated:
        return buf
    return realized_buffer(t)[1]


def _run(kind: str, t: Tensor, op: str, root: int, out_shape: tuple[int, ...], name: str | None) -> Tensor:
    w = world()
    assert w is not None
    what = f"{kind}({op if kind in ('all_reduce', 'reduce_scatter') else f'root={root}'}) of {name or 'a tensor'}"
    check_collective(w, kind, op, root, t, what)
    if (fast := eager_call(w, kind, op, root, t, out_shape, what)) is not None:
        if (ret := fast(t, input_buffer(t))) is not None:
            return ret
    _, src_buf = realized_buffer(t)
    out, out_buf = output_like(out_shape, t)
    if t.numel():
        launch([(Collective(w, kind, op, root, what, t.dtype), [out_buf, src_buf])])
    return out


def check_op(t: Tensor, op: str, fn: str) -> None:
    if op not in OPS:
        raise ValueError(f"{fn}: op must be one of {OPS}, got {op!r}")
    if t.dtype is dtypes.bool and op in ("sum", "mean"):
        raise TypeError(f"{fn}: op={op!r} of a bool tensor is not defined; use 'max' (any) or 'min' (all)")
    if op == "mean" and not dtypes.is_float(t.dtype):
        raise TypeError(f"{fn}: op='mean' of a {t.dtype} tensor would truncate; cast it to a float dtype first")


def all_reduce(t: Tensor, op: str = "sum", name: str | None = None) -> Tensor:
    """Every rank's t combined elementwise by op ("sum", "mean", "max", "min"), on every rank (a new tensor)."""
    t = check_tensor(t, "all_reduce", sharded_ok=True)
    check_op(t, op, "all_reduce")
    w = world()
    if w is None:
        return t
    if isinstance(t.device, tuple):  # over its local devices first (a gather), then across ranks, then back
        return all_reduce(t.to(t.device[0]), op, name).shard_like(t)
    if t.dtype in NARROW_FLOATS:  # MPI has no 16- or 8-bit float types: reduce in float32
        return all_reduce(t.cast(dtypes.float32), op, name).cast(t.dtype)
    out = _run("all_reduce", t, "sum" if op == "mean" else op, 0, t.shape, name)
    return out / w.size if op == "mean" else out


def broadcast(t: Tensor, root: int = 0, name: str | None = None) -> Tensor:
    """Rank root's t, on every rank (a new tensor)."""
    t = check_tensor(t, "broadcast", sharded_ok=True)
    w = world()
    n = 1 if w is None else w.size
    if not isinstance(root, int) or not 0 <= root < n:
        raise ValueError(f"broadcast: root must be a rank in 0..{n - 1}, got {root!r}")
    if w is not None and isinstance(t.device, tuple):
        return broadcast(t.to(t.device[0]), root, name).shard_like(t)
    return t if w is None else _run("broadcast", t, "", root, t.shape, name)


def all_gather(t: Tensor, name: str | None = None) -> Tensor:
    """Every rank's t concatenated along axis 0 in rank order (a scalar becomes a vector of size() values)."""
    t = check_tensor(t, "all_gather")
    w = world()
    shape = t.shape if t.shape else (1,)
    if w is None:
        return t.reshape(shape)
    return _run("all_gather", t, "", 0, (shape[0] * w.size, *shape[1:]), name)


def reduce_scatter(t: Tensor, op: str = "sum", name: str | None = None) -> Tensor:
    """t summed (or op) over ranks, split along axis 0 into size() equal blocks: rank r gets block r."""
    t = check_tensor(t, "reduce_scatter")
    check_op(t, op, "reduce_scatter")
    w = world()
    n = 1 if w is None else w.size
    if not t.shape or t.shape[0] % n:
        raise ValueError(f"reduce_scatter: axis 0 of shape {t.shape} must split into {n} equal blocks, one per rank")
    if w is None:
        return t
    if t.dtype in NARROW_FLOATS:
        return reduce_scatter(t.cast(dtypes.float32), op, name).cast(t.dtype)
    out = _run("reduce_scatter", t, "sum" if op == "mean" else op, 0, (t.shape[0] // n, *t.shape[1:]), name)
    return out / n if op == "mean" else out


__all__ = ["Collective", "Finish", "Start", "all_gather", "all_reduce", "broadcast", "launch", "reduce_scatter"]
