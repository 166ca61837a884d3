"""A plain matmul (codegen/opt/matrix_tile.py) as an AMDGPU kernel on the matrix cores, tiled through LDS.

One wave64 workgroup computes a 32 x 32 tile of C: workgroup (x, y) takes columns 32x.. and rows 32y... For each
block of KT = 32 reduce steps the wave copies the A tile (32 x KT) and the B tile (KT x 32) from global memory into
LDS (16 elements of each per lane), waits at `s_barrier`, then runs KT / K_STEP `v_mfma_f32_32x32x*` on operands read
from LDS, accumulating the 16 floats per lane the instruction keeps (LLVM puts them in AGPRs or VGPRs), and waits
again before the next block overwrites the tiles. C is stored from the accumulators, rounded once to its dtype.

The intrinsics are LLVM's `llvm.amdgcn.mfma.*` (AMDGPUUsage).
Lane layouts (CDNA3 ISA, matrix cores): lane l holds A[l % 32][k0 + (l / 32) * per + v] and B[k0 + (l / 32) * per +
v][l % 32] for v < per, and accumulator r of lane l is C[(r / 4) * 8 + (l / 32) * 4 + r % 4][l % 32]. Float32 inputs
use 32x32x2 (per = 1), float16 32x32x8 (per = 4), bfloat16 32x32x8 on i16 lanes (per = 4); on gfx950 the 16-bit
inputs use CDNA4's 32x32x16 (per = 8) instead. Accumulation is in
float32 for every input dtype (the generic path rounds a float16 product to float16 first).
"""

from __future__ import annotations

from fusegrad.codegen.gpu_dims import LaunchDims
from fusegrad.codegen.opt.matrix_tile import TILE, Matmul
from fusegrad.dtype import dtypes
from fusegrad.renderer.llvmir import _f32_to_bf16

KT = 32  # reduce steps per LDS block
WAVE = 64
# dtype -> (LLVM element type in memory, intrinsic, operand type, K per instruction, K values per lane)
SHAPES = {
    dtypes.float32: ("float", "llvm.amdgcn.mfma.f32.32x32x2f32", "float", 2, 1),
    dtypes.float16: ("half", "llvm.amdgcn.mfma.f32.32x32x8f16", "<4 x half>", 8, 4),
    dtypes.bfloat16: ("i16", "llvm.amdgcn.mfma.f32.32x32x8bf16.1k", "<4 x i16>", 8, 4),
}
# CDNA4 doubles the K of the 16-bit shapes (v_mfma_f32_32x32x16_f16/bf16, 8 values per lane): half the instructions
SHAPES_GFX950 = SHAPES | {
    dtypes.float16: ("half", "llvm.amdgcn.mfma.f32.32x32x16.f16", "<8 x half>", 16, 8),
    dtypes.bfloat16: ("i16", "llvm.amdgcn.mfma.f32.32x32x16.bf16", "<8 x bfloat>", 16, 8),
}


