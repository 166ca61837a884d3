"""The LLVM IR dialect for amdgcn-amd-amdhsa (DEV=AMD): the host LLVM renderer with AMDGPU's address spaces and ABI.

Buffers are `ptr addrspace(1)` kernel arguments in DEFINE_GLOBAL order, so the kernarg segment is one 8-byte pointer
per buffer (what runtime/ops_amd.py writes). Loop counters and accumulators are allocas in the private address
space 5, which `opt -O2` promotes to registers. One work-item runs the whole loop nest: there is no core range to
split (correct, not fast).
"""

from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.renderer.cstyle import RenderError
from fusegrad.renderer.llvmir import INTRINSICS, LLVMRenderer
from fusegrad.uop.ops import Ops, UOp

TRIPLE = "amdgcn-amd-amdhsa"
# LLVM has no amdgcn lowering for these on float64 (no libm on the device): llc fails on them
NO_FLOAT64 = frozenset(INTRINSICS) - {Ops.SQRT, Ops.TRUNC}


class AMDGPURenderer(LLVMRenderer):
    global_ptr = "ptr addrspace(1)"
    private_ptr = "ptr addrspace(5)"
    alloca_suffix = ", addrspace(5)"
    calling_convention = "amdgpu_kernel "

    def __init__(self, vector_bytes: int = 16):
        super().__init__(vector_bytes, TRIPLE)  # opt fills in the target's data layout

    def check(self, lin: tuple[UOp, ...]) -> None:
        for u in lin:
            if u.op in NO_FLOAT64 and u.dtype is dtypes.float64:
                op = u.op.name.lower()
                raise RenderError(f"DEV=AMD cannot compute {op} on {u.dtype}: LLVM has no amdgcn lowering for it")

    def outer_range(self, lin: tuple[UOp, ...]) -> UOp | None:
        return None  # a single work-item runs every loop from 0

    def params(self, lin: tuple[UOp, ...]) -> list[str]:
        bufs = sorted((u for u in lin if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg[0])
        return [f"{self.global_ptr} %data{u.arg[0]}" for u in bufs]  # no noalias: an assign may pass one buffer twice
