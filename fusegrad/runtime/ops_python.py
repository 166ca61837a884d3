"""The PYTHON device: interprets the linear UOps one scalar at a time (slow; the reference backend for tests)."""

from __future__ import annotations
from typing import Any
from fusegrad.dtype import dtypes, bf16_to_float, float_to_bf16, float_to_fp8, fp8_to_float
from fusegrad.helpers import DEBUG
from fusegrad.uop.alu import bitcast_value, cast_value, exec_alu
from fusegrad.uop.ops import GroupOp, Ops, UOp
from fusegrad.renderer import Renderer
from fusegrad.runtime.ops_cpu import host_capabilities
from fusegrad.runtime.device import Buffer, Compiled, HostAllocator


def _read(mem: Any, i: int, dt) -> Any:
    v = mem[i]
    if dt is dtypes.bfloat16:
        return bf16_to_float(int(v))
    if dt in dtypes.fp8s:
        return fp8_to_float(int(v), dt)
    return v.item()


def _write(mem: Any, i: int, dt, v: Any) -> None:
    if dt in dtypes.fp8s:
        mem[i] = float_to_fp8(v, dt)
    else:
        mem[i] = float_to_bf16(v) if dt is dtypes.bfloat16 else v


class PythonProgram:
    def __init__(self, lin: tuple[UOp, ...], outer_size: int):
        self.lin, self.outer_size = lin, outer_size
        self.range_at = {u: i for i, u in enumerate(lin) if u.op is Ops.RANGE}
        self.end_at = {u.src[0]: i for i, u in enumerate(lin) if u.op is Ops.ENDRANGE}
        self.update_of = {u.src[0]: u for u in lin if u.op is Ops.ACC_UPDATE}

    def __call__(self, buffers: list[Buffer]) -> None:
        mems = [b.host_view() for b in buffers]
        lin = self.lin
        vals: dict[UOp, Any] = {}

        def val(u: UOp) -> Any:
            return u.arg if u.op is Ops.CONST else vals[u]

        pc = 0
        while pc < len(lin):
            u = lin[pc]
            op = u.op
            if op is Ops.RANGE:
                if u not in vals:
                    vals[u] = 0
                if vals[u] >= val(u.src[0]):
                    del vals[u]
                    pc = self.end_at[u] + 1
                    continue
            elif op is Ops.ENDRANGE:
                vals[u.src[0]] += 1
                pc = self.range_at[u.src[0]]
                continue
            elif op is Ops.DEFINE_GLOBAL:
                vals[u] = u.arg[0]
            elif op is Ops.CONST:
                pass
            elif op is Ops.DEFINE_ACC:
                vals[u] = vals[self.update_of[u]] = val(u.src[0])
            elif op is Ops.ACC_UPDATE:
                vals[u] = vals[u.src[0]] = exec_alu(u.arg, u.dtype, [vals[u.src[0]], val(u.src[1])])
            elif op is Ops.LOAD:
                gate = val(u.src[2]) if len(u.src) == 3 else True
                vals[u] = _read(mems[vals[u.src[0]]], val(u.src[1]), u.dtype) if gate else cast_value(0, u.dtype)
            elif op is Ops.STORE:
                _write(mems[vals[u.src[0]]], val(u.src[1]), u.src[0].dtype, val(u.src[2]))
            elif op is Ops.CAST:
                vals[u] = cast_value(val(u.src[0]), u.dtype)
            elif op is Ops.BITCAST:
                vals[u] = bitcast_value(val(u.src[0]), u.src[0].dtype, u.dtype)
            elif op in GroupOp.ALU:
                vals[u] = exec_alu(op, u.dtype, [val(s) for s in u.src])
            else:
                raise NotImplementedError(f"PYTHON backend cannot run {op}")
            pc += 1


class PythonDevice(Compiled):
    def __init__(self, name: str):
        # codegen plans for the host CPU's vectors, as for the CPU device (the same kernels, the same opts)
        super().__init__(name, HostAllocator(), Renderer(host_capabilities(Renderer.capabilities)), None, PythonProgram)

    def build(self, info) -> PythonProgram:
        if DEBUG >= 4:
            for i, u in enumerate(info.lin):
                print(f"{i:4d} {u.op.name:12s} {u.dtype!r:18s} {u.arg!r}")
        return PythonProgram(info.lin, info.outer_size)