def mfma_dims(mm: Matmul) -> LaunchDims:
    """One wave per 32 x 32 tile of C: (N / 32) x (M / 32) workgroups of 64 work-items."""
    return LaunchDims((mm.n // TILE * WAVE, mm.m // TILE, 1), (WAVE, 1, 1), {})


class _IR:
    def __init__(self):
        self.lines: list[str] = []
        self.n = 0

    def emit(self, expr: str) -> str:
        self.n += 1
        self.lines.append(f"  %t{self.n} = {expr}")
        return f"%t{self.n}"

    def index(self, offset: int, row: str, row_stride: int, col: str, col_stride: int) -> str:
        """offset + row * row_stride + col * col_stride as i64 (row, col are i32 values)."""
        r, c = self.emit(f"sext i32 {row} to i64"), self.emit(f"sext i32 {col} to i64")
        r, c = self.emit(f"mul i64 {r}, {row_stride}"), self.emit(f"mul i64 {c}, {col_stride}")
        return self.emit(f"add i64 {self.emit(f'add i64 {r}, {c}')}, {offset}")

    def barrier(self) -> None:
        self.lines += [
            '  fence syncscope("workgroup") release',
            "  call void @llvm.amdgcn.s.barrier()",
            '  fence syncscope("workgroup") acquire',
        ]


def _copy_tile(ir: _IR, t: str, src: str, lds: str, offset: int, strides, first: str, second: str):
    """The 32 x KT tile (A: rows i, columns k) or KT x 32 tile (B: rows k, columns j) into LDS, row-major: lane l
    copies element (2e + l / 32, l % 32) for e < 16; first/second: the tile's origin in the matrix."""
    for e in range(TILE * KT // WAVE):
        r = ir.emit(f"add i32 %lhi, {2 * e}")
        row, col = ir.emit(f"add i32 {first}, {r}"), ir.emit(f"add i32 {second}, %l32")
        at = ir.index(offset, row, strides[0], col, strides[1])
        g = ir.emit(f"getelementptr inbounds {t}, ptr addrspace(1) {src}, i64 {at}")
        v = ir.emit(f"load {t}, ptr addrspace(1) {g}")
        slot = ir.emit(f"add i32 {ir.emit(f'shl i32 {r}, 5')}, %l32")
        p = ir.emit(f"getelementptr inbounds [{TILE * KT} x {t}], ptr addrspace(3) {lds}, i32 0, i32 {slot}")
        ir.lines.append(f"  store {t} {v}, ptr addrspace(3) {p}")


def _operand(ir: _IR, t: str, op_t: str, lds: str, per: int, kbase: str, a_side: bool) -> str:
    """This lane's `per` K values of its row of A (a_side) or column of B, read from the LDS tile."""
    vals = []
    for v in range(per):
        k = ir.emit(f"add i32 {kbase}, {v}")
        if a_side:  # A tile row-major 32 x KT: [l32][k]
            slot = ir.emit(f"add i32 %arow, {k}")
        else:  # B tile row-major KT x 32: [k][l32]
            slot = ir.emit(f"add i32 {ir.emit(f'shl i32 {k}, 5')}, %l32")
        p = ir.emit(f"getelementptr inbounds [{TILE * KT} x {t}], ptr addrspace(3) {lds}, i32 0, i32 {slot}")
        vals.append(ir.emit(f"load {t}, ptr addrspace(3) {p}"))
    if per == 1:
        return vals[0]
    vec, vec_t = "poison", f"<{per} x {t}>"
    for v, x in enumerate(vals):
        vec = ir.emit(f"insertelement {vec_t} {vec}, {t} {x}, i32 {v}")
    return vec if vec_t == op_t else ir.emit(f"bitcast {vec_t} {vec} to {op_t}")  # i16 lanes as bfloat


def render_mfma(name: str, mm: Matmul, params: list[str], arch: str = "gfx950") -> str:
    t, intrinsic, op_t, k_step, per = (SHAPES_GFX950 if arch == "gfx950" else SHAPES)[mm.dtype]
    out_t = SHAPES[mm.out][0]
    ir = _IR()
    a_buf, b_buf, c_buf = (f"%data{o.buffer}" for o in (mm.a, mm.b, mm.c))
    ir.lines += [
        "entry:",
        "  %lane = call i32 @llvm.amdgcn.workitem.id.x()",
        "  %gx = call i32 @llvm.amdgcn.workgroup.id.x()",
        "  %gy = call i32 @llvm.amdgcn.workgroup.id.y()",
        "  %l32 = and i32 %lane, 31",
        "  %lhi = lshr i32 %lane, 5",
        "  %row0 = shl i32 %gy, 5",
        "  %col0 = shl i32 %gx, 5",
        f"  %arow = mul i32 %l32, {KT}",
        f"  %kpart = mul i32 %lhi, {per}",
        "  br label %loop",
        "loop:",
        "  %kb = phi i32 [ 0, %entry ], [ %kb.next, %loop ]",
        "  %acc = phi <16 x float> [ zeroinitializer, %entry ], [ %acc.next, %loop ]",
    ]
    _copy_tile(ir, t, a_buf, "@fg_mfma_a", mm.a.offset, mm.a.strides, "%row0", "%kb")
    _copy_tile(ir, t, b_buf, "@fg_mfma_b", mm.b.offset, mm.b.strides, "%kb", "%col0")
    ir.barrier()
    acc, steps = "%acc", KT // k_step
    for s in range(steps):
        kbase = ir.emit(f"add i32 %kpart, {s * k_step}")
        a = _operand(ir, t, op_t, "@fg_mfma_a", per, kbase, True)
        b = _operand(ir, t, op_t, "@fg_mfma_b", per, kbase, False)
        call = f"call <16 x float> @{intrinsic}({op_t} {a}, {op_t} {b}, <16 x float> {acc}, i32 0, i32 0, i32 0)"
        if s == steps - 1:
            ir.lines.append(f"  %acc.next = {call}")
        else:
            acc = ir.emit(call)
    ir.barrier()
    ir.lines += [
        f"  %kb.next = add i32 %kb, {KT}",
        f"  %more = icmp slt i32 %kb.next, {mm.k}",
        "  br i1 %more, label %loop, label %done",
        "done:",
    ]
    quad = ir.emit("shl i32 %lhi, 2")
    j = ir.emit("add i32 %col0, %l32")
    for r in range(16):
        i = ir.emit(f"add i32 %row0, {ir.emit(f'add i32 {quad}, {(r // 4) * 8 + r % 4}')}")
        v = ir.emit(f"extractelement <16 x float> %acc.next, i32 {r}")
        if mm.out is dtypes.float16:
            v = ir.emit(f"fptrunc float {v} to half")
        elif mm.out is dtypes.bfloat16:
            v = _f32_to_bf16(ir, v)  # type: ignore[arg-type]  # the LLVM renderer's rounding, on this emitter
        at = ir.index(mm.c.offset, i, mm.c.strides[0], j, mm.c.strides[1])
        g = ir.emit(f"getelementptr inbounds {out_t}, ptr addrspace(1) {c_buf}, i64 {at}")
        ir.lines.append(f"  store {out_t} {v}, ptr addrspace(1) {g}")
    ir.lines.append("  ret void")
    head = [
        'target triple = "amdgcn-amd-amdhsa"',
        "declare i32 @llvm.amdgcn.workitem.id.x()",
        "declare i32 @llvm.amdgcn.workgroup.id.x()",
        "declare i32 @llvm.amdgcn.workgroup.id.y()",
        "declare void @llvm.amdgcn.s.barrier()",
        f"declare <16 x float> @{intrinsic}({op_t}, {op_t}, <16 x float>, i32, i32, i32)",
        f"@fg_mfma_a = internal addrspace(3) global [{TILE * KT} x {t}] poison, align 16",
        f"@fg_mfma_b = internal addrspace(3) global [{TILE * KT} x {t}] poison, align 16",
        f"define amdgpu_kernel void @{name}({', '.join(params)}) "
        f'nounwind "amdgpu-flat-work-group-size"="{WAVE},{WAVE}" !reqd_work_group_size !0 {{',
    ]
    tail = [
        "}",
        f"!0 = !{{i32 {WAVE}, i32 1, i32 1}}",
        "!llvm.module.flags = !{!1}",
        '!1 = !{i32 1, !"amdhsa_code_object_version", i32 500}',
    ]
    return "\n".join(head + ir.lines + tail) + "\n"
