"""The LLVM device: kernels as LLVM IR, compiled in-process by llvmlite for the host CPU (no C compiler needed),
cached on disk as checksummed object files, loaded with MCJIT and split over threads like the CPU device."""

from __future__ import annotations
import ctypes
import ctypes.util
import functools
import hashlib
import os
import tempfile
import threading
from typing import Any
from fusegrad.helpers import CACHELEVEL, CCACHE, DEBUG
from fusegrad.renderer import Capabilities
from fusegrad.renderer.llvmir import LLVMRenderer
from fusegrad.runtime.device import Compiled, HostAllocator
from fusegrad.runtime.kernel_cache import KernelCache
from fusegrad.runtime.ops_cpu import CompileError, CPUProgram

try:
    import llvmlite
    import llvmlite.binding as llvm
except ImportError as e:  # the registry reports this when DEV=LLVM is opened
    raise ImportError("the LLVM device needs llvmlite: pip install llvmlite (or pip install 'fusegrad[llvm]')") from e

OPT_LEVEL = 3
# MCJIT maps a kernel's code, constant pool and unwind tables separately; in a process holding gigabytes they can land
# more than 2 GiB apart, where a 32-bit PC-relative relocation fails LLVM's `isInt<32>` assert and aborts the process.
# The large code model with static relocations reaches every constant and libm function by a 64-bit address.
RELOC, CODE_MODEL = "static", "large"


@functools.cache
def host_target() -> llvm.TargetMachine:
    """The target machine of this CPU, with every feature it has (the vector width follows from them)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # helpers LLVM may call for conversions the CPU lacks instructions for (e.g. double -> half): libgcc has them
    if (libgcc := ctypes.util.find_library("gcc_s")) is not None:
        llvm.load_library_permanently(libgcc)
    return new_target_machine()


def new_target_machine() -> llvm.TargetMachine:
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=OPT_LEVEL,
        reloc=RELOC,
        codemodel=CODE_MODEL,
        jit=True,
    )


def host_capabilities() -> Capabilities:
    """The vector width and register count of the host CPU llvmlite compiles for, from its features."""
    features = llvm.get_host_cpu_features()
    if features.get("avx512f"):
        return LLVMRenderer.capabilities.replace(vector_bytes=64, vector_registers=32)
    if features.get("avx"):
        return LLVMRenderer.capabilities.replace(vector_bytes=32, vector_registers=16)
    registers = 32 if llvm.get_process_triple().startswith(("aarch64", "arm64")) else 16  # NEON: 32 of 16 bytes
    return LLVMRenderer.capabilities.replace(vector_bytes=16, vector_registers=registers)


def identity() -> str:
    tm = host_target()
    return f"llvmlite {llvmlite.__version__}|llvm {llvm.llvm_version_info}|{tm.triple}|{llvm.get_host_cpu_name()}|" + (
        f"{llvm.get_host_cpu_features().flatten()}|O{OPT_LEVEL}|{RELOC}|{CODE_MODEL}"
    )


def optimize(ir: str, name: str) -> llvm.ModuleRef:
    """Parse, verify and optimize one kernel's IR at O3 with the loop and SLP vectorizers."""
    tm = host_target()
    try:
        mod = llvm.parse_assembly(ir)
        mod.verify()
    except RuntimeError as e:
        numbered = "\n".join(f"{i + 1:4d} {ln}" for i, ln in enumerate(ir.splitlines()))
        raise CompileError(f"LLVM rejected the IR of kernel {name}: {e}\n--- IR ---\n{numbered}") from None
    mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
    tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    tuning.loop_vectorization = tuning.slp_vectorization = True
    builder = llvm.create_pass_builder(tm, tuning)
    builder.getModulePassManager().run(mod, builder)
    return mod


