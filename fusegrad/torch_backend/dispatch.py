"""How an aten op on `fuse` tensors runs: views share storage, mutations write through, the rest computes lazily.

Order of resolution: the ops handled here (copies between devices, scalars), views (their geometry from the same
op on meta tensors), mutating ops (their functional twin, then a write into the mutated arguments), ops with a
direct implementation (ops.py), torch's decompositions, torch's CompositeImplicit kernels, and last the CPU
fallback (FUSE_CPU_FALLBACK=1) or NotImplementedError naming the op.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable

import torch
import torch._decomp
from torch.utils._pytree import tree_flatten, tree_map

from fusegrad.helpers import FUSE_CPU_FALLBACK
from fusegrad.tensor import Tensor

from .dtypes import to_fuse_dtype
from .ops import INPLACE, OPS, OpCall
from .tensor import _deferred, FuseTensor, Storage, from_cpu, fuse_device_name, to_cpu, wrap

aten = torch.ops.aten
_DECOMPOSITIONS = torch._decomp.decomposition_table
_warned: set[str] = set()


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    # a thread Python did not start is one of autograd's device threads
    if isinstance(threading.current_thread(), threading._DummyThread):
        return _on_worker(func, args, kwargs)
    if _deferred:
        raise _deferred.pop(0)
    return _dispatch(func, args, kwargs)


FuseTensor.dispatcher = staticmethod(dispatch)


def _on_worker(func: Any, args: tuple, kwargs: dict) -> Any:
    """On autograd's device thread an exception aborts the process, so it is raised by the next op or sync on
    `fuse` in a Python thread (as a GPU reports a kernel's error at the next sync), and the op gives zeros meanwhile."""
    try:
        return _dispatch(func, args, kwargs)
    except Exception as e:
        _deferred.append(e)
        out, _ = _meta_call(func, args, kwargs)
        device = torch.device("fuse", _index_of(args, kwargs))

        def zeros(m: Any) -> Any:
            return empty_storage(tuple(m.shape), m.dtype, device) if isinstance(m, torch.Tensor) else m

        return tree_map(zeros, out)


def _dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    special = SPECIAL.get(func)
    if special is not None:
        return special(*args, **kwargs)
    if func.overloadpacket.__name__.startswith("_foreach_"):
        return _foreach(func, args, kwargs)
    if _is_implicit(func) and func not in OPS:
        result = func.decompose(*args, **kwargs)
        if result is not NotImplemented:
            return result
    _check_devices(func, args, kwargs)
    if _is_view(func):
        return _view(func, args, kwargs)
    if func._schema.is_mutable:
        return _mutate(func, args, kwargs)
    if func in OPS:
        return _compute(func, args, kwargs)
    return _fallback(func, args, kwargs)


# ---- arguments as meta tensors and as fusegrad values


def _meta(x: Any) -> Any:
    if isinstance(x, FuseTensor):
        n = x._fuse_storage.value.shape[0]
        base = torch.empty(n, dtype=x.dtype, device="meta")
        return base.as_strided(tuple(x.shape), x.stride(), x.storage_offset())
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, torch.device) and x.type == "fuse":
        return torch.device("meta")
    return x


def _meta_key(x: Any) -> Any:
    """What the result's shape and dtype can depend on: tensor geometry and dtype, every non-float argument."""
    if isinstance(x, FuseTensor):
        return ("fuse", tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x._fuse_storage.value.shape[0])
    if isinstance(x, torch.Tensor):
        return (x.device.type, tuple(x.shape), x.stride(), x.dtype)
    if isinstance(x, float):
        return float
    if isinstance(x, (list, tuple)):
        return tuple(_meta_key(i) for i in x)
    if isinstance(x, dict):
        return tuple((k, _meta_key(v)) for k, v in x.items())
    return x


_meta_cache: dict[Any, tuple] = {}


def _meta_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """The op on meta tensors (torch's shape, dtype and error checks), memoized by what its result depends on."""
    try:
        key = (func, _meta_key(args), _meta_key(kwargs))
        hit = _meta_cache.get(key)
    except TypeError:  # an unhashable argument
        key, hit = None, None
    if hit is not None:
        return hit
    margs, mkwargs = tree_map(_meta, args), tree_map(_meta, kwargs)
    if isinstance(mkwargs.get("device"), str) and mkwargs["device"].startswith("fuse"):
        mkwargs["device"] = "meta"
    result = func(*margs, **mkwargs), margs
    if key is not None:
        if len(_meta_cache) > 8192:
            _meta_cache.clear()
        _meta_cache[key] = result
    return result


