"""Tensor.custom_kernel: a user-written kernel over tensors, as one lazy node the scheduler gives a kernel of its own.

The kernel writes fresh buffers for the inputs it stores into (each starting with that input's value), so the inputs
keep their values and the returned tensors hold what the kernel left in them."""

from __future__ import annotations
from typing import TYPE_CHECKING, Any, Callable
from fusegrad.gradient import register_gradient
from fusegrad.tensor_ops.base import TensorBase
from fusegrad.uop.kernel import CustomKernel, KernelInfo, RawKernel
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


def custom_kernel(inputs: tuple[Tensor, ...], fxn: Callable[..., Any], grad_fxn: Callable | None) -> list[Tensor]:
    if fxn is None or not callable(fxn):
        raise TypeError(f"custom_kernel needs fxn, a function of one placeholder per input, got {fxn!r}")
    if bad := [type(t).__name__ for t in inputs if not isinstance(t, TensorBase)]:
        raise TypeError(f"custom_kernel takes tensors, got {bad}")
    devices = {t.device if isinstance(t.device, str) else tuple(t.device) for t in inputs}
    if len(devices) > 1:
        raise RuntimeError(f"custom_kernel inputs are on different devices {sorted(map(str, devices))}")
    device, tensor_class = inputs[0].device, type(inputs[0])
    if bad := [t.shape for t in inputs if not all(isinstance(d, int) for d in t.shape)]:
        raise ValueError(f"custom_kernel inputs have concrete shapes, got {bad}")
    # on sharded inputs the kernel runs once per device, on its shards: it is written for the shard shapes
    shapes = [_shard_shape(t) for t in inputs] if isinstance(device, tuple) else [t.shape for t in inputs]
    placeholders = [UOp.placeholder(shape, t.dtype, i) for i, (t, shape) in enumerate(zip(inputs, shapes))]
    kernel = fxn(*placeholders)
    params = [p.base if p.op is not Ops.DEFINE_GLOBAL else p for p in placeholders]
    if isinstance(kernel, RawKernel):
        kernel, written = UOp(Ops.SINK, src=tuple(params), arg=kernel), _raw_written(kernel, len(inputs))
    elif isinstance(kernel, UOp) and kernel.op is Ops.SINK:
        kernel, written = _checked(kernel, params, device)
    else:
        raise TypeError(f"custom_kernel's fxn returns a sink (.sink(arg=KernelInfo(...))) or a RawKernel: {kernel!r}")
    from fusegrad.engine.realize import check_custom_kernel

    check_custom_kernel(
        kernel, device if isinstance(device, str) else device[0]
    )  # compiled now: a bad kernel raises here, before anything runs
    empty = tuple(s for s in written if _is_empty(inputs[s].uop))
    node = UOp(Ops.CUSTOM_KERNEL, src=tuple(t.uop for t in inputs), arg=CustomKernel(kernel, written, grad_fxn, empty))
    outs = [tensor_class(UOp(Ops.AFTER, inputs[s].dtype, (inputs[s].uop, node), s), device=device) for s in written]
    _register_backward(node, outs, inputs, written, grad_fxn, device)
    return outs


def _checked(sink: UOp, params: list[UOp], device: str) -> tuple[UOp, tuple[int, ...]]:
    """The sink with every input a parameter (in slot order), and the slots it stores into; errors a bad kernel."""
    if not isinstance(sink.arg, KernelInfo):
        sink = sink.replace(arg=KernelInfo())
    name = sink.arg.name
    given = {p.arg[0]: p for p in params}
    written: set[int] = set()
    for u in sink.toposort():
        if u.op is Ops.DEFINE_GLOBAL and given.get(u.arg[0]) is not u:
            p = given.get(u.arg[0])
            want = f"{p.dtype!r} x {p.arg[1]}" if p is not None else f"no input (it was given {len(params)})"
            got = f"{u.dtype!r} x {u.arg[1]}"
            raise ValueError(f"custom kernel {name!r} uses placeholder slot {u.arg[0]} ({got}), the input is {want}")
        if u.op is Ops.STORE and u.src[0].op is Ops.INDEX and (b := u.src[0].src[0].base).op is Ops.DEFINE_GLOBAL:
            written.add(b.arg[0])
    if not written:
        raise ValueError(f"custom kernel {name!r} stores into no input: it computes nothing")
    return UOp(Ops.SINK, src=sink.src + tuple(p for p in params if p not in sink.src), arg=sink.arg), tuple(
        sorted(written)
    )


def _is_empty(u: UOp) -> bool:
    """u is a whole buffer that holds nothing yet (Tensor.empty): a kernel writing it needs no copy of it."""
    u = u.peel(Ops.RESHAPE)
    buf = u.buffer if u.op is Ops.BUFFER else None
    return buf is not None and not buf.is_allocated and buf._initial is None and buf.size == u.size


def _raw_written(kernel: RawKernel, n: int) -> tuple[int, ...]:
    if not kernel.written or any(not 0 <= s < n for s in kernel.written):
        raise ValueError(f"raw kernel {kernel.entry!r} writes slots {kernel.written}, but it was given {n} inputs")
    return tuple(sorted(set(kernel.written)))


def _register_backward(
    node: UOp, outs: list[Tensor], inputs: tuple[Tensor, ...], written: tuple[int, ...], grad_fxn: Any, device: str
) -> None:
    name, input_uops, tensor_class = node.arg.name, tuple(t.uop for t in inputs), type(inputs[0])
    # shapes, not the output nodes: the backward must not hold the node it is registered on
    out_types = [(o.shape, o.dtype) for o in outs]
    for k, out in enumerate(outs):
        if not any(t.dtype.kind == "float" for t in inputs):
            continue

        def backward(g: UOp, k: int = k) -> tuple[UOp | None, ...]:
            if grad_fxn is None:
                raise RuntimeError(f"custom kernel {name!r} has no gradient: pass grad_fxn to custom_kernel")
            # the gradient is linear in the output gradients: each output's share is grad_fxn with the others zero
            grads = [
                tensor_class(g, device=device) if j == k else tensor_class.zeros(shape, dtype=dt, device=device)
                for j, (shape, dt) in enumerate(out_types)
            ]
            res = grad_fxn(grads, *(tensor_class(u, device=device) for u in input_uops))
            res = list(res) if isinstance(res, (list, tuple)) else [res]
            if len(res) != len(input_uops):
                n = len(input_uops)
                raise ValueError(f"custom kernel {name!r}: grad_fxn gave {len(res)} gradients for {n} inputs")
            return tuple(None if r is None else r.uop for r in res)

        register_gradient(out.uop, input_uops, backward)


def _shard_shape(t: Tensor) -> tuple[int, ...]:
    from fusegrad.uop.multi import multi_axis, shard_shape

    return shard_shape(t.shape, multi_axis(t.uop), len(t.device))