class LLVMCompiler:
    """IR -> object file for the host; object files are cached on disk by a hash of the IR and the target."""

    def __init__(self):
        self.cache = KernelCache("llvm", ".o")

    def compile(self, ir: str, name: str = "kernel") -> bytes:
        key = hashlib.sha256((identity() + ir).encode()).hexdigest()
        if CACHELEVEL >= 1 and CCACHE and (path := self.cache.lookup(key)) is not None:
            with open(path, "rb") as f:
                data = f.read()
            if DEBUG >= 7:
                print(host_target().emit_assembly(optimize(ir, name)))
            return data
        mod = optimize(ir, name)
        if DEBUG >= 7:
            print(host_target().emit_assembly(mod))
        data = host_target().emit_object(mod)
        with tempfile.TemporaryDirectory() as tmp:
            built = os.path.join(tmp, "kernel.o")
            with open(built, "wb") as f:
                f.write(data)
            path = self.cache.store(key, built)
        if DEBUG >= 3:
            print(f"compiled {path}")
        return data

    def load(self, ir: str, name: str) -> tuple[llvm.ExecutionEngine, int]:
        """(the engine holding the code, the kernel's address); a cached object that fails to load is compiled again."""
        data = self.compile(ir, name)
        try:
            return self._link(data, name)
        except RuntimeError:
            for d in self.cache.dirs():
                self.cache.evict(os.path.join(d, hashlib.sha256((identity() + ir).encode()).hexdigest() + ".o"))
        try:
            return self._link(self.compile(ir, name), name)
        except RuntimeError as e:
            raise CompileError(f"kernel {name} compiled by LLVM cannot be loaded: {e}") from None

    @staticmethod
    def _link(data: bytes, name: str) -> tuple[llvm.ExecutionEngine, int]:
        host_target()  # LLVM initialized
        with _engine_lock:
            _retired_engines.clear()  # disposed here, never by a finalizer on whatever thread dropped the program
            # an engine owns its target machine and frees it with itself: each gets its own
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
            # llvmlite's object file points into `data` without copying, and the engine keeps reading its loaded
            # objects (it walks them again when disposed): the bytes must live exactly as long as the engine
            engine.object_bytes = data
            engine.add_object_file(llvm.ObjectFileRef.from_data(data))
            engine.finalize_object()
            if not (address := engine.get_function_address(name)):
                raise RuntimeError(f"the object file has no function {name}")
        return engine, address


# MCJIT engines are created and disposed under one lock, on the thread that links the next kernel: a program dropped
# by garbage collection on a worker thread only retires its engine
_engine_lock = threading.Lock()
_retired_engines: list[llvm.ExecutionEngine] = []


class LLVMProgram(CPUProgram):
    """A JIT-compiled kernel called through ctypes (which releases the GIL), chunks of the outer loop on the CPU
    device's thread pool."""

    def __init__(self, name: str, engine: llvm.ExecutionEngine, address: int, nparams: int, outer_size: int, ops: int):
        self.engine = engine  # owns the code: it lives as long as the program
        signature = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nparams), ctypes.c_longlong, ctypes.c_longlong)
        self.fn = signature(address)
        self.outer_size, self.ops, self.nparams = outer_size, ops, nparams

    def __del__(self) -> None:
        # at interpreter exit the module's globals may already be None: the process frees the engines then
        if (engine := getattr(self, "engine", None)) is not None and _retired_engines is not None:
            _retired_engines.append(engine)


class LlvmDevice(Compiled):
    def __init__(self, name: str):
        tm = host_target()
        renderer = LLVMRenderer(host_capabilities(), tm.triple, str(tm.target_data))
        super().__init__(name, HostAllocator(), renderer, None, LLVMProgram)
        self.compiler = LLVMCompiler()  # its objects are linked in-process from bytes (load), not run by the base

    def build(self, info) -> LLVMProgram:
        ir = self.renderer.render(info.name, info.lin, info.packs)
        if DEBUG >= 4:
            print(ir)
        engine, address = self.compiler.load(ir, info.name)
        return LLVMProgram(info.name, engine, address, info.nparams, info.outer_size, info.ops_estimate)

    def assembly(self, info) -> str:
        """The kernel's host machine code as text, from the IR optimized as its build optimizes it (VIZ shows it)."""
        return host_target().emit_assembly(optimize(self.renderer.render(info.name, info.lin, info.packs), info.name))

    def build_raw(self, raw: Any, nparams: int) -> LLVMProgram:
        """A user's LLVM IR function (RawKernel) taking one pointer per buffer, called once per launch."""
        from fusegrad.runtime.raw_source import llvm_with_wrapper

        ir, name = llvm_with_wrapper(raw.src, raw.entry, nparams)
        engine, address = self.compiler.load(ir, name)
        return LLVMProgram(name, engine, address, nparams, 1, 0)
