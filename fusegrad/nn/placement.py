"""Placing a value like a tensor it will replace or be assigned to: on its device, or split like it."""

from __future__ import annotations
from fusegrad.tensor import Tensor
from fusegrad.uop.multi import multi_axis


def placed_like(x: Tensor, t: Tensor, *, match_axis: bool = False) -> Tensor:
    """x on t's device, or split over t's devices along t's sharded axis. A value on t's devices already is kept as it
    is; with match_axis only when it is split along t's axis too (else it is gathered on one device and split again)."""
    if x.device == t.device:
        # an optimizer's update is computed next to its parameter, split like it: no axis check (a lowering of x)
        if not match_axis or not isinstance(t.device, tuple) or multi_axis(x.uop) == multi_axis(t.uop):
            return x
    if isinstance(t.device, tuple):
        return (x.to(x.device[0]) if isinstance(x.device, tuple) else x).shard(t.device, multi_axis(t.uop))
    return x.to(t.device)
