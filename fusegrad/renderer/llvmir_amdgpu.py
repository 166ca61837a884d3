"""The LLVM IR dialect for amdgcn-amd-amdhsa (DEV=AMD): the host LLVM renderer with AMDGPU's address spaces and ABI.

Buffers are `ptr addrspace(1)` kernel arguments in DEFINE_GLOBAL order, so the kernarg segment is one 8-byte pointer
per buffer (what runtime/ops_amd.py writes). Loop counters and accumulators are allocas in the private address
space 5, which `opt -O2` promotes to registers. One work-item runs the whole loop nest: there is no core range to
split (correct, not fast).

The amdgcn backend lowers `llvm.pow` as powr, exp2(y * log2 x), which is NaN for every negative base (the wave
emulator showed (a - b) ** 2 turning into NaN). Kernels call `fg_pow_<type>` instead: powr on |x|, with the sign of
an odd integer exponent put back (by the sign bit, so -0 counts) and NaN for a negative finite non-zero base with
a non-integer exponent, as C's pow does.
"""

from __future__ import annotations

import re

from fusegrad.dtype import dtypes
from fusegrad.codegen.opt.packs import Pack
from fusegrad.renderer import Capabilities
from fusegrad.renderer.cstyle import RenderError
from fusegrad.renderer.llvmir import INTRINSICS, LLVMRenderer
from fusegrad.uop.ops import Ops, UOp

TRIPLE = "amdgcn-amd-amdhsa"
# LLVM has no amdgcn lowering for these on float64 (no libm on the device): llc fails on them
NO_FLOAT64 = frozenset(INTRINSICS) - {Ops.SQRT, Ops.TRUNC}


POW_CALL = re.compile(r"@llvm\.pow\.(f16|f32)\(")
POW_HELPER = """
define internal {t} @fg_pow_{s}({t} %x, {t} %y) alwaysinline {{
  %ax = call {t} @llvm.fabs.{s}({t} %x)
  %r = call {t} @llvm.pow.{s}({t} %ax, {t} %y)
  %yi = call {t} @llvm.trunc.{s}({t} %y)
  %isint = fcmp oeq {t} %yi, %y
  %half = fmul {t} %y, {half}
  %halfi = call {t} @llvm.trunc.{s}({t} %half)
  %odd = fcmp une {t} %halfi, %half
  %negr = fneg {t} %r
  %signed = select i1 %odd, {t} %negr, {t} %r
  %iszero = fcmp oeq {t} %ax, {zero}
  %isinf = fcmp oeq {t} %ax, {inf}
  %edge = or i1 %iszero, %isinf
  %nonint = select i1 %edge, {t} %r, {t} {nan}
  %intpow = select i1 %isint, {t} %signed, {t} %nonint
  %xbits = bitcast {t} %x to {i}
  %neg = icmp slt {i} %xbits, 0
  %out = select i1 %neg, {t} %intpow, {t} %r
  ret {t} %out
}}
declare {t} @llvm.fabs.{s}({t})
declare {t} @llvm.trunc.{s}({t})
"""


def _pow_helpers(ir: str) -> str:
    kinds = sorted(set(POW_CALL.findall(ir)))
    if not kinds:
        return ir
    body = ir
    for s in kinds:
        body = body.replace(
            f"call {'half' if s == 'f16' else 'float'} @llvm.pow.{s}(",
            f"call {'half' if s == 'f16' else 'float'} @fg_pow_{s}(",
        )
    out = [body]
    for s in kinds:
        t = "half" if s == "f16" else "float"
        consts = (
            {"half": "0xH3800", "nan": "0xH7E00", "i": "i16", "zero": "0xH0000", "inf": "0xH7C00"} if s == "f16" else {}
        )
        consts = consts or {
            "half": "5.000000e-01",
            "nan": "0x7FF8000000000000",
            "i": "i32",
            "zero": "0.000000e+00",
            "inf": "0x7FF0000000000000",
        }
        helper = POW_HELPER.format(t=t, s=s, **consts)
        if f"declare {t} @llvm.fabs.{s}(" in body:
            helper = helper.replace(f"declare {t} @llvm.fabs.{s}({t})\n", "")
        if f"declare {t} @llvm.trunc.{s}(" in body:
            helper = helper.replace(f"declare {t} @llvm.trunc.{s}({t})\n", "")
        if f"declare {t} @llvm.pow.{s}(" not in body:
            helper += f"declare {t} @llvm.pow.{s}({t}, {t})\n"
        out.append(helper)
    return "\n".join(out)


class AMDGPURenderer(LLVMRenderer):
    global_ptr = "ptr addrspace(1)"
    private_ptr = "ptr addrspace(5)"
    alloca_suffix = ", addrspace(5)"
    calling_convention = "amdgpu_kernel "

    # one work item runs every loop (outer_range); fixed values, as the device has no query: register tiles planned
    # as for AVX2's 32-byte vectors and 16 registers (what the tiles were tuned for), lanes packed into 16 bytes
    capabilities = Capabilities(vector_bytes=32, vector_registers=16, vector_types=True, pack_bytes=16)

    def __init__(self, capabilities: Capabilities | None = None):
        super().__init__(capabilities, TRIPLE)  # opt fills in the target's data layout

    def check(self, lin: tuple[UOp, ...]) -> None:
        for u in lin:
            if u.op in NO_FLOAT64 and u.dtype is dtypes.float64:
                op = u.op.name.lower()
                raise RenderError(f"DEV=AMD cannot compute {op} on {u.dtype}: LLVM has no amdgcn lowering for it")

    def render(self, name: str, lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]] | None = None) -> str:
        return _pow_helpers(super().render(name, lin, packs))

    def outer_range(self, lin: tuple[UOp, ...]) -> UOp | None:
        return None  # a single work-item runs every loop from 0

    def params(self, lin: tuple[UOp, ...]) -> list[str]:
        bufs = sorted((u for u in lin if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg[0])
        return [f"{self.global_ptr} %data{u.arg[0]}" for u in bufs]  # no noalias: an assign may pass one buffer twice
