"""The CUDA device: CUDA C from the renderer, compiled to PTX (and a cubin where ptxas is on PATH) by nvcc or NVRTC,
run through the CUDA driver API (libcuda) with ctypes. Without the NVIDIA driver the compiler still works."""

from __future__ import annotations
import ctypes
import ctypes.util
import functools
import os
import shutil
import subprocess
import tempfile
from typing import Any
import numpy as np
from fusegrad.codegen.gpu_dims import launch_dims
from fusegrad.helpers import CUDA_ARCH, DEBUG
from fusegrad.renderer.gpu import CUDAKernelRenderer
from fusegrad.runtime.device import Allocator, Buffer, Compiled, Compiler


class CompileError(RuntimeError):
    pass


@functools.cache
def _load_library(names: tuple[str, ...]) -> ctypes.CDLL | None:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    found = ctypes.util.find_library(names[0].split(".")[0].removeprefix("lib"))
    return ctypes.CDLL(found) if found else None


def libcuda() -> ctypes.CDLL | None:
    return _load_library(("libcuda.so.1", "libcuda.so"))


def libnvrtc() -> ctypes.CDLL | None:
    return _load_library(("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"))


class CUDACompiler(Compiler):
    """CUDA C -> PTX for `arch` (sm_90 for an H200), by nvcc on PATH or else NVRTC; then a cubin when ptxas is on PATH.
    The binary is the cubin, or the PTX (which the driver compiles when it loads it)."""

    def __init__(self, arch: str):
        super().__init__("cuda")
        self.arch = arch

    def identity(self) -> str:
        return f"{self.arch}|{_toolchain_version(shutil.which('nvcc'))}|{shutil.which('ptxas') is not None}"

    def to_ptx(self, src: str, name: str) -> str:
        if (nvcc := shutil.which("nvcc")) is not None:
            with tempfile.TemporaryDirectory() as tmp:
                cu, ptx = os.path.join(tmp, f"{name}.cu"), os.path.join(tmp, f"{name}.ptx")
                with open(cu, "w") as f:
                    f.write(src)
                argv = [nvcc, "--ptx", f"-arch=compute_{self.arch[3:]}", "-o", ptx, cu]
                proc = subprocess.run(argv, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise CompileError(_failure(f"nvcc ({' '.join(argv[1:4])})", name, proc.stderr, src))
                with open(ptx) as f:
                    return f.read()
        if (nvrtc := libnvrtc()) is not None:
            return _nvrtc_ptx(nvrtc, src, name, self.arch)
        raise CompileError(
            f"no CUDA compiler for kernel {name}: neither nvcc on PATH nor libnvrtc found; install the CUDA toolkit"
        )

    def compile(self, src: str, name: str) -> bytes:
        ptx = self.to_ptx(src, name)
        if DEBUG >= 7:
            print(ptx)
        if (ptxas := shutil.which("ptxas")) is None:
            return ptx.encode()
        with tempfile.TemporaryDirectory() as tmp:
            ptx_path, cubin = os.path.join(tmp, f"{name}.ptx"), os.path.join(tmp, f"{name}.cubin")
            with open(ptx_path, "w") as f:
                f.write(ptx)
            proc = subprocess.run([ptxas, f"-arch={self.arch}", "-o", cubin, ptx_path], capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileError(_failure(f"ptxas -arch={self.arch}", name, proc.stderr, ptx))
            with open(cubin, "rb") as f:
                return f.read()


@functools.cache
def _toolchain_version(nvcc: str | None) -> str:
    if nvcc is None:
        return "nvrtc"
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]


def _failure(tool: str, name: str, log: str, src: str) -> str:
    numbered = "\n".join(f"{i + 1:4d} {ln}" for i, ln in enumerate(src.splitlines()))
    return f"{tool} failed on kernel {name}:\n{log}\n--- source ---\n{numbered}"


def _nvrtc_ptx(nvrtc: ctypes.CDLL, src: str, name: str, arch: str) -> str:
    prog = ctypes.c_void_p()
    _check_nvrtc(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None))
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture=compute_{arch[3:]}".encode())
    status = nvrtc.nvrtcCompileProgram(prog, 1, opts)
    if status != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise CompileError(_failure("NVRTC", name, log.value.decode(errors="replace"), src))
    size = ctypes.c_size_t()
    _check_nvrtc(nvrtc, nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)))
    ptx = ctypes.create_string_buffer(size.value)
    _check_nvrtc(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx))
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def _check_nvrtc(nvrtc: ctypes.CDLL, status: int) -> None:
    if status != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise CompileError(f"NVRTC error {status}: {nvrtc.nvrtcGetErrorString(status).decode()}")


