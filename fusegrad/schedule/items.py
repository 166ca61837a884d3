"""What a schedule is made of: ScheduleItem (one launch) and the view of a buffer as a planned value's shape."""

from __future__ import annotations
from typing import NamedTuple
from fusegrad.runtime.device import Buffer
from fusegrad.schedule.variables import symbolic_view
from fusegrad.uop.ops import Ops, UOp


class ScheduleItem(NamedTuple):
    """One launch: a kernel (ast is a SINK) or a transfer (ast is a COPY). buffers[0] is the output. A named tuple:
    a re-bound schedule makes one per kernel per realize, at a fraction of a frozen dataclass's cost."""

    ast: UOp
    buffers: tuple[Buffer, ...]
    device: str


def buffer_view(buf: UOp, shape: tuple) -> UOp:
    """buf seen as shape (a reshape, or a symbolic view when a size is a variable)."""
    if any(isinstance(d, UOp) for d in shape):
        return symbolic_view(buf, shape)
    return buf if buf.shape == shape else UOp(Ops.RESHAPE, buf.dtype, (buf,), shape)
