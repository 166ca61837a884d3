"""Multi-device tensors: lowers a graph over MULTI nodes (logical, full-shape values) to one graph per device.

MULTI(shard_0, ..., shard_n-1) with arg (axis, devices) means the concatenation of its shards along `axis`, or the
same value replicated on every device when axis is None. Users build graphs on MULTI freely; before scheduling,
`lower_multi` pushes each op through the MULTI nodes below it: elementwise ops and ops that keep the sharded axis
whole run per shard, a reduce over the sharded axis reduces per shard and then all-reduces (each device adds the
copied partials), and everything else gathers the shards on every device first (a replicated result).

Graph-level only: the front end asks a value's sharded axis (multi_axis) and the scheduler lowers before it plans."""

from __future__ import annotations
from typing import Sequence
from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.uop.ops import GroupOp, Ops, UOp, device_of, is_contiguous_view


def shard_shape(shape: tuple[int, ...], axis: int | None, n: int) -> tuple[int, ...]:
    return shape if axis is None else tuple(d // n if i == axis else d for i, d in enumerate(shape))


def shard_bounds(shape: tuple[int, ...], axis: int, n: int, i: int) -> tuple[tuple[int, int], ...]:
    size = shape[axis] // n
    return tuple((i * size, (i + 1) * size) if j == axis else (0, d) for j, d in enumerate(shape))


def make_multi(shards: Sequence[UOp], axis: int | None, devices: tuple[str, ...]) -> UOp:
    return UOp(Ops.MULTI, shards[0].dtype, tuple(shards), (axis, devices))


def shard_uop(u: UOp, devices: tuple[str, ...], axis: int | None) -> UOp:
    """Split u along axis (or replicate it) onto devices; a device-less constant is not copied, only sliced."""
    on_device = device_of(u) is not None
    parts = [
        u if axis is None else UOp(Ops.SHRINK, u.dtype, (u,), shard_bounds(u.shape, axis, len(devices), i))
        for i in range(len(devices))
    ]
    shards = [UOp(Ops.COPY, p.dtype, (p,), d) if on_device else p for p, d in zip(parts, devices)]
    return make_multi(shards, axis, devices)


def _combine(op: Ops, a: UOp, b: UOp) -> UOp:
    return UOp(Ops.OR if a.dtype is dtypes.bool and op is Ops.ADD else op, a.dtype, (a, b))


def _copy(u: UOp, device: str) -> UOp:
    return u if device_of(u) in (device, None) else UOp(Ops.COPY, u.dtype, (u,), device)


def gather(m: UOp, device: str) -> UOp:
    """The full value of MULTI m on one device: its shards copied there and concatenated (pad with zeros, add)."""
    axis, devices = m.arg
    if axis is None:
        return m.src[devices.index(device)] if device in devices else _copy(m.src[0], device)
    size, n = m.src[0].shape[axis], len(m.src)
    out = None
    for i, s in enumerate(m.src):
        pad = tuple((i * size, (n - 1 - i) * size) if j == axis else (0, 0) for j in range(len(s.shape)))
        part = UOp(Ops.PAD, s.dtype, (_copy(s, device),), pad)
        out = part if out is None else _combine(Ops.ADD, out, part)
    return out  # type: ignore[return-value]


def to_axis(u: UOp, axis: int | None, devices: tuple[str, ...]) -> UOp:
    """u (a MULTI on devices or a device-less constant) as a MULTI sharded along axis."""
    if u.op is not Ops.MULTI:
        if (d := device_of(u)) is not None:
            raise RuntimeError(f"an op mixes a tensor on {d} with one sharded on {devices}; move them with .to() first")
        return shard_uop(u, devices, axis)
    if u.arg[1] != devices:
        raise RuntimeError(f"an op mixes tensors sharded on {u.arg[1]} and on {devices}")
    if u.arg[0] == axis:
        return u
    full = [gather(u, d) for d in devices]
    if axis is None:
        return make_multi(full, None, devices)
    return make_multi(
        [UOp(Ops.SHRINK, f.dtype, (f,), shard_bounds(f.shape, axis, len(devices), i)) for i, f in enumerate(full)],
        axis,
        devices,
    )


def _per_shard(n: UOp, srcs: list[UOp], axis: int | None, arg=None) -> UOp:
    devices = srcs[0].arg[1]
    new_arg = n.arg if arg is None else arg
    shards = [n.replace(src=tuple(s.src[i] for s in srcs), arg=new_arg) for i in range(len(devices))]
    return make_multi(shards, axis, devices)


def _lower_elementwise(n: UOp, srcs: list[UOp]) -> UOp:
    multis = [s for s in srcs if s.op is Ops.MULTI]
    devices = multis[0].arg[1]
    # an assign keeps its target's layout; otherwise the first sharded operand decides
    if n.op is Ops.ASSIGN and srcs[0].op is Ops.MULTI:
        axis = srcs[0].arg[0]
    else:
        axis = next((m.arg[0] for m in multis if m.arg[0] is not None), None)
    return _per_shard(n, [to_axis(s, axis, devices) for s in srcs], axis)


def _lower_reduce(n: UOp, m: UOp) -> UOp:
    axis, devices = m.arg
    op, axes = n.arg
    if axis is None or axis not in axes:
        return _per_shard(n, [m], axis)
    # all-reduce: every device combines all per-shard partial results
    partials = [n.replace(src=(s,)) for s in m.src]
    out = []
    for d in devices:
        acc = _copy(partials[0], d)
        for p in partials[1:]:
            acc = _combine(op, acc, _copy(p, d))
        out.append(acc)
    return make_multi(out, None, devices)


def _reshaped_axis(old: tuple[int, ...], new: tuple[int, ...], axis: int) -> int | None:
    """Where the sharded dim lands in a reshape that keeps it whole (same size, same elements before it)."""
    before = prod(old[:axis])
    return next((j for j in range(len(new)) if new[j] == old[axis] and prod(new[:j]) == before), None)


def _lower_movement(n: UOp, m: UOp) -> UOp:
    axis, devices = m.arg
    k = len(devices)
    if axis is None:
        return _per_shard(n, [m], None)
    if n.op is Ops.PERMUTE:
        return _per_shard(n, [m], n.arg.index(axis))
    if n.op is Ops.EXPAND and n.arg[axis] == m.shape[axis]:
        return _per_shard(n, [m], axis, shard_shape(n.arg, axis, k))
    if n.op is Ops.RESHAPE and (j := _reshaped_axis(m.shape, n.arg, axis)) is not None:
        return _per_shard(n, [m], j, shard_shape(n.arg, j, k))
    if n.op is Ops.SHRINK and n.arg[axis] == (0, m.shape[axis]):
        return _per_shard(n, [m], axis, tuple((0, m.shape[axis] // k) if i == axis else b for i, b in enumerate(n.arg)))
    if n.op is Ops.PAD and n.arg[axis] == (0, 0) or n.op is Ops.FLIP and not n.arg[axis]:
        return _per_shard(n, [m], axis)
    return _per_shard(n, [to_axis(m, None, devices)], None)  # the op splits the sharded axis: gather first


def _lower_custom_kernel(n: UOp, srcs: list[UOp]) -> UOp:
    """A custom kernel over sharded inputs runs once per device on its shards (its kernel was written for the shard
    shapes); the result stands for the per-device kernels, which the AFTERs of its outputs take apart."""
    devices = next(s.arg[1] for s in srcs if s.op is Ops.MULTI)
    if bad := [
        s.arg[1] if s.op is Ops.MULTI else device_of(s) for s in srcs if s.op is not Ops.MULTI or s.arg[1] != devices
    ]:
        raise RuntimeError(f"custom kernel {n.arg.name!r} mixes inputs sharded on {devices} with inputs on {bad}")
    return make_multi([n.replace(src=tuple(s.src[i] for s in srcs)) for i in range(len(devices))], None, devices)


def _lower(n: UOp, srcs: list[UOp]) -> UOp:
    if n.op is Ops.MULTI or not any(s.op is Ops.MULTI for s in srcs):
        return n if tuple(srcs) == n.src else n.replace(src=tuple(srcs))
    if n.op is Ops.CUSTOM_KERNEL:
        return _lower_custom_kernel(n, srcs)
    if n.op is Ops.AFTER and srcs[1].op is Ops.MULTI and srcs[1].src[0].op is Ops.CUSTOM_KERNEL:
        return _per_shard(n, srcs, srcs[0].arg[0])
    if n.op is Ops.COPY:
        return gather(srcs[0], n.arg)
    if n.op is Ops.REDUCE_AXIS:
        return _lower_reduce(n, srcs[0])
    if n.op in GroupOp.Movement:
        return _lower_movement(n, srcs[0])
    if n.op is Ops.BITCAST and n.shape != srcs[0].shape:  # the item size changes the last dim: gather first
        return _per_shard(n, [to_axis(srcs[0], None, srcs[0].arg[1])], None)
    return _lower_elementwise(n, srcs)


def lower_multi(roots: list[UOp], devices: Sequence[str | tuple[str, ...]]) -> list[UOp]:
    """Each root as a per-device graph, or as a MULTI of per-device graphs when it is multi-device. A root placed on
    several devices whose value is a device-less constant becomes a replicated MULTI."""
    sink = UOp(Ops.SINK, src=tuple(roots))
    nodes = sink.toposort()
    if not any(u.op is Ops.MULTI for u in nodes) and not any(isinstance(d, tuple) for d in devices):
        return roots
    # the sink only groups the roots: lowering it like an elementwise op would mix single- and multi-device roots
    memo = _lower_graph([u for u in nodes if u is not sink])
    out = []
    for r, d in zip(roots, devices):
        u = memo[r]
        if u.op is not Ops.MULTI and isinstance(d, tuple):
            u = to_axis(u, None, d)
        if u.op is Ops.MULTI:  # each shard realized on its own device needs a node of its own (constants are shared)
            u = u.replace(
                src=tuple(
                    s if device_of(s) is not None else UOp(Ops.CONTIGUOUS, s.dtype, (s,), ("shard", i))
                    for i, s in enumerate(u.src)
                )
            )
        out.append(u)
    return out


def _lower_graph(nodes: list[UOp]) -> dict[UOp, UOp]:
    memo: dict[UOp, UOp] = {}
    for u in nodes:
        memo[u] = _lower(u, [memo[s] for s in u.src])
    return memo


def multi_axis(u: UOp) -> int | None:
    """The sharded axis of a multi-device value (None when replicated or a constant)."""
    m = u if u.op is Ops.MULTI else _lower_graph(u.toposort())[u]
    return m.arg[0] if m.op is Ops.MULTI else None


def is_realized_multi(u: UOp) -> bool:
    """A MULTI whose every shard is a whole buffer (only reshaped)."""
    return u.op is Ops.MULTI and all(is_contiguous_view(s) for s in u.src)
