"""SPEC=2: every kernel built with opts also runs without them on the same random inputs (its own buffers, never the
user's), and the two outputs must agree: bit for bit for integers and bools, within accumulated rounding for floats.
An opt that changes a kernel's meaning is then caught where it is born, naming the kernel and its opts."""

from __future__ import annotations
import numpy as np
from fusegrad.codegen import KernelInfo, lower_to_linear
from fusegrad.codegen.opt.beam import KernelBench
from fusegrad.engine.search_target import DeviceSearchTarget
from fusegrad.runtime.device import Device
from fusegrad.uop.ops import UOp


class OptEquivalenceError(AssertionError):
    """A kernel's result with its opts differs from its result with none."""


def check_opts_keep_meaning(ast: UOp, device: str, info: KernelInfo, program) -> None:
    """Runs `program` (built from `info`, which has opts) and the kernel lowered without opts on one set of random
    inputs; OptEquivalenceError when their outputs differ."""
    bench = KernelBench(ast, DeviceSearchTarget(device))
    bench.run(Device[device].build(lower_to_linear(ast, Device[device].renderer, opts=())))
    reference = bench.output()
    bench.run(program)
    out = bench.output()
    if not bench.matches(out, reference):
        diff = np.abs(out.astype(np.float64) - reference.astype(np.float64))
        where = int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff)))
        raise OptEquivalenceError(
            f"kernel {info.name} on {device} with opts {list(info.opts)} differs from the same kernel without opts: "
            f"element {where} is {out[where]!r}, {reference[where]!r} without opts"
        )
