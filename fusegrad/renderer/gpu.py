"""The GPU dialects as the CL and CUDA devices use them: every global loop becomes a work-item index, as
codegen/gpu_dims.py maps it (the runtime launches the same dims), instead of only the outermost loop."""

from __future__ import annotations
from fusegrad.codegen.gpu_dims import launch_dims
from fusegrad.dtype import dtypes
from fusegrad.renderer.cstyle import CUDARenderer, KernelText, OpenCLRenderer, RenderError
from fusegrad.uop.ops import Ops, UOp


class _WorkItemLoops:
    """A global loop is one work item's index and a bound check; its ENDRANGE closes the check's block."""

    def work_item_id(self, dim: int) -> str:
        raise NotImplementedError

    def render_range(self, ctx: KernelText, u: UOp) -> str:
        if u.arg[1] != "global":
            return super().render_range(ctx, u)  # type: ignore[misc]
        name, t = ctx.names[u], self.ctype(u.dtype)  # type: ignore[attr-defined]
        dims = launch_dims(ctx.lin)
        index = dims.index(u, self.work_item_id(dims.axes[u].dim))
        return f"{t} {name} = ({t}){index};\nif ({name} < {ctx.ref(u.src[0])}) {{"


class OpenCLKernelRenderer(_WorkItemLoops, OpenCLRenderer):
    """OpenCL C for the CL device. Buffers of bool are uchar (OpenCL forbids bool in kernel arguments); half needs the
    device's cl_khr_fp16, which `half_supported` says."""

    def __init__(self, half_supported: bool = True):
        self.half_supported = half_supported

    def work_item_id(self, dim: int) -> str:
        return f"get_global_id({dim})"

    def render_params(self, lin: tuple[UOp, ...]) -> list[str]:
        return [p.replace("bool*", "uchar*") for p in super().render_params(lin)]

    def render(self, name: str, lin: tuple[UOp, ...], vectorize: bool = True) -> str:
        if not self.half_supported and any(u.dtype is dtypes.float16 for u in lin if u.op is not Ops.CONST):
            raise RenderError(
                f"kernel {name} uses float16, but this OpenCL device lacks cl_khr_fp16: use float32 (or bfloat16) on CL"
            )
        return super().render(name, lin, vectorize)


class CUDAKernelRenderer(_WorkItemLoops, CUDARenderer):
    """CUDA C for the CUDA device: dimension d of the launch is blockIdx * blockDim + threadIdx."""

    def work_item_id(self, dim: int) -> str:
        axis = "xyz"[dim]
        return f"(blockIdx.{axis}*blockDim.{axis}+threadIdx.{axis})"
