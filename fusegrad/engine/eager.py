"""An eager op on realized tensors whose one-kernel schedule the leaf-op memo holds (a loop of `(x + y).realize()`),
launched straight from what its first run prepared: no schedule items, no per-item loop, one C call on the CPU."""

from __future__ import annotations
import time
from typing import Any, Callable
from fusegrad.helpers import GlobalCounters
from fusegrad.runtime.buffers import buffer_uop
from fusegrad.runtime.device import Buffer, Device, HostAllocator
from fusegrad.uop.ops import UOp


class EagerLaunch:
    """One kernel writing one new buffer from the caller's buffers (ScheduleTemplate.one_kernel), with its program and
    the counters each launch adds: `run` gives the result's node for another set of input buffers."""

    __slots__ = (
        "gather",
        "device",
        "size",
        "dtype",
        "chain",
        "program",
        "call",
        "tail",
        "ops",
        "mem",
        "allocator",
        "spare",
        "packed",
        "pack_pending",
    )
    # outputs up to this size keep their memory for the next call's (Buffer.allocate_spare): one block per eager op
    # form, outside the host cache's bound, so a small one
    MAX_SPARE_BYTES = 1 << 16
    PACK_AFTER = 64  # launches of one op form before it asks for the runner's packed call

    def __init__(self, one_kernel: tuple, program: Any, ops: int, mem: int):
        self.gather, (self.device, self.size, self.dtype), self.chain = one_kernel
        self.program, self.ops, self.mem = program, ops, mem
        self.allocator = Device[self.device].allocator
        small = type(self.allocator) is HostAllocator and self.size * self.dtype.itemsize <= self.MAX_SPARE_BYTES
        self.spare: list | None = [] if small else None
        # the C function itself where a launch is one call on this thread (a small CPU kernel)
        direct = getattr(program, "address_launch", None)
        launch = direct() if direct is not None else None
        self.call: Callable | None
        self.call, self.tail = launch if launch is not None else (None, ())
        # the same call through the C runner with one argument (PackedLaunch), asked for after PACK_AFTER launches:
        # a loop, not a script's few ops, is worth the runner's build (a second and a half of compiling when cold)
        self.packed: Any = None
        self.pack_pending = self.PACK_AFTER if launch is not None else 0

    def _pack(self) -> None:
        from fusegrad.runtime.cpu_graph import packed_launch  # the runner's module, loaded once a kernel has run

        got = packed_launch(self.program)
        if got is True:  # the runner is building (on a background thread): ask again later
            self.pack_pending = self.PACK_AFTER
        else:
            self.packed = got or None

    def run(self, inputs: list[Buffer]) -> UOp:
        """Launch on `inputs` (the template's input buffers in slot order; the new buffer is appended) and count it."""
        out = Buffer(self.device, self.size, self.dtype)
        if (spare := self.spare) is not None:
            out.allocate_spare(spare, self.allocator)
        else:
            out.ensure_allocated()
        inputs.append(out)
        args = self.gather(inputs)
        st = _clock()
        if (call := self.call) is not None:
            # each buffer's remembered address (Buffer.address's first case) without a call per buffer
            addrs = [c[1] if (c := b._address) is not None and c[0] is b._mem else b.address() for b in args]
            if (packed := self.packed) is not None:
                if addrs != packed.addrs:  # an op on the same tensors whose output took the spare block: the same
                    packed.table[:] = packed.addrs = addrs
                packed.call()
            else:
                call(*addrs, *self.tail)
                if self.pack_pending:
                    self.pack_pending -= 1
                    if not self.pack_pending:
                        self._pack()
        else:
            for b in args:
                if b._mem is None:
                    b.ensure_allocated()
            self.program(args)
        counters = GlobalCounters
        counters.time_sum_s += _clock() - st
        counters.kernel_count += 1
        counters.global_ops += self.ops
        counters.global_mem += self.mem
        u = buffer_uop(out)
        for op, dtype, arg in self.chain:
            u = UOp(op, dtype, (u,), arg)
        return u


_clock = time.perf_counter


def eager_launch(template: Any, runners: list, ops: int, mem: int) -> EagerLaunch | None:
    """The EagerLaunch of a bound leaf-op template and its compiled runners (Prepared's), or None when the template is
    not one kernel of that form."""
    if (one := template.one_kernel()) is None or len(runners) != 1 or runners[0] is None:
        return None
    return EagerLaunch(one, runners[0].program, ops, mem)
