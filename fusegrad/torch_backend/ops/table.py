"""The table of aten ops the `fuse` device implements directly, each on fusegrad Tensors; torch decomposes the rest.

Each implementation takes an `OpCall` (the op's output and arguments as meta tensors, which give torch's result
shape and dtype) and the op's arguments with every `fuse` tensor replaced by its lazy fusegrad Tensor. The result
is cast to torch's dtype by the caller, so an implementation only needs the right values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from fusegrad.tensor import Tensor

from ..dtypes import to_fuse_dtype

aten, prims = torch.ops.aten, torch.ops.prims


@dataclass
class OpCall:
    out: Any  # the op's result on meta tensors
    meta_args: tuple
    device: str  # the fusegrad device of the result


OPS: dict[Any, Callable] = {}
# in-place ops without a functional twin: the implementation returns the new value of `self`
INPLACE: dict[Any, Callable] = {}


def register(*ops: Any, table: dict = OPS) -> Callable:
    def deco(fn: Callable) -> Callable:
        for op in ops:
            table[op] = fn
        return fn

    return deco


def meta_dtype(meta: torch.Tensor):
    return to_fuse_dtype(meta.dtype)


def cast_if(x: Any, dt) -> Any:
    return x.cast(dt) if isinstance(x, Tensor) and x.dtype != dt else x


def as_tensor(x: Any, dt, device: str) -> Tensor:
    return x.cast(dt) if isinstance(x, Tensor) else Tensor(x, dtype=dt, device=device)


def common_dtype(call: OpCall, i: int, j: int):
    """torch's common dtype of the op's arguments i and j (comparisons compute in it)."""
    return to_fuse_dtype(torch.result_type(call.meta_args[i], call.meta_args[j]))


def axes_of(dim: Any, ndim: int) -> tuple[int, ...] | None:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % max(ndim, 1) for d in dims) if ndim else None