class CUDADriver:
    """The few driver API calls the device uses, each checked: a failing call raises naming the call and the error."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def __call__(self, fn: str, *args: Any) -> None:
        status = getattr(self.lib, fn)(*args)
        if status != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(status, ctypes.byref(msg))
            raise RuntimeError(f"CUDA {fn} failed: error {status} ({(msg.value or b'?').decode()})")


class CUDAAllocator(Allocator):
    """Device pointers (CUdeviceptr, as int) from cuMemAlloc; copies are synchronous cuMemcpy calls."""

    def __init__(self, dev: CudaDevice):
        self.dev = dev

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.dev.activate()
        try:
            self.dev.cu("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1)))
        except RuntimeError as e:
            raise MemoryError(f"{self.dev.device}: cannot allocate {nbytes} bytes: {e}") from None
        return ptr.value

    def free(self, handle: int) -> None:
        self.dev.activate()
        self.dev.cu("cuMemFree_v2", ctypes.c_uint64(handle))

    def copyin(self, handle: int, src: np.ndarray) -> None:
        src = np.ascontiguousarray(src)
        self.dev.activate()
        self.dev.cu(
            "cuMemcpyHtoD_v2", ctypes.c_uint64(handle), src.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(src.nbytes)
        )

    def copyout(self, dst: np.ndarray, handle: int) -> None:
        self.dev.activate()
        self.dev.cu(
            "cuMemcpyDtoH_v2", dst.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(handle), ctypes.c_size_t(dst.nbytes)
        )

    def can_transfer_from(self, src: Allocator) -> bool:
        return isinstance(src, CUDAAllocator) and src.dev.context.value == self.dev.context.value

    def transfer(self, dst: int, src: int, nbytes: int, src_allocator: Allocator) -> None:
        self.dev.activate()
        self.dev.cu("cuMemcpyDtoD_v2", ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_size_t(nbytes))


class CUDAProgram:
    """A loaded module's kernel, launched over gpu_dims' grid (global / local) with blocks of local_size."""

    def __init__(self, dev: CudaDevice, info: Any, binary: bytes):
        self.dev, self.name, self.nparams = dev, info.name, info.nparams
        self.dims = launch_dims(info.lin, dev.renderer.capabilities.group_reduce)
        self.module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
        dev.activate()
        image = binary if not binary.lstrip().startswith(b"//") else binary + b"\0"  # PTX is loaded as a C string
        dev.cu("cuModuleLoadData", ctypes.byref(self.module), ctypes.c_char_p(image))
        dev.cu("cuModuleGetFunction", ctypes.byref(self.function), self.module, info.name.encode())

    def __call__(self, buffers: list[Buffer], wait: bool = False) -> float | None:
        if len(buffers) != self.nparams:
            raise RuntimeError(f"kernel {self.name} takes {self.nparams} buffers, got {len(buffers)}")
        ptrs = [ctypes.c_uint64(b.handle) for b in buffers]
        args = (ctypes.c_void_p * len(ptrs))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs])
        grid, block = self.dims.groups, self.dims.local_size
        self.dev.activate()
        start, end = (self.dev.event(), self.dev.event()) if wait else (None, None)
        if start is not None:
            self.dev.cu("cuEventRecord", start, None)
        self.dev.cu(
            "cuLaunchKernel", self.function, *map(ctypes.c_uint, (*grid, *block)), ctypes.c_uint(0), None, args, None
        )
        if start is None:
            return None
        self.dev.cu("cuEventRecord", end, None)
        self.dev.cu("cuEventSynchronize", end)
        ms = ctypes.c_float()
        self.dev.cu("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value * 1e-3


def missing_driver_reason() -> str | None:
    """Why the CUDA device cannot open here, or None when the driver library is present."""
    if libcuda() is None:
        return (
            "the CUDA device needs the NVIDIA driver's libcuda.so.1, which is not installed on this machine (no NVIDIA "
            "driver); kernels still compile to PTX with nvcc or NVRTC (fusegrad.runtime.ops_cuda.CUDACompiler)"
        )
    return None


class CudaDevice(Compiled):
    def __init__(self, name: str):
        if (reason := missing_driver_reason()) is not None:
            raise RuntimeError(f"{name}: {reason}")
        self.cu = CUDADriver(libcuda())  # type: ignore[arg-type]
        self.cu("cuInit", 0)
        count = ctypes.c_int()
        self.cu("cuDeviceGetCount", ctypes.byref(count))
        index = int(name.partition(":")[2] or 0)
        if index >= count.value:
            raise RuntimeError(f"{name} not found: the NVIDIA driver lists {count.value} CUDA device(s)")
        self.cu_device, self.context = ctypes.c_int(), ctypes.c_void_p()
        self.cu("cuDeviceGet", ctypes.byref(self.cu_device), index)
        self.cu("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.cu_device)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.cu("cuDeviceGetAttribute", ctypes.byref(major), 75, self.cu_device)  # COMPUTE_CAPABILITY_MAJOR
        self.cu("cuDeviceGetAttribute", ctypes.byref(minor), 76, self.cu_device)  # COMPUTE_CAPABILITY_MINOR
        arch = f"sm_{major.value}{minor.value}"
        super().__init__(name, CUDAAllocator(self), CUDAKernelRenderer(), CUDACompiler(arch), CUDAProgram)

    def activate(self) -> None:
        self.cu("cuCtxSetCurrent", self.context)

    def event(self) -> ctypes.c_void_p:
        ev = ctypes.c_void_p()
        self.cu("cuEventCreate", ctypes.byref(ev), 0)
        return ev

    def synchronize(self) -> None:
        self.activate()
        self.cu("cuCtxSynchronize")


def default_arch() -> str:
    """The arch compile-only use targets: CUDA_ARCH, else sm_90 (H100/H200)."""
    return CUDA_ARCH.value or "sm_90"