def _value(x: Any) -> Any:
    if isinstance(x, FuseTensor):
        return x.fuse_value()
    if isinstance(x, torch.Tensor):
        return x.item()  # a 0-d CPU tensor acts as a scalar, as it does for torch's other devices
    return x


def _index_of(args: tuple, kwargs: dict) -> int:
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, FuseTensor):
            return x.device.index or 0
        if isinstance(x, (torch.device, str)) and str(x).startswith("fuse"):
            return torch.device(x).index or 0
    return 0


def _check_devices(func: Any, args: tuple, kwargs: dict) -> None:
    """torch's device-mismatch error: every tensor on one device, except 0-d CPU tensors (scalars)."""
    seen: list[torch.device] = []
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor) and not (x.device.type == "cpu" and x.ndim == 0):
            if x.device not in seen:
                seen.append(x.device)
    if len(seen) > 1:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {seen[0]} and "
            f"{seen[1]}! (in aten op {func})"
        )


# ---- views


@functools.cache
def _is_implicit(func: Any) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


@functools.cache
def _is_view(func: Any) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _view(func: Any, args: tuple, kwargs: dict) -> Any:
    out, _ = _meta_call(func, args, kwargs)
    src = next(x for x in tree_flatten(args)[0] if isinstance(x, FuseTensor))

    def as_view(m: Any) -> Any:
        if not isinstance(m, torch.Tensor):
            return m
        if m.dtype != src.dtype:
            raise NotImplementedError(f"fuse: aten op {func} reinterprets {src.dtype} as {m.dtype}; not supported")
        return FuseTensor(
            src._fuse_storage, tuple(m.shape), m.stride(), m.storage_offset(), m.dtype, src.device.index or 0
        )

    return tree_map(as_view, out)


# ---- mutation


def _written(func: Any) -> list[tuple[int | str, bool]]:
    """The mutated arguments: (position or keyword name, whether keyword-only)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            out.append((a.name if a.kwarg_only else i, a.kwarg_only))
    return out


@functools.cache
def _functional(func: Any) -> Any:
    """The op's non-mutating twin: `add_.Tensor` -> `add.Tensor`, `add.out` -> `add.Tensor`."""
    schema = func._schema
    name = schema.name.split("::")[1]
    keep = [a.name for a in schema.arguments if not (a.alias_info is not None and a.alias_info.is_write)]
    inplace = name.endswith("_") and not name.endswith("__")
    packet = getattr(aten, name[:-1] if inplace else name, None)
    if packet is None:
        return None
    if inplace:
        op = getattr(packet, func._overloadname, None)
        return op if op is not None and not op._schema.is_mutable else None
    for ov in packet.overloads():
        op = getattr(packet, ov)
        names = [a.name for a in op._schema.arguments]
        extra = op._schema.arguments[len(keep) :]
        # a factory's functional form adds dtype/layout/device/pin_memory keywords the out tensor decides
        if not op._schema.is_mutable and names[: len(keep)] == keep and all(a.kwarg_only for a in extra):
            return op
    return None


def _mutate(func: Any, args: tuple, kwargs: dict) -> Any:
    _meta_call(func, args, kwargs)  # torch's own checks: broadcast into self, casting rules, out shapes
    written = _written(func)
    targets = [kwargs[k] if kw else args[k] for k, kw in written]
    if not all(isinstance(t, FuseTensor) for t in targets):
        return _fallback(func, args, kwargs)
    if func in INPLACE:
        out, margs = _meta_call(_functional(func) or func, args, kwargs)
        call = OpCall(out, margs, targets[0].fuse_device)
        targets[0].fuse_write(INPLACE[func](call, *tree_map(_value, args), **tree_map(_value, kwargs)))
        return targets[0]
    functional = _functional(func)
    if functional is None:
        return _fallback(func, args, kwargs)
    fkwargs = {k: v for k, v in kwargs.items() if not any(k == name for name, kw in written if kw)}
    if any(a.name == "device" for a in functional._schema.arguments) and not any(
        isinstance(x, FuseTensor) for x in tree_flatten((args, fkwargs))[0]
    ):
        fkwargs.update(dtype=targets[0].dtype, device=targets[0].device)
    result = _dispatch(functional, args, fkwargs)
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    for target, value in zip(targets, results):
        if tuple(target.shape) != tuple(value.shape):
            raise RuntimeError(
                f"fuse: out= tensor of shape {tuple(target.shape)} cannot be resized to {tuple(value.shape)} "
                f"(in aten op {func})"
            )
        target.fuse_write(value.fuse_value())
    rets = func._schema.returns
    return targets[0] if len(rets) == 1 else tuple(targets)


