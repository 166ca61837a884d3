"""The op table: each ONNX op is a function `fn(node, *inputs)`; `node` gives attributes and the opset version.
Inputs are numpy arrays (constants known at load or call time), Tensors, or None for an omitted optional input."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import DType, dtypes, from_numpy
from fusegrad.runtime.buffers import Buffer, buffer_uop, canonical_device

OPS: dict[tuple[str, str], Callable[..., Any]] = {}
# ops that run on numpy when every input is a small constant, so Shape → arithmetic → Reshape folds to constants
FOLD: dict[tuple[str, str], Callable[..., Any]] = {}
FOLD_LIMIT = 4096
# load-time checks `check(node)` that raise NotImplementedError for attribute values an op cannot run
CHECKS: dict[tuple[str, str], Callable[..., Any]] = {}


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _registrar(table: dict[tuple[str, str], Callable[..., Any]]) -> Callable[..., Decorator]:
    """A decorator factory that files a function under (domain, name) in `table` for each name given."""

    def register(*names: str, domain: str = "") -> Decorator:
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            for n in names:
                table[(domain, n)] = fn
            return fn

        return deco

    return register


op, fold, check = _registrar(OPS), _registrar(FOLD), _registrar(CHECKS)


class Node:
    """One node while it runs: its attributes, the opset of its domain, and how many outputs it must give."""

    def __init__(self, proto: Any, attrs: dict[str, Any], opset: int, runner: Any):
        self.proto, self.attrs, self.opset, self.runner = proto, attrs, opset, runner
        self.op_type, self.name = proto.op_type, proto.name or proto.op_type
        self.num_outputs = len(proto.output)
        self.env: dict[str, Any] = {}

    def a(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def __repr__(self) -> str:
        return f"node {self.name!r} ({self.op_type})"


# numpy dtypes that Tensor() cannot take directly: widen to float32, build the Tensor, cast back
_NP_SPECIAL = {
    "bfloat16": dtypes.bfloat16,
    "float8_e4m3fn": dtypes.fp8e4m3,
    "float8_e5m2": dtypes.fp8e5m2,
    "float8_e4m3fnuz": dtypes.fp8e4m3fnuz,
    "float8_e5m2fnuz": dtypes.fp8e5m2fnuz,
}


def np_to_tensor(x: np.ndarray, device: str | None = None) -> Tensor:
    """x copied (a caller's later write cannot reach it) into a Tensor: on a host device straight into an allocated
    buffer, one copy into memory the allocator reuses, where Tensor() copies into a fresh array first and into the
    buffer when it is realized (SqueezeNet's 600 KB input: 0.15 -> 0.05 ms a call)."""
    if x.dtype.name in _NP_SPECIAL:
        return Tensor(x.astype(np.float32), device=device).cast(_NP_SPECIAL[x.dtype.name])
    dev = canonical_device(device)
    dt = from_numpy(x.dtype) if x.dtype.kind in "biuf" else None
    if not isinstance(dev, str) or dt is None or dt.fmt is None or not x.size:
        return Tensor(x, device=device)
    buf = Buffer(dev, x.size, dt)
    return host_copy(x.reshape(-1), buf, x.shape) if buf.is_host else Tensor(x, device=device)


def host_copy(flat: np.ndarray, buf: Buffer, shape: tuple[int, ...]) -> Tensor:
    """flat's values written into buf (new, on a host device), as a Tensor of `shape`: no kernel, no schedule."""
    buf.host_view()[:] = flat
    t = Tensor(buffer_uop(buf), device=buf.device)
    return t if shape == (buf.size,) else t.reshape(shape)


def T(x: Any) -> Tensor:
    """A value as a Tensor."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return np_to_tensor(x)
    return Tensor(np.asarray(x))


# host copies of Tensors whose values are known (graph inputs given as numpy), so reading them costs no realize
HOST: dict[int, tuple[Tensor, np.ndarray]] = {}


def C(x: Any) -> np.ndarray:
    """A value as a numpy array (realizing a Tensor: for data that decides shapes, like Reshape's shape input)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, Tensor):
        hit = HOST.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        return x.numpy()
    return np.asarray(x)


def ints(x: Any) -> list[int]:
    return [int(v) for v in C(x).reshape(-1)]


def dtype_of(x: Any) -> DType:
    if isinstance(x, Tensor):
        return x.dtype
    return _NP_SPECIAL[x.dtype.name] if x.dtype.name in _NP_SPECIAL else from_numpy(x.dtype)


def shape_of(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def axis_of(axis: int, ndim: int, node: Node) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"{node}: axis {axis} is out of range for rank {ndim}")
    return axis % max(ndim, 1)
