"""The LLVM IR dialect for amdgcn-amd-amdhsa (DEV=AMD): the host LLVM renderer with AMDGPU's address spaces, ABI and
work-items.

Buffers are `ptr addrspace(1)` kernel arguments in DEFINE_GLOBAL order, so the kernarg segment is one 8-byte pointer
per buffer (what runtime/ops_amd.py writes; the kernel loads them with s_load from the kernarg pointer the dispatch puts
in its user SGPRs). Loop counters and accumulators are allocas in the private address space 5, which `opt -O2`
promotes to registers.

The global loops are work-items, mapped as codegen/gpu_dims.py maps them for the CL and CUDA devices (the runtime
launches the same dims): loop d's value is (workgroup_id.d * local_size.d + workitem_id.d) / divisor % size, the ids
from `llvm.amdgcn.workgroup.id.*` (SGPRs after the user SGPRs) and `llvm.amdgcn.workitem.id.*` (v0, packed X | Y << 10
| Z << 20 on gfx90a+), and a work-item past the loop's end skips the body. The definition carries the group size
(`amdgpu-flat-work-group-size`, `!reqd_work_group_size`), at most GROUP_SIZE = 128 work-items: two wave64s. A reduce
with few outputs is split over the lanes of a work group: each lane runs every `lanes`-th iteration, then the partial
accumulators are combined by a tree in LDS (a `ptr addrspace(3)` array per accumulator) with `s_barrier` between the
steps, and lane 0 alone goes on to the store.

The amdgcn backend lowers `llvm.pow` as powr, exp2(y * log2 x), which is NaN for every negative base (the wave
emulator showed (a - b) ** 2 turning into NaN). Kernels call `fg_pow_<type>` instead: powr on |x|, with the sign of
an odd integer exponent put back (by the sign bit, so -0 counts) and NaN for a negative finite non-zero base with
a non-integer exponent, as C's pow does.
"""

from __future__ import annotations

import re

from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.codegen.gpu_dims import LaunchDims, grouped_updates, launch_dims
from fusegrad.codegen.opt.matrix_tile import Matmul, match_matmul
from fusegrad.codegen.opt.packs import Pack
from fusegrad.renderer import Capabilities
from fusegrad.renderer.cstyle import RenderError
from fusegrad.renderer.llvmir_amdgpu_mfma import mfma_dims, render_mfma
from fusegrad.renderer.llvmir import INTRINSICS, IRText, LLVMRenderer, _alu, _endrange, _range, llvm_rewrite, ltype
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat

TRIPLE = "amdgcn-amd-amdhsa"
# LLVM has no amdgcn lowering for these on float64 (no libm on the device): llc fails on them, so codegen writes them
# out unless a test turns the capability float64_math on
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


LDS_BYTES = 65536  # a workgroup's LDS on CDNA3 (gfx950 has 160 KiB; the smaller bound holds for both)


