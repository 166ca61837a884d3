"""The GPU dialects as the CL and CUDA devices use them: every global loop becomes a work-item index, as
codegen/gpu_dims.py maps it (the runtime launches the same dims), and a reduce with few outputs is split over the lanes
of a work group that combine their accumulators in local memory."""

from __future__ import annotations
from fusegrad.codegen.opt.packs import Pack
from fusegrad.codegen.gpu_dims import LaunchDims, global_loops, grouped_updates, launch_dims
from fusegrad.dtype import DType, dtypes
from fusegrad.renderer import Capabilities
from fusegrad.renderer.cstyle import CUDARenderer, KernelText, OpenCLRenderer, RenderError
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat

LANE = "fg_lane"


def _end_grouped(ctx: KernelText, x: UOp) -> str | None:
    """After the lanes' share of the split loop: a tree reduction in local memory, then only lane 0 goes on."""
    dims: LaunchDims = launch_dims(ctx.lin, ctx.renderer.capabilities.group_reduce)
    if x.src[0] is not dims.grouped:
        return None
    r = ctx.renderer
    lines = ["}"]
    for i, u in enumerate(grouped_updates(ctx.lin, dims.grouped)):
        acc, red = ctx.names[u.src[0]], f"fg_red{i}"
        both = r.render_alu(u.arg, u.dtype, [f"{red}[{LANE}]", f"{red}[{LANE}+fg_s]"], (u, u), wrap=True)  # type: ignore[attr-defined]
        lines += [
            f"{red}[{LANE}] = {acc};",
            r.barrier,  # type: ignore[attr-defined]
            f"for (int fg_s = {dims.lanes // 2}; fg_s > 0; fg_s >>= 1) {{",
            f"  if ({LANE} < fg_s) {red}[{LANE}] = {both};",
            f"  {r.barrier}",  # type: ignore[attr-defined]
            "}",
            f"{acc} = {red}[0];",
        ]
    return "\n".join(lines + [f"if ({LANE} != 0) return;"])


class _WorkItemLoops:
    """A global loop is one work item's index and a bound check (its ENDRANGE closes the check's block); the grouped
    reduce loop strides by the lane count."""

    local_array = ""  # declaration prefix of a work group's shared array
    barrier = ""
    lane_id = ""

    def work_item_id(self, dim: int) -> str:
        raise NotImplementedError

    def group_declarations(self, ctx: KernelText, dims: LaunchDims) -> str:
        """The lane id and one shared array per combined accumulator, at function scope (OpenCL requires it)."""
        lines = [f"int {LANE} = {self.lane_id};"]
        for i, u in enumerate(grouped_updates(ctx.lin, dims.grouped)):  # type: ignore[arg-type]
            lines.append(f"{self.local_array}{self.ctype(u.dtype)} fg_red{i}[{dims.lanes}];")  # type: ignore[attr-defined]
        return "\n".join(lines) + "\n"

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        dims = launch_dims(ctx.lin, self.capabilities.group_reduce)  # type: ignore[attr-defined]
        name, t = ctx.names[u], self.ctype(u.dtype)  # type: ignore[attr-defined]
        loops = global_loops(ctx.lin)
        first = loops[0] if loops else dims.grouped
        prefix = self.group_declarations(ctx, dims) if dims.grouped is not None and u is first else ""
        if u is dims.grouped:
            return f"{prefix}for ({t} {name} = {LANE}; {name} < {ctx.ref(u.src[0])}; {name} += {dims.lanes}) {{"
        if u.arg[1] != "global":
            return super().render_range(ctx, u)  # type: ignore[misc]
        index = dims.index(u, self.work_item_id(dims.axes[u].dim))
        return f"{prefix}{t} {name} = ({t}){index};\nif ({name} < {ctx.ref(u.src[0])}) {{"


# fixed values, as the GPU devices have no query for them: the heuristics plan register tiles as for AVX2's 32-byte
# vectors and 16 registers (the tiles they were tuned with), and every global loop is a parallel work item
GPU_CAPABILITIES = Capabilities(vector_bytes=32, vector_registers=16, parallel_loops=True, group_reduce=True)


class OpenCLKernelRenderer(_WorkItemLoops, OpenCLRenderer):
    """OpenCL C for the CL device. Buffers of bool are uchar (OpenCL forbids bool in kernel arguments); half needs the
    device's cl_khr_fp16, which `half_supported` says; `group_reduce` is off on CPU devices (PoCL), where lanes are
    not cheaper than loop iterations and LLVM takes minutes on some kernels with barriers in loops. Lanes pack into
    float4 / double2 (16 bytes)."""

    capabilities = GPU_CAPABILITIES.replace(vector_types=True, pack_bytes=16)

    local_array = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    lane_id = "get_local_id(0)"
    string_rewrite = PatternMatcher([(UPat(Ops.ENDRANGE, name="x"), _end_grouped)]) + OpenCLRenderer.string_rewrite

    def __init__(self, half_supported: bool = True, group_reduce: bool = True):
        super().__init__(type(self).capabilities.replace(group_reduce=group_reduce))
        self.half_supported = half_supported

    def work_item_id(self, dim: int) -> str:
        return f"get_global_id({dim})"

    def render_params(self, lin: tuple[UOp, ...]) -> list[str]:
        return [p.replace("bool*", "uchar*") for p in super().render_params(lin)]

    def unsupported_dtypes(self) -> tuple[DType, ...]:
        return tuple(self.unsupported) + (() if self.half_supported else (dtypes.float16,))

    def render(self, name: str, lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]] | None = None) -> str:
        if bad := sorted({u.dtype for u in lin if u.dtype in self.unsupported_dtypes()}, key=str):
            why = "the fp8 formats have no OpenCL C type" if bad[0] in dtypes.fp8s else "the device lacks cl_khr_fp16"
            raise RenderError(
                f"the OpenCL renderer does not support {bad[0]} (kernel {name}): {why}; use float32 on CL"
            )
        return super().render(name, lin, packs)


class CUDAKernelRenderer(_WorkItemLoops, CUDARenderer):
    """CUDA C for the CUDA device: dimension d of the launch is blockIdx * blockDim + threadIdx."""

    capabilities = GPU_CAPABILITIES

    local_array = "__shared__ "
    barrier = "__syncthreads();"
    lane_id = "threadIdx.x"
    string_rewrite = PatternMatcher([(UPat(Ops.ENDRANGE, name="x"), _end_grouped)]) + CUDARenderer.string_rewrite

    def work_item_id(self, dim: int) -> str:
        axis = "xyz"[dim]
        return f"(blockIdx.{axis}*blockDim.{axis}+threadIdx.{axis})"
