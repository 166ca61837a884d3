"""Custom kernels in a schedule: a CUSTOM_KERNEL node is one kernel of its own over its inputs' buffers, and each of
its outputs (an AFTER of a written input) is a fresh buffer that starts as a copy of that input (unless the input was
Tensor.empty: then it starts empty)."""

from __future__ import annotations
from typing import TYPE_CHECKING
from fusegrad.runtime.buffers import base_buffer, buffer_of, is_contiguous_view
from fusegrad.schedule.items import ScheduleItem, buffer_view
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from fusegrad.schedule.planner import Planner


def is_custom_output(u: UOp) -> bool:
    return u.op is Ops.AFTER and len(u.src) == 2 and u.src[1].op is Ops.CUSTOM_KERNEL


def fills_its_buffer(u: UOp) -> bool:
    """u is its buffer, element for element: a kernel parameter as it is."""
    # stricter than is_contiguous_view: a symbolic view whose largest size is not the buffer's is not the buffer
    base = base_buffer(u)
    return base is not None and is_contiguous_view(u) and base.arg[2] == u.size and base.dtype is u.dtype


def custom_needs(point: UOp) -> list[UOp]:
    """What must be realized before point: a custom output needs its kernel, a kernel its inputs as buffers."""
    if point.op is Ops.AFTER:
        return [point.src[1]]
    return [x for x in point.src if not fills_its_buffer(x)]


def emit_custom(planner: Planner, point: UOp, device: str) -> None:
    if point.op is Ops.AFTER:
        planner.result[point] = buffer_view(planner.custom_outputs[(point.src[1], point.arg)], point.shape)
        return
    custom, buffers = point.arg, []
    for slot, x in enumerate(point.src):
        buf = buffer_of[base_buffer(planner.result.get(x, x))]  # type: ignore[index]
        if slot in custom.written:
            out = planner._new_buffer(device, buf.size, buf.dtype)
            if slot not in custom.empty:
                planner._emit_buffer_copy(out, buf, device)  # the kernel may store only part of it
            planner.custom_outputs[(point, slot)] = out
            buf = buffer_of[out]
        buffers.append(buf)
    planner.items.append(ScheduleItem(custom.kernel_ast, tuple(buffers), device))