# ---- compute


def compute(func: Any, *args: Any, **kwargs: Any) -> Any:
    """A factory op on the fuse device (called by torch through the PrivateUse1 kernel registered for it)."""
    return _compute(func, args, kwargs)


def _compute(func: Any, args: tuple, kwargs: dict) -> Any:
    out, margs = _meta_call(func, args, kwargs)
    index = _index_of(args, kwargs)
    call = OpCall(out, margs, fuse_device_name(index))
    result = OPS[func](call, *tree_map(_value, args), **tree_map(_value, kwargs))
    if result is NotImplemented:  # a case the direct implementation leaves to torch's decomposition
        return _fallback(func, args, kwargs)
    return _wrap_like(result, out, index, func)


def _wrap_like(result: Any, out: Any, index: int, func: Any) -> Any:
    if isinstance(out, torch.Tensor):
        value = result.cast(to_fuse_dtype(out.dtype)) if result.dtype != to_fuse_dtype(out.dtype) else result
        if tuple(value.shape) != tuple(out.shape):
            raise AssertionError(f"fuse: aten op {func} gave shape {value.shape}, torch expects {tuple(out.shape)}")
        return wrap(value, index)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap_like(r, o, index, func) for r, o in zip(result, out))
    return result if out is None else out


def _fallback(func: Any, args: tuple, kwargs: dict) -> Any:
    decomposition = _DECOMPOSITIONS.get(func)
    if decomposition is not None:
        try:
            result = decomposition(*args, **kwargs)
        except NotImplementedError as e:
            raise NotImplementedError(f"{e}, decomposing aten op {func}") from None
        if result is not NotImplemented:
            return result
    result = func.decompose(*args, **kwargs)
    if result is not NotImplemented:
        return result
    if FUSE_CPU_FALLBACK.value:
        return _on_cpu(func, args, kwargs)
    raise NotImplementedError(
        f"fuse: aten op {func} is not supported on the fuse device (FUSE_CPU_FALLBACK=1 runs it on torch's CPU)"
    )


