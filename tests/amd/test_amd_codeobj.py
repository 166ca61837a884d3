"""Kernels as amdgcn code objects: LLVM IR rendered from linear UOps, compiled by LLVM, descriptor parsed."""

from __future__ import annotations
import struct
import pytest
from fusegrad import Tensor, dtypes
from fusegrad.codegen import lower_to_linear, pack_vectors
from fusegrad.schedule import create_schedule
from fusegrad.runtime.support.amd.codeobj import (
    ToolchainError,
    compile_ir,
    find_llvm,
    in_process,
    load_image,
    parse_code_object,
    pick_target,
)
from fusegrad.runtime.support.amd import inproc
from fusegrad.renderer.cstyle import RenderError
from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer
from fusegrad.runtime.device import Device


def render(name: str, lin) -> str:
    renderer = AMDGPURenderer()
    return renderer.render(name, lin, pack_vectors(tuple(lin), renderer.capabilities))


def kernels(t: Tensor):
    items, _, _ = create_schedule([t.uop], ["CPU"])
    return [lower_to_linear(it.ast, Device["CPU"].renderer) for it in items if it.ast.op.name == "SINK"]


def test_target_falls_back_to_gfx942_when_llvm_lacks_gfx950(amdgpu_target):
    assert amdgpu_target in ("gfx950", "gfx942")


def test_kernel_descriptor_gives_the_abi_and_resources(amdgpu_target):
    (info,) = kernels((Tensor([1.0, 2, 3]) + 1) * Tensor([2.0, 2, 2]))
    ir = render(info.name, info.lin)
    assert 'target triple = "amdgcn-amd-amdhsa"' in ir and f"define amdgpu_kernel void @{info.name}(" in ir
    elf = compile_ir(ir, amdgpu_target)
    kd = parse_code_object(elf, info.name)
    assert kd.kernarg_size == 8 * info.nparams  # one 8-byte global pointer per buffer
    assert kd.properties >> 3 & 1 and kd.kernarg_user_sgpr == 0  # kernarg pointer in the first user SGPRs
    assert kd.private_segment == 0  # loop counters and accumulators were promoted to registers
    assert kd.entry_offset % 256 == 0 and kd.vgprs >= 8 and kd.sgprs >= 8
    image = load_image(elf)
    # the descriptor in the loaded image points at the code: kernel_code_entry_byte_offset at byte 16
    assert struct.unpack_from("<q", image, kd.kd_offset + 16)[0] == kd.entry_offset - kd.kd_offset
    with pytest.raises(ToolchainError, match="no symbol nope.kd"):
        parse_code_object(elf, "nope")


def test_reductions_and_transcendentals_compile(amdgpu_target):
    x = Tensor.ones(4, 8)
    for info in kernels(x.log_softmax(axis=1).sum() + (x**2).max()):
        parse_code_object(compile_ir(render(info.name, info.lin), amdgpu_target), info.name)


def test_unsupported_float64_transcendentals_are_named():
    (info,) = kernels(Tensor([1.0, 2.0], dtype=dtypes.float64).sin())
    with pytest.raises(RenderError, match="sin on dtypes.float64"):
        render(info.name, info.lin)


def test_other_dtypes_compile(amdgpu_target):
    x = Tensor([1.0, 2.0, 3.0])
    cases = [
        (x.cast(dtypes.bfloat16) + 1).cast(dtypes.float32),
        x.cast(dtypes.float16).exp2(),
        x.cast(dtypes.float64).sqrt() * 2,
        (x > 1.5) & (x < 2.5),
        (x * 40).cast(dtypes.uint8) >> 1,
        Tensor([7, -7, 9], dtype=dtypes.int64) // Tensor([2, 0, -1], dtype=dtypes.int64),
    ]
    for t in cases:
        for info in kernels(t):
            kd = parse_code_object(compile_ir(render(info.name, info.lin), amdgpu_target), info.name)
            assert kd.kernarg_size == 8 * info.nparams and kd.private_segment == 0


def test_broken_ir_reports_the_tool_and_its_message(amdgpu_target):
    with pytest.raises(ToolchainError, match="opt failed" if not in_process() else "llvmlite .* failed"):
        compile_ir('target triple = "amdgcn-amd-amdhsa"\ndefine void @f() {\n  ret i32 0\n}\n', amdgpu_target)


MACH = {"gfx942": 0x4C, "gfx950": 0x4F}  # EF_AMDGPU_MACH_AMDGCN_* (LLVM AMDGPUUsage, "ELF Header")


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_llvmlite_builds_a_v5_code_object_like_ld_lld(arch):
    """The in-process path (llvmlite + the small linker) gives what opt/llc/ld.lld give: an ET_DYN for the arch,
    HSA ABI version 3 (code object v5), the same descriptor fields and the same code bytes."""
    if not inproc.available():
        pytest.skip("llvmlite without the amdgcn target")
    (info,) = kernels(Tensor.ones(4, 8).sum(axis=1))
    elf = inproc.link(inproc.compile_object(render(info.name, info.lin), arch))
    assert struct.unpack_from("<HH", elf, 0x10) == (3, 224) and elf[7:9] == bytes([64, 3])  # DYN, AMDGPU, HSA, v5
    assert struct.unpack_from("<I", elf, 0x30)[0] & 0xFF == MACH[arch]
    kd = parse_code_object(elf, info.name)
    image = load_image(elf)
    assert kd.entry_offset % 256 == 0 and kd.kernarg_size == 8 * info.nparams and kd.properties >> 3 & 1
    assert struct.unpack_from("<q", image, kd.kd_offset + 16)[0] == kd.entry_offset - kd.kd_offset
    assert kd.vgprs >= 8 and kd.sgprs >= 8 and kd.accum_offset >= 4 and kd.group_segment >= 4
    try:
        find_llvm()
    except ToolchainError:
        return
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:  # ld.lld on the same object: the same descriptor and code
        with open(f"{d}/k.o", "wb") as f:
            f.write(inproc.compile_object(render(info.name, info.lin), arch))
        subprocess.run([find_llvm()["ld.lld"], "-shared", "-o", f"{d}/k.so", f"{d}/k.o"], check=True)
        with open(f"{d}/k.so", "rb") as f:
            lld = f.read()
    kd2, image2 = parse_code_object(lld, info.name), load_image(lld)
    assert (kd2.rsrc1, kd2.rsrc2, kd2.rsrc3, kd2.properties, kd2.group_segment) == (
        kd.rsrc1, kd.rsrc2, kd.rsrc3, kd.properties, kd.group_segment
    )  # fmt: skip
    assert image2[kd2.entry_offset : kd2.entry_offset + 64] == image[kd.entry_offset : kd.entry_offset + 64]


def test_unknown_arch_is_refused_by_name():
    with pytest.raises(ToolchainError, match="gfx1100"):
        pick_target("gfx1100")
