"""The GPU dialects of C: `OpenCLRenderer` (OpenCL C) and `CUDARenderer` (CUDA C) render one work item per
iteration of the outermost global loop; `OpenCLKernelRenderer` and `CUDAKernelRenderer`, which the CL and CUDA devices
use, make every global loop a work-item index, as codegen/gpu_dims.py maps it (the runtime launches the same dims), and
split a reduce with few outputs over the lanes of a work group that combine their accumulators in local memory."""

from __future__ import annotations
from fusegrad.codegen.opt.packs import Pack
from fusegrad.codegen.gpu_dims import LaunchDims, global_loops, grouped_updates, launch_dims
from fusegrad.dtype import DType, dtypes
from fusegrad.renderer import Capabilities
from fusegrad.renderer.cstyle import INFIX, CStyleRenderer, KernelText, RenderError, base_rewrite
from fusegrad.uop.ops import Ops, UOp
from fusegrad.uop.pattern import PatternMatcher, UPat


def _uses(lin: tuple[UOp, ...], dt: DType) -> bool:
    return any(u.dtype is dt or (u.op is Ops.CAST and u.src[0].dtype is dt) for u in lin)


OPENCL_BF16 = """inline float fg_bf16_to_f32(ushort b) { return as_float((uint)b << 16); }
inline ushort fg_f32_to_bf16(float f) {
  uint u = as_uint(f);
  if (f != f) return 0x7FC0;
  return (ushort)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
"""


class OpenCLRenderer(CStyleRenderer):
    """OpenCL C: `__kernel` functions over `__global` buffers, work item i runs iteration i of the outer loop; native
    vector types (float4) loaded with vload/vstore; half through cl_khr_fp16."""

    kernel_prefix = "__kernel "
    buffer_prefix = "__global "
    type_map = {
        dtypes.bool: "bool",
        dtypes.float16: "half",
        dtypes.bfloat16: "ushort",
        dtypes.int8: "char",
        dtypes.uint8: "uchar",
        dtypes.uint16: "ushort",
        dtypes.uint32: "uint",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
    }
    unsupported = dtypes.fp8s
    float32_math_suffix = ""  # the math builtins are overloaded
    int64_suffix, uint64_suffix = "L", "UL"
    wrapping_types = {dtypes.int32: "uint", dtypes.int64: "ulong"}
    capabilities = Capabilities(vector_bytes=16, vector_types=True)  # float4 / double2
    string_rewrite = (
        PatternMatcher(
            [(UPat(Ops.BITCAST, name="x"), lambda ctx, x: f"as_{ctx.renderer.ctype(x.dtype)}({ctx.ref(x.src[0])})")]
        )
        + base_rewrite
    )

    def buffer_type(self, dt: DType) -> str:
        return "uchar" if dt is dtypes.bool else self.ctype(dt)

    def render_prelude(self, lin: tuple[UOp, ...], kernel: str) -> str:
        half = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" if _uses(lin, dtypes.float16) else ""
        fp64 = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if _uses(lin, dtypes.float64) else ""
        return half + fp64 + (OPENCL_BF16 if _uses(lin, dtypes.bfloat16) else "")

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        if u is not ctx.outer:
            return super().render_range(ctx, u)
        name = ctx.names[u]
        return f"{self.ctype(u.dtype)} {name} = get_global_id(0);\nif ({name} < {ctx.ref(u.src[0])}) {{"

    def vector_type(self, dt: DType, n: int) -> tuple[str, str]:
        return f"{self.ctype(dt)}{n}", ""

    def lane(self, vector: str, i: int) -> str:
        return f"{vector}.s{i:x}"

    def render_vector(self, ctx: KernelText, u: UOp, pack: Pack) -> None:
        n = len(pack.lanes)
        if u.op is Ops.STORE:
            value = ctx.vec_names[pack] = ctx.vec_names[ctx.packs[u.src[2]][0]]
            ctx.line(f"vstore{n}({value}, 0, {ctx.address(u, pack)});")
            return
        if u.op is Ops.ACC_UPDATE:
            if u.arg is not Ops.ADD:  # only sums pack here (MAX is not in this dialect's vector_math)
                raise RenderError(f"{type(self).__name__} has no vector accumulator update for {u.arg}")
            acc = ctx.vec_names[pack] = ctx.vec_names[ctx.packs[u.src[0]][0]]
            ctx.line(f"{acc} = {acc} + {ctx.vref(u.src[1])};")
            return
        v, t = ctx.fresh("vec"), ctx.vtype(pack)
        ctx.vec_names[pack] = v
        if u.op is Ops.LOAD:
            zero = f"({t})({self.render_const(0, pack.dtype)})"
            load = f"vload{n}(0, {ctx.address(u, pack)})"
            ctx.line(f"{t} {v} = {f'({ctx.ref(u.src[2])}?{load}:{zero})' if len(u.src) == 3 else load};")
        elif u.op is Ops.DEFINE_ACC:
            ctx.line(f"{t} {v} = ({t})({ctx.ref(u.src[0])});")
        elif u.op is Ops.NEG:
            ctx.line(f"{t} {v} = -{ctx.vref(u.src[0])};")
        elif u.op is Ops.WHERE:
            arms = [ctx.vref(s) if s in ctx.packs else f"({t})({ctx.ref(s)})" for s in u.src[1:]]
            if u.src[0] in ctx.packs:  # a mask pack selects lane by lane (select takes lanes whose top bit is set)
                ctx.line(f"{t} {v} = select({arms[1]}, {arms[0]}, {ctx.vec_names[ctx.packs[u.src[0]][0]]});")
            else:
                ctx.line(f"{t} {v} = ({ctx.ref(u.src[0])} ? {arms[0]} : {arms[1]});")
        elif u.op in INFIX:
            ctx.line(f"{t} {v} = ({ctx.vref(u.src[0])}{INFIX[u.op]}{ctx.vref(u.src[1])});")
        else:
            raise RenderError(f"{type(self).__name__} has no vector rule for {u.op}")


