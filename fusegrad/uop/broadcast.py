"""Constants and 0-d nodes broadcast to a shape, as the front end and the scheduler's rewrites build them."""

from __future__ import annotations

import math
from collections import OrderedDict

from fusegrad.dtype import DType
from fusegrad.uop.ops import Ops, UOp

# (dtype, shape, value, sign) -> the constant broadcast to shape; a loop applying the same scalars asks for a few
_broadcast_consts: OrderedDict[tuple, UOp] = OrderedDict()
MAX_BROADCAST_CONSTS = 1024


def broadcast_uop(u: UOp, shape: tuple) -> UOp:
    """A 0-d node broadcast to shape (a reshape to all ones, then an expand)."""
    return UOp(Ops.EXPAND, u.dtype, (UOp(Ops.RESHAPE, u.dtype, (u,), (1,) * len(shape)),), shape) if shape else u


def broadcast_const(dtype: DType, value: bool | int | float, shape: tuple[int, ...]) -> UOp:
    """UOp.const(dtype, value) broadcast to shape, the same node for the same arguments while it is remembered."""
    # a zero's sign keeps 0.0 and -0.0 apart (equal as keys otherwise); other values need no sign
    key = (dtype, shape, value) if value else (dtype, shape, value, math.copysign(1.0, value))
    if (const := _broadcast_consts.get(key)) is not None:
        return const
    const = broadcast_uop(UOp.const(dtype, value), shape)
    _broadcast_consts[key] = const
    if len(_broadcast_consts) > MAX_BROADCAST_CONSTS:
        _broadcast_consts.popitem(last=False)
    return const