def lds_bytes(lin: tuple[UOp, ...], dims: LaunchDims) -> int:
    """The LDS a split reduction's arrays take: one element per lane for each accumulator, each array 4-byte aligned."""
    accs = dict.fromkeys(u.src[0] for u in grouped_updates(lin, dims.grouped))  # type: ignore[arg-type]
    return sum(-(-dims.lanes * a.dtype.itemsize // 4) * 4 for a in accs)


def _dims(ctx: IRText) -> LaunchDims:
    return ctx.renderer.launch_dims(ctx.lin)  # type: ignore[attr-defined]


def _intrinsic_i32(ctx: IRText, name: str) -> str:
    ctx.declares.add(f"declare i32 @llvm.amdgcn.{name}()")
    return ctx.emit(f"call i32 @llvm.amdgcn.{name}()")


def _global_id(ctx: IRText, dims: LaunchDims, dim: int) -> str:
    """workgroup_id * local_size + workitem_id along dim (an id that is always 0 is not read)."""
    axis, local = "xyz"[dim], dims.local_size[dim]
    item = _intrinsic_i32(ctx, f"workitem.id.{axis}") if local > 1 else "0"
    if dims.groups[dim] == 1:
        return item
    group = _intrinsic_i32(ctx, f"workgroup.id.{axis}")
    base = group if local == 1 else ctx.emit(f"mul nuw i32 {group}, {local}")
    return base if item == "0" else ctx.emit(f"add nuw i32 {base}, {item}")


def _work_item_range(ctx: IRText, x: UOp) -> str | None:
    """A global loop is this work-item's index and a bound check; the grouped reduce loop starts at the lane id and
    strides by the lane count (its end, in _end_grouped, combines the lanes)."""
    dims = _dims(ctx)
    if x is dims.grouped:
        return _range(ctx, x, first=_as(ctx, _intrinsic_i32(ctx, "workitem.id.x"), ltype(x.dtype)))
    if x.arg[1] != "global":
        return None
    a, t = dims.axes[x], ltype(x.dtype)
    v = _global_id(ctx, dims, a.dim)
    if a.divisor != 1:
        v = ctx.emit(f"udiv i32 {v}, {a.divisor}")
    if not a.outermost:
        v = ctx.emit(f"urem i32 {v}, {a.size}")
    v = _as(ctx, v, t)
    inside, body, done = ctx.emit(f"icmp slt {t} {v}, {ctx.ref(x.src[0])}"), ctx.fresh("item"), ctx.fresh("skip")
    ctx.lines.append(f"  br i1 {inside}, label %{body}, label %{done}")
    ctx.label(body)
    ctx.loops[x] = (v, "", done)
    return v


def _as(ctx: IRText, v: str, t: str) -> str:
    """An i32 id (non-negative) as the loop's integer type."""
    if v == "0" or t == "i32":
        return v
    return ctx.emit(f"zext i32 {v} to {t}") if t == "i64" else ctx.emit(f"trunc i32 {v} to {t}")


def _work_item_end(ctx: IRText, x: UOp) -> str | None:
    r, dims = x.src[0], _dims(ctx)
    if r is dims.grouped:
        return _end_grouped(ctx, r, dims)
    if r.arg[1] != "global":
        return None
    done = ctx.loops[r][2]
    ctx.lines.append(f"  br label %{done}")
    ctx.label(done)
    return ""


def _barrier(ctx: IRText) -> None:
    """s_barrier between the workgroup's waves, with the fences that make the LDS stores before it visible after it."""
    ctx.declares.add("declare void @llvm.amdgcn.s.barrier()")
    ctx.lines += [
        '  fence syncscope("workgroup") release',
        "  call void @llvm.amdgcn.s.barrier()",
        '  fence syncscope("workgroup") acquire',
    ]


def _end_grouped(ctx: IRText, r: UOp, dims: LaunchDims) -> str:
    """After the lanes' share of the split loop: every accumulator goes to its LDS array, then a tree reduction
    combines them all (lane i takes in lane i + s for s = lanes/2 .. 1, a barrier after each step), lane 0 takes the
    totals and the other lanes end."""
    _endrange(ctx, UOp(Ops.ENDRANGE, dtypes.void, (r,)), step=dims.lanes)
    lane = _intrinsic_i32(ctx, "workitem.id.x")
    updates = {u.src[0]: u for u in grouped_updates(ctx.lin, r)}  # one update per accumulator combines it
    shared: dict[UOp, tuple[str, str, str]] = {}  # accumulator -> (its type, its array, this lane's element)
    for acc in updates:
        at, name = ltype(acc.dtype), f"@{ctx.fresh('fg_red')}"
        array = f"[{dims.lanes} x {at}]"
        ctx.globals.append(f"{name} = internal addrspace(3) global {array} poison, align {max(acc.dtype.itemsize, 4)}")
        mine = ctx.emit(f"getelementptr inbounds {array}, ptr addrspace(3) {name}, i32 0, i32 {lane}")
        ctx.lines.append(f"  store {at} {ctx.ref(acc)}, ptr addrspace(3) {mine}")
        shared[acc] = (at, name, mine)
    _barrier(ctx)
    s = dims.lanes // 2
    while s:
        active, add, join = ctx.emit(f"icmp ult i32 {lane}, {s}"), ctx.fresh("combine"), ctx.fresh("combined")
        ctx.lines.append(f"  br i1 {active}, label %{add}, label %{join}")
        ctx.label(add)
        for acc, (at, _, mine) in shared.items():
            other = ctx.emit(f"getelementptr inbounds {at}, ptr addrspace(3) {mine}, i32 {s}")
            a, b = ctx.emit(f"load {at}, ptr addrspace(3) {mine}"), ctx.emit(f"load {at}, ptr addrspace(3) {other}")
            u = updates[acc]
            ctx.lines.append(f"  store {at} {_alu(ctx, u.arg, u.dtype, [a, b], (u, u))}, ptr addrspace(3) {mine}")
        ctx.lines.append(f"  br label %{join}")
        ctx.label(join)
        _barrier(ctx)
        s //= 2
    others, end, first = ctx.emit(f"icmp ne i32 {lane}, 0"), ctx.fresh("lane_done"), ctx.fresh("lane0")
    ctx.lines.append(f"  br i1 {others}, label %{end}, label %{first}")
    ctx.label(end)
    ctx.lines.append("  ret void")
    ctx.label(first)
    for acc, (at, name, _) in shared.items():
        total = ctx.emit(f"load {at}, ptr addrspace(3) {name}")
        ctx.lines.append(f"  store {at} {total}, {ctx.renderer.private_ptr} {ctx.slots[acc]}")
    return ""


amdgpu_rewrite = (
    PatternMatcher([(UPat(Ops.RANGE, name="x"), _work_item_range), (UPat(Ops.ENDRANGE, name="x"), _work_item_end)])
    + llvm_rewrite
)


class AMDGPURenderer(LLVMRenderer):
    global_ptr = "ptr addrspace(1)"
    private_ptr = "ptr addrspace(5)"
    alloca_suffix = ", addrspace(5)"
    calling_convention = "amdgpu_kernel "

    # fixed values, as the device has no query: register tiles planned as for AVX2's 32-byte vectors and 16
    # registers (what the GPU devices' tiles were tuned with), lanes packed into 16 bytes; every global loop is a
    # work-item, a reduce with few outputs is split over a work group, and a plain matmul goes to the matrix cores;
    # amdgcn has no float64 libm and v_sin_f32 no range reduction: codegen writes that math out (float_math.py)
    capabilities = Capabilities(
        vector_bytes=32,
        vector_registers=16,
        vector_types=True,
        pack_bytes=16,
        parallel_loops=True,
        group_reduce=True,
        matrix_cores=True,
        float64_math=False,
        sin_reduction=False,
    )

    def __init__(self, capabilities: Capabilities | None = None, arch: str = "gfx950"):
        super().__init__(capabilities, TRIPLE)  # opt fills in the target's data layout
        self.arch = arch  # the matrix-core shapes differ (gfx950 has the 32x32x16 16-bit ones)
        self._matmul_of: tuple[tuple[UOp, ...] | None, Matmul | None] = (None, None)
        self.string_rewrite = amdgpu_rewrite

    def check(self, lin: tuple[UOp, ...]) -> None:
        for u in lin:
            if u.op in NO_FLOAT64 and u.dtype is dtypes.float64:
                op = u.op.name.lower()
                raise RenderError(f"DEV=AMD cannot compute {op} on {u.dtype}: LLVM has no amdgcn lowering for it")

    def matmul(self, lin: tuple[UOp, ...]) -> Matmul | None:
        """The plain matmul lin computes, when this renderer puts it on the matrix cores (llvmir_amdgpu_mfma.py).
        Remembered for the last lin: launch_dims asks at every loop of the kernel being rendered."""
        if not self.capabilities.matrix_cores:
            return None
        seen, mm = self._matmul_of  # one read: kernels may be rendered on several threads at once
        if seen is not lin:
            mm = match_matmul(lin)
            self._matmul_of = (lin, mm)
        return mm

    def render(self, name: str, lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]] | None = None) -> str:
        if (mm := self.matmul(lin)) is not None:
            return render_mfma(name, mm, self.params(lin), self.arch)
        if self.launch_dims(lin).grouped is not None:
            packs = None  # the lanes' accumulators are combined one by one in LDS
        return _pow_helpers(super().render(name, lin, packs))

    def launch_dims(self, lin: tuple[UOp, ...]) -> LaunchDims:
        """gpu_dims' launch of lin (a wave per 32 x 32 tile for the matrix cores); a split reduction whose LDS arrays
        would not fit a workgroup's LDS is not split."""
        if (mm := self.matmul(lin)) is not None:
            return mfma_dims(mm)
        dims = launch_dims(lin, self.capabilities.group_reduce)
        if dims.grouped is not None and lds_bytes(lin, dims) > LDS_BYTES:
            return launch_dims(lin, group_reduce=False)
        return dims

    def outer_range(self, lin: tuple[UOp, ...]) -> UOp | None:
        return None  # the global loops are work-items (_work_item_range), every other loop runs from 0

    def function_attributes(self, lin: tuple[UOp, ...]) -> str:
        threads = prod(self.launch_dims(lin).local_size)
        return f'nounwind "amdgpu-flat-work-group-size"="1,{threads}" !reqd_work_group_size !0 '

    def module_trailer(self, lin: tuple[UOp, ...]) -> str:
        x, y, z = self.launch_dims(lin).local_size
        # code object v5 (LLVM 19's default; LLVM 22 would write v6, which the MI300/MI350 stacks need not load)
        v5 = '!llvm.module.flags = !{!1}\n!1 = !{i32 1, !"amdhsa_code_object_version", i32 500}\n'
        return f"!0 = !{{i32 {x}, i32 {y}, i32 {z}}}\n" + v5

    def params(self, lin: tuple[UOp, ...]) -> list[str]:
        bufs = sorted((u for u in lin if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg[0])
        return [f"{self.global_ptr} %data{u.arg[0]}" for u in bufs]  # no noalias: an assign may pass one buffer twice