CUDA_PRELUDE = """#include <cuda_fp16.h>
__device__ inline float fg_bf16_to_f32(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
__device__ inline unsigned short fg_f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if (f != f) return 0x7FC0;
  return (unsigned short)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
template <class T, class F> __device__ inline T fg_bitcast(F x) { T y; memcpy(&y, &x, sizeof(y)); return y; }
"""


class CUDARenderer(CStyleRenderer):
    """CUDA C: `extern "C" __global__` kernels, thread blockIdx.x * blockDim.x + threadIdx.x runs that iteration of the
    outer loop; half from cuda_fp16.h; NaN/infinity from their bits (no math.h macros in device code); scalar code."""

    kernel_prefix = 'extern "C" __global__ '
    prelude = CUDA_PRELUDE
    type_map = {dtypes.bool: "bool", dtypes.float16: "half", dtypes.bfloat16: "unsigned short"}
    unsupported = dtypes.fp8s
    nan, infinity = "__int_as_float(0x7fc00000)", "__int_as_float(0x7f800000)"
    string_rewrite = (
        PatternMatcher(
            [
                (
                    UPat(Ops.BITCAST, name="x"),
                    lambda ctx, x: f"fg_bitcast<{ctx.renderer.ctype(x.dtype)}>({ctx.ref(x.src[0])})",
                )
            ]
        )
        + base_rewrite
    )

    def render_float(self, s: str, dt: DType) -> str:
        if dt is dtypes.float64 and s in (self.nan, self.infinity, f"(-{self.infinity})"):
            return s.replace("__int_as_float(0x7fc00000)", "__longlong_as_double(0x7ff8000000000000LL)").replace(
                "__int_as_float(0x7f800000)", "__longlong_as_double(0x7ff0000000000000LL)"
            )
        return super().render_float(s, dt)

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        if u is not ctx.outer:
            return super().render_range(ctx, u)
        name, t = ctx.names[u], self.ctype(u.dtype)
        index = f"({t})blockIdx.x * blockDim.x + threadIdx.x"
        return f"{t} {name} = {index};\nif ({name} < {ctx.ref(u.src[0])}) {{"


# ---- as the devices launch them: every global loop a work-item index, grouped reduces in local memory

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