def _on_cpu(func: Any, args: tuple, kwargs: dict) -> Any:
    if str(func) not in _warned:
        _warned.add(str(func))
        warnings.warn(f"fuse: aten op {func} runs on the CPU (FUSE_CPU_FALLBACK=1)", stacklevel=3)
    index = _index_of(args, kwargs)
    cpu_of: dict[int, torch.Tensor] = {}

    def to_host(x: Any) -> Any:
        if isinstance(x, FuseTensor):
            cpu_of[id(x)] = cpu_of.get(id(x)) if id(x) in cpu_of else to_cpu(x)
            return cpu_of[id(x)]
        if isinstance(x, torch.device) and x.type == "fuse":
            return torch.device("cpu")
        return x

    cargs, ckwargs = tree_map(to_host, args), tree_map(to_host, kwargs)
    if isinstance(ckwargs.get("device"), str) and ckwargs["device"].startswith("fuse"):
        ckwargs["device"] = "cpu"
    out = func(*cargs, **ckwargs)
    written: dict[int, FuseTensor] = {}
    for k, kw in _written(func):
        host, target = (ckwargs[k], kwargs[k]) if kw else (cargs[k], args[k])
        if isinstance(target, FuseTensor):
            target.fuse_write(from_cpu(host, index).fuse_value())
            written[id(host)] = target

    def back(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return written[id(x)] if id(x) in written else from_cpu(x, index)

    return tree_map(back, out)


def _foreach(func: Any, args: tuple, kwargs: dict) -> Any:
    """A `_foreach_` op as its per-tensor op over the lists (scalars and scalar lists zipped along)."""
    name = func.overloadpacket.__name__.removeprefix("_foreach_")
    per = getattr(aten, name, None)
    if per is None:
        return _fallback(func, args, kwargs)
    n = len(next(a for a in args if isinstance(a, (list, tuple))))

    def pick(a: Any, i: int) -> Any:
        return a[i] if isinstance(a, (list, tuple)) and len(a) == n and not isinstance(a[0], int) else a

    results = []
    for i in range(n):
        call_args = tuple(pick(a, i) for a in args)
        op = _per_overload(per, call_args, kwargs)
        results.append(op(*call_args, **kwargs))
    return results if func._schema.returns else None


def _per_overload(packet: Any, args: tuple, kwargs: dict) -> Callable:
    second = args[1] if len(args) > 1 else None
    kind = "Tensor" if isinstance(second, torch.Tensor) else "Scalar"
    for ov in (kind, "default", "Tensor", "Scalar"):
        if ov in packet.overloads():
            return getattr(packet, ov)
    return getattr(packet, packet.overloads()[0])


# ---- ops between devices and to Python


def _copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if not isinstance(dst, FuseTensor):
        dst.copy_(to_cpu(src).to(dst.device))
        return dst
    if isinstance(src, FuseTensor):
        value = src.fuse_value()
        if src.fuse_device != dst.fuse_device:
            value = value.to(dst.fuse_device)
    else:
        value = from_cpu(src.to(dst.dtype) if src.dtype != dst.dtype else src, dst.device.index or 0).fuse_value()
    torch.broadcast_shapes(tuple(src.shape), tuple(dst.shape))
    dst.fuse_write(value)
    return dst


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """aten._copy_from, which torch's CPU copy_ calls when its source is on another device."""
    if isinstance(dst, FuseTensor):
        return _copy_(dst, src)
    with torch._C._DisableTorchDispatch():
        dst.copy_(to_cpu(src).to(dst.dtype))
    return dst


def _to_copy(
    x: torch.Tensor, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None
) -> torch.Tensor:
    target = torch.device(device) if device is not None else x.device
    dtype = dtype or x.dtype
    if target.type == "fuse":
        to_fuse_dtype(dtype)
        if not isinstance(x, FuseTensor):
            return from_cpu(x.to("cpu", dtype), target.index or 0)
        value = x.fuse_value().cast(to_fuse_dtype(dtype))
        if fuse_device_name(target.index) != x.fuse_device:
            value = value.to(fuse_device_name(target.index))
        return wrap(value, target.index or 0)
    if not isinstance(x, FuseTensor):
        return x.to(device=target, dtype=dtype)
    return to_cpu(x, dtype).to(target)


def _local_scalar_dense(x: FuseTensor) -> Any:
    return to_cpu(x).item()


def _resize_(x: FuseTensor, size: Any, memory_format: Any = None) -> FuseTensor:
    if tuple(size) != tuple(x.shape):
        raise RuntimeError(f"fuse: cannot resize a fuse tensor of shape {tuple(x.shape)} to {tuple(size)}")
    return x


def _set_(x: FuseTensor, source: FuseTensor, *rest: Any) -> FuseTensor:
    raise NotImplementedError("fuse: aten op aten.set_ (rebinding a tensor's storage) is not supported")


FACTORIES = (
    aten.arange.default,
    aten.arange.start,
    aten.arange.start_step,
    aten.full.default,
    aten.scalar_tensor.default,
)

SPECIAL: dict[Any, Callable] = {
    aten.copy_.default: _copy_,
    aten._copy_from.default: copy_from,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.resize_.default: _resize_,
    aten.set_.source_Tensor: _set_,
    aten.is_pinned.default: lambda x, device=None: False,
}


def empty_storage(size: tuple, dtype: torch.dtype | None, device: Any) -> FuseTensor:
    """A new `fuse` tensor of zeros: an empty tensor reads as zeros until written (lazy, no memory)."""
    index = torch.device(device).index or 0 if device is not None else 0
    dt = dtype or torch.get_default_dtype()
    value = Tensor.zeros(tuple(size), dtype=to_fuse_dtype(dt), device=fuse_device_name(index))
    return wrap(value, index)


__all__ = ["dispatch", "empty_storage", "Storage"]
